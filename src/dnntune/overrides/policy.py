"""``SelectionHeuristic::Config``: the heuristic policy that reuses what tuning left behind.

For each heuristic query (hipDNN's ``ConfigBuiltIn`` policy):

1. no candidates: decline;
2. the exact-match ranking cache (:mod:`dnntune.overrides.exact_cache`): a hit orders every
   candidate as measured and pre-empts the override file;
3. the override file named by ``DNNTUNE_HEUR_CONFIG_PATH``, looked at on every query: the
   variable is read each time, and the file is parsed once per state of the file
   (:mod:`dnntune.overrides.file_cache`: an edit, a replacement or a deletion is seen on the
   next query, so a file written a moment ago, or a changed variable, takes effect at once).
   Unset: decline. Unreadable or malformed: decline with a warning naming the file and the problem;
   the policy never raises;
4. the core node, then the other nodes, are matched against the entries (first match wins);
5. a matched engine that is not among the candidates: decline;
6. otherwise the matched engine moves first and the others keep their order.

The decision's ``matched`` dict says where the choice came from: ``source`` ("exact_cache" or
"override_file"), ``engine_id``, ``engine_name``, ``knob_settings`` (list of KnobSetting, typed,
from the entry's ``autotune_metadata.knobs``; empty for default-knob entries) and ``knobs``
(the same as a dict), plus ``path``, ``entry_index``, ``op``, ``node`` and
``autotune_metadata`` for the file, or ``hit``, ``key`` and ``order`` for the cache. Callers
that want the tuned knobs rebuild the plan with ``knob_settings``; the RFC itself applies no
knobs on load.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dnntune import settings
from dnntune.backend.engine import engine_name_or_id, register_plan_serializer
from dnntune.backend.heuristics import CONFIG_POLICY, HeuristicMode, PolicyDecision, register_policy
from dnntune.backend.registry import get_registry
from dnntune.errors import ConfigFileError, InvalidValueError
from dnntune.graph.signature import graph_key
from dnntune.overrides import exact_cache
from dnntune.overrides.batch import batch_free_graph_key
from dnntune.overrides.file_cache import load_file_cached
from dnntune.overrides.format import OverrideEntry, OverrideFile
from dnntune.overrides.match import Match, find_match, graph_queries, metadata_graph_key
from dnntune.overrides.plan_serialization import serialize_plan

if TYPE_CHECKING:
    from dnntune.backend.engine import Engine
    from dnntune.backend.handle import Handle
    from dnntune.backend.knobs import KnobSetting
    from dnntune.graph.ir import OpGraph

__all__ = ["ConfigPolicy", "entry_knobs", "install", "match_override_file"]

_log = logging.getLogger(__name__)
_PREFIX = "[Config]"
#: (file, problem) pairs already warned about: a file is looked at on every query (several per
#: graph), and one warning per file and problem per process is enough (DEBUG after that)
_REPORTED: set[tuple[str, str]] = set()


def _warn_once(path: str | Path, problem: str, message: str, *args: object) -> None:
    key = (str(path), problem)
    level = logging.DEBUG if key in _REPORTED else logging.WARNING
    _REPORTED.add(key)
    _log.log(level, message, *args)


def match_override_file(
    graph: OpGraph, path: str | Path | None = None
) -> tuple[Match, OverrideFile] | None:
    """The first entry of the override file that matches ``graph`` (file from the env if None).

    The file is parsed once per state of the file (:func:`load_file_cached`) and shared with
    later reads, so the caller gets its own copy of the matched entry (``match.entry``, also at
    ``match.index`` of the returned file's ``entries``) and of the ``entries`` list; the other
    entries are the shared ones: read them, do not change them.

    Raises:
        ConfigFileError: when the file cannot be read or parsed (on every call, until it is
            fixed).
    """
    p = Path(path) if path is not None else settings.heur_config_path()
    if p is None:
        return None
    config = load_file_cached(p)
    match = find_match(
        config, graph_queries(graph), graph_key(graph), lambda: batch_free_graph_key(graph)
    )
    if match is None:
        return None
    entry = copy.deepcopy(match.entry)  # one entry: tens of microseconds, not a parse
    entries = list(config.entries)
    entries[match.index] = entry
    return dataclasses.replace(match, entry=entry), dataclasses.replace(config, entries=entries)


def entry_knobs(entry: OverrideEntry, graph: OpGraph) -> list[KnobSetting]:
    """The knobs of ``entry`` that apply to ``graph``: all of them on the graph they were
    tuned and verified on, none on another graph that shares only its core node.

    An entry matches by its core node alone (op, criteria, tensor dims and strides), so it
    also matches a graph with another epilogue, scale or mask. Its engine is a fair choice
    there; its knobs are not: a knob can change what the plan computes (a 16-bit intermediate,
    TF32), and it was checked against the reference on one graph only. The writer records that
    graph's key (``autotune_metadata.graph_key``); on any other graph the engine runs with its
    default knobs, as the RFC, which applies no knobs on load, would. An entry without the key
    (written by hand) keeps its knobs: they were put there on purpose.
    """
    knobs = list(entry.knobs or [])
    tuned_on = metadata_graph_key(entry.metadata)
    if not knobs or tuned_on is None:
        return knobs
    mine = graph_key(graph)
    if tuned_on != mine:
        _log.info(
            "%s %s entry's knobs were verified on graph %s, not this one (%s); engine defaults",
            _PREFIX,
            entry.op,
            tuned_on,
            mine,
        )
        return []
    return knobs


class ConfigPolicy:
    """Exact-match cache first, then the ``DNNTUNE_HEUR_CONFIG_PATH`` override file."""

    name = CONFIG_POLICY

    def order(
        self, graph: OpGraph, handle: Handle, candidates: Sequence[Engine], mode: HeuristicMode
    ) -> PolicyDecision | None:
        if not candidates:
            return None
        try:
            decision = exact_cache.lookup(graph, handle, candidates)
        except Exception as exc:  # the cache fails soft: fall through to the file
            _log.warning(
                "%s exact-match cache unavailable: %s: %s", _PREFIX, type(exc).__name__, exc
            )
            decision = None
        if decision is not None:
            return decision
        return self._from_file(graph, candidates)

    def _from_file(self, graph: OpGraph, candidates: Sequence[Engine]) -> PolicyDecision | None:
        path = settings.heur_config_path()
        if path is None:
            _log.debug("%s DNNTUNE_HEUR_CONFIG_PATH unset; declining", _PREFIX)
            return None
        try:
            found = match_override_file(graph, path)
        except ConfigFileError as exc:
            _warn_once(
                path,
                str(exc),
                "%s DNNTUNE_HEUR_CONFIG_PATH file unusable: %s; it is ignored: %s",
                _PREFIX,
                exc,
                _unusable_hint(path),
            )
            return None
        except Exception as exc:  # e.g. a graph that cannot be queried; never break planning
            _log.warning(
                "%s cannot match %s against graph %r: %s: %s; declining",
                _PREFIX,
                path,
                graph.name,
                type(exc).__name__,
                exc,
            )
            return None
        if found is None:
            _log.info("%s %s: no entry matches graph %r; declining", _PREFIX, path, graph.name)
            return None
        match, _ = found
        entry = match.entry
        try:
            wanted = engine_name_or_id(entry.engine_name)
        except InvalidValueError as exc:
            _log.warning(
                "%s %s: engine_overrides[%d]: %s; declining", _PREFIX, path, match.index, exc
            )
            return None
        engine = next((e for e in candidates if e.id == wanted), None)
        if engine is None and _unknown_engine(wanted):
            _warn_unknown_engine(path, match.index, entry.engine_name)
            return None
        if engine is None:
            _log.info(
                "%s %s: engine_overrides[%d] names %s, which is not a candidate here "
                "(candidates: %s); declining",
                _PREFIX,
                path,
                match.index,
                entry.engine_name,
                ", ".join(e.name for e in candidates),
            )
            return None
        engines = [engine, *(e for e in candidates if e is not engine)]
        knob_settings = entry_knobs(entry, graph)
        _log.info(
            "%s %s: engine_overrides[%d] (%s) -> %s",
            _PREFIX,
            path,
            match.index,
            entry.op,
            engine.name,
        )
        return PolicyDecision(
            engines,
            CONFIG_POLICY,
            f"override file {path}: engine_overrides[{match.index}] ({entry.op}) -> {engine.name}",
            matched={
                "source": "override_file",
                "path": str(path),
                "entry_index": match.index,
                "op": entry.op,
                "node": match.query.node_name,
                "engine_id": engine.id,
                "engine_name": engine.name,
                "knob_settings": knob_settings,
                "knobs": {s.knob_id: s.value for s in knob_settings},
                "autotune_metadata": dict(entry.metadata or {}),
            },
        )


def _unusable_hint(path: Path) -> str:
    """What to try when the file ``DNNTUNE_HEUR_CONFIG_PATH`` names cannot be used (the
    warning says what is wrong; this, the way out). ``dnntune tune -o`` creates a missing file
    but refuses to append to an invalid one, so an invalid file gets a new name."""
    unset = "or unset DNNTUNE_HEUR_CONFIG_PATH"
    if path.is_dir():
        return (
            f"point the variable at a file (`dnntune tune GRAPH... -o {path / 'overrides.json'}` "
            f"writes one), {unset}"
        )
    if not path.exists():
        return f"fix the path, create the file with `dnntune tune GRAPH... -o {path}`, {unset}"
    if not os.access(path, os.R_OK):
        return f"make it readable (chmod u+r {path}), {unset}"
    return (
        "fix the file, or tune into a new one (`dnntune tune GRAPH... -o NEW.json`) and point "
        f"the variable at it, {unset}"
    )


def install() -> None:
    """Register the Config policy in the heuristic chain and the plan serializer behind
    ``Plan.serialize`` (called by ``import dnntune``)."""

    register_policy(ConfigPolicy())
    register_plan_serializer(serialize_plan)


_warned_unknown: set[tuple[str, str]] = set()


def _unknown_engine(engine_id: int) -> bool:
    """No installed provider has this engine, on any device: a misspelled name, most likely
    (an engine that exists but cannot run this graph here is an expected outcome)."""
    return get_registry().find(engine_id) is None


def _warn_unknown_engine(path: Path, index: int, name: str) -> None:
    """Once per file and name: the entry can never be used, and nothing else would say so."""
    if (str(path), name) in _warned_unknown:
        return
    _warned_unknown.add((str(path), name))
    known = ", ".join(sorted(e.name for e in get_registry().engines()))
    _log.warning(
        "%s %s: engine_overrides[%d] names engine %r, which no installed provider has "
        "(known: %s); the entry is ignored: check its spelling",
        _PREFIX,
        path,
        index,
        name,
        known,
    )
