"""Node: one operation of a graph, with its input/output tensors by field name and parameters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType

__all__ = ["Node", "OpKind"]


class OpKind(enum.Enum):
    """The operation a node performs. The value is the override-file op family name."""

    CONV_FPROP = "conv_fprop"
    CONV_DGRAD = "conv_dgrad"
    CONV_WGRAD = "conv_wgrad"
    MATMUL = "matmul"
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"
    BATCHNORM = "batchnorm_training"
    BATCHNORM_INFERENCE = "batchnorm_inference"
    BATCHNORM_BACKWARD = "batchnorm_backward"
    SDPA = "sdpa_fwd"
    RESAMPLE = "resample_fwd"


@dataclass(eq=False)
class Node:
    """An operation: ``inputs``/``outputs`` map hipDNN field names (``x_tensor_uid``) to tensors.

    Optional fields that are absent map to None. ``params`` holds the parsed parameters (enums
    as enum members, lists as lists of int); the op's spec defines their names and defaults.
    Validation fills in parameters the caller left out (``stride`` of a conv, the
    ``normalized_dim_count`` of a norm); ``inferred`` records those values so that the JSON
    writer can tell them from values the caller chose.
    """

    name: str
    kind: OpKind
    inputs: dict[str, TensorAttributes | None]
    outputs: dict[str, TensorAttributes | None]
    params: dict[str, Any] = field(default_factory=dict)
    compute_data_type: DataType | None = None
    #: keys of a loaded JSON node that dnntune does not model (kept in ``json_source``)
    json_extra: dict[str, Any] = field(default_factory=dict)
    #: parameters filled in by validation, with the value it chose
    inferred: dict[str, Any] = field(default_factory=dict)
    #: the JSON object this node was loaded from (the writer patches it: exact round trips)
    json_source: dict[str, Any] | None = None
    #: where each field/parameter was found in ``json_source``: name -> (section, key);
    #: section "" is the node object itself
    json_locations: dict[str, tuple[str, str]] = field(default_factory=dict)

    def infer(self, name: str, value: Any) -> Any:
        """Set a parameter the caller left unset, remembering that validation chose it."""
        self.params[name] = value
        self.inferred[name] = value
        return value

    def input(self, field_name: str) -> TensorAttributes | None:
        return self.inputs.get(field_name)

    def output(self, field_name: str) -> TensorAttributes | None:
        return self.outputs.get(field_name)

    def tensors(self) -> list[TensorAttributes]:
        """Every tensor the node touches, inputs first, in field order."""
        seen: list[TensorAttributes] = []
        for t in [*self.inputs.values(), *self.outputs.values()]:
            if t is not None and all(t is not s for s in seen):
                seen.append(t)
        return seen

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.kind.value})"
