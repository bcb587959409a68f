"""Plain-data forms of autotune results and graph reports, so ranks exchange data rather than
live objects."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from dnntune.autotune.confirm import Confirmation
from dnntune.backend.knobs import KnobSetting
from dnntune.rfc import AutotuneResult, AutotuneStrategy, TuneMode
from dnntune.workflows.tuning import GraphTuneReport

__all__ = [
    "confirmation_from_dict",
    "report_from_payload",
    "report_to_payload",
    "result_from_dict",
    "result_to_dict",
]

_ENUMS = {"mode_used": TuneMode, "strategy_used": AutotuneStrategy}


def result_to_dict(result: AutotuneResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif f.name == "knob_settings":
            value = [[s.knob_id, s.value] for s in value]
        elif isinstance(value, list):
            value = list(value)
        out[f.name] = value
    return out


def result_from_dict(data: dict[str, Any]) -> AutotuneResult:
    kwargs = dict(data)
    for name, enum_type in _ENUMS.items():
        if name in kwargs:
            kwargs[name] = enum_type(kwargs[name])
    kwargs["knob_settings"] = [KnobSetting(k, v) for k, v in kwargs.get("knob_settings", [])]
    known = {f.name for f in dataclasses.fields(AutotuneResult)}
    return AutotuneResult(**{k: v for k, v in kwargs.items() if k in known})


def _confirmation_to_dict(c: Confirmation | None) -> dict[str, Any] | None:
    return None if c is None else c.to_dict()


def confirmation_from_dict(data: dict[str, Any] | None) -> Confirmation | None:
    if data is None:
        return None
    known = {f.name for f in dataclasses.fields(Confirmation)}
    return Confirmation(**{k: v for k, v in data.items() if k in known})


def report_to_payload(
    index: int, report: GraphTuneReport, device_name: str | None = None
) -> dict[str, Any]:
    """Graph ``index``'s report as plain data; ``device_name``: the tuning rank's device."""
    return {
        "index": index,
        "graph_name": report.graph_name,
        "source": report.source,
        "graph_key": report.graph_key,
        "device": report.device,
        "results": [result_to_dict(r) for r in report.results],
        "heuristic_plan": report.heuristic_plan,
        "heuristic_error": report.heuristic_error,
        "heuristic_time_ms": report.heuristic_time_ms,
        "winner_retimed_ms": report.winner_retimed_ms,
        "tuning_time_ms": report.tuning_time_ms,
        "cost": dict(report.cost),
        "error": report.error,
        "confirmation": _confirmation_to_dict(report.confirmation),
        "write_winner": report.write_winner,
        #: the tuning rank's device, for the entry rank 0 writes (``autotune_metadata.device``)
        "device_name": device_name,
    }


def report_from_payload(data: dict[str, Any]) -> GraphTuneReport:
    """The report :func:`report_to_payload` made plain data."""
    return GraphTuneReport(
        graph_name=data["graph_name"],
        source=data["source"],
        graph_key=data["graph_key"],
        device=data["device"],
        results=[result_from_dict(r) for r in data["results"]],
        heuristic_plan=data["heuristic_plan"],
        heuristic_error=data["heuristic_error"],
        heuristic_time_ms=data["heuristic_time_ms"],
        winner_retimed_ms=data["winner_retimed_ms"],
        tuning_time_ms=data["tuning_time_ms"],
        cost=dict(data.get("cost") or {}),
        error=data["error"],
        confirmation=confirmation_from_dict(data.get("confirmation")),
        write_winner=data.get("write_winner", True),
    )
