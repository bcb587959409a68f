"""``dnntune tune``'s last line: where the results are (interrupted before or after a winner
was written, or how to reuse them), and the output file's state that line compares."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from dnntune.cli._output import escape
from dnntune.workflows.tuning import GraphTuneReport

__all__ = ["file_state", "print_outcome"]


def file_state(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or written: (inode, size, mtime); None if absent."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def print_outcome(
    console: Console, reports: list[GraphTuneReport], output: Path, interrupted: bool, changed: bool
) -> None:
    """Where the results are: interrupted before or after writing, or how to reuse them.
    ``changed``: the output file is not as it was when the run began."""
    tuned = [r for r in reports if r.ok]
    written = [r for r in tuned if r.written_to]
    if interrupted and not any(r.written_to for r in reports):
        # never name a file as holding results it lacks, nor as unchanged where an entry
        # landed just before the interrupt (its report never reached the table)
        state = "is unchanged" if output.exists() else "was not created"
        if changed:
            state = "has changed since the run began (a graph may have finished as it was "
            state += "interrupted, or another process wrote it): check its entries"
        when = "before any graph was tuned" if not tuned else "before any winner was written"
        console.print(escape(f"interrupted {when}; {output} {state}"), soft_wrap=True)
    elif interrupted:
        console.print(
            escape(f"interrupted: {_tuned_so_far(len(tuned))} in {output}"),
            soft_wrap=True,
        )
    elif written:
        console.print(
            escape(f"reuse it: DNNTUNE_HEUR_CONFIG_PATH={output} dnntune run -g <graphs>"),
            soft_wrap=True,
        )
    else:
        # every graph failed, or no winner was worth writing: say what became of the file
        # (--overwrite clears it only as the first winner is written, so its old entries stand)
        state = "is unchanged" if output.exists() else "was not created"
        if changed:
            state = "has changed since the run began (another process wrote it)"
        console.print(escape(f"no winner was written: {output} {state}"), soft_wrap=True)


def _tuned_so_far(n: int) -> str:
    return "the graph tuned so far is" if n == 1 else f"the {n} graphs tuned so far are"
