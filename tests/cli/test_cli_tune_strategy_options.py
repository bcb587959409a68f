"""tune: an option the others make do nothing is a usage error before any tuning, as ``--shard``
without ``--distributed`` is. ``--iters 50`` under the default run_until_stable strategy was
accepted and ignored (each candidate timed until stable, 3 to 100 runs), and so were
``--max-iters`` with fixed_average and ``--priming-failure`` without ``--mode exhaustive``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune import testing


@pytest.mark.parametrize(
    ("flags", "option", "advice"),
    [
        (["--iters", "50"], "--iters", "add --strategy fixed_average"),
        (["--strategy", "run_until_stable", "--iters", "5"], "--iters", "give --max-iters"),
        (["--strategy", "fixed_average", "--max-iters", "5"], "--max-iters", "give --iters"),
        (["--priming-failure", "unprimed"], "--priming-failure", "add --mode exhaustive"),
    ],
)
def test_an_option_that_would_do_nothing_is_refused(
    cli: Callable[..., Result],
    graph_dir: Path,
    tmp_path: Path,
    flags: list[str],
    option: str,
    advice: str,
) -> None:
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *flags)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("\u2502", " ").split())
    assert f"Invalid value for '{option}'" in said and advice in said
    assert not out.exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--strategy", "fixed_average", "--iters", "2"],
        ["--max-iters", "3"],
        ["--mode", "exhaustive", "--priming-failure", "unprimed", "--max-iters", "3"],
    ],
)
def test_the_options_that_apply_still_work(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    flags: list[str],
) -> None:
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *flags)
    assert result.exit_code == 0, result.output
    assert out.exists()
