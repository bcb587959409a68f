"""Batch-norm inference of channels-last (NHWC) data, with a fused pointwise epilogue.

``y = (x - mean) * inv_variance * scale + bias`` per channel, in float32. The data is a
[pixels, channels] matrix with contiguous rows; each program covers ``BLOCK_P`` pixels x
``BLOCK_C`` channels: it loads its channels' statistics once and folds them into ``a =
inv_variance * scale`` in registers, then streams one [pixels, channels] tile of ``x`` (16-byte
vector loads along C) and computes ``(x - mean) * a + bias``, an FMA per element that keeps the
reference's subtraction first (no cancellation in ``x * a + (bias - mean * a)`` when the
mean is large). The epilogue (any pointwise DAG after the batch norm: ReLU, a residual add...)
runs on that value in registers and every graph output is stored once.

The kernel is generated per epilogue (:mod:`.codegen`); pixel strides and sizes are runtime
arguments, channel strides (0 or 1 for the data, any for the statistics) are literals. Where
the tile divides the problem (``EVEN_P``, ``EVEN_C``) loads and stores carry no mask; ``x`` and
the outputs are streamed (evict-first), the statistics, which every program reads, evict-last.
"""

from __future__ import annotations

import math

from dnntune.providers.triton.batchnorm_match import BatchnormMatch
from dnntune.providers.triton.expression import Operand
from dnntune.providers.triton.kernels.codegen import PRELUDE, emit_ops, load_module
from dnntune.providers.triton.kernels.launch import OneKernel
from dnntune.providers.triton.solvers import Config

__all__ = ["BatchnormLauncher", "source"]

_STAT_NAMES = ("mean", "inv", "scale", "bias")


def _masked(indent: str, even: str, plain: str, masked: str) -> list[str]:
    """``plain`` where ``even`` (a constexpr condition) holds, else ``masked``."""
    return [
        f"{indent}if {even}:",
        f"{indent}    {plain}",
        f"{indent}else:",
        f"{indent}    {masked}",
    ]


def _channel_vector(name: str, ptr: str, stride: int, evict: str) -> list[str]:
    """Load a per-channel vector ``name`` [BLOCK_C] as fp32."""
    offs = f"{ptr} + rc * {stride}"
    return _masked(
        "    ",
        "EVEN_C",
        f"{name} = tl.load({offs}, eviction_policy={evict!r}).to(tl.float32)",
        f"{name} = tl.load({offs}, mask=cmask, other=0.0, eviction_policy={evict!r})"
        ".to(tl.float32)",
    )


def _epilogue_input(i: int, o: Operand) -> list[str]:
    """Load epilogue input ``in<i>`` broadcast to the tile (scalar, per channel, per pixel or
    a full tile)."""
    sp, sc = o.strides
    name, ptr = f"in{i}", f"p_in{i}"
    if sp == 0 and sc == 0:
        return [f"    {name} = tl.load({ptr}).to(tl.float32)"]
    if sp == 0:
        lines = _channel_vector(name, ptr, sc, "evict_last")
        return [*lines, f"    {name} = {name}[None, :]"]
    if sc == 0:
        offs = f"{ptr} + rp_o * s_in{i}"
        lines = _masked(
            "    ",
            "EVEN_P",
            f"{name} = tl.load({offs}).to(tl.float32)",
            f"{name} = tl.load({offs}, mask=pmask, other=0.0).to(tl.float32)",
        )
        return [*lines, f"    {name} = {name}[:, None]"]
    offs = f"{ptr} + rp_o[:, None] * s_in{i} + rc[None, :] * {sc}"
    return _masked(
        "    ",
        "EVEN_P and EVEN_C",
        f"{name} = tl.load({offs}, eviction_policy='evict_first').to(tl.float32)",
        f"{name} = tl.load({offs}, mask=mask, other=0.0, eviction_policy='evict_first')"
        ".to(tl.float32)",
    )


def source(match: BatchnormMatch) -> str:
    """The generated module text: one ``kernel(ptrs..., P, C, pixel strides..., meta)``."""
    ew = match.epilogue
    ptrs = ["p_x", *(f"p_{n}" for n in _STAT_NAMES)]
    ptrs += [f"p_in{i}" for i in range(len(ew.inputs))]
    ptrs += [f"p_out{j}" for j in range(len(ew.outputs))]
    strides = ["s_x", *(f"s_in{i}" for i in range(len(ew.inputs)))]
    strides += [f"s_out{j}" for j in range(len(ew.outputs))]
    x_sc = match.x.strides[1]
    lines = [
        PRELUDE,
        "",
        "@triton.jit",
        f"def kernel({', '.join(ptrs)}, P, C, {', '.join(strides)},",
        "           BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,",
        "           EVEN_P: tl.constexpr, EVEN_C: tl.constexpr):",
        "    rp = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)",
        "    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
        "    pmask = rp < P",
        "    cmask = rc < C",
        "    mask = pmask[:, None] & cmask[None, :]",
        "    rp_o = rp.to(tl.int64)",
    ]
    # the statistics, once per program, folded into a = inv_variance * scale
    for name, o in zip(_STAT_NAMES, match.stats, strict=True):
        lines += _channel_vector(name, f"p_{name}", o.strides[0], "evict_last")
    lines.append("    a = inv * scale")
    x_offs = f"p_x + rp_o[:, None] * s_x + rc[None, :] * {x_sc}"
    lines += _masked(
        "    ",
        "EVEN_P and EVEN_C",
        f"x = tl.load({x_offs}, eviction_policy='evict_first')",
        f"x = tl.load({x_offs}, mask=mask, other=0.0, eviction_policy='evict_first')",
    )
    lines.append("    acc = (x.to(tl.float32) - mean[None, :]) * a[None, :] + bias[None, :]")
    for i, o in enumerate(ew.inputs):
        lines += _epilogue_input(i, o)
    lines += emit_ops(ew.ops)
    for j, (value, o) in enumerate(ew.outputs):
        offs = f"p_out{j} + rp_o[:, None] * s_out{j} + rc[None, :] * {o.strides[1]}"
        out = f"{value}.to(p_out{j}.dtype.element_ty)"
        lines += _masked(
            "    ",
            "EVEN_P and EVEN_C",
            f"tl.store({offs}, {out}, eviction_policy='evict_first')",
            f"tl.store({offs}, {out}, mask=mask, eviction_policy='evict_first')",
        )
    return "\n".join(lines) + "\n"


class BatchnormLauncher(OneKernel):
    """Runs the generated kernel on a variant pack; built once per plan."""

    def __init__(self, match: BatchnormMatch, config: Config) -> None:
        kernel = load_module("batchnorm", source(match)).kernel
        ew = match.epilogue
        self.uids = [match.x.uid, *(o.uid for o in match.stats)]
        self.uids += [o.uid for o in ew.inputs] + [o.uid for _, o in ew.outputs]
        block_p, block_c = config["block_m"], config["block_n"]
        self.scalars = (
            match.pixels,
            match.channels,
            match.x.strides[0],
            *(o.strides[0] for o in ew.inputs),
            *(o.strides[0] for _, o in ew.outputs),
        )
        meta = {
            "BLOCK_P": block_p,
            "BLOCK_C": block_c,
            "EVEN_P": match.pixels % block_p == 0,
            "EVEN_C": match.channels % block_c == 0,
            "num_warps": config["num_warps"],
        }
        grid = (
            max(1, math.ceil(match.pixels / block_p)),
            max(1, math.ceil(match.channels / block_c)),
        )
        super().__init__(kernel, grid, meta, self.uids, self.scalars)
