"""``dnntune bench compare --json`` prints strict JSON: a row with no time on one side (new,
failed or missing in B) has null there, and a null ``log_ratio``. It printed Python's ``NaN``
token, which jq and ``JSON.parse`` refuse, and a ``log_ratio`` of 0.0 ("no change") for rows
that were never compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_compare_json_is_strict_where_a_side_has_no_time(tmp_path: Path) -> None:
    graph = tmp_path / "mm.json"
    testing.small_matmul_graph().save(graph)
    both = tmp_path / "both.json"
    runner = CliRunner()
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        args = ["bench", "-g", str(graph), "--warmup", "1", "--iters", "3", "-o", str(both)]
        assert runner.invoke(app, args, catch_exceptions=False).exit_code == 0
    doc = json.loads(both.read_text())
    assert len(doc["graphs"][0]["results"]) == 2
    doc["graphs"][0]["results"].pop()
    one = tmp_path / "one.json"
    one.write_text(json.dumps(doc))

    for a, b, lost in ((one, both, "new in B"), (both, one, "missing in B")):
        result = runner.invoke(app, ["bench", "compare", str(a), str(b), "--json"])
        rows = {r["verdict"]: r for r in _strict(result.stdout)}
        assert set(rows) == {"within noise", lost}, result.output
        timed, untimed = rows["within noise"], rows[lost]
        assert timed["log_ratio"] == 0.0 and timed["speedup"] == 1.0
        assert untimed["speedup"] is None and untimed["noise_pct"] is None
        assert untimed["log_ratio"] is None
        side = "a_median_ms" if lost == "new in B" else "b_median_ms"
        assert untimed[side] is None
