"""The graph intermediate representation: tensors, nodes, op specs, validation, JSON, key."""

from dnntune.graph.builders import GraphBuilder
from dnntune.graph.ir import OpGraph, TensorError
from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops import ConvMode, OpSpec, spec_for
from dnntune.graph.ops.base import NodeError
from dnntune.graph.ops.sdpa import DiagonalAlignment
from dnntune.graph.signature import graph_key
from dnntune.graph.tensor import TensorAttributes, channels_last_strides, contiguous_strides
from dnntune.graph.types import DataType, NormFwdPhase, PointwiseMode, ReductionMode, ResampleMode

__all__ = [
    "ConvMode",
    "DataType",
    "DiagonalAlignment",
    "GraphBuilder",
    "Node",
    "NodeError",
    "NormFwdPhase",
    "OpGraph",
    "OpKind",
    "OpSpec",
    "PointwiseMode",
    "ReductionMode",
    "ResampleMode",
    "TensorAttributes",
    "TensorError",
    "channels_last_strides",
    "contiguous_strides",
    "graph_key",
    "spec_for",
]
