"""Analytic FLOP and byte counts per graph, for TFLOP/s and GB/s columns.

FLOPs follow the dnn-benchmarking formulas: conv (all directions) 2*N*(C/g)*R*S*K*out_spatial,
matmul 2*batch*M*N*K, SDPA 2*B*Hq*(non-masked score entries)*(Dqk+Dv), batch norm inference 4
per element and training 8, layer/RMS norm 8 per element, pointwise 1 per output element,
reduction 1 per input element, pooling window-size per output element. Bytes = sum of the sizes
of the non-virtual tensors (a lower bound on traffic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind

__all__ = ["GraphMetrics", "graph_metrics"]


def _t(node: Node, field: str) -> list[int]:
    t = node.inputs.get(field) or node.outputs.get(field)
    return list(t.dims) if t is not None else []


def _conv(node: Node, out_field: str, x_field: str, w_field: str) -> float:
    w = _t(node, w_field)
    if node.kind is OpKind.CONV_FPROP:
        out = _t(node, "y_tensor_uid")
    else:
        out = _t(node, "dy_tensor_uid")
    n, k = out[0], out[1]
    return 2.0 * n * k * prod(w[1:]) * prod(out[2:])


def _matmul(node: Node) -> float:
    a, c = _t(node, "a_tensor_uid"), _t(node, "c_tensor_uid")
    return 2.0 * prod(c) * a[-1]


def _sdpa(node: Node) -> float:
    b, h, sq, d = _t(node, "q_tensor_uid")
    skv = _t(node, "k_tensor_uid")[2]
    dv = _t(node, "v_tensor_uid")[3]
    if node.params.get("causal_mask") or node.params.get("causal_mask_bottom_right"):
        # Entries on or below the diagonal (top-left or bottom-right aligned).
        offset = skv - sq if node.params.get("causal_mask_bottom_right") else 0
        kept = sum(max(0, min(skv, i + offset + 1)) for i in range(sq))
    else:
        kept = sq * skv
    return 2.0 * b * h * kept * (d + dv)


def _per_elem(field: str, flops: float) -> Callable[[Node], float]:
    return lambda node: flops * prod(_t(node, field))


def _pool(node: Node) -> float:
    return float(prod(_t(node, "y_tensor_uid")) * prod(node.params.get("window") or [1]))


_FLOPS: dict[OpKind, Callable[[Node], float]] = {
    OpKind.CONV_FPROP: lambda n: _conv(n, "y_tensor_uid", "x_tensor_uid", "w_tensor_uid"),
    OpKind.CONV_DGRAD: lambda n: _conv(n, "dx_tensor_uid", "dy_tensor_uid", "w_tensor_uid"),
    OpKind.CONV_WGRAD: lambda n: _conv(n, "dw_tensor_uid", "x_tensor_uid", "dw_tensor_uid"),
    OpKind.MATMUL: _matmul,
    OpKind.SDPA: _sdpa,
    OpKind.POINTWISE: _per_elem("out_0_tensor_uid", 1.0),
    OpKind.REDUCTION: _per_elem("x_tensor_uid", 1.0),
    OpKind.LAYERNORM: _per_elem("x_tensor_uid", 8.0),
    OpKind.RMSNORM: _per_elem("x_tensor_uid", 8.0),
    OpKind.BATCHNORM: _per_elem("x_tensor_uid", 8.0),
    OpKind.BATCHNORM_INFERENCE: _per_elem("x_tensor_uid", 4.0),
    OpKind.BATCHNORM_BACKWARD: _per_elem("x_tensor_uid", 8.0),
    OpKind.RESAMPLE: _pool,
}


@dataclass(frozen=True)
class GraphMetrics:
    flops: float
    io_bytes: int

    def tflops(self, median_ms: float) -> float | None:
        return self.flops / (median_ms * 1e-3) / 1e12 if median_ms > 0 else None

    def gbps(self, median_ms: float) -> float | None:
        return self.io_bytes / (median_ms * 1e-3) / 1e9 if median_ms > 0 else None


def graph_metrics(graph: OpGraph) -> GraphMetrics:
    """FLOPs (sum over nodes) and bytes (non-virtual tensors) of a validated graph."""
    flops = sum(_FLOPS[node.kind](node) for node in graph.nodes)
    io_bytes = sum(
        t.numel * (t.data_type.itemsize if t.data_type else 4) for t in graph.io_tensors()
    )
    return GraphMetrics(flops=float(flops), io_bytes=int(io_bytes))
