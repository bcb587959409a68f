"""Training records: one measured problem on one device, and the records file that holds them.

A :class:`Record` is (problem, device class, engine -> time): the default-configuration time of
every engine measured on that problem (``times_ms``), plus, where a tuned variant of an engine
was measured, its best knob setting and time (``configs``). Sources that keep only a winner or
an order (override files, the exact-match cache) give ``order_only`` records whose times are
nominal (1.0 for the first engine, +0.05 per place after it).

:func:`merge` turns records into one per (problem, device class): each engine's slowdown against
the fastest engine of its record, combined over records by geometric mean. Measured records
outrank order-only ones: when a problem has any measured record, its order-only records are
dropped.

The records file (``dnntune-heuristics-records``, version 1) is how a data set is kept and
shared: ``{"format", "format_version", "records": [{"problem", "device_class", "times_ms",
"configs", "order_only", "source"}]}``. ``dnntune heuristics train`` reads it like any other
source.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune._file_kinds import document_kind
from dnntune._json_keys import DuplicateKeyError, loads
from dnntune.backend.learned import Problem
from dnntune.errors import ConfigFileError, InvalidValueError
from dnntune.graph.json_numbers import finite_float
from dnntune.overrides.store import atomic_write_text

__all__ = [
    "NOMINAL_STEP",
    "RECORDS_FORMAT",
    "RECORDS_VERSION",
    "TIE_STEP",
    "MergedProblem",
    "Record",
    "merge",
    "order_record",
    "read_records_file",
    "write_records_file",
]

RECORDS_FORMAT = "dnntune-heuristics-records"
RECORDS_VERSION = 1
#: nominal slowdown per place in an order-only record (the winner is 1.0)
NOMINAL_STEP = 0.05
#: how much slower a measured record puts a plan that its tuner did not find faster than the
#: plan it chose, though the times said so (a tie, or a win not beyond noise): the order is
#: the tuner's, the gap none that anything measures (far below ``NEAR_BEST``'s 2 % and the
#: model's 3 % margin), and it survives the model file's six decimals
TIE_STEP = 1e-4


@dataclass
class Record:
    """One measured problem on one device (see the module docstring)."""

    problem: Problem
    device_class: str
    times_ms: dict[str, float]
    #: engine -> {"knobs": {knob_id: value}, "time_ms": t}: its best measured tuned variant
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    order_only: bool = False
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem.to_json(),
            "device_class": self.device_class,
            "times_ms": dict(sorted(self.times_ms.items())),
            "configs": {e: self.configs[e] for e in sorted(self.configs)},
            "order_only": self.order_only,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Record:
        if not isinstance(obj, Mapping):
            raise InvalidValueError(f"{where}: expected an object")
        problem = Problem.from_json(obj.get("problem"), f"{where}.problem")
        device = obj.get("device_class")
        if not isinstance(device, str) or not device:
            raise InvalidValueError(f"{where}.device_class: expected a name, got {device!r}")
        times = obj.get("times_ms")
        if not isinstance(times, Mapping):
            raise InvalidValueError(f"{where}.times_ms: expected an object")
        clean = {}
        for engine, t in times.items():
            ms = finite_float(t)  # infinity and huge integers too: training wrote no model
            if ms is None or not ms > 0:
                raise InvalidValueError(f"{where}.times_ms.{engine}: expected a finite time > 0")
            clean[str(engine)] = ms
        configs = obj.get("configs", {})
        if not isinstance(configs, Mapping):
            raise InvalidValueError(f"{where}.configs: expected an object")
        for engine, c in configs.items():  # one not an object was dropped without a word
            if not isinstance(c, Mapping):
                raise InvalidValueError(
                    f"{where}.configs.{engine}: expected an object (knobs and time), got {c!r}"
                )
        # bool("false") is True: a hand-written "order_only": "false" made a measured record
        # order-only (dropped beside any measured one), and "source": 5 became "5"
        order_only = obj.get("order_only", False)
        if not isinstance(order_only, bool):
            raise InvalidValueError(
                f"{where}.order_only: expected true or false, got {order_only!r}"
            )
        source = obj.get("source", "")
        if not isinstance(source, str):
            raise InvalidValueError(f"{where}.source: expected a string, got {source!r}")
        return cls(
            problem,
            device,
            clean,
            {str(e): dict(c) for e, c in configs.items()},
            order_only,
            source,
        )


def order_record(problem: Problem, device_class: str, order: Iterable[str], source: str) -> Record:
    """An order-only record: the engines fastest first, with nominal times."""
    times = {e: 1.0 + NOMINAL_STEP * i for i, e in enumerate(dict.fromkeys(order))}
    return Record(problem, device_class, times, order_only=True, source=source)


@dataclass
class MergedProblem:
    """One (problem, device class): engine slowdowns against the fastest (1.0)."""

    problem: Problem
    device_class: str
    ratios: dict[str, float]
    configs: dict[str, dict[str, Any]]
    order_only: bool
    records: int
    sources: list[str]

    @property
    def best(self) -> str:
        return min((r, e) for e, r in self.ratios.items())[1]


#: the slowest ratio to the fastest engine a record keeps, as a log (a million): times that
#: far apart (1e308 against 1e-3 ms) overflowed the merge and the model file (new-user audit,
#: session 56), and an engine a million times slower ranks last either way
_LOG_CAP = math.log(1e6)


def merge(records: Iterable[Record]) -> list[MergedProblem]:
    """One :class:`MergedProblem` per (problem, device class), in first-seen order."""
    buckets: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        if r.times_ms:
            buckets.setdefault((r.problem.key(), r.device_class), []).append(r)
    out = []
    for recs in buckets.values():
        measured = [r for r in recs if not r.order_only]
        use = measured or recs
        logs: dict[str, list[float]] = {}
        configs: dict[str, dict[str, Any]] = {}
        for r in use:
            best = math.log(min(r.times_ms.values()))
            for engine, t in r.times_ms.items():
                logs.setdefault(engine, []).append(min(math.log(t) - best, _LOG_CAP))
            for engine, c in r.configs.items():
                tuned = finite_float(c.get("time_ms"))
                if tuned is not None and tuned > 0:
                    ratio = math.exp(min(math.log(tuned) - best, _LOG_CAP))
                    if engine not in configs or ratio < configs[engine]["ratio"]:
                        configs[engine] = {"knobs": dict(c.get("knobs", {})), "ratio": ratio}
        ratios = {e: math.exp(sum(v) / len(v)) for e, v in logs.items()}
        low = min(ratios.values())
        ratios = {e: r / low for e, r in ratios.items()}
        configs = {e: {**c, "ratio": c["ratio"] / low} for e, c in configs.items()}
        out.append(
            MergedProblem(
                use[0].problem,
                use[0].device_class,
                ratios,
                configs,
                not measured,
                len(use),
                [r.source for r in use],
            )
        )
    return out


def read_records_file(path: str | Path) -> list[Record]:
    """Read a records file; raises ConfigFileError naming the file and the bad field."""
    p = Path(path)
    try:
        doc = loads(p.read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:  # json kept the last value (a hand edit), silently
        raise ConfigFileError(f"{p}: {exc}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigFileError(f"{p}: cannot read the records file: {exc}") from None
    except RecursionError:
        raise ConfigFileError(
            f"{p}: cannot read the records file: invalid JSON: nested too deeply"
        ) from None
    if not isinstance(doc, Mapping) or doc.get("format") != RECORDS_FORMAT:
        other = document_kind(doc)  # another dnntune file is named, as every reader names it
        if other is not None:
            raise ConfigFileError(f"{p}: {other.not_a(f'a {RECORDS_FORMAT} file')}")
        raise ConfigFileError(f"{p}: not a {RECORDS_FORMAT} file")
    if doc.get("format_version") != RECORDS_VERSION:
        raise ConfigFileError(
            f"{p}: format_version {doc.get('format_version')!r} is not supported (this dnntune "
            f"reads version {RECORDS_VERSION}); rewrite it with this version's tools"
        )
    raw = doc.get("records")
    if not isinstance(raw, list):
        raise ConfigFileError(f"{p}: records: expected a list")
    try:
        return [Record.from_json(r, f"records[{i}]") for i, r in enumerate(raw)]
    except InvalidValueError as exc:
        raise ConfigFileError(f"{p}: {exc}") from None


def write_records_file(records: Iterable[Record], path: str | Path, **meta: Any) -> Path:
    """Write records (``meta``: extra top-level keys, e.g. where they came from)."""
    p = Path(path)
    doc = {
        "format": RECORDS_FORMAT,
        "format_version": RECORDS_VERSION,
        **meta,
        "records": [r.to_json() for r in records],
    }
    atomic_write_text(p, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return p
