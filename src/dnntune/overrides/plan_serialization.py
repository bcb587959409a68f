"""Plan serialization: the RFC's mechanism for full restoration of a winning plan.

The override file is a hint (which engine); a serialized plan is the whole choice: engine,
every knob with its type, the workspace size and the provider's plan metadata, bound to the
graph key and the device it was tuned for. It is JSON (never pickle), so it can be stored,
diffed and shipped. Deserializing looks the engine up in the registry and compiles it again
with the same knobs on this handle; it refuses a different graph or device with an error that
says which, since a plan tuned for another problem or GPU is not the plan that was measured,
and a plan the graph's deselect criteria bar (an engine deselected, a workspace over the limit),
as the plan-building paths do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dnntune._version import __version__
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.errors import ConfigFileError, InvalidValueError, NotSupportedError
from dnntune.graph.signature import graph_key
from dnntune.overrides.format import knob_from_json, knob_to_json

if TYPE_CHECKING:
    from dnntune.backend.engine import Plan
    from dnntune.backend.handle import Handle
    from dnntune.backend.plans import DeselectCriteria
    from dnntune.graph.ir import OpGraph

__all__ = ["PLAN_FORMAT", "PLAN_FORMAT_VERSION", "deserialize_plan", "serialize_plan"]

_log = logging.getLogger(__name__)

PLAN_FORMAT = "dnntune-plan"
PLAN_FORMAT_VERSION = 1

_AGAIN = "serialize the plan again (Graph.serialize_plan())"


def _json_safe(value: Any) -> Any:
    """Plan metadata as JSON: containers kept, anything else that JSON lacks becomes its str."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def serialize_plan(plan: Plan, graph: OpGraph, handle: Handle) -> str:
    """The plan as a JSON document (a string).

    Fields: ``format``, ``format_version``, ``engine_name``, ``engine_id``, ``knob_settings``
    (``[{"knob_id", "type", "value"}]``, every knob of the plan), ``workspace_size``,
    ``graph_key``, ``device_signature``, ``device_key``, ``dnntune_version`` and ``metadata``
    (the provider's plan metadata; values JSON cannot hold are written as strings).

    Raises BadStateError when the graph changed since its plan was built (a frontend
    ``Graph``'s ``check_plan_current``): the key would name a graph the plan does not compute.
    """
    check = getattr(graph, "check_plan_current", None)
    if check is not None:
        check("serialize()")
    doc = {
        "format": PLAN_FORMAT,
        "format_version": PLAN_FORMAT_VERSION,
        "engine_name": plan.engine.name,
        "engine_id": plan.engine.id,
        "knob_settings": [knob_to_json(s) for s in plan.knob_settings],
        "workspace_size": int(plan.workspace_size),
        "graph_key": graph_key(graph),
        "device_signature": _json_safe(handle.device_signature()),
        "device_key": handle.device_key(),
        "dnntune_version": __version__,
        "metadata": _json_safe(plan.metadata),
    }
    return json.dumps(doc, indent=2, sort_keys=False, allow_nan=False)


