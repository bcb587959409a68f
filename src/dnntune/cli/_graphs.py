"""Graph arguments: ``-g PATH`` accepts files, directories (their ``*.json``, sorted) and globs.

Every command that takes graphs expands them here, so ``validate``, ``run`` and ``tune`` agree
on what ``-g examples/graphs`` means. A path that names nothing is a usage error (exit 2)
raised before any work starts; a file that names a bad graph is a per-graph failure.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from dnntune._file_kinds import GRAPH, document_kind
from dnntune.cli._output import quiet, warn
from dnntune.errors import DnnTuneError, GraphFormatError, InvalidValueError
from dnntune.frontend import Graph
from dnntune.graph.json_format import (
    graph_from_dict,
    graph_problems,
    parse_graph_text,
    read_graph_text,
)
from dnntune.graph.json_unknown import unknown_fields, unknown_fields_note
from dnntune.overrides.store import check_writable

__all__ = [
    "DEFAULT_MAX_INPUT_GB",
    "GRAPH_ARGS_HELP",
    "GRAPH_OPTION_HELP",
    "GraphArgs",
    "GraphLoad",
    "GraphOption",
    "MaxInputGbOption",
    "Parsed",
    "check_output_option",
    "collect_graph_args",
    "expand_graph_paths",
    "finite",
    "resolved",
    "load_graph",
    "max_input_bytes",
    "other_file_kind",
]

GRAPH_OPTION_HELP = (
    "Graph JSON file, directory (its *.json files, sorted) or glob. Repeat -g, or list more "
    "paths after it."
)
GRAPH_ARGS_HELP = "More graph paths (so `-g a.json b.json dir/` works)."

#: the ``-g/--graph`` option and the trailing PATH arguments of every command that takes graphs
GraphOption = Annotated[
    list[str] | None,
    typer.Option("-g", "--graph", help=GRAPH_OPTION_HELP, show_default=False),
]
GraphArgs = Annotated[
    list[str] | None,
    typer.Argument(help=GRAPH_ARGS_HELP, show_default=False, metavar="PATH"),
]

#: the ``--max-input-gb`` default of the commands that make inputs (run, tune, bench): 8 GiB,
#: :data:`dnntune.reference.DEFAULT_MAX_PACK_BYTES`
DEFAULT_MAX_INPUT_GB = 8.0


def resolved(path: Path) -> Path:
    """``path`` with its links followed, for comparing two paths; as given (made absolute)
    when it cannot be resolved (a loop of links, which the writability check then names)."""
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop on Python 3.11
        return path.expanduser().absolute()


def check_output_option(
    path: Path, graphs: Sequence[Path], hint: str, what: str, example: str
) -> None:
    """Before any work: an output option's file is not one of the ``graphs`` read, and can be
    written. Raises typer.BadParameter (exit 2) naming ``hint`` (``'--json'``) and saying
    where to write ``what`` ("the results") instead; ``example`` is the file name a "name a
    file in it" hint suggests for a directory ("run_results.json")."""
    if resolved(path) in {resolved(p) for p in graphs}:
        raise typer.BadParameter(
            f"{path} is one of the graphs given; write {what} elsewhere", param_hint=hint
        )
    try:
        check_writable(path, example=example)
    except DnnTuneError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def finite(value: float | None) -> float | None:
    """An option callback: a float option must be a finite number (click's ranges pass inf
    and NaN, which then overflowed deep inside: ``int(inf * 2**30)``)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def finite_non_negative(value: float | None) -> float | None:
    """:func:`finite`, and at least 0 (checked here, not by click's range: a range said NaN
    "should be greater than or equal to 0")."""
    value = finite(value)
    if value is not None and value < 0:
        raise typer.BadParameter(f"must be 0 or more, got {value}")
    return value


#: ``--max-input-gb``: what a graph's variant pack may cost before it is allocated
MaxInputGbOption = Annotated[
    float,
    typer.Option(
        "--max-input-gb",
        callback=finite_non_negative,
        help="Refuse a graph whose input and output buffers need more GiB than this (padded "
        "strides included), before allocating them; 0: no limit.",
    ),
]

_log = logging.getLogger(__name__)


def max_input_bytes(max_input_gb: float) -> int | None:
    """``--max-input-gb`` in bytes; None for 0 (no limit)."""
    return int(max_input_gb * (1 << 30)) if max_input_gb > 0 else None


#: the parsed documents of graph files, by path: what :func:`expand_graph_paths` parsed to tell
#: graphs from dnntune's other files, for :func:`load_graph` to take (each once) instead of
#: parsing the file again. A value is the document, or the DnnTuneError that reading it raised.
Parsed = dict[Path, Any]


_GLOB_CHARS = frozenset("*?[")
_NOT_PARSED = object()


def _is_glob(text: str) -> bool:
    return any(c in _GLOB_CHARS for c in text)


def expand_graph_paths(paths: Iterable[str | Path], parsed: Parsed | None = None) -> list[Path]:
    """Expand files, directories and globs into graph files, each once, in the order given.

    A folder or a glob leaves out the other JSON files dnntune writes (:func:`other_file_kind`:
    an override file, tune reports, run and bench results, a heuristics model), so that
    ``tune -g graphs -o graphs/overrides.json`` can run again and ``run -g graphs`` reads the
    graphs beside the file (new-user audit, session 55: the second tune refused its own
    override file as "one of the graphs to tune", and run failed on it). A file named
    itself is read as a graph, and such a file is said to be no graph. The documents of the
    graphs a folder or a glob gave, parsed for that, go to ``parsed`` (when given) for
    :func:`load_graph` to take.

    Raises:
        FileNotFoundError: for a path that does not exist, a glob that matches nothing, or a
            directory without ``*.json`` graph files (the message names it).
    """
    out: list[Path] = []
    seen: set[Path] = set()

    def graphs_among(files: list[Path]) -> list[tuple[Path, Any]]:
        """The graph files among ``files``, each with its parsed document."""
        kept = []
        for f in files:
            doc = _parse(f)
            other = _other_kind(doc)
            if other is None:
                kept.append((f, doc))
            else:
                _log.info("%s: left out, %s", f, other)
        return kept

    def add(p: Path, doc: Any = _NOT_PARSED) -> None:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            out.append(p)
            if parsed is not None and doc is not _NOT_PARSED:
                parsed[p] = doc

    for raw in paths:
        text = str(raw)
        if not text.strip():  # Path("") is ".": an unset variable would read the working folder
            raise FileNotFoundError(
                "an empty graph path (an unset variable?); name a graph file, a folder or a glob"
            )
        path = Path(text).expanduser()
        try:  # pathlib answers "no" only for a missing file: not for a name too long, EACCES
            is_dir, is_file, exists = path.is_dir(), path.is_file(), path.exists()
        except OSError as exc:
            raise FileNotFoundError(f"{text}: cannot look it up: {exc.strerror or exc}") from None
        if is_dir:
            entries = sorted(path.glob("*.json"))
            for f in entries:
                if f.is_symlink() and not f.exists():  # dropped without a word before
                    _log.warning("%s: left out, %s", f, _broken_link(f))
            files = graphs_among([f for f in entries if f.is_file()])
            if not files:
                raise FileNotFoundError(f"{text}: directory has no *.json graph files")
            for f, doc in files:
                add(f, doc)
        elif is_file:
            add(path)
        elif _is_glob(text):
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            matched = [m for m in matches if m.is_file()]
            if not matched:
                raise FileNotFoundError(f"{text}: no file matches this pattern")
            files = graphs_among(matched)
            if not files:
                raise FileNotFoundError(
                    f"{text}: the files this pattern matches are dnntune's own (override, "
                    "report or results files), no graph"
                )
            for f, doc in files:
                add(f, doc)
        elif exists:  # /dev/null, a fifo: there, but not a graph file
            raise FileNotFoundError(f"{text}: not a regular file or a directory")
        elif path.is_symlink():  # a link whose target is missing, or a loop of links
            raise FileNotFoundError(f"{text}: {_broken_link(path)}")
        else:
            raise FileNotFoundError(f"{text}: no such file or directory")
    return out


def _broken_link(path: Path) -> str:
    """Why the symbolic link ``path`` leads to no file: a loop, or a target that is missing
    (both read "no such file or directory" before; new-user audit, session 56)."""
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python before 3.13 raises this for a loop
        loop = True
    except OSError as exc:
        loop = exc.errno == errno.ELOOP
    else:
        loop = False
    if loop:
        return "a symbolic link in a loop (it leads back to itself); point it at a graph file"
    return f"a symbolic link to {os.readlink(path)}, which does not exist"


def collect_graph_args(
    option_paths: Sequence[str] | None,
    extra_paths: Sequence[str] | None,
    parsed: Parsed | None = None,
) -> list[Path]:
    """Merge ``-g`` values and trailing positional paths and expand them (typer callers);
    ``parsed`` as :func:`expand_graph_paths` fills it.

    Raises:
        typer.BadParameter: exit code 2, when nothing was given or a path names nothing.
    """
    given = [*(option_paths or []), *(extra_paths or [])]
    if not given:
        raise typer.BadParameter("give at least one graph path", param_hint="'-g' / '--graph'")
    try:
        return expand_graph_paths(given, parsed)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="'-g' / '--graph'") from None


@dataclass
class GraphLoad:
    """A graph file after loading and validation: ``graph`` or ``error`` (with ``json_path``)."""

    path: Path
    graph: Graph | None = None
    error: str = ""
    json_path: str = ""
    #: every problem of an invalid file (``json.path: problem`` each; the first is ``error``),
    #: when :func:`load_graph` was asked for all of them
    problems: list[str] = field(default_factory=list)
    #: the file's keys dnntune keeps but does not read (``json.path: unknown field ...``
    #: each), whether or not it loaded: a misspelled key reads as its default
    unknown: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.graph is not None

    def describe_error(self) -> str:
        """``path: json.path: problem``, the one line the CLI prints for a bad graph."""
        return f"{self.path}: {self.error}"


def _strip_path(message: str, path: Path) -> str:
    """The loader may prefix or suffix the source file in a message; the CLI names it once."""
    return message.replace(f"{path}: ", "", 1).replace(f" (in {path})", "")


def _parse(path: Path) -> Any:
    """The parsed document of the file ``path``, or the DnnTuneError reading it raised (a file
    that cannot be read, or is no JSON: GraphFormatError naming the file)."""
    try:
        text = read_graph_text(path)
    except DnnTuneError as exc:
        return exc
    try:
        return parse_graph_text(text, str(path))
    except GraphFormatError as exc:
        # a key named twice is refused in a graph; another dnntune file so damaged (an
        # override file a hand edit left with two "version" lines) is still that file, which a
        # folder of graphs leaves out, as it leaves out the sound ones
        exc.other_kind = _kind_of(_json_or_none(text))  # type: ignore[attr-defined]
        return exc
    except DnnTuneError as exc:
        return exc


def _json_or_none(text: str) -> Any:
    """``text`` parsed as Python's json does (a repeated key: the last value), None if it is
    no JSON: only to tell which kind of file it is."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _kind_of(doc: Any) -> str | None:
    kind = document_kind(doc)
    return None if kind is None or kind is GRAPH else kind.not_a("a graph")


