"""Another dnntune command's output given where an override file goes is named as what it is,
by ``tune -o`` (refused before tuning) and ``overrides show``: a tune report (``-o`` and
``--report`` swapped) read only "it is no override file (a JSON list, ...)", ``run --json``
results "a JSON list", and bench results listed their keys (schema_version, tool, ...)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune import testing

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def _said(result: Result) -> str:
    return " ".join(result.output.replace("\u2502", " ").split())


@pytest.mark.parametrize(
    ("command", "looks_like"),
    [
        (["tune", "-o", "{tmp}/o.json", *FAST, "--report", "{out}"], "looks like a tune report"),
        (["run", "--iters", "2", "--json", "{out}"], "looks like `dnntune run --json` results"),
        (["bench", "--iters", "2", "-o", "{out}"], "looks like `dnntune bench` results"),
    ],
    ids=["tune-report", "run-json", "bench"],
)
def test_tune_and_show_name_another_commands_output(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    command: list[str],
    looks_like: str,
) -> None:
    out = tmp_path / "made.json"
    args = [a.format(tmp=tmp_path, out=out) for a in command]
    made = cli(args[0], "-g", str(graph_dir), *args[1:])
    assert made.exit_code == 0, made.output
    content = out.read_text()

    refused = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert refused.exit_code == 1, refused.output
    assert f"refusing to update {out}" in _said(refused)
    assert looks_like in _said(refused) and "--overwrite" in _said(refused)
    assert out.read_text() == content

    shown = cli("overrides", "show", str(out))
    assert shown.exit_code == 1, shown.output
    assert looks_like in _said(shown)
