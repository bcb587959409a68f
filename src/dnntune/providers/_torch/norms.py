"""Layer norm, RMS norm and batch norm (training, inference, backward) as ATen calls.

Fused ATen kernels are used where the shapes allow (``F.layer_norm``, ``native_layer_norm``,
``F.rms_norm``, ``native_batch_norm``); statistics outputs the fused kernels do not give, or give
in too low a precision, are computed explicitly in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dnntune.graph.node import Node
from dnntune.graph.tensor import TensorAttributes, channels_last_strides, contiguous_strides
from dnntune.providers._torch.program import LowerContext, Reader, Slots, Step, is_low_precision

__all__ = [
    "lower_batchnorm",
    "lower_batchnorm_backward",
    "lower_batchnorm_inference",
    "lower_layernorm",
    "lower_rmsnorm",
]


def _param_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """Statistics and per-channel parameters: float64 with float64 data, float32 otherwise."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def _epsilon(ctx: LowerContext, t: TensorAttributes, dtype: torch.dtype) -> float | Reader:
    """Epsilon as a number when passed by value, else a reader of its tensor."""
    if t.is_scalar:
        return float(ctx.scalar_value(t))
    return ctx.read(t, dtype)


def _norm_layout(node: Node, x_t: TensorAttributes) -> tuple[list[int], list[int]]:
    """(normalized dims, normalized shape) of a layer/RMS norm."""
    rank = len(x_t.dims)
    count = int(node.params.get("normalized_dim_count") or rank - 1)
    return list(range(rank - count, rank)), list(x_t.dims[rank - count :])


def _fits(t: TensorAttributes | None, shape: list[int]) -> bool:
    return t is None or t.numel == math.prod(shape)


def _read_as(
    ctx: LowerContext, t: TensorAttributes, dtype: torch.dtype, shape: list[int]
) -> Reader:
    """A reader of ``t`` (cast to ``dtype``) with dims ``shape`` (of the same size): the slot
    itself when its dims are ``shape``, a view when they differ only by size-1 dims (valid
    whatever the strides, and half the host time of ``reshape``), else a reshape."""
    read = ctx.read(t, dtype)
    if list(t.dims) == list(shape):
        return read
    if [d for d in t.dims if d != 1] == [d for d in shape if d != 1]:
        return lambda slots: read(slots).view(shape)
    return lambda slots: read(slots).reshape(shape)


def lower_layernorm(ctx: LowerContext, node: Node) -> Step:
    x_t, s_t, b_t, e_t = (
        node.inputs.get(f)
        for f in ("x_tensor_uid", "scale_tensor_uid", "bias_tensor_uid", "epsilon_tensor_uid")
    )
    y_t, mean_t, inv_t = (
        node.outputs.get(f) for f in ("y_tensor_uid", "mean_tensor_uid", "inv_variance_tensor_uid")
    )
    assert x_t is not None and s_t is not None and b_t is not None and e_t is not None
    assert y_t is not None
    dims, shape = _norm_layout(node, x_t)
    x_dtype = ctx.dtype(x_t)
    training = mean_t is not None or inv_t is not None
    fused = e_t.is_scalar and _fits(s_t, shape) and _fits(b_t, shape)
    write_y = ctx.write(y_t)
    write_mean = ctx.write(mean_t) if mean_t is not None else None
    write_inv = ctx.write(inv_t) if inv_t is not None else None

    # native_layer_norm keeps statistics in the input type on the CPU: fp16 stats are too coarse
    if fused and (not training or not is_low_precision(x_dtype) or ctx.device.type == "cuda"):
        eps = float(ctx.scalar_value(e_t))
        read_x, read_s, read_b = ctx.read(x_t), ctx.read(s_t, x_dtype), ctx.read(b_t, x_dtype)
        if not training:
            read_w, read_wb = _read_as(ctx, s_t, x_dtype, shape), _read_as(ctx, b_t, x_dtype, shape)

            def layernorm(slots: Slots) -> None:
                w, b = read_w(slots), read_wb(slots)
                write_y(slots, F.layer_norm(read_x(slots), shape, w, b, eps))

            return layernorm

        def layernorm_training(slots: Slots) -> None:
            w, b = read_s(slots).reshape(shape), read_b(slots).reshape(shape)
            y, mean, rstd = torch.native_layer_norm(read_x(slots), shape, w, b, eps)
            write_y(slots, y)
            if write_mean is not None:
                write_mean(slots, mean)
            if write_inv is not None:
                write_inv(slots, rstd)

        return layernorm_training

    cd = _param_dtype(x_dtype)
    read_x, read_s, read_b = ctx.read(x_t, cd), ctx.read(s_t, cd), ctx.read(b_t, cd)
    eps_value = _epsilon(ctx, e_t, cd)

    def layernorm_explicit(slots: Slots) -> None:
        x = read_x(slots)
        var, mean = torch.var_mean(x, dims, correction=0, keepdim=True)
        eps = eps_value if isinstance(eps_value, float) else eps_value(slots)
        inv = torch.rsqrt(var + eps)
        write_y(slots, torch.addcmul(read_b(slots), (x - mean) * inv, read_s(slots)))
        if write_mean is not None:
            write_mean(slots, mean)
        if write_inv is not None:
            write_inv(slots, inv)

    return layernorm_explicit


