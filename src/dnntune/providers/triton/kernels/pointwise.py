"""Any pointwise-only graph as one fused Triton kernel, generated per problem.

The iteration space is the output's (coalesced) dims; each program handles ``block_n`` flat
elements. Tensors whose layout matches the space's row-major order are read at the flat index;
broadcast or strided ones get an index decomposed with compile-time dims (cheap: constants).
"""

from __future__ import annotations

import math

from dnntune.providers.triton.kernels.codegen import PRELUDE, emit_ops, load_module
from dnntune.providers.triton.kernels.launch import OneKernel
from dnntune.providers.triton.patterns import Operand, PointwiseMatch
from dnntune.providers.triton.solvers import Config

__all__ = ["PointwiseLauncher", "source"]

_INT32_MAX = 2**31 - 1


def _row_major(dims: tuple[int, ...]) -> list[int]:
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    return strides


def _needs_int64(dims: tuple[int, ...], operands: list[Operand]) -> bool:
    numel = math.prod(dims)
    reach = max(
        (sum((d - 1) * abs(s) for d, s in zip(dims, o.strides, strict=True)) for o in operands),
        default=0,
    )
    return numel + 2**16 > _INT32_MAX or reach > _INT32_MAX


def source(match: PointwiseMatch) -> str:
    """The generated module text: one ``kernel(ptrs..., numel, BLOCK)``."""
    ew = match.expr
    dims = ew.space
    contiguous = _row_major(dims)
    operands = [*ew.inputs, *(o for _, o in ew.outputs)]
    i64 = _needs_int64(dims, operands)

    def offset(o: Operand) -> str:
        if list(o.strides) == contiguous:
            return "offs"
        terms = [f"i{d} * {s}" for d, s in enumerate(o.strides) if s != 0 and dims[d] != 1]
        return " + ".join(terms) if terms else "offs * 0"

    ptrs = [f"p_in{i}" for i in range(len(ew.inputs))]
    ptrs += [f"p_out{j}" for j in range(len(ew.outputs))]
    lines = [
        PRELUDE,
        "",
        "@triton.jit",
        f"def kernel({', '.join(ptrs)}, numel, BLOCK: tl.constexpr):",
    ]
    lines.append("    pid = tl.program_id(0)")
    start = "pid.to(tl.int64) * BLOCK" if i64 else "pid * BLOCK"
    lines.append(f"    offs = {start} + tl.arange(0, BLOCK)")
    lines.append("    mask = offs < numel")
    if any(offset(o) not in ("offs", "offs * 0") for o in operands):
        lines.append("    r = offs")
        for d in range(len(dims) - 1, 0, -1):
            lines.append(f"    i{d} = r % {dims[d]}")
            lines.append(f"    r = r // {dims[d]}")
        lines.append("    i0 = r")
    for i, o in enumerate(ew.inputs):
        lines.append(
            f"    in{i} = tl.load(p_in{i} + ({offset(o)}), mask=mask, other=0.0).to(tl.float32)"
        )
    lines += emit_ops(ew.ops)
    for j, (value, o) in enumerate(ew.outputs):
        lines.append(
            f"    tl.store(p_out{j} + ({offset(o)}), {value}.to(p_out{j}.dtype.element_ty), "
            "mask=mask)"
        )
    return "\n".join(lines) + "\n"


class PointwiseLauncher(OneKernel):
    """Runs the generated kernel on a variant pack; built once per plan."""

    def __init__(self, match: PointwiseMatch, config: Config) -> None:
        kernel = load_module("pointwise", source(match)).kernel
        ew = match.expr
        self.uids = [o.uid for o in ew.inputs] + [o.uid for _, o in ew.outputs]
        self.numel = match.numel
        meta = {"BLOCK": config["block_n"], "num_warps": config["num_warps"]}
        grid = (max(1, math.ceil(self.numel / config["block_n"])),)
        super().__init__(kernel, grid, meta, self.uids, (self.numel,))
