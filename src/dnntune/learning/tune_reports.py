"""Training records from ``dnntune tune --report`` reports: the winner and runner-up of each
graph, and the heuristic plan the winner was confirmed against, read as tuning decided
(:func:`as_decided`). The report names no GPU model, so a ``device_name`` must be given; an
entry tuned on a device that contradicts it is skipped (:func:`device_clash`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnntune.backend.learned import device_class
from dnntune.backend.learned import problem_of as graph_problem
from dnntune.learning.graph_index import GraphIndex
from dnntune.learning.records import TIE_STEP, Record
from dnntune.learning.source_fields import Collected, field_of, knobs_of, ms_of, name_of
from dnntune.measure.contention import BUSY_WAIT_SHARE

__all__ = ["as_decided", "device_clash", "read_tune_report"]


def read_tune_report(
    doc: Sequence[Any], path: Path, index: GraphIndex, out: Collected, device_name: str | None
) -> int:
    if not device_name:
        out.notes.append(f"{path}: a tune report names no GPU model; pass --device-name")
        return 0
    n = 0
    for i, r in enumerate(doc):
        if not isinstance(r, Mapping) or not r.get("ok"):
            continue
        clash = device_clash(r.get("device"), device_name)
        if clash:
            out.notes.append(f"{path}: [{i}]: {clash}; skipped")
            continue
        graph = index.resolve(str(r.get("source") or ""), path.parent)
        if graph is None:
            out.notes.append(f"{path}: [{i}]: graph {r.get('source')!r} not found")
            continue
        plans: dict[str, _Plan] = {}
        for part in ("winner", "runner_up"):
            res = r.get(part)
            if not isinstance(res, Mapping):
                continue
            engine, t = name_of(res.get("engine_name")), ms_of(res.get("median_time_ms"))
            if engine is None:
                out.notes.append(f"{path}: [{i}]: {part}'s engine_name is malformed; skipped")
                continue
            if t is not None:
                name = name_of(res.get("plan")) or engine
                plans.setdefault(part, _Plan(name, engine, knobs_of(res.get("knobs")), t))
        if not plans:
            continue
        why = as_decided(r, plans)
        if why:
            out.notes.append(f"{path}: [{i}]: {why}; skipped")
            continue
        times: dict[str, float] = {}
        configs: dict[str, dict[str, Any]] = {}
        for plan in sorted(plans.values(), key=lambda p: p.time_ms):
            if plan.engine in times:
                continue  # an engine's time is its fastest plan's
            times[plan.engine] = plan.time_ms
            if plan.knobs:
                configs[plan.engine] = {"knobs": plan.knobs, "time_ms": plan.time_ms}
        device = device_class(device_name)
        problem = graph_problem(graph)
        out.records.append(Record(problem, device, times, configs, False, f"{path}[{i}]"))
        n += 1
    return n


@dataclass
class _Plan:
    """One plan of a tune report entry and the time the record gives it."""

    name: str
    engine: str
    knobs: dict[str, Any]
    time_ms: float


def as_decided(entry: Mapping[str, Any], plans: dict[str, _Plan]) -> str:
    """Make ``plans`` (the report's ``winner`` and ``runner_up``, keyed so; the heuristic plan
    is added under ``default``) say what the tuner decided; returns why the entry cannot
    ("" when it can).

    The sweep's medians alone are not the decision. After the sweep, ``dnntune tune``
    confirms its winner against the heuristic plan in interleaved rounds (``confirmation``)
    and keeps the heuristic plan unless the winner is faster beyond noise
    (``kept_heuristic``): the plan written to the override file is then the heuristic one,
    which a lucky sweep median may show as the slower. So:

    * the confirmation's paired speedup gives the heuristic plan's time against the
      challenger it timed, scaling the sweep's other times to the same clock (the heuristic
      plan is added when the report's two plans do not include it);
    * the plan the tuner chose (the kept heuristic plan, else the winner) is the fastest: a
      plan timed at least as fast as it is a tie, recorded :data:`TIE_STEP` slower;
    * timings taken while the timing threads waited for a CPU core
      :data:`~dnntune.measure.contention.BUSY_WAIT_SHARE` of the time or more are not trusted
      by the tuner, nor here: the entry is skipped (:func:`_busy`).
    """
    conf = entry.get("confirmation")
    conf = conf if isinstance(conf, Mapping) else {}
    busy = _busy(entry, conf)
    if busy:
        return f"timed while the CPU was busy ({busy}), so tuning did not trust the timings"
    kept = entry.get("kept_heuristic") is True or conf.get("kept_default") is True
    challenger, default = name_of(conf.get("winner")), name_of(conf.get("default"))
    speedup, timed = ms_of(conf.get("speedup")), ms_of(conf.get("winner_ms"))
    if kept and default is None:
        return "tuning kept the heuristic plan, but the report does not name it"
    by_name = {p.name: p for p in plans.values()}
    if challenger in by_name and default and speedup is not None and timed is not None:
        # the paired rounds decided: their clock for the plans they timed, the sweep's
        # ratios for the rest
        scale = timed / by_name[challenger].time_ms
        for plan in plans.values():
            plan.time_ms *= scale
        if default in by_name:
            by_name[default].time_ms = timed * speedup
        else:
            plans["default"] = _Plan(default, default.split("[", 1)[0], {}, timed * speedup)
            by_name[default] = plans["default"]
    chosen = by_name.get(default or "") if kept else plans.get("winner")
    if chosen is None:
        if kept:
            return (
                f"tuning kept the heuristic plan {default}, which the report gives no time "
                "against the others"
            )
        return ""  # no winner: nothing was chosen among what is left
    for plan in plans.values():
        if plan is not chosen and plan.time_ms <= chosen.time_ms:
            plan.time_ms = chosen.time_ms * (1.0 + TIE_STEP)
    return ""


def _busy(entry: Mapping[str, Any], conf: Mapping[str, Any]) -> str:
    """How the entry's timings were taken on an oversubscribed CPU ("" if they were not): the
    confirmation's rounds (``confirmation.cpu_wait_share``), the sweep's
    (``cost.timing_cpu_wait_share``), or the report's own verdict on them
    (``timed_while_busy``)."""
    where = (
        ("the confirmation", field_of(conf, "cpu_wait_share")),
        ("the sweep", field_of(entry.get("cost"), "timing_cpu_wait_share")),
    )
    for what, share in where:
        if ms_of(share) is not None and share >= BUSY_WAIT_SHARE:
            return f"its timing threads waited for a core {100.0 * share:.0f}% of {what}"
    if entry.get("timed_while_busy") is True:
        return "the report says its timings were taken on a busy CPU"
    return ""


#: words of a device class (:func:`device_class`) that name a GPU, and a CPU
_GPU_WORDS = ("nvidia", "geforce", "tesla", "quadro", "radeon", "instinct", "gpu")
_CPU_WORDS = ("cpu", "epyc", "xeon", "ryzen", "threadripper")


def device_clash(device: Any, device_name: str) -> str:
    """Why a tune report's entry, tuned on ``device`` ("cpu", "cuda:0"), cannot be the
    ``--device-name`` given ("" when nothing contradicts it): CPU timings labelled as a GPU
    (or the reverse) would teach the model the wrong device's ranking."""
    if not isinstance(device, str) or not device:
        return ""
    kind = device.split(":")[0].lower()
    named = device_class(device_name)
    gpu = any(w in named for w in _GPU_WORDS)
    cpu = any(w in named for w in _CPU_WORDS)
    if (kind == "cpu" and gpu) or (kind == "cuda" and cpu):
        return (
            f"tuned on {device!r}, which cannot be --device-name {device_name!r}; pass the "
            "name of the device it was tuned on (one --device-name per train: give reports "
            "of other devices to another train)"
        )
    return ""
