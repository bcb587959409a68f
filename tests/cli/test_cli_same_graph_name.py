"""Two graph files with one graph ``name`` (a copy edited to other shapes keeps it) are told
apart in ``run``'s and ``tune``'s tables by their file; a name that is not repeated stays as it
is. Both rows read ``pw_mul`` before, with their different times and no way to tell which file
each row was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import matmul_bias_relu, pointwise_mul
from typer.testing import Result

from dnntune import testing


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--iters", "2"],
        ["tune", "--strategy", "fixed_average", "--iters", "3", "-o", "{tmp}/o.json"],
    ],
    ids=["run", "tune"],
)
def test_rows_of_one_graph_name_name_their_files(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # short paths: the cells do not wrap
    small, wide = Path("small.json"), Path("wide", "pw.json")
    wide.parent.mkdir()
    pointwise_mul(rows=4).save(small)
    pointwise_mul(rows=64).save(wide)  # the same name, "pw_mul"
    other = Path("mm.json")
    matmul_bias_relu().save(other)
    args = [a.format(tmp=tmp_path) for a in command]
    result = cli(args[0], "-g", str(small), str(wide), str(other), *args[1:])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("\u2502")]
    cells = [row.split("\u2502")[1].strip() for row in rows]
    assert cells == [f"pw_mul ({small})", f"pw_mul ({wide})", "mm_bias_relu"]
