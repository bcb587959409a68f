"""Training records from ``dnntune bench`` results (``schema_version`` 1, docs/bench.md): per
graph, each engine's out-of-the-box row (``kernel.median_ms``, rows that succeeded and did not
fail validation), and with ``--oracle`` the tuned plan's knobs and median as that engine's best
config. Device: ``environment.device.name``. A row timed while its timing threads waited for
a CPU core :data:`~dnntune.measure.contention.BUSY_WAIT_SHARE` of the time or more
(``timing.cpu_wait_share``, which bench flags "CPU busy") is skipped, as tune reports' entries
timed so are: the model would learn the load, not the engines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dnntune.backend.learned import device_class
from dnntune.backend.learned import problem_of as graph_problem
from dnntune.learning.graph_index import GraphIndex
from dnntune.learning.records import Record
from dnntune.learning.source_fields import Collected, field_of, knobs_of, ms_of, name_of
from dnntune.measure.contention import BUSY_WAIT_SHARE

__all__ = ["read_bench"]


def read_bench(doc: Mapping[str, Any], path: Path, index: GraphIndex, out: Collected) -> int:
    name = name_of(field_of(field_of(doc.get("environment"), "device"), "name"))
    if name is None:
        out.notes.append(f"{path}: no environment.device.name; skipped")
        return 0
    n = 0
    for i, g in enumerate(doc.get("graphs") or []):
        if not isinstance(g, Mapping) or g.get("status") != "ok":
            continue
        graph = index.resolve(str(g.get("graph_path") or ""), path.parent)
        if graph is None:
            out.notes.append(f"{path}: graphs[{i}]: graph {g.get('graph_path')!r} not found")
            continue
        times: dict[str, float] = {}
        configs: dict[str, dict[str, Any]] = {}
        busy = 0
        for row in g.get("results") or []:
            if not isinstance(row, Mapping) or row.get("provider", "dnntune") != "dnntune":
                continue
            if row.get("status") not in ("success", "ok"):
                continue
            if row.get("verdict") not in ("passed", "unchecked"):
                continue
            engine, kernel = name_of(field_of(row.get("engine"), "name")), row.get("kernel")
            if engine is None or not isinstance(kernel, Mapping | None):
                out.notes.append(
                    f"{path}: graphs[{i}]: a result row whose engine or kernel is malformed; "
                    "row skipped"
                )
                continue
            t = ms_of(field_of(kernel, "median_ms"))
            if t is None:
                continue
            share = ms_of(field_of(row.get("timing"), "cpu_wait_share"))
            if share is not None and share >= BUSY_WAIT_SHARE:
                busy += 1
                continue
            times[engine] = min(t, times.get(engine, math.inf))
            tuned = ms_of(field_of(row.get("oracle_delta"), "tuned_median_ms"))
            oracle = row.get("oracle")
            if tuned is not None and isinstance(oracle, Mapping):
                configs[engine] = {"knobs": knobs_of(oracle.get("knob_settings")), "time_ms": tuned}
        if busy:
            out.notes.append(
                f"{path}: graphs[{i}]: {busy} row(s) timed while the CPU was busy (their timing "
                f"threads waited for a core {BUSY_WAIT_SHARE:.0%} of the time or more); skipped"
            )
        if times:
            out.records.append(
                Record(
                    graph_problem(graph),
                    device_class(str(name)),
                    times,
                    configs,
                    False,
                    f"{path}#graphs[{i}]",
                )
            )
            n += 1
    return n