def _other_kind(doc: Any) -> str | None:
    """:func:`other_file_kind` of a parsed document (or of a parse's error: the kind of the
    file its text is, where a plain parse tells it)."""
    if isinstance(doc, DnnTuneError):
        return getattr(doc, "other_kind", None)
    return _kind_of(doc)


def other_file_kind(path: Path) -> str | None:
    """What ``path`` is, when it is another dnntune JSON file (an override file, a heuristics
    model, bench results, a tune report, run results) rather than a graph: a graph's problems
    say little about it. ``dnntune bench`` names such a file with the same words
    (:func:`dnntune._file_kinds.document_kind`)."""
    return _other_kind(_parse(path))


def load_graph(
    path: Path,
    validate: bool = True,
    every_problem: bool = False,
    warn_unknown: bool = True,
    parsed: Parsed | None = None,
) -> GraphLoad:
    """Load (and validate) one graph file; expected problems become ``GraphLoad.error``.

    The file is read and parsed once (before, loading it, listing its unknown keys, naming
    another dnntune file and listing every problem each read and parsed it again); a document
    :func:`expand_graph_paths` put in ``parsed`` is taken from there (and removed) instead.
    With ``every_problem``, an invalid file also lists all its problems in
    ``GraphLoad.problems`` (:func:`dnntune.graph.json_format.graph_problems`), not only the first.
    Keys the file holds that dnntune does not read are listed in ``GraphLoad.unknown`` and,
    with ``warn_unknown`` (``run``, ``tune``, ``engines``: the graph is used as read), said
    in one warning on stderr (not under ``-q``, nor on a torchrun job's other ranks, which
    ``-q`` quiets): such a key is kept in the file (hipDNN's own keys, a newer dnntune's) but
    ignored, and a misspelled one silently meant the default (``casual_mask``).
    """
    doc = parsed.pop(path) if parsed is not None and path in parsed else _parse(path)
    if isinstance(doc, GraphFormatError):  # not UTF-8 text, no JSON, a key named twice
        message = _strip_path(str(doc), path)
        return GraphLoad(path, error=message, json_path=doc.json_path, problems=[message])
    if isinstance(doc, DnnTuneError):  # "cannot read graph file F: ...", F inside: kept
        return GraphLoad(path, error=str(doc), problems=[str(doc)])
    unknown = [str(u) for u in unknown_fields(doc)]  # before the graph holds the document
    loaded = _load_graph(path, doc, validate, every_problem)
    if not loaded.ok:
        other = _other_kind(doc)
        if other is not None:  # "name: required field missing" says little about such a file
            return GraphLoad(path, error=other, problems=[other])
    loaded.unknown = unknown
    if unknown and warn_unknown and not quiet():
        warn(unknown_fields_note(path, unknown))
    return loaded


def _load_graph(path: Path, doc: Any, validate: bool, every_problem: bool) -> GraphLoad:
    """The graph of the parsed document ``doc`` of ``path``, or its problems."""
    try:
        graph = graph_from_dict(doc, Graph, validate=validate)
    except (GraphFormatError, InvalidValueError) as exc:
        if not isinstance(exc, GraphFormatError):
            return GraphLoad(path, error=str(exc), problems=[str(exc)])
        message = _strip_path(str(exc), path)
        problems = [message]
        if every_problem and validate:
            found = [_strip_path(str(p), path) for p in graph_problems(doc, Graph)]
            problems += [p for p in found if p != message]
        return GraphLoad(path, error=message, json_path=exc.json_path, problems=problems)
    except Exception as exc:  # a loader bug must not stop the other graphs
        _log.debug("loading %s failed", path, exc_info=True)
        message = f"internal error while loading: {type(exc).__name__}: {exc}"
        return GraphLoad(path, error=message, problems=[message])
    return GraphLoad(path, graph=graph)
