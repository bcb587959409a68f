"""bench: ``--rtol``/``--atol`` without ``--validate reference`` is a usage error (exit 2), as
``--oracle-mode`` without ``--oracle`` is; the rows were timed with no comparison, exit 0,
and nothing said that the tolerance given had checked nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result


@pytest.mark.parametrize(
    "flags", [["--rtol", "0.1"], ["--atol", "1e-3"], ["--validate", "none", "--rtol", "0.1"]]
)
def test_a_tolerance_without_validation_is_refused(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, flags: list[str]
) -> None:
    out = tmp_path / "r.json"
    result = cli("bench", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *flags)
    assert result.exit_code == 2, result.output
    assert "add --validate reference" in result.stderr
    assert not out.exists()


def test_a_tolerance_with_validation_is_used(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    args = ("-g", graph, "--iters", "2", "--warmup", "0", "--engine", "TORCH_ENGINE")
    result = cli("bench", *args, "--validate", "reference", "--rtol", "0.1")
    assert result.exit_code == 0, result.output
    assert "passed" in result.stdout
