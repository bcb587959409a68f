"""Where ``dnntune heuristics train`` writes: its outputs are checked before any work.

Every output is its own file, none is an input (or a file read from a folder given), each can
be written, and none replaces a file of another kind (an override file, a graph, results).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from dnntune.backend.learned import FORMAT as MODEL_FORMAT
from dnntune.cli._output import refuse_other_kind
from dnntune.errors import DnnTuneError
from dnntune.learning.evaluation import EVALUATION_FORMAT
from dnntune.learning.records import RECORDS_FORMAT
from dnntune.overrides.store import check_writable, write_target

__all__ = ["check_not_read", "check_outputs"]


#: the file name each output option's "is a directory" hint suggests
_EXAMPLE_NAME = {
    "-o": "heuristics_model.json",
    "--records-out": "records.json",
    "--json": "evaluation.json",
}


def _hint(option: str) -> str:
    """How a usage error names an output option (as ``dnntune tune`` names its ``-o``)."""
    return "'-o' / '--output'" if option == "-o" else option


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once resolved (links followed),
    or one existing file under two names (a hard link)."""
    a, b = a.expanduser(), b.expanduser()
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):  # a loop of links: check_writable names it
        pass
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def check_outputs(outputs: Sequence[tuple[str, Path | None]], inputs: Sequence[Path]) -> None:
    """Before any work: every output is its own file, none is an input, each can be written.

    Raises:
        typer.BadParameter: naming the option, the path and what to do instead (exit 2).
    """
    given = [(option, path) for option, path in outputs if path is not None]
    for i, (option, path) in enumerate(given):
        for other_option, other in given[:i]:
            if _same_file(path, other):
                raise typer.BadParameter(
                    f"{path} is also the {other_option} file; give each output its own name",
                    param_hint=_hint(option),
                )
        for source in inputs:
            if _same_file(path, source):
                raise typer.BadParameter(
                    f"{path} is one of the inputs ({source}); writing it would replace what "
                    "train reads: write it elsewhere",
                    param_hint=_hint(option),
                )
    for option, path in given:
        try:  # an output that cannot be written is a usage error before any work, as in tune
            target = write_target(path.expanduser())
            if target.is_dir():
                raise typer.BadParameter(
                    f"{target}: is a directory; name a file in it, e.g. "
                    f"{target / _EXAMPLE_NAME[option]}",
                    param_hint=_hint(option),
                )
            check_writable(target)
        except DnnTuneError as exc:
            raise typer.BadParameter(str(exc), param_hint=_hint(option)) from None
        # -o's tuned entries were lost when a message's advice was followed (session 15);
        # --json and --records-out replaced such files silently until session 18
        what, ours = _KINDS[option]
        refuse_other_kind(path, ours, option, what, _EXAMPLE_NAME[option], _hint(option))


#: what each output option writes: a name for it, and whether a document is one of its own
_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "-o": ("a dnntune heuristics model", lambda doc: _format_of(doc) == MODEL_FORMAT),
    "--records-out": ("a dnntune records file", lambda doc: _format_of(doc) == RECORDS_FORMAT),
    "--json": ("a train --json evaluation", lambda doc: _is_evaluation(doc)),
}


def _format_of(doc: Any) -> Any:
    return doc.get("format") if isinstance(doc, dict) else None


def _is_evaluation(doc: Any) -> bool:
    """A ``train --json`` file: marked (since session 18), or of its shape before that."""
    if _format_of(doc) == EVALUATION_FORMAT:
        return True
    return isinstance(doc, dict) and isinstance(doc.get("cases"), list) and "method" in doc


def check_not_read(outputs: Sequence[tuple[str, Path | None]], read: Sequence[str]) -> None:
    """After reading, before writing: no output is a file records were read from (a file in a
    folder given as input: :func:`check_outputs` sees only the paths given)."""
    given = [(option, path) for option, path in outputs if path is not None]
    for option, path in given:
        for source in read:
            if _same_file(path, Path(source)):
                raise typer.BadParameter(
                    f"{path} is training data read from a folder given; writing it would "
                    "replace it: write it elsewhere",
                    param_hint=_hint(option),
                )
