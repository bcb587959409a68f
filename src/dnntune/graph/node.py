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
    """

    name: str
    kind: OpKind
    inputs: dict[str, TensorAttributes | None]
    outputs: dict[str, TensorAttributes | None]
    params: dict[str, Any] = field(default_factory=dict)
    compute_data_type: DataType | None = None
    #: fields of a loaded JSON node that dnntune does not model, kept for exact round trips
    json_extra: dict[str, Any] = field(default_factory=dict)

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
