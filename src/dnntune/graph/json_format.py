"""hipDNN's graph JSON serialization: ``to_json`` / ``from_json`` with exact round trips.

Every problem in a document raises :class:`GraphFormatError` naming the JSON path of the bad
field (``nodes[2].inputs.w_tensor_uid: tensor uid 7 not defined``), never a KeyError/TypeError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dnntune.errors import GraphFormatError, InvalidValueError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node
from dnntune.graph.ops import spec_for, spec_for_json
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType

__all__ = ["graph_to_dict", "graph_from_dict", "SCHEMA_PATH", "load_schema"]

SCHEMA_PATH = Path(__file__).with_name("graph.schema.json")

G = TypeVar("G", bound=OpGraph)

_VALUE_TYPES = {
    "Float32Value": DataType.FLOAT,
    "Float16Value": DataType.HALF,
    "BFloat16Value": DataType.BFLOAT16,
    "Float64Value": DataType.DOUBLE,
    "Int32Value": DataType.INT32,
    "Int64Value": DataType.INT64,
    "Float8Value": DataType.FP8_E4M3,
}
_VALUE_TYPE_NAMES = {v: k for k, v in _VALUE_TYPES.items()}


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the graph format, shipped in the package."""
    return json.loads(SCHEMA_PATH.read_text())  # type: ignore[no-any-return]


# ---- writing ------------------------------------------------------------------------------
def _dtype_name(dtype: DataType | None) -> str:
    return dtype.json_name if dtype is not None else "unset"


def _tensor_to_dict(t: TensorAttributes) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uid": t.uid,
        "name": t.name,
        "dims": list(t.dims),
        "strides": list(t.strides),
        "data_type": "unset" if t._json_unset or t.data_type is None else t.data_type.json_name,
        "virtual": t.is_virtual,
    }
    if t.value is not None:
        out["value_type"] = _VALUE_TYPE_NAMES.get(t.data_type or DataType.FLOAT, "Float32Value")
        out["value"] = t.value
    return out


def _node_to_dict(node: Node) -> dict[str, Any]:
    spec = spec_for(node.kind)
    out: dict[str, Any] = {
        "name": node.name,
        "type": spec.json_type,
        "compute_data_type": _dtype_name(node.compute_data_type),
        "inputs": {f: t.uid for f, t in node.inputs.items() if t is not None},
        "outputs": {f: t.uid for f, t in node.outputs.items() if t is not None},
    }
    for dotted, value in spec.json_constants.items():
        section, key = dotted.split(".", 1)
        out[section].setdefault(key, value)
    params: dict[str, Any] = {}
    for p in spec.params:
        value = node.params.get(p.name)
        if value is not None:
            params[p.name] = p.to_json(value)
    if params or spec.params:
        out[spec.params_key] = params
    if node.json_extra:
        for key, value in node.json_extra.items():
            if key in ("inputs", "outputs"):
                for f, v in value.items():
                    out[key].setdefault(f, v)
            elif key == spec.params_key:
                out.setdefault(key, {}).update(value)
            else:
                out.setdefault(key, value)
    return out


def graph_to_dict(graph: OpGraph) -> dict[str, Any]:
    """The hipDNN JSON document of ``graph`` (uids are assigned first if missing)."""
    graph.assign_uids()
    return {
        "name": graph.name,
        "compute_data_type": _dtype_name(graph.compute_data_type),
        "io_data_type": _dtype_name(graph.io_data_type),
        "intermediate_data_type": _dtype_name(graph.intermediate_data_type),
        "tensors": [_tensor_to_dict(t) for t in graph.tensors],
        "nodes": [_node_to_dict(n) for n in graph.nodes],
    }


# ---- reading ------------------------------------------------------------------------------
T = TypeVar("T")