def lower_rmsnorm(ctx: LowerContext, node: Node) -> Step:
    x_t, s_t, b_t, e_t = (
        node.inputs.get(f)
        for f in ("x_tensor_uid", "scale_tensor_uid", "bias_tensor_uid", "epsilon_tensor_uid")
    )
    y_t, inv_t = node.outputs.get("y_tensor_uid"), node.outputs.get("inv_rms_tensor_uid")
    assert x_t is not None and s_t is not None and e_t is not None and y_t is not None
    dims, shape = _norm_layout(node, x_t)
    x_dtype = ctx.dtype(x_t)
    write_y = ctx.write(y_t)

    if inv_t is None and e_t.is_scalar and _fits(s_t, shape):
        eps = float(ctx.scalar_value(e_t))
        read_x, read_w = ctx.read(x_t), _read_as(ctx, s_t, x_dtype, shape)
        read_b = ctx.read(b_t, x_dtype) if b_t is not None else None

        def rmsnorm(slots: Slots) -> None:
            y = F.rms_norm(read_x(slots), shape, read_w(slots), eps)
            write_y(slots, y if read_b is None else y + read_b(slots))

        return rmsnorm

    cd = _param_dtype(x_dtype)
    read_x, read_s = ctx.read(x_t, cd), ctx.read(s_t, cd)
    read_bias = ctx.read(b_t, cd) if b_t is not None else None
    eps_value = _epsilon(ctx, e_t, cd)
    write_inv = ctx.write(inv_t) if inv_t is not None else None

    def rmsnorm_explicit(slots: Slots) -> None:
        x = read_x(slots)
        eps = eps_value if isinstance(eps_value, float) else eps_value(slots)
        inv = torch.rsqrt(torch.mean(x * x, dims, keepdim=True) + eps)
        y = x * inv * read_s(slots)
        write_y(slots, y if read_bias is None else y + read_bias(slots))
        if write_inv is not None:
            write_inv(slots, inv)

    return rmsnorm_explicit


def _channels(x_t: TensorAttributes) -> tuple[int, list[int]]:
    """(C, the [1, C, 1, ...] shape of per-channel tensors)."""
    c = x_t.dims[1]
    return c, [1, c, *([1] * (len(x_t.dims) - 2))]


def _dense(t: TensorAttributes) -> bool:
    """True if ``t`` is packed row-major or channels-last (size-1 dimensions' strides aside)."""
    return t.has_layout(contiguous_strides(t.dims)) or t.has_layout(channels_last_strides(t.dims))


def lower_batchnorm(ctx: LowerContext, node: Node) -> Step:
    get = node.inputs.get
    x_t, s_t, b_t = get("x_tensor_uid"), get("scale_tensor_uid"), get("bias_tensor_uid")
    pm_t, pv_t = get("prev_running_mean_tensor_uid"), get("prev_running_variance_tensor_uid")
    assert x_t is not None and s_t is not None and b_t is not None
    out = node.outputs.get
    eps = ctx.constant(get("epsilon_tensor_uid"), "epsilon", node)
    running = pm_t is not None and pv_t is not None
    momentum = ctx.constant(get("momentum_tensor_uid"), "momentum", node) if running else 0.0
    c, stat_shape = _channels(x_t)
    pd = _param_dtype(ctx.dtype(x_t))
    # A half or bfloat16 x that is neither row-major nor channels-last (a padded or sliced
    # view) gets a mean rounded to the input's type from ATen's CUDA kernel (1 of 13 channels
    # off by 2.3e-5 of 0.065 in dnntune's H200 conformance sweep, issue 20): read such an x
    # as float32, which is also the copy to a dense layout that kernel would make.
    x_dtype = ctx.dtype(x_t)
    read_as = pd if x_dtype in (torch.float16, torch.bfloat16) and not _dense(x_t) else None
    read_x, read_s, read_b = ctx.read(x_t, read_as), ctx.read(s_t, pd), ctx.read(b_t, pd)
    read_pm = ctx.read(pm_t, pd) if pm_t is not None else None
    read_pv = ctx.read(pv_t, pd) if pv_t is not None else None
    y_t = out("y_tensor_uid")
    assert y_t is not None
    write_y = ctx.write(y_t)
    stat_writers = [
        (ctx.write(t), i)
        for i, t in enumerate(
            (
                out("mean_tensor_uid"),
                out("inv_variance_tensor_uid"),
                out("next_running_mean_tensor_uid"),
                out("next_running_variance_tensor_uid"),
            )
        )
        if t is not None
    ]

    def batchnorm(slots: Slots) -> None:
        rm: torch.Tensor | None = None
        rv: torch.Tensor | None = None
        if read_pm is not None and read_pv is not None:
            # native_batch_norm updates running statistics in place: give it copies
            rm = read_pm(slots).reshape(c).clone()
            rv = read_pv(slots).reshape(c).clone()
        y, mean, invstd = torch.native_batch_norm(
            read_x(slots),
            read_s(slots).reshape(c),
            read_b(slots).reshape(c),
            rm,
            rv,
            True,
            momentum,
            eps,
        )
        write_y(slots, y)
        stats = (mean, invstd, rm, rv)
        for write, i in stat_writers:
            value = stats[i]
            assert value is not None
            write(slots, value.reshape(stat_shape))

    return batchnorm


