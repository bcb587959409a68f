"""``-v``/``-vv``/``-q`` after the command (``dnntune tune -g g.json -v``) set the same log
level as before it; they were "No such option: -v" (exit 2), although ``bench`` takes ``-v``
there and nothing said the option exists one word earlier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune import testing

FAST = ("--strategy", "fixed_average", "--iters", "2", "--warmup", "1")


def _tune(cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, *flags: str) -> Result:
    graph = str(graph_dir / "a_mm_bias_relu.json")
    first = [f for f in flags[:1] if f]
    return cli(*first, "tune", "-g", graph, "-o", str(tmp_path / "o.json"), *FAST, *flags[1:])


@pytest.mark.parametrize("flags", [("-v",), ("--verbose",), ("-vv",)])
def test_verbose_after_the_command_shows_each_candidate(
    cli: Callable[..., Result],
    fakes: testing.FakeEngines,
    graph_dir: Path,
    tmp_path: Path,
    flags: tuple[str, ...],
) -> None:
    after = _tune(cli, graph_dir, tmp_path, "", *flags)  # "" is dropped below
    assert after.exit_code == 0, after.output
    before = _tune(cli, graph_dir, tmp_path, flags[0])
    assert before.exit_code == 0, before.output
    default = _tune(cli, graph_dir, tmp_path, "")
    assert default.exit_code == 0, default.output
    assert "autotune:" in before.stderr and "autotune:" in after.stderr
    assert "autotune:" not in default.stderr


def test_counts_add_up_and_quiet_wins(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    missing = {"DNNTUNE_HEUR_CONFIG_PATH": str(tmp_path / "missing.json")}
    args = ("run", "-g", graph, "--iters", "1", "--warmup", "0")
    loud = cli(*args, env=missing)
    assert loud.exit_code == 0, loud.output
    assert "missing.json" in loud.stderr  # the override file that cannot be used: a warning
    for flags in (("-q",), ("--quiet",), ("-v", "-q")):
        quiet = cli(*args, *flags, env=missing)
        assert quiet.exit_code == 0, quiet.output
        assert "missing.json" not in quiet.stderr
    debug = cli("-v", *args, "-v")
    assert debug.exit_code == 0, debug.output
    assert "DEBUG" in debug.stderr


def test_subcommands_of_sub_apps_take_them_too(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    missing = cli("overrides", "show", str(graph_dir / "b_pw_mul.json"), "-q")
    assert missing.exit_code == 1  # a graph is no override file: an error, still shown
    assert "not an engine-override file" in missing.stderr
    assert "No such option" not in missing.stderr