def _get(obj: dict[str, Any], key: str, path: str, kind: type | tuple[type, ...],
         what: str, required: bool = True, default: Any = None) -> Any:
    if key not in obj:
        if required:
            raise GraphFormatError(f"{path}.{key}" if path else key, f"required field missing ({what})")
        return default
    value = obj[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
    if not ok:
        raise GraphFormatError(f"{path}.{key}" if path else key, f"expected {what}, got {value!r}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _parse(path: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        raise GraphFormatError(path, str(exc)) from None


def _dtype(value: str, path: str) -> DataType | None:
    if value == "unset":
        return None
    return _parse(path, lambda: DataType.from_json_name(value))


def _int_list(obj: dict[str, Any], key: str, path: str) -> list[int]:
    values = _get(obj, key, path, list, "a list of integers")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise GraphFormatError(f"{path}.{key}[{i}]", f"expected an integer, got {v!r}")
    return [int(v) for v in values]


def _tensor_from_dict(obj: Any, path: str) -> TensorAttributes:
    if not isinstance(obj, dict):
        raise GraphFormatError(path, f"expected an object, got {type(obj).__name__}")
    uid = _get(obj, "uid", path, int, "an integer uid")
    name = _get(obj, "name", path, str, "a string")
    dims = _int_list(obj, "dims", path)
    strides = _int_list(obj, "strides", path)
    dtype_text = _get(obj, "data_type", path, str, "a data type string")
    dtype = _dtype(dtype_text, f"{path}.data_type")
    virtual = _get(obj, "virtual", path, bool, "true or false")
    value = None
    if "value" in obj or "value_type" in obj:
        vt = _get(obj, "value_type", path, str, "a value type string")
        if vt not in _VALUE_TYPES:
            raise GraphFormatError(f"{path}.value_type", f"unknown value type {vt!r}; expected one "
                                   f"of {', '.join(_VALUE_TYPES)}")
        value = _get(obj, "value", path, (int, float, bool), "a number")
        if dtype is None:
            dtype = _VALUE_TYPES[vt]
    t = TensorAttributes(name=name, dims=dims, strides=strides, data_type=dtype, uid=uid,
                         is_virtual=virtual, is_output=False, value=value)
    if dtype is None:
        t._auto_data_type = True
        t._json_unset = True
    return t


def _node_from_dict(obj: Any, path: str, by_uid: dict[int, TensorAttributes]) -> Node:
    if not isinstance(obj, dict):
        raise GraphFormatError(path, f"expected an object, got {type(obj).__name__}")
    type_name = _get(obj, "type", path, str, "a node type string")
    spec = spec_for_json(type_name)
    if spec is None:
        raise GraphFormatError(f"{path}.type", f"unsupported node type {type_name!r}")
    name = _get(obj, "name", path, str, "a string")
    compute = _dtype(_get(obj, "compute_data_type", path, str, "a data type string", required=False,
                          default="unset"), f"{path}.compute_data_type")
    extra: dict[str, Any] = {}
    io: dict[str, dict[str, TensorAttributes | None]] = {}
    for section, allowed in (("inputs", spec.all_inputs), ("outputs", spec.all_outputs)):
        mapping = _get(obj, section, path, dict, "an object of *_tensor_uid fields")
        io[section] = {}
        for field_name, uid in mapping.items():
            fpath = f"{path}.{section}.{field_name}"
            if field_name not in allowed:
                if uid is None or uid == []:
                    extra.setdefault(section, {})[field_name] = uid
                    continue
                raise GraphFormatError(fpath, f"unsupported field for {type_name}; expected one of "
                                       f"{', '.join(allowed)}")
            if uid is None:
                continue
            if isinstance(uid, bool) or not isinstance(uid, int):
                raise GraphFormatError(fpath, f"expected a tensor uid (integer), got {uid!r}")
            if uid not in by_uid:
                raise GraphFormatError(fpath, f"tensor uid {uid} not defined")
            io[section][field_name] = by_uid[uid]
    params: dict[str, Any] = spec.defaults()
    raw_params = obj.get(spec.params_key, obj.get("parameters" if spec.params_key == "attributes"
                                                   else "attributes", {}))
    ppath = f"{path}.{spec.params_key}"
    if not isinstance(raw_params, dict):
        raise GraphFormatError(ppath, f"expected an object, got {raw_params!r}")
    known = {p.name for p in spec.params}
    for key, value in raw_params.items():
        if key not in known:
            extra.setdefault(spec.params_key, {})
            continue
        params[key] = _parse(f"{ppath}.{key}", lambda p=spec.param(key), v=value: p.parse(v, key))
    for p in spec.params:
        if p.required and params.get(p.name) is None:
            raise GraphFormatError(f"{ppath}.{p.name}", "required parameter missing")
    for key in obj:
        if key not in ("type", "name", "compute_data_type", "inputs", "outputs", "parameters",
                       "attributes"):
            extra[key] = obj[key]
    # Unknown params are kept verbatim so that a hipDNN file round-trips exactly.
    unknown_params = {k: v for k, v in raw_params.items() if k not in known}
    if unknown_params:
        extra[spec.params_key] = unknown_params
    else:
        extra.pop(spec.params_key, None)
    return Node(name=name, kind=spec.kind, inputs=io["inputs"], outputs=io["outputs"],
                params=params, compute_data_type=compute, json_extra=extra)


def graph_from_dict(doc: Any, graph_cls: type[G]) -> G:
    """Build a graph of class ``graph_cls`` from a parsed JSON document.

    Raises:
        GraphFormatError: with the JSON path of the first bad field.
    """
    if not isinstance(doc, dict):
        raise GraphFormatError("", f"a graph document must be a JSON object, got {type(doc).__name__}")
    name = _get(doc, "name", "", str, "a string")
    dtypes = {
        key: _dtype(_get(doc, key, "", str, "a data type string"), key)
        for key in ("compute_data_type", "io_data_type", "intermediate_data_type")
    }
    graph = graph_cls(name=name, **dtypes)
    tensors = _get(doc, "tensors", "", list, "a list of tensors")
    by_uid: dict[int, TensorAttributes] = {}
    for i, obj in enumerate(tensors):
        t = _tensor_from_dict(obj, f"tensors[{i}]")
        if t.uid in by_uid:
            raise GraphFormatError(f"tensors[{i}].uid", f"duplicate tensor uid {t.uid}")
        assert t.uid is not None
        by_uid[t.uid] = t
        graph.add_tensor(t)
    nodes = _get(doc, "nodes", "", list, "a list of nodes")
    for i, obj in enumerate(nodes):
        graph.nodes.append(_node_from_dict(obj, f"nodes[{i}]", by_uid))
    produced = graph.producers()
    for t in graph.tensors:
        if id(t) in produced and not t.is_virtual:
            t.is_output = True
    return graph


def graph_from_json_text(text: str, graph_cls: type[G], source: str = "<string>") -> G:
    """Parse JSON text; syntax errors become GraphFormatError naming line and column."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphFormatError("", f"{source}: invalid JSON at line {exc.lineno} column "
                               f"{exc.colno}: {exc.msg}") from None
    except (TypeError, ValueError) as exc:
        raise GraphFormatError("", f"{source}: cannot decode: {exc}") from None
    return graph_from_dict(doc, graph_cls)


def validate_loaded(graph: OpGraph) -> None:
    """Validate a loaded graph, turning InvalidValueError into GraphFormatError with a path."""
    try:
        graph.validate()
    except GraphFormatError:
        raise
    except InvalidValueError as exc:
        raise GraphFormatError(_path_for(graph, str(exc)), str(exc)) from None


def _path_for(graph: OpGraph, message: str) -> str:
    for i, node in enumerate(graph.nodes):
        if f"node {node.name!r}" in message:
            return f"nodes[{i}]"
    for i, t in enumerate(graph.tensors):
        if f"tensor {t.name!r}" in message:
            return f"tensors[{i}]"
    return ""
