"""Writing hipDNN graph JSON: fresh documents in hipDNN's per-op layouts, or loaded ones patched.

A graph built with the builder is written the way hipDNN's serializer writes it (every key its
reader requires, ``null`` for unset optional fields). A node or tensor that was loaded from a
document is written by patching its original object, so keys dnntune does not model, their
order and their spelling survive the round trip. The document is strict JSON: a non-finite
float is written as the string ``"inf"``, ``"-inf"`` or ``"nan"``
(:mod:`dnntune.graph.json_numbers`).
"""

from __future__ import annotations

import copy
from typing import Any

from dnntune.graph.ir import OpGraph
from dnntune.graph.json_numbers import strict_json_numbers
from dnntune.graph.node import Node
from dnntune.graph.ops import OpSpec, spec_for
from dnntune.graph.ops.base import Param
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType

__all__ = ["VALUE_TYPES", "dtype_value", "graph_to_dict"]

#: pass-by-value scalar types hipDNN writes (``value_type``) and the data type of each
VALUE_TYPES = {
    "Float32Value": DataType.FLOAT,
    "Float16Value": DataType.HALF,
    "BFloat16Value": DataType.BFLOAT16,
    "Float64Value": DataType.DOUBLE,
    "Int32Value": DataType.INT32,
    "Int64Value": DataType.INT64,
}
_VALUE_TYPE_NAMES = {v: k for k, v in VALUE_TYPES.items()}


def dtype_value(text: str) -> DataType | None:
    """The data type a JSON string names (None for "unset"); raises ValueError if unknown."""
    return None if text.lower() == "unset" else DataType.from_json_name(text)


def _dtype_name(dtype: DataType | None) -> str:
    return dtype.json_name if dtype is not None else "unset"


def _keep_dtype(raw: Any, current: DataType | None) -> Any:
    """The loaded spelling when it still means ``current``, else the canonical name."""
    try:
        if isinstance(raw, str) and dtype_value(raw) == current:
            return raw
    except ValueError:
        pass
    return _dtype_name(current)


def _dtype_unchanged(src: dict[str, Any] | None, t: TensorAttributes) -> bool:
    """True when the tensor still has the data type it was loaded with."""
    if src is None:
        return False
    if t._json_unset:
        return True
    raw = src.get("data_type")
    try:
        return isinstance(raw, str) and dtype_value(raw) == t.data_type
    except ValueError:
        return False


def _tensor_to_dict(t: TensorAttributes) -> dict[str, Any]:
    fresh: dict[str, Any] = {
        "uid": t.uid,
        "name": t.name,
        "dims": list(t.dims),
        "strides": list(t.strides),
        "data_type": "unset" if t._json_unset else _dtype_name(t.data_type),
        "virtual": t.is_virtual,
    }
    src = t._json_source
    if src is not None and "data_type" in src and not t._json_unset:
        fresh["data_type"] = _keep_dtype(src["data_type"], t.data_type)
    if t.value is not None:
        value_type = _VALUE_TYPE_NAMES.get(t.data_type or DataType.FLOAT, "Float32Value")
        raw_vt = None if src is None else src.get("value_type")
        if raw_vt in VALUE_TYPES and (
            VALUE_TYPES[raw_vt] == t.data_type or _dtype_unchanged(src, t)
        ):
            value_type = raw_vt
        fresh["value_type"] = value_type
        raw_value = None if src is None else src.get("value")
        same = raw_value == t.value and not isinstance(raw_value, bool)
        fresh["value"] = raw_value if same else t.value
    if src is None:
        return fresh
    out: dict[str, Any] = {}
    for key, value in src.items():
        if key in fresh:
            out[key] = fresh[key]
        elif key not in ("value", "value_type"):
            out[key] = copy.deepcopy(value)
    for key, value in fresh.items():
        out.setdefault(key, value)
    return out


def _inferred(node: Node, name: str, value: Any) -> bool:
    """True when ``value`` is what validation filled in (not something the caller chose)."""
    return name in node.inferred and node.inferred[name] == value


def _container(out: dict[str, Any], section: str) -> dict[str, Any]:
    if section == "":
        return out
    box = out.get(section)
    if not isinstance(box, dict):
        box = out[section] = {}
    return box


