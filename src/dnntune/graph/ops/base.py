"""OpSpec: the contract every operation fulfils (fields, parameters, shape inference, checks).

Adding an operation means writing one OpSpec; the JSON format, validation, the graph key and
the override-file writer all read the spec instead of switching on op names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dnntune.errors import InvalidValueError
from dnntune.graph.node import Node, OpKind
from dnntune.graph.tensor import TensorAttributes

__all__ = ["NodeError", "OpSpec", "Param", "broadcast_dims", "node_error", "require"]

#: a JSON location: (section, key); section "" is the node object itself
Location = tuple[str, str]


class NodeError(InvalidValueError):
    """A node is wrong; ``node`` and ``field`` (a tensor field or parameter name) say where."""

    def __init__(self, node: Node, field: str, problem: str) -> None:
        super().__init__(f"node {node.name!r} ({node.kind.value}): {field}: {problem}")
        self.node = node
        self.field = field
        self.problem = problem


def node_error(node: Node, where: str, problem: str) -> NodeError:
    """An InvalidValueError naming the node, the field (or parameter) and the problem."""
    return NodeError(node, where, problem)


def require(node: Node, field_name: str) -> TensorAttributes:
    tensor = node.inputs.get(field_name) or node.outputs.get(field_name)
    if tensor is None:
        raise node_error(node, field_name, "required tensor is missing")
    return tensor


def broadcast_dims(node: Node, where: str, *shapes: Sequence[int]) -> list[int]:
    """NumPy-style broadcast of same-rank or lower-rank shapes; raises naming the node."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        padded = [1] * (rank - len(shape)) + list(shape)
        for i, d in enumerate(padded):
            if d == out[i] or d == 1:
                continue
            if out[i] == 1:
                out[i] = d
            else:
                raise node_error(
                    node, where, f"shapes {[list(s) for s in shapes]} do not broadcast"
                )
    return out


class ParamKind(enum.Enum):
    INT = "int"
    INT_LIST = "int_list"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    ENUM = "enum"


@dataclass(frozen=True)
class Param:
    """One node parameter: its name, kind, default and where hipDNN writes it in JSON."""

    name: str
    kind: ParamKind
    default: Any = None
    enum_type: type[enum.Enum] | None = None
    #: dnntune needs a value (validation fails without one)
    required: bool = False
    #: part of the graph key and of override-file criteria (int-encoded) when set
    criterion: str | None = None
    #: the JSON key, when it differs from ``name`` (resample ``mode`` is ``resample_mode``)
    json_name: str | None = None
    #: the JSON section holding it: "parameters", "attributes", "inputs" (hipDNN pointwise) or
    #: "" (the node object itself); None means the spec's ``params_key``
    section: str | None = None
    #: hipDNN's reader requires the key, so it is always written (``null`` when unset)
    json_required: bool = False
    #: whether the value changes what the graph computes (False for implementation hints)
    in_key: bool = True
    #: how an enum is written: "json" (its json_name), "upper" (its NAME) or "int" (its value)
    enum_style: str = "json"

    @property
    def key(self) -> str:
        """The JSON key of this parameter."""
        return self.json_name or self.name

    def parse(self, value: Any, where: str) -> Any:
        """Parse a JSON (or Python) value; raises ValueError with a message (caller adds path)."""
        if value is None:
            return None
        if self.kind is ParamKind.ENUM:
            assert self.enum_type is not None
            if isinstance(value, self.enum_type):
                return value
            if isinstance(value, str):
                return self.enum_type.from_json_name(value)  # type: ignore[attr-defined]
            if isinstance(value, int) and not isinstance(value, bool):
                try:
                    return self.enum_type(value)
                except ValueError:
                    pass
            raise ValueError(f"expected a {self.enum_type.__name__} name, got {value!r}")
        if self.kind is ParamKind.INT_LIST:
            if not isinstance(value, list | tuple) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise ValueError(f"expected a list of integers, got {value!r}")
            return [int(v) for v in value]
        if self.kind is ParamKind.INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {value!r}")
            return value
        if self.kind is ParamKind.FLOAT:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"expected a number, got {value!r}")
            try:
                number = float(value)
            except OverflowError:  # an integer of hundreds of digits: an internal error before
                raise ValueError(
                    f"expected a number a float can hold, got an integer of {len(str(value))} "
                    "digits"
                ) from None
            return number
        if self.kind is ParamKind.BOOL:
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {value!r}")
            return value
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value

    def to_json(self, value: Any) -> Any:
        if value is None:
            return None
        if self.kind is ParamKind.ENUM:
            if self.enum_style == "upper":
                return value.name
            if self.enum_style == "int":
                return value.value
            return value.json_name
        if self.kind is ParamKind.INT_LIST:
            return list(value)
        return value


@dataclass(frozen=True)
class OpSpec:
    """Everything dnntune knows about one operation, independent of any engine."""

    kind: OpKind
    json_type: str
    builder_name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optional_inputs: tuple[str, ...] = ()
    optional_outputs: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    #: "parameters" for most nodes; SDPA uses "attributes" as hipDNN does
    params_key: str = "parameters"
    #: RFC 0013 section 6.5 core-operation priority
    priority: int = 10
    #: fills in dims/strides/dtype of outputs with empty dims, then checks everything
    check: Callable[[Node], None] = field(default=lambda node: None)
    #: checks data types once the graph has filled in the unset ones (besides float_fields)
    check_types: Callable[[Node], None] = field(default=lambda node: None)
    #: drops parameters that restate something else from the graph key (SDPA bounds that
    #: validation turned into a causal flag), so equivalent spellings share a key
    key_params: Callable[[Node, dict[str, Any]], dict[str, Any]] = field(
        default=lambda node, params: params
    )
    #: JSON keys hipDNN requires but dnntune does not model, written with these values
    #: ("section.key", or "key" for the node object); a loaded file may only hold these values
    json_constants: dict[str, Any] = field(default_factory=dict)
    #: tensor uids sit on the node object itself instead of in "inputs"/"outputs" maps
    flat_io: bool = False
    #: JSON keys of tensor fields that hipDNN spells differently (reduction ``in_tensor_uid``)
    json_fields: dict[str, str] = field(default_factory=dict)
    #: optional tensor fields hipDNN requires to be present: written as ``null`` when unset
    null_fields: tuple[str, ...] = ()
    #: tensor fields that must have a floating-point data type
    float_fields: tuple[str, ...] = ()

    @property
    def all_inputs(self) -> tuple[str, ...]:
        return self.inputs + self.optional_inputs

    @property
    def all_outputs(self) -> tuple[str, ...]:
        return self.outputs + self.optional_outputs

    def has_param(self, name: str) -> bool:
        return any(p.name == name for p in self.params)

    def location(self, name: str) -> Location:
        """Where hipDNN writes tensor field or parameter ``name`` in a node object."""
        if name in self.all_inputs or name in self.all_outputs:
            key = self.json_fields.get(name, name)
            if self.flat_io:
                return ("", key)
            return ("inputs" if name in self.all_inputs else "outputs", key)
        p = self.param(name)
        return (self.params_key if p.section is None else p.section, p.key)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def criteria(self, node: Node) -> dict[str, int]:
        """Int-encoded behavioural attributes (override-file ``criteria``)."""
        out: dict[str, int] = {}
        for p in self.params:
            if p.criterion and node.params.get(p.name) is not None:
                value = node.params[p.name]
                out[p.criterion] = int(value.value if isinstance(value, enum.Enum) else value)
        return out