def lower_batchnorm_inference(ctx: LowerContext, node: Node) -> Step:
    get = node.inputs.get
    x_t = get("x_tensor_uid")
    y_t = node.outputs.get("y_tensor_uid")
    assert x_t is not None and y_t is not None
    _, shape = _channels(x_t)
    x_dtype = ctx.dtype(x_t)
    pd = _param_dtype(x_dtype)
    readers = []
    for f in ("mean_tensor_uid", "inv_variance_tensor_uid", "scale_tensor_uid", "bias_tensor_uid"):
        t = get(f)
        assert t is not None
        readers.append(ctx.read(t, pd))
    read_mean, read_inv, read_s, read_b = readers
    read_x, write = ctx.read(x_t), ctx.write(y_t)
    # Writing straight into the caller's buffer keeps its layout (NHWC stays NHWC) and saves
    # a full copy; measured on the H200, the copy made this op 1.7x slower than F.batch_norm.
    out_slot = ctx.out_buffer(y_t, x_dtype)

    def batchnorm_inference(slots: Slots) -> None:
        # y = x * a + b with a = inv_var * scale and b = bias - mean * a, per channel
        a = read_inv(slots).reshape(shape) * read_s(slots).reshape(shape)
        b = read_b(slots).reshape(shape) - read_mean(slots).reshape(shape) * a
        if out_slot is not None:
            torch.addcmul(b.to(x_dtype), read_x(slots), a.to(x_dtype), out=slots[out_slot])
            return
        write(slots, torch.addcmul(b.to(x_dtype), read_x(slots), a.to(x_dtype)))

    return batchnorm_inference


def lower_batchnorm_backward(ctx: LowerContext, node: Node) -> Step:
    get = node.inputs.get
    dy_t, x_t = get("dy_tensor_uid"), get("x_tensor_uid")
    m_t, i_t, s_t = get("mean_tensor_uid"), get("inv_variance_tensor_uid"), get("scale_tensor_uid")
    assert dy_t is not None and x_t is not None and m_t is not None and i_t is not None
    assert s_t is not None
    out = node.outputs.get
    dx_t, ds_t, db_t = out("dx_tensor_uid"), out("dscale_tensor_uid"), out("dbias_tensor_uid")
    assert dx_t is not None and ds_t is not None and db_t is not None
    c, shape = _channels(x_t)
    # In half or bfloat16, ATen's backward works with x - mean in the input's type: the
    # rounding of mean alone shifts dscale by (mean - rounded mean) * inv_var * sum(dy), 0.5
    # on a 3x65536 bf16 batch (dnntune's H200 conformance sweep, issue 20). The gradients are
    # float32 math, as the graph's compute type says: read the inputs as float32.
    dtype = ctx.promote(dy_t, x_t)
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    pd = _param_dtype(dtype)
    read_dy, read_x = ctx.read(dy_t, dtype), ctx.read(x_t, dtype)
    read_m, read_i, read_s = ctx.read(m_t, pd), ctx.read(i_t, pd), ctx.read(s_t, pd)
    write_dx, write_ds, write_db = ctx.write(dx_t), ctx.write(ds_t), ctx.write(db_t)
    mask = [True, True, True]

    def batchnorm_backward(slots: Slots) -> None:
        dx, dscale, dbias = torch.ops.aten.native_batch_norm_backward(
            read_dy(slots),
            read_x(slots),
            read_s(slots).reshape(c),
            None,
            None,
            read_m(slots).reshape(c),
            read_i(slots).reshape(c),
            True,
            0.0,
            mask,
        )
        write_dx(slots, dx)
        write_ds(slots, dscale.reshape(shape))
        write_db(slots, dbias.reshape(shape))

    return batchnorm_backward