def _fresh_node(node: Node, spec: OpSpec, compute: DataType | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": node.name,
        "type": spec.json_type,
        "compute_data_type": _dtype_name(node.compute_data_type or compute),
    }
    if not spec.flat_io:
        out["inputs"], out["outputs"] = {}, {}
    for f in (*spec.all_inputs, *spec.all_outputs):
        t = node.inputs.get(f) if f in spec.all_inputs else node.outputs.get(f)
        section, key = spec.location(f)
        if t is not None:
            _container(out, section)[key] = t.uid
        elif f in spec.null_fields:
            _container(out, section)[key] = None
    for dotted, value in spec.json_constants.items():
        section, _, key = dotted.rpartition(".")
        _container(out, section)[key] = copy.deepcopy(value)
    for p in spec.params:
        value = node.params.get(p.name)
        if p.json_required or (value is not None and not _inferred(node, p.name, value)):
            section, key = spec.location(p.name)
            _container(out, section)[key] = p.to_json(value)
    return out


def _same_param(p: Param, raw: Any, value: Any) -> bool:
    try:
        return bool(p.parse(raw, p.name) == value)
    except ValueError:
        return False


def _patched_node(node: Node, spec: OpSpec, src: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(src)
    out["name"] = node.name
    out["type"] = spec.json_type
    if "compute_data_type" in src:
        out["compute_data_type"] = _keep_dtype(src["compute_data_type"], node.compute_data_type)
    elif node.compute_data_type is not None:
        out["compute_data_type"] = node.compute_data_type.json_name
    for f in (*spec.all_inputs, *spec.all_outputs):
        t = node.inputs.get(f) if f in spec.all_inputs else node.outputs.get(f)
        loc = node.json_locations.get(f)
        if loc is not None:
            box = _container(out, loc[0])
            if t is not None:
                box[loc[1]] = t.uid
            elif box.get(loc[1]) is not None:
                if f in spec.null_fields:
                    box[loc[1]] = None
                else:
                    del box[loc[1]]
        elif t is not None:
            section, key = spec.location(f)
            _container(out, section)[key] = t.uid
    for p in spec.params:
        value = node.params.get(p.name)
        loc = node.json_locations.get(p.name)
        if loc is not None:
            box = _container(out, loc[0])
            raw = box.get(loc[1])
            if not (_same_param(p, raw, value) or _inferred(node, p.name, value)):
                box[loc[1]] = p.to_json(value)
        elif value is not None and value != p.default and not _inferred(node, p.name, value):
            section, key = spec.location(p.name)
            _container(out, section)[key] = p.to_json(value)
    return out


def _node_to_dict(node: Node, compute: DataType | None) -> dict[str, Any]:
    spec = spec_for(node.kind)
    if node.json_source is None:
        return _fresh_node(node, spec, compute)
    return _patched_node(node, spec, node.json_source)


def graph_to_dict(graph: OpGraph) -> dict[str, Any]:
    """The hipDNN JSON document of ``graph`` (uids are assigned first if missing).

    Non-finite floats (a scalar's ``value``, a float parameter, a kept unknown field) are the
    strings ``"inf"``, ``"-inf"`` and ``"nan"``, so the document is strict JSON.
    """
    doc = _graph_document(graph)
    strict_json_numbers(doc)  # the document is built here: its containers are its own
    return doc


def _graph_document(graph: OpGraph) -> dict[str, Any]:
    graph.assign_uids()
    fresh: dict[str, Any] = {
        "name": graph.name,
        "compute_data_type": _dtype_name(graph.compute_data_type),
        "io_data_type": _dtype_name(graph.io_data_type),
        "intermediate_data_type": _dtype_name(graph.intermediate_data_type),
        "tensors": [_tensor_to_dict(t) for t in graph.tensors],
        "nodes": [_node_to_dict(n, graph.compute_data_type) for n in graph.nodes],
    }
    src = graph.json_source
    if src is None:
        return fresh
    for key in ("compute_data_type", "io_data_type", "intermediate_data_type"):
        if key in src:
            fresh[key] = _keep_dtype(src[key], getattr(graph, key))
    out: dict[str, Any] = {}
    for key, value in src.items():
        out[key] = fresh[key] if key in fresh else copy.deepcopy(value)
    for key, value in fresh.items():
        out.setdefault(key, value)
    return out
