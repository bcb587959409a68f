"""The JSON Schema (draft 2020-12) of the graph format, derived from the op specs.

The shipped ``graph.schema.json`` is the output of :func:`build_schema`; a test regenerates it
and compares, so the schema cannot drift from what the reader and writer do. Regenerate with::

    python -m dnntune.graph.schema > src/dnntune/graph/graph.schema.json

The schema describes documents as hipDNN writes them (every key its reader requires, in the
place it expects it). dnntune's own reader is more lenient about missing optional keys.
"""

from __future__ import annotations

import enum
import json
import sys
from typing import Any

from dnntune.graph.json_numbers import NON_FINITE
from dnntune.graph.ops import ALL_SPECS, OpSpec
from dnntune.graph.ops.base import Param, ParamKind
from dnntune.graph.types import DataType

__all__ = ["SCHEMA_ID", "build_schema", "schema_text"]

SCHEMA_ID = "urn:dnntune:schema:graph:1"

_UID = {"type": "integer"}
_UID_OR_NULL = {"type": ["integer", "null"]}
#: how a non-finite float is written (JSON has no literal for it)
_NON_FINITE = {"enum": list(NON_FINITE), "description": "a non-finite number"}


def _enum_values(p: Param) -> list[Any]:
    assert p.enum_type is not None
    members: list[enum.Enum] = list(p.enum_type)
    if p.enum_style == "int":
        return [m.value for m in members]
    if p.enum_style == "upper":
        return [m.name for m in members]
    # Lower-case JSON names, plus the upper-case spellings older hipDNN files use.
    names = [m.json_name for m in members]  # type: ignore[attr-defined]
    return names + [n.upper() for n in names if n.upper() != n]


def _param_schema(p: Param) -> dict[str, Any]:
    nullable = p.default is None and not p.required
    if p.kind is ParamKind.ENUM:
        values = _enum_values(p)
        return {"enum": [*values, None] if nullable else values}
    kinds: dict[ParamKind, dict[str, Any]] = {
        ParamKind.INT: {"type": "integer"},
        ParamKind.FLOAT: {"type": "number"},
        ParamKind.BOOL: {"type": "boolean"},
        ParamKind.STR: {"type": "string"},
        ParamKind.INT_LIST: {"type": "array", "items": {"type": "integer"}},
    }
    base = kinds[p.kind]
    if nullable:
        kind = base["type"]
        base = {**base, "type": [kind, "null"]}
    if p.kind is ParamKind.FLOAT:
        return {"anyOf": [base, _NON_FINITE]}
    return dict(base)


def _node_schema(spec: OpSpec) -> dict[str, Any]:
    """Properties and required keys per section ("" = the node object) for one node type."""
    sections: dict[str, dict[str, Any]] = {}

    def add(section: str, key: str, schema: dict[str, Any], required: bool) -> None:
        box = sections.setdefault(section, {"properties": {}, "required": []})
        box["properties"][key] = schema
        if required:
            box["required"].append(key)

    if not spec.flat_io:
        sections["inputs"] = {"properties": {}, "required": []}
        sections["outputs"] = {"properties": {}, "required": []}
    for f in (*spec.all_inputs, *spec.all_outputs):
        section, key = spec.location(f)
        mandatory = f in spec.inputs or f in spec.outputs
        add(section, key, _UID if mandatory else _UID_OR_NULL, mandatory or f in spec.null_fields)
    for dotted, value in spec.json_constants.items():
        section, _, key = dotted.rpartition(".")
        add(section, key, {"enum": [value, None]} if value is not None else {"type": "null"}, True)
    for p in spec.params:
        section, key = spec.location(p.name)
        add(section, key, _param_schema(p), p.json_required)
    node = sections.pop("", {"properties": {}, "required": []})
    properties: dict[str, Any] = {"type": {"const": spec.json_type}}
    required: list[str] = ["name", "type", "compute_data_type"]
    for section, box in sections.items():
        properties[section] = {
            "type": "object",
            "properties": box["properties"],
            "required": box["required"],
        }
        required.append(section)
    properties.update(node["properties"])
    required.extend(node["required"])
    return {
        "type": "object",
        "description": f"dnntune {spec.kind.value} node (builder method {spec.builder_name}).",
        "properties": properties,
        "required": required,
    }


def build_schema() -> dict[str, Any]:
    """The schema of a graph document, from the op specs."""
    data_types = [d.json_name for d in DataType] + ["unset"]
    value_types = ["Float32Value", "Float16Value", "BFloat16Value", "Float64Value"]
    value_types += ["Int32Value", "Int64Value"]
    defs: dict[str, Any] = {
        "data_type": {"type": "string", "enum": data_types},
        "tensor": {
            "type": "object",
            "required": ["uid", "name", "dims", "strides", "data_type", "virtual"],
            "properties": {
                "uid": {"type": "integer", "description": "unique in the graph; may start at 0"},
                "name": {"type": "string"},
                "dims": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "integer", "minimum": 1},
                    "description": "logical dims, N C [D] H W order for convolutions",
                },
                "strides": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0},
                    "description": "in elements; the layout (NCHW, NHWC, ...) lives here",
                },
                "data_type": {"$ref": "#/$defs/data_type"},
                "virtual": {"type": "boolean", "description": "an intermediate with no buffer"},
                "value_type": {"enum": value_types},
                "value": {
                    "anyOf": [{"type": "number"}, _NON_FINITE],
                    "description": "a pass-by-value scalar",
                },
            },
            "dependentRequired": {"value": ["value_type"], "value_type": ["value"]},
        },
        "node": {
            "type": "object",
            "required": ["name", "type", "compute_data_type"],
            "properties": {
                "name": {"type": "string"},
                "type": {"enum": [s.json_type for s in ALL_SPECS]},
                "compute_data_type": {"$ref": "#/$defs/data_type"},
            },
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": s.json_type}}},
                    "then": {"$ref": f"#/$defs/{s.json_type}"},
                }
                for s in ALL_SPECS
            ],
        },
    }
    for spec in ALL_SPECS:
        defs[spec.json_type] = _node_schema(spec)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "hipDNN operation graph",
        "description": (
            "An operation graph in hipDNN's JSON serialization, as dnntune reads and writes "
            "it. Generated from dnntune's op specs by dnntune.graph.schema; do not edit."
        ),
        "type": "object",
        "required": [
            "name",
            "compute_data_type",
            "io_data_type",
            "intermediate_data_type",
            "tensors",
            "nodes",
        ],
        "properties": {
            "name": {"type": "string"},
            "compute_data_type": {"$ref": "#/$defs/data_type"},
            "io_data_type": {"$ref": "#/$defs/data_type"},
            "intermediate_data_type": {"$ref": "#/$defs/data_type"},
            "tensors": {"type": "array", "items": {"$ref": "#/$defs/tensor"}},
            "nodes": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            "preferred_engine_id": {"type": "integer"},
            "is_override_shape_enabled": {"type": "boolean"},
            "id": {"type": "string"},
            # a note for people (JSON has no comments): kept and written back, never read;
            # benchmarks/suite's graphs say where their shapes come from in it
            "comment": {"type": "string"},
        },
        "$defs": defs,
    }


def schema_text() -> str:
    """The schema as written to ``graph.schema.json``."""
    return json.dumps(build_schema(), indent=2) + "\n"


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    sys.stdout.write(schema_text())