def _load(data: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(data, Mapping):
        doc: Any = dict(data)
    elif not isinstance(data, str | bytes | bytearray):
        raise InvalidValueError(
            "deserialize_plan: data must be the JSON text serialize_plan() returned (str or "
            f"bytes) or its parsed dict, got {type(data).__name__}"
        )
    else:
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidValueError(f"serialized plan is not valid JSON: {exc}") from None
        except RecursionError:  # (not a ValueError) no serialized plan is nested this deep
            raise InvalidValueError(
                "serialized plan is not valid JSON: nested too deeply"
            ) from None
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise InvalidValueError(
            f'not a serialized dnntune plan (expected "format": "{PLAN_FORMAT}")'
        )
    if doc.get("format_version") != PLAN_FORMAT_VERSION:
        raise InvalidValueError(
            f"serialized plan format_version {doc.get('format_version')!r} is not supported "
            f"(this dnntune reads {PLAN_FORMAT_VERSION})"
        )
    # serialize_plan() writes every one of these: a document without one is damaged, and a
    # missing knob list would restore the engine's defaults, not the plan that was measured
    missing = [k for k in ("knob_settings", "graph_key", "device_key") if k not in doc]
    if missing:
        raise InvalidValueError(
            f"serialized plan is missing {', '.join(missing)}: the document is incomplete; {_AGAIN}"
        )
    return doc


def _knob_settings(raw: Any) -> list[KnobSetting]:
    """The document's knob list, typed; a malformed or repeated knob is refused by position."""
    if not isinstance(raw, list):
        raise InvalidValueError(
            f"serialized plan: knob_settings must be a list of knob objects, got "
            f"{type(raw).__name__}; {_AGAIN}"
        )
    settings: list[KnobSetting] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        where = f"knob_settings[{i}]"
        try:
            setting = knob_from_json(item, where)
        except ConfigFileError as exc:
            raise InvalidValueError(f"serialized plan: {exc}") from None
        if setting.knob_id in seen:
            raise InvalidValueError(
                f"serialized plan: {where} repeats knob {setting.knob_id!r} (also "
                f"knob_settings[{seen[setting.knob_id]}]); serialize_plan() writes each knob once, "
                f"so the document was edited or damaged; {_AGAIN}"
            )
        seen[setting.knob_id] = i
        settings.append(setting)
    return settings


def deserialize_plan(
    graph: OpGraph,
    handle: Handle,
    data: str | bytes | Mapping[str, Any],
    deselect: DeselectCriteria | None = None,
) -> Plan:
    """Rebuild the serialized plan for ``graph`` on ``handle``: same engine, same knobs.

    ``deselect``: the graph's deselect criteria (a frontend ``Graph``'s), applied as the
    plan-building paths apply them: a deselected engine is refused before compiling, a plan
    whose workspace exceeds the limit after.

    Raises:
        InvalidValueError: the data is not a serialized plan or is damaged (a field missing,
            a knob malformed or repeated, engine_id and engine_name naming different engines);
            it was made for another graph (graph key differs) or another device (device key
            differs); its engine is unknown here; a knob is no longer valid for the engine; or
            ``deselect`` bars the plan ("Plan barred").
        NotSupportedError, ExecutionError: the engine cannot build the plan here.
    """
    doc = _load(data)
    want_key = graph_key(graph)
    if doc.get("graph_key") != want_key:
        raise InvalidValueError(
            f"serialized plan is for graph key {doc.get('graph_key')!r}, but graph "
            f"{graph.name!r} has key {want_key!r}: the plan was made for a different problem "
            "(ops, shapes, strides or data types differ)"
        )
    if doc.get("device_key") != handle.device_key():
        saved = doc.get("device_signature") or {}
        here = handle.device_signature()
        saved_name = saved.get("name") if isinstance(saved, Mapping) else saved
        raise InvalidValueError(
            f"serialized plan was made on device {saved_name!r} "
            f"({saved}), but this handle is on {here.get('name')!r} ({here}); "
            "tune again on this device"
        )
    settings = _knob_settings(doc["knob_settings"])
    registry = get_registry()
    engine = registry.find(doc.get("engine_id", "")) if doc.get("engine_id") is not None else None
    name = doc.get("engine_name")
    if engine is not None and isinstance(name, str) and name and name != engine.name:
        raise InvalidValueError(
            f"serialized plan names engine {name!r}, but its engine_id {doc.get('engine_id')} "
            f"is engine {engine.name}: the document was edited or damaged; {_AGAIN}"
        )
    if engine is None and name:
        engine = registry.find(str(name))
    if engine is None:
        known = ", ".join(e.name for e in registry.engines())
        raise InvalidValueError(
            f"serialized plan uses engine {name!r} (id {doc.get('engine_id')}), "
            f"which is not registered here; known engines: {known}"
        )
    barred = deselect.engine_reason(engine) if deselect is not None else None
    if barred is not None:
        raise InvalidValueError(
            f"serialized plan ({engine.name}) for graph {graph.name!r}: {barred}; restore a "
            "plan of an engine the graph allows, or build one (create_execution_plans() and "
            "build_plans(), or autotune())"
        )
    if doc.get("dnntune_version") != __version__:
        _log.info(
            "plan serialized by dnntune %s, restored by %s", doc.get("dnntune_version"), __version__
        )
    reason = registry.why_not(engine, graph, handle)
    if reason is not None:
        raise NotSupportedError(f"serialized plan's engine {engine.name} cannot run here: {reason}")
    engine.validate_knobs(settings, graph)
    plan = engine.compile(graph, settings, handle)
    barred = deselect.workspace_reason(plan.workspace_size) if deselect is not None else None
    if barred is not None:
        raise InvalidValueError(
            f"serialized plan {plan.name} for graph {graph.name!r}: {barred}; raise the limit "
            "with deselect_workspace_greater_than(), or build a plan within it "
            "(create_execution_plans() and build_plans(), or autotune())"
        )
    saved_ws = doc.get("workspace_size")
    if isinstance(saved_ws, int) and saved_ws != plan.workspace_size:
        _log.info(
            "restored plan %s needs %d workspace bytes (serialized: %d)",
            plan.name,
            plan.workspace_size,
            saved_ws,
        )
    return plan
