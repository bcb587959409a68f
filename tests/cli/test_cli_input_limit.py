"""``--max-input-gb``: a graph whose buffers would be huge is refused before anything is allocated.

``validate`` accepts a graph with a padded stride raised by 10**9, yet its input takes 11 GiB.
``run`` and ``bench`` are covered in their own test files; this one is ``tune``.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import padded_graph

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def test_tune_refuses_a_huge_input_and_tunes_the_others(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    huge = padded_graph(tmp_path / "huge.json", 1_000_000_000)
    out = tmp_path / "overrides.json"
    result = cli("tune", "-g", str(huge), str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 1, result.output
    assert "graph 'huge' needs 11.18 GiB" in result.output
    assert "more than the limit of 8.00 GiB" in result.output
    written = json.loads(out.read_text())["engine_overrides"]
    assert [e["op"] for e in written] == ["matmul", "pointwise"]  # the two others were tuned


def test_tune_max_input_gb_lowers_and_lifts_the_limit(cli, fakes, tmp_path: Path) -> None:
    padded = padded_graph(tmp_path / "padded.json", 1_000_000)  # about 11.4 MiB
    out = tmp_path / "overrides.json"
    args = ("tune", "-g", str(padded), "-o", str(out), *FAST)
    refused = cli(*args, "--max-input-gb", "0.01")
    assert refused.exit_code == 1
    assert "more than the limit of 10.2 MiB" in refused.output
    assert cli(*args, "--max-input-gb", "0.02").exit_code == 0, refused.output
    assert cli(*args, "--max-input-gb", "0").exit_code == 0
