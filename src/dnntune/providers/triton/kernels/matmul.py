"""Matmul with a fused pointwise epilogue, optionally split-K, generated per epilogue shape.

``C[b] = A[b] @ B[b]`` tiled ``block_m x block_n``, walking K in ``block_k`` steps with an fp32
accumulator (``tl.dot``; fp32 inputs use IEEE precision, not TF32). Tile order is grouped by
``group_m`` rows for L2 reuse. The epilogue (bias, activation, residual, scaling: any pointwise
DAG of the graph) runs on the accumulator in registers and stores every graph output once.

With ``split_k > 1`` each split writes its partial sums to an fp32 workspace
``[split_k, batch, M, N]`` and a second kernel adds the splits in a fixed order (deterministic,
no atomics) and runs the epilogue there.

Sizes and strides are runtime arguments, so one compiled kernel serves every shape with the
same epilogue structure (Triton specializes on unit strides and 16-divisibility by itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dnntune.errors import InvalidValueError
from dnntune.graph.types import DataType
from dnntune.providers.triton.kernels.codegen import PRELUDE, emit_ops, load_module
from dnntune.providers.triton.kernels.launch import WORKSPACE, Launch, gatherer
from dnntune.providers.triton.patterns import Elementwise, MatmulMatch, Operand
from dnntune.providers.triton.solvers import Config, MatmulSolver

__all__ = ["MatmulLauncher", "source"]

_INT32_MAX = 2**31 - 1
#: tile of the split-K reduction kernel
_RED_BM, _RED_BN, _RED_WARPS = 32, 128, 4


def _epilogue(ew: Elementwise, i64: bool) -> list[str]:
    """Lines that load epilogue inputs, compute the DAG from ``acc`` and store the outputs.

    Expects ``rm``, ``rn`` (tile rows/cols), ``bid`` (batch) and ``mask`` in scope.
    """
    lines = []
    if i64:
        lines += [
            "    rm_o = rm.to(tl.int64)",
            "    rn_o = rn.to(tl.int64)",
            "    bid_o = bid.to(tl.int64)",
        ]
    else:
        lines += ["    rm_o = rm", "    rn_o = rn", "    bid_o = bid"]

    def pointer(base: str, o: Operand, j: int) -> tuple[str, str]:
        # (pointer expression, how to broadcast a 1-D load to the tile)
        sb, sm, sn = (f"s_{base}{j}_{x}" for x in "bmn")
        zb, zm, zn = (s == 0 for s in o.strides)
        batch = "" if zb else f" + bid_o * {sb}"
        if zm and zn:
            return f"p_{base}{j}{batch}", "scalar"
        if zm:
            return f"p_{base}{j}{batch} + rn_o * {sn}", "row"
        if zn:
            return f"p_{base}{j}{batch} + rm_o * {sm}", "col"
        return f"p_{base}{j}{batch} + rm_o[:, None] * {sm} + rn_o[None, :] * {sn}", "tile"

    for i, o in enumerate(ew.inputs):
        ptr, kind = pointer("in", o, i)
        if kind == "row":
            load = f"tl.load({ptr}, mask=rn < N, other=0.0).to(tl.float32)[None, :]"
        elif kind == "col":
            load = f"tl.load({ptr}, mask=rm < M, other=0.0).to(tl.float32)[:, None]"
        elif kind == "scalar":
            load = f"tl.load({ptr}).to(tl.float32)"
        else:
            load = f"tl.load({ptr}, mask=mask, other=0.0).to(tl.float32)"
        lines.append(f"    in{i} = {load}")
    lines += emit_ops(ew.ops)
    for j, (value, _o) in enumerate(ew.outputs):
        sb, sm, sn = (f"s_out{j}_{x}" for x in "bmn")
        ptr = f"p_out{j} + bid_o * {sb} + rm_o[:, None] * {sm} + rn_o[None, :] * {sn}"
        lines.append(f"    tl.store({ptr}, {value}.to(p_out{j}.dtype.element_ty), mask=mask)")
    return lines


def _needs_int64(m: MatmulMatch) -> bool:
    ew = m.epilogue
    reach = [
        (m.batch - 1) * m.a_strides[0] + (m.m - 1) * m.a_strides[1] + (m.k - 1) * m.a_strides[2],
        (m.batch - 1) * m.b_strides[0] + (m.k - 1) * m.b_strides[1] + (m.n - 1) * m.b_strides[2],
        # split-K workspace: up to 32 splits of [batch, M, N]
        32 * m.batch * m.m * m.n,
    ]
    for o in [*ew.inputs, *(o for _, o in ew.outputs)]:
        reach.append(sum((d - 1) * s for d, s in zip(ew.space, o.strides, strict=True)))
    return max(reach) > _INT32_MAX


def source(m: MatmulMatch) -> str:
    """The generated module: ``mm_kernel`` and the split-K ``reduce_kernel``."""
    ew = m.epilogue
    i64 = _needs_int64(m)
    ops = [f"p_in{i}" for i in range(len(ew.inputs))] + [
        f"p_out{j}" for j in range(len(ew.outputs))
    ]
    strides = [f"s_in{i}_{x}" for i in range(len(ew.inputs)) for x in "bmn"]
    strides += [f"s_out{j}_{x}" for j in range(len(ew.outputs)) for x in "bmn"]
    extra = ", ".join(ops + strides)
    extra = f"{extra}, " if extra else ""
    # fp32 inputs: IEEE products (the default would be TF32, which the reference rejects)
    precision = ', input_precision="ieee"' if m.dtype is DataType.FLOAT else ""
    idx = ".to(tl.int64)" if i64 else ""
    epilogue = _epilogue(ew, i64)
    mm = [
        "@triton.jit",
        f"def mm_kernel(p_a, p_b, p_ws, {extra}M, N, K, BATCH,",
        "              s_ab, s_am, s_ak, s_bb, s_bk, s_bn,",
        "              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,",
        "              GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):",
        "    pid = tl.program_id(0)",
        "    pid_k = tl.program_id(1)",
        "    bid = tl.program_id(2)",
        "    num_pid_m = tl.cdiv(M, BLOCK_M)",
        "    num_pid_n = tl.cdiv(N, BLOCK_N)",
        "    in_group = GROUP_M * num_pid_n",
        "    first_m = (pid // in_group) * GROUP_M",
        "    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)",
        "    pid_m = first_m + (pid % in_group) % group_rows",
        "    pid_n = (pid % in_group) // group_rows",
        "    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    rk = tl.arange(0, BLOCK_K)",
        # Rows/cols past the edge read a valid row/col (modulo) and are never stored.
        "    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)",
        "    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)",
        f"    a_ptr = p_a + bid{idx} * s_ab + ram{idx}[:, None] * s_am",
        f"    b_ptr = p_b + bid{idx} * s_bb + rbn{idx}[None, :] * s_bn",
        "    k_tiles = tl.cdiv(K, BLOCK_K)",
        "    per_split = tl.cdiv(K, BLOCK_K * SPLIT_K)",  # K tiles of each split
        "    k_begin = pid_k * per_split",
        "    k_end = tl.minimum(k_begin + per_split, k_tiles)",
        "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "    for kt in range(k_begin, k_end):",
        "        kk = kt * BLOCK_K + rk",
        "        if EVEN_K:",
        f"            a = tl.load(a_ptr + kk{idx}[None, :] * s_ak)",
        f"            b = tl.load(b_ptr + kk{idx}[:, None] * s_bk)",
        "        else:",
        f"            a = tl.load(a_ptr + kk{idx}[None, :] * s_ak, mask=kk[None, :] < K, "
        "other=0.0)",
        f"            b = tl.load(b_ptr + kk{idx}[:, None] * s_bk, mask=kk[:, None] < K, "
        "other=0.0)",
        f"        acc = tl.dot(a, b, acc{precision})",
        "    mask = (rm < M)[:, None] & (rn < N)[None, :]",
        "    if SPLIT_K == 1:",
        *["    " + line for line in epilogue],
        "    else:",
        "        ws = p_ws.to(tl.pointer_type(tl.float32))",
        f"        row = (pid_k{idx} * BATCH + bid) * M + rm",
        "        tl.store(ws + row[:, None] * N + rn[None, :], acc, mask=mask)",
    ]
    red = [
        "@triton.jit",
        f"def reduce_kernel(p_ws, {extra}M, N, BATCH,",
        "                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):",
        "    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    bid = tl.program_id(2)",
        "    mask = (rm < M)[:, None] & (rn < N)[None, :]",
        "    ws = p_ws.to(tl.pointer_type(tl.float32))",
        "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "    for s in tl.static_range(SPLIT_K):",
        f"        row = (s * BATCH + bid{idx}) * M + rm",
        "        acc += tl.load(ws + row[:, None] * N + rn[None, :], mask=mask, other=0.0)",
        *epilogue,
    ]
    return "\n".join([PRELUDE, "", *mm, "", "", *red]) + "\n"


class MatmulLauncher:
    """Launches the generated kernels for one plan (and the split-K reduction if needed)."""

    def __init__(self, match: MatmulMatch, config: Config) -> None:
        module = load_module("matmul", source(match))
        ew = match.epilogue
        self.m, self.n, self.k, self.batch = match.m, match.n, match.k, match.batch
        self.a_uid, self.b_uid = match.a_uid, match.b_uid
        self.op_uids = [o.uid for o in ew.inputs] + [o.uid for _, o in ew.outputs]
        self._ops = gatherer(self.op_uids)
        self.strides: list[int] = [s for o in ew.inputs for s in o.strides]
        self.strides += [s for _, o in ew.outputs for s in o.strides]
        self.ab_strides = [*match.a_strides, *match.b_strides]
        self.split = config["split_k"]
        meta = {
            "BLOCK_M": config["block_m"],
            "BLOCK_N": config["block_n"],
            "BLOCK_K": config["block_k"],
            "GROUP_M": config["group_m"],
            "SPLIT_K": self.split,
            "EVEN_K": self.k % (config["block_k"] * self.split) == 0,
            "num_warps": config["num_warps"],
            "num_stages": config["num_stages"],
        }
        tiles = math.ceil(self.m / config["block_m"]) * math.ceil(self.n / config["block_n"])
        n_ops = len(self.op_uids)
        self.mm = Launch(module.mm_kernel, (tiles, self.split, self.batch), meta, 3 + n_ops)
        red_grid = (math.ceil(self.m / _RED_BM), math.ceil(self.n / _RED_BN), self.batch)
        red_meta = {
            "BLOCK_M": _RED_BM,
            "BLOCK_N": _RED_BN,
            "SPLIT_K": self.split,
            "num_warps": _RED_WARPS,
        }
        self.reduce = Launch(module.reduce_kernel, red_grid, red_meta, 1 + n_ops)
        self.workspace_bytes = MatmulSolver().workspace_bytes(config, match)

    def __call__(self, pack: Mapping[int, Any], workspace: Any, warmup: bool = False) -> None:
        a = pack[self.a_uid]
        ops = self._ops(pack)
        sizes = (self.m, self.n, self.k, self.batch)
        if self.split == 1:
            self.mm([a, pack[self.b_uid], a, *ops, *self.strides, *sizes, *self.ab_strides], warmup)
            return
        if workspace is None or workspace.numel() * workspace.element_size() < self.workspace_bytes:
            raise InvalidValueError(
                f"TRITON_ENGINE matmul with split_k={self.split} needs a workspace of "
                f"{self.workspace_bytes} bytes"
            )
        args = [a, pack[self.b_uid], workspace, *ops, *self.strides, *sizes, *self.ab_strides]
        self.mm(args, warmup)
        self.reduce([workspace, *ops, *self.strides, self.m, self.n, self.batch], warmup)

    def bind(
        self, uids: Sequence[int], fallback: Callable[[Sequence[Any], Any], None]
    ) -> Callable[[Sequence[Any], Any], None]:
        """The plan's bound call, launching directly (:meth:`Launch.bind`, or
        :meth:`Launch.bind_chain` for split-K's two launches) with the arguments :meth:`__call__`
        gives the kernels: A, B, then A again in the unused workspace slot or the workspace,
        the epilogue's tensors, then the strides and sizes; the reduction the workspace, the
        epilogue's tensors, strides and sizes."""
        sizes = (self.m, self.n, self.k, self.batch)
        scalars = (*self.strides, *sizes, *self.ab_strides)
        if self.split == 1:
            ptr_uids = [self.a_uid, self.b_uid, self.a_uid, *self.op_uids]
            return self.mm.bind(ptr_uids, scalars, uids, fallback)
        steps = [
            (self.mm, [self.a_uid, self.b_uid, WORKSPACE, *self.op_uids], scalars),
            (self.reduce, [WORKSPACE, *self.op_uids], (*self.strides, self.m, self.n, self.batch)),
        ]
        return Launch.bind_chain(steps, uids, self.workspace_bytes, fallback)
