"""A ``tune`` run that writes no winner (every graph failed) says what became of its ``-o``
file, as an interrupted one does: with ``--overwrite`` the file keeps its old entries (it is
cleared only as the first winner is written), and the run ended on "tuned 0 of 1 graph; 1
failed" without a word about it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cli_helpers import bad_uid_document
from typer.testing import Result

from dnntune import testing

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def test_a_run_that_writes_no_winner_names_the_file_unchanged_or_not_created(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    assert cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST).exit_code == 0
    before = out.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(bad_uid_document()))

    kept = cli("tune", "-g", str(bad), "-o", str(out), "--overwrite", *FAST)
    assert kept.exit_code == 1, kept.output
    assert f"no winner was written: {out} is unchanged" in kept.stdout
    assert "reuse it" not in kept.stdout
    assert out.read_text() == before

    fresh = tmp_path / "new.json"
    none = cli("tune", "-g", str(bad), "-o", str(fresh), *FAST)
    assert none.exit_code == 1, none.output
    assert f"no winner was written: {fresh} was not created" in none.stdout
    assert not fresh.exists()

    tuned = cli("tune", "-g", str(graph_dir), "-o", str(fresh), *FAST)
    assert tuned.exit_code == 0 and "no winner was written" not in tuned.stdout
