"""A rank of a torchrun job ends through ``exit_rank``: exit handlers run, output is kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_exit_rank_runs_the_exit_handlers_flushes_and_keeps_the_code() -> None:
    proc = _python(
        """
        import atexit, sys
        from dnntune.distributed.env import exit_rank
        atexit.register(lambda: print("handler ran", flush=True))
        sys.stdout.write("written, not flushed ")
        sys.stderr.write("to stderr")
        exit_rank(3)
        print("never reached")
        """
    )
    assert proc.returncode == 3
    assert proc.stdout == "written, not flushed handler ran\n"  # one buffer, flushed once
    assert proc.stderr == "to stderr"


@pytest.mark.parametrize(
    ("argv", "code", "out"), [(["--version"], 0, "dnntune"), (["no-such-command"], 2, "")]
)
def test_the_cli_of_a_rank_that_joined_a_group_keeps_its_exit_code(
    argv: list[str], code: int, out: str
) -> None:
    """``main()`` hands the exit code to ``exit_rank`` once the process joined a group."""
    proc = _python(
        f"""
        import sys
        import dnntune.distributed.env as env
        env._used_a_group = True
        sys.argv = ["dnntune", *{argv!r}]
        from dnntune.cli.app import main
        main()
        """
    )
    assert proc.returncode == code, proc.stderr
    assert out in proc.stdout
