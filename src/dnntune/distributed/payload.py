"""Plain-data forms of autotune results, so ranks exchange data rather than live objects."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from dnntune.backend.knobs import KnobSetting
from dnntune.rfc import AutotuneResult, AutotuneStrategy, TuneMode

__all__ = ["result_from_dict", "result_to_dict"]

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
