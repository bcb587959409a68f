"""Graphs shared by the TRITON_ENGINE tests (CPU and GPU)."""

from __future__ import annotations

from collections.abc import Sequence

import dnntune as dt

P = dt.PointwiseMode
F, H, BF = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16


def _graph(dtype: dt.DataType, name: str) -> dt.Graph:
    return dt.Graph(
        name=name,
        io_data_type=dtype,
        compute_data_type=F,
        intermediate_data_type=F,
    )


def matmul_graph(
    m: int,
    n: int,
    k: int,
    dtype: dt.DataType = H,
    epilogue: Sequence[str] = ("bias", "gelu"),
    batch: int | None = None,
    b_transposed: bool = False,
) -> dt.Graph:
    """C = A @ B then the epilogue: bias (row vector), res (full), gelu, gelu_tanh, silu,
    relu, scale (times 0.5)."""
    g = _graph(dtype, "matmul_" + "_".join(epilogue))
    bd = [batch] if batch else []
    a = g.tensor("A", [*bd, m, k])
    if b_transposed:
        strides = [*([k * n] if batch else []), 1, k]
        b = g.tensor("B", [*bd, k, n], strides=strides)
    else:
        b = g.tensor("B", [*bd, k, n])
    y = g.matmul(a, b)
    for step in epilogue:
        if step == "bias":
            y = g.pointwise(y, g.tensor("bias", [*([1] * len(bd)), 1, n]), mode=P.ADD)
        elif step == "res":
            y = g.pointwise(y, g.tensor("res", [*bd, m, n]), mode=P.ADD)
        elif step == "scale":
            y = g.pointwise(y, 0.5, mode=P.MUL)
        else:
            mode = {
                "gelu": P.GELU_FWD,
                "gelu_tanh": P.GELU_APPROX_TANH_FWD,
                "silu": P.SWISH_FWD,
                "relu": P.RELU_FWD,
            }[step]
            y = g.pointwise(y, mode=mode)
    y.set_output(True)
    g.validate()
    return g


def norm_graph(
    op: str,
    rows: Sequence[int],
    n: int,
    dtype: dt.DataType = BF,
    training: bool = False,
    bias: bool = True,
) -> dt.Graph:
    """layernorm ("ln") or rmsnorm ("rms") over the last dim of ``[*rows, n]``."""
    g = _graph(dtype, f"{op}_norm")
    ones = [1] * len(rows)
    x = g.tensor("X", [*rows, n])
    w = g.tensor("W", [*ones, n])
    phase = dt.NormFwdPhase.TRAINING if training else dt.NormFwdPhase.INFERENCE
    if op == "ln":
        b = g.tensor("B", [*ones, n])
        outs = g.layernorm(x, w, b, 1e-5, forward_phase=phase, normalized_dim_count=1)
    else:
        b = g.tensor("B", [*ones, n]) if bias else None
        outs = g.rmsnorm(x, w, 1e-6, b, forward_phase=phase, normalized_dim_count=1)
    for t in outs:
        t.set_output(True)
    g.validate()
    return g


def reduction_graph(
    rows: int, n: int, mode: dt.ReductionMode, dtype: dt.DataType = H, axis: int = 1
) -> dt.Graph:
    g = _graph(dtype, "reduction")
    x = g.tensor("X", [rows, n])
    y = g.reduction(x, mode=mode, axes=[axis])
    y.set_output(True)
    y.set_data_type(F)
    g.validate()
    return g


def pointwise_graph(dims: Sequence[int], dtype: dt.DataType = BF) -> dt.Graph:
    """(x + b) -> tanh -> * r -> softplus, with b broadcast over the last dim and a second
    output; then select(softplus, x, x > 0.3): a broadcast, a scalar, a comparison (of an
    input, so that rounding never flips it) and a select."""
    g = _graph(dtype, "pointwise_chain")
    x = g.tensor("X", list(dims))
    b = g.tensor("b", [*([1] * (len(dims) - 1)), dims[-1]])
    r = g.tensor("r", list(dims))
    y = g.pointwise(x, b, mode=P.ADD)
    t = g.pointwise(y, mode=P.TANH_FWD)
    t.set_output(True)
    z = g.pointwise(g.pointwise(t, r, mode=P.MUL), mode=P.SOFTPLUS_FWD)
    mask = g.pointwise(x, 0.3, mode=P.CMP_GT)
    out = g.pointwise(z, x, mask, mode=P.BINARY_SELECT)
    out.set_output(True)
    g.validate()
    return g


def conv_graph() -> dt.Graph:
    g = _graph(H, "conv")
    x = g.tensor("X", [2, 8, 8, 8])
    w = g.tensor("W", [8, 8, 3, 3])
    y = g.conv_fprop(x, w, padding=1)
    y.set_output(True)
    g.validate()
    return g


def attention_graph(
    q: Sequence[int],
    kv: Sequence[int],
    dtype: dt.DataType = H,
    *,
    mask: Sequence[int] | None = None,
    mask_type: dt.DataType | None = None,
    causal: bool = False,
    bottom_right: bool = False,
    scale: float | None = None,
    stats: bool = False,
    interleaved: bool = False,
    dv: int | None = None,
) -> dt.Graph:
    """softmax(q k^T * scale + mask) v on [B, H, S, D] tensors; kv is k's dims (v's unless
    ``dv``). ``interleaved``: q, k and v as a Linear's qkv output lays them out ([B, S, 3, H, D]
    permuted: the heads and rows strided, a Swin or ViT block's attention); ``mask_type``:
    the mask's type (default the io type; BOOLEAN for a boolean mask)."""
    g = _graph(dtype, "attention")
    _, h, sq, d = q
    if interleaved:
        assert list(kv) == list(q) and dv is None, "an interleaved qkv has one shape"
        strides = [sq * 3 * h * d, d, 3 * h * d, 1]
        qt, kt, vt = (g.tensor(n, list(q), strides=strides) for n in "qkv")
    else:
        qt, kt = g.tensor("q", list(q)), g.tensor("k", list(kv))
        vt = g.tensor("v", [*kv[:3], kv[3] if dv is None else dv])
    mt = None if mask is None else g.tensor("mask", list(mask), data_type=mask_type or dtype)
    outs = g.sdpa(
        qt,
        kt,
        vt,
        attn_mask=mt,
        causal_mask=causal,
        causal_mask_bottom_right=bottom_right,
        attn_scale=scale,
        generate_stats=stats,
    )
    for t in outs:
        t.set_output(True)
    g.validate()
    return g
