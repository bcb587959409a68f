"""The tensors and nodes of a graph document, read into dnntune's IR (:mod:`.json_format`
reads the document around them).

Every problem raises :class:`GraphFormatError` naming the JSON path of the bad field
(``nodes[2].inputs.w_tensor_uid: tensor uid 7 not defined (its tensors have uids 0-4)``). A
node records where it found each field (``Node.json_locations``) so that writing it back
(:mod:`dnntune.graph.json_writer`) keeps the document's own layout.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from dnntune.errors import GraphFormatError
from dnntune.graph.json_numbers import non_finite_from_json
from dnntune.graph.json_writer import VALUE_TYPES, dtype_value
from dnntune.graph.node import Node
from dnntune.graph.ops import ALL_SPECS, OpSpec, spec_for_json
from dnntune.graph.ops.base import Location, ParamKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import INT64_RANGE, DataType

__all__ = [
    "get_field",
    "join_path",
    "locate_fields",
    "node_from_dict",
    "parse_dtype",
    "tensor_from_dict",
    "json_type_name",
    "field_path",
    "unread_fields",
]

T = TypeVar("T")

_NODE_KEYS = ("type", "name", "compute_data_type")
_SECTIONS = ("inputs", "outputs", "parameters", "attributes")

_INT_VALUE_TYPES = ("Int32Value", "Int64Value")


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def json_type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def get_field(
    obj: dict[str, Any],
    key: str,
    path: str,
    kind: type | tuple[type, ...],
    what: str,
    required: bool = True,
    default: Any = None,
) -> Any:
    if key not in obj:
        if required:
            raise GraphFormatError(join_path(path, key), f"required field missing ({what})")
        return default
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise GraphFormatError(join_path(path, key), f"expected {what}, got {value!r}")
    return value


def _parse(path: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        raise GraphFormatError(path, str(exc)) from None


def parse_dtype(value: str, path: str) -> DataType | None:
    return _parse(path, lambda: dtype_value(value))


def _int(value: Any, path: str, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphFormatError(path, f"expected {what}, got {value!r}")
    if not minimum <= value <= INT64_RANGE[1]:
        raise GraphFormatError(path, f"{what} must be between {minimum} and 2**63-1, got {value}")
    return value


def _int_list(obj: dict[str, Any], key: str, path: str, minimum: int) -> list[int]:
    values = get_field(obj, key, path, list, "a list of integers")
    what = "an integer >= 1" if minimum == 1 else "an integer >= 0"
    return [_int(v, f"{path}.{key}[{i}]", minimum, what) for i, v in enumerate(values)]


def tensor_from_dict(obj: Any, path: str) -> TensorAttributes:
    if not isinstance(obj, dict):
        raise GraphFormatError(path, f"expected a tensor object, got {json_type_name(obj)}")
    uid = _int(
        get_field(obj, "uid", path, int, "an integer uid"), f"{path}.uid", INT64_RANGE[0], "a uid"
    )
    name = get_field(obj, "name", path, str, "a string")
    dims = _int_list(obj, "dims", path, 1)
    if not dims:
        raise GraphFormatError(f"{path}.dims", "a tensor needs at least one dim")
    strides = _int_list(obj, "strides", path, 0)
    if len(strides) != len(dims):
        raise GraphFormatError(
            f"{path}.strides", f"{len(strides)} strides for {len(dims)} dims {dims}"
        )
    dtype_text = get_field(obj, "data_type", path, str, "a data type string")
    dtype = parse_dtype(dtype_text, f"{path}.data_type")
    virtual = get_field(obj, "virtual", path, bool, "true or false")
    value: float | int | None = None
    from_value_type = False
    if "value" in obj or "value_type" in obj:
        vt = get_field(obj, "value_type", path, str, "a value type string")
        if vt not in VALUE_TYPES:
            raise GraphFormatError(
                f"{path}.value_type",
                f"unsupported value type {vt!r}; expected one of {', '.join(VALUE_TYPES)}",
            )
        kinds: tuple[type, ...] = (int,) if vt in _INT_VALUE_TYPES else (int, float)
        raw_value = obj.get("value")
        if isinstance(raw_value, str) and vt not in _INT_VALUE_TYPES:  # "inf", "-inf", "nan"
            value = non_finite_from_json(raw_value, f"{path}.value", f"a number for {vt}")
        else:
            value = get_field(obj, "value", path, kinds, f"a number for {vt}")
        if dtype is None:
            dtype, from_value_type = VALUE_TYPES[vt], True
    t = TensorAttributes(
        name=name,
        dims=dims,
        strides=strides,
        data_type=dtype,
        uid=uid,
        is_virtual=virtual,
        value=value,
    )
    if dtype_text.lower() == "unset":
        t._json_unset = True
        t._auto_data_type = not from_value_type
        t._spec_data_type = from_value_type
    t._json_source = copy.deepcopy(obj)
    return t


def _find(
    obj: dict[str, Any],
    keys: tuple[str, ...],
    sections: tuple[str, ...],
    taken: set[Location],
) -> tuple[Location, Any] | None:
    """The first (section, key) holding one of ``keys``, searching ``sections`` in order."""
    for section in sections:
        box = _box(obj, section)
        if not isinstance(box, dict):
            continue
        for key in keys:
            if key in box and (section, key) not in taken:
                if section == "" and key in (*_NODE_KEYS, *_SECTIONS):
                    continue
                return (section, key), box[key]
    return None


def _unique(*items: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _defined_uids(by_uid: Mapping[int, Any]) -> str:
    """The uids the file's ``tensors`` define, for a message about one it does not: runs
    written as ranges, at most a few dozen shown."""
    uids = sorted(by_uid)
    if not uids:
        return "the graph has no tensors"
    runs: list[str] = []
    start = prev = uids[0]
    for u in [*uids[1:], None]:
        if u is not None and u == prev + 1:
            prev = u
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if u is not None:
            start = prev = u
    shown = ", ".join(runs[:24]) + (", ..." if len(runs) > 24 else "")
    plural = "s" if len(uids) > 1 else ""
    return f"its tensors have uid{plural} {shown}"


def field_path(path: str, loc: tuple[str, str]) -> str:
    return join_path(join_path(path, loc[0]), loc[1]) if loc[0] else join_path(path, loc[1])


def _box(obj: dict[str, Any], section: str) -> Any:
    """The object a section names in a node object ("" is the node object itself)."""
    return obj if section == "" else obj.get(section)


def locate_fields(obj: dict[str, Any], spec: OpSpec) -> dict[str, Location]:
    """Where each tensor field and parameter of ``spec`` sits in the node object ``obj``
    (field or parameter name -> (section, key)); those absent are left out.

    Reading is lenient about where a key sits (the older everything-under-``parameters``
    layout, a parameter on the node object itself): each field is looked for in its own
    section first, then in the others, and one key serves one field only.
    """
    taken: set[Location] = set()
    locations: dict[str, Location] = {}
    for section, fields in (("inputs", spec.all_inputs), ("outputs", spec.all_outputs)):
        for f in fields:
            own = spec.location(f)[0]
            found = _find(
                obj, _unique(spec.json_fields.get(f, f), f), _unique(own, section, ""), taken
            )
            if found is not None:
                taken.add(found[0])
                locations[f] = found[0]
    for p in spec.params:
        own = spec.location(p.name)[0]
        found = _find(
            obj, _unique(p.key, p.name), _unique(own, "", *_SECTIONS[2:], "inputs"), taken
        )
        if found is not None:
            taken.add(found[0])
            locations[p.name] = found[0]
    return locations


def unread_fields(obj: dict[str, Any], taken: set[Location]) -> Iterator[tuple[str, str, Any]]:
    """The (section, key, value) of every key of the node object ``obj`` that no field or
    parameter took (``taken``: the locations :func:`locate_fields` found), besides the node's
    own ``type``/``name``/``compute_data_type`` and its sections."""
    for section in ("", *_SECTIONS):
        box = _box(obj, section)
        if not isinstance(box, dict):
            continue
        for key, value in box.items():
            if (section, key) in taken or (section == "" and key in (*_NODE_KEYS, *_SECTIONS)):
                continue
            yield section, key, value


def node_from_dict(obj: Any, path: str, by_uid: dict[int, TensorAttributes]) -> Node:
    if not isinstance(obj, dict):
        raise GraphFormatError(path, f"expected a node object, got {json_type_name(obj)}")
    type_name = get_field(obj, "type", path, str, "a node type string")
    spec = spec_for_json(type_name)
    if spec is None:
        known = ", ".join(s.json_type for s in ALL_SPECS)
        raise GraphFormatError(
            f"{path}.type", f"unsupported node type {type_name!r}; dnntune supports {known}"
        )
    name = get_field(obj, "name", path, str, "a string")
    compute_text = get_field(
        obj, "compute_data_type", path, str, "a data type string", False, "unset"
    )
    compute = parse_dtype(compute_text, f"{path}.compute_data_type")
    for section in _SECTIONS:
        if section in obj and not isinstance(obj[section], dict):
            raise GraphFormatError(
                f"{path}.{section}", f"expected an object, got {json_type_name(obj[section])}"
            )
    if not spec.flat_io:
        for section in ("inputs", "outputs"):
            get_field(obj, section, path, dict, "an object of *_tensor_uid fields")
    locations = locate_fields(obj, spec)
    io: dict[str, dict[str, TensorAttributes | None]] = {"inputs": {}, "outputs": {}}
    for section, fields in (("inputs", spec.all_inputs), ("outputs", spec.all_outputs)):
        for f in fields:
            loc = locations.get(f)
            if loc is None:
                continue
            uid = _box(obj, loc[0])[loc[1]]
            if uid is None:
                continue
            where = field_path(path, loc)
            if isinstance(uid, bool) or not isinstance(uid, int):
                raise GraphFormatError(where, f"expected a tensor uid (integer), got {uid!r}")
            if uid not in by_uid:
                raise GraphFormatError(
                    where, f"tensor uid {uid} not defined ({_defined_uids(by_uid)})"
                )
            io[section][f] = by_uid[uid]
    params: dict[str, Any] = spec.defaults()
    for p in spec.params:
        loc = locations.get(p.name)
        if loc is None:
            continue
        raw = _box(obj, loc[0])[loc[1]]
        if p.kind is ParamKind.FLOAT and isinstance(raw, str):  # "inf", "-inf", "nan"
            raw = non_finite_from_json(raw, field_path(path, loc), "a number")
        try:
            params[p.name] = p.parse(raw, p.name)
        except ValueError as exc:
            raise GraphFormatError(field_path(path, loc), str(exc)) from None
    extra: dict[str, Any] = {}
    for section, key, value in unread_fields(obj, set(locations.values())):
        dotted = f"{section}.{key}" if section else key
        where = field_path(path, (section, key))
        if dotted in spec.json_constants:
            if value not in (None, [], spec.json_constants[dotted]):
                raise GraphFormatError(
                    where,
                    f"dnntune does not support {key} on {type_name}; expected "
                    f"{json.dumps(spec.json_constants[dotted])}, got {value!r}",
                )
            continue
        if key.endswith("_tensor_uid") and value not in (None, []):
            raise GraphFormatError(
                where, f"unsupported field for {type_name}; dnntune does not model it"
            )
        extra[dotted] = copy.deepcopy(value)
    return Node(
        name=name,
        kind=spec.kind,
        inputs=io["inputs"],
        outputs=io["outputs"],
        params=params,
        compute_data_type=compute,
        json_extra=extra,
        json_source=copy.deepcopy(obj),
        json_locations=locations,
    )
