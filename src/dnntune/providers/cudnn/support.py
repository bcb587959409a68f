"""What CUDNN_ENGINE can lower, decided from the graph alone (no cuDNN, no GPU needed).

cuDNN itself has the last word (the lowered graph's heuristics and ``check_support``); this is
the part that needs neither, so it gives precise reasons early and runs in CPU tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.conv import ConvMode
from dnntune.graph.ops.sdpa import causal_flags
from dnntune.graph.tensor import TensorAttributes, contiguous_strides
from dnntune.graph.types import DataType, NormFwdPhase, PointwiseMode

if TYPE_CHECKING:
    from collections.abc import Callable

    from dnntune.graph.ir import OpGraph

__all__ = [
    "INPUT_CLOBBERING_ENGINES",
    "ClobberingEngine",
    "POINTWISE_METHODS",
    "SUPPORTED_KINDS",
    "TF32_NUMERIC_NOTES",
    "WRONG_RESULT_ENGINES",
    "WrongResultEngine",
    "clobbering_reason",
    "excluded_numeric_notes",
    "has_fp32_dot",
    "known_fault_reason",
    "padded_inputs",
    "unsupported_reason",
]

SUPPORTED_KINDS = frozenset(
    {
        OpKind.CONV_FPROP,
        OpKind.CONV_DGRAD,
        OpKind.CONV_WGRAD,
        OpKind.MATMUL,
        OpKind.POINTWISE,
        OpKind.REDUCTION,
        OpKind.LAYERNORM,
        OpKind.RMSNORM,
        OpKind.BATCHNORM_INFERENCE,
        OpKind.SDPA,
    }
)

_DOT_KINDS = frozenset({OpKind.CONV_FPROP, OpKind.CONV_DGRAD, OpKind.CONV_WGRAD, OpKind.MATMUL})

#: cuDNN numerical notes (``cudnn.numerical_note`` members) of engine configs that do not
#: compute float32 dot products in float32: TF32 tensor cores, and inputs converted to a
#: narrower type. The engines PyTorch's cuDNN convolutions leave out for float32 without
#: ``torch.backends.cudnn.allow_tf32``.
TF32_NUMERIC_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS")


@dataclass(frozen=True)
class ClobberingEngine:
    """A cuDNN engine (the ``N`` of an ``engN_...`` tag) that writes into an INPUT tensor of
    ``kind`` (in ``phase``; None: every phase), found by ``benchmarks/conformance.py``'s guarded
    run. Such a plan stays in cuDNN's list (``cudnn.engine_config`` indices stay cuDNN's) but
    never builds."""

    kind: OpKind
    engine_id: int
    phase: NormFwdPhase | None
    seen: str


#: found on the H200 with cuDNN 9.19
INPUT_CLOBBERING_ENGINES: tuple[ClobberingEngine, ...] = (
    # the layernorm and rmsnorm forward of engine 5 overwrote the first rows of x (12 KiB of a
    # 128x768 layernorm, 32 KiB of a 64x4096 rmsnorm, in fp32, fp16 and bf16 alike), so its
    # own output and every later plan run on that buffer were wrong
    *(
        ClobberingEngine(kind, 5, None, "it overwrote rows of x")
        for kind in (OpKind.LAYERNORM, OpKind.RMSNORM)
    ),
    # the layernorm TRAINING forward of engine 4 (no knobs) wrote into x at every shape tried
    # (1x65536, 2x65536, 1x32768, 8x16384, 128x768, 4096x4096, fp32); its outputs matched the
    # reference, its inference forward left x alone
    ClobberingEngine(OpKind.LAYERNORM, 4, NormFwdPhase.TRAINING, "it wrote into x"),
)


def padded_inputs(node: Node) -> bool:
    """Some input of ``node`` has gaps in its layout (a buffer larger than its elements: rows
    padded to a wider pitch), as opposed to a packed or broadcast one."""
    return any(t is not None and t.storage_size() > math.prod(t.dims) for t in node.inputs.values())


@dataclass(frozen=True)
class WrongResultEngine:
    """A cuDNN engine (the ``N`` of an ``engN_...`` tag) whose outputs for ``kind`` were wrong
    where ``when(node)`` holds (``condition`` says it in words), found by
    ``benchmarks/conformance.py``. Like a :class:`ClobberingEngine`, it stays in cuDNN's list and
    never builds for such graphs; elsewhere it builds as usual."""

    kind: OpKind
    engine_id: int
    when: Callable[[Node], bool]
    condition: str
    seen: str


#: found on the H200 with cuDNN 9.19
WRONG_RESULT_ENGINES: tuple[WrongResultEngine, ...] = (
    # the wgrad of engine 70 (c00561's engine_config 43, also what global.benchmarking=1 picked)
    # was wrong in 18,616 to 140,450 values of DW whenever x and dy had rows padded to a wider
    # pitch (fp16 and bf16; n 8 and 32; c 64 and 128; 56x56 and 28x28; 3x3 filters); on the
    # same shapes packed, every engine config matched the reference
    WrongResultEngine(
        OpKind.CONV_WGRAD,
        70,
        padded_inputs,
        "on inputs whose rows are padded to a wider pitch",
        "DW wrong in up to 95% of its values on 4 padded shapes, right on packed ones,",
    ),
)


def _phase(node: Node) -> NormFwdPhase:
    return node.params.get("forward_phase") or NormFwdPhase.INFERENCE


def known_fault_reason(graph: OpGraph, engine_id: int | None) -> str | None:
    """Why cuDNN engine ``engine_id`` must not run ``graph`` (it writes into an input, or its
    results were wrong for such a graph), or None."""
    why = clobbering_reason(graph, engine_id)
    if why is not None or engine_id is None:
        return why
    for node in graph.nodes:
        for bad in WRONG_RESULT_ENGINES:
            if bad.engine_id == engine_id and bad.kind is node.kind and bad.when(node):
                return (
                    f"cuDNN engine {engine_id} gave wrong results for "
                    f"{node.kind.name.lower()} {bad.condition} ({bad.seen} in dnntune's "
                    "conformance run on cuDNN 9.19), so CUDNN_ENGINE never builds it for such "
                    "graphs; the other engine configs are unaffected"
                )
    return None


def clobbering_reason(graph: OpGraph, engine_id: int | None) -> str | None:
    """Why cuDNN engine ``engine_id`` must not run ``graph`` (it writes into an input), or None."""
    if engine_id is None:
        return None
    for node in graph.nodes:
        for bad in INPUT_CLOBBERING_ENGINES:
            if (
                bad.engine_id == engine_id
                and bad.kind is node.kind
                and (bad.phase is None or bad.phase is _phase(node))
            ):
                phase = "" if bad.phase is None else f" {bad.phase.name.lower()}"
                return (
                    f"cuDNN engine {engine_id} writes into an input tensor of "
                    f"{node.kind.name.lower()}{phase} ({bad.seen} in dnntune's guarded "
                    "conformance run on cuDNN 9.19), so CUDNN_ENGINE never builds it; the other "
                    "engine configs are unaffected"
                )
    return None


#: pointwise mode -> pygraph method name (arity comes from the mode)
POINTWISE_METHODS: dict[PointwiseMode, str] = {
    PointwiseMode.ADD: "add",
    PointwiseMode.SUB: "sub",
    PointwiseMode.MUL: "mul",
    PointwiseMode.DIV: "div",
    PointwiseMode.MAX: "max",
    PointwiseMode.MIN: "min",
    PointwiseMode.POW: "pow",
    PointwiseMode.RELU_FWD: "relu",
    PointwiseMode.GELU_FWD: "gelu",
    PointwiseMode.GELU_APPROX_TANH_FWD: "gelu_approx_tanh",
    PointwiseMode.TANH_FWD: "tanh",
    PointwiseMode.SIGMOID_FWD: "sigmoid",
    PointwiseMode.SWISH_FWD: "swish",
    PointwiseMode.ELU_FWD: "elu",
    PointwiseMode.SOFTPLUS_FWD: "softplus",
    PointwiseMode.EXP: "exp",
    PointwiseMode.LOG: "log",
    PointwiseMode.NEG: "neg",
    PointwiseMode.ABS: "abs",
    PointwiseMode.SQRT: "sqrt",
    PointwiseMode.RSQRT: "rsqrt",
    PointwiseMode.IDENTITY: "identity",
    PointwiseMode.RECIPROCAL: "reciprocal",
    PointwiseMode.SIN: "sin",
    PointwiseMode.COS: "cos",
    PointwiseMode.CEIL: "ceil",
    PointwiseMode.FLOOR: "floor",
    PointwiseMode.ERF: "erf",
    PointwiseMode.CMP_EQ: "cmp_eq",
    PointwiseMode.CMP_NEQ: "cmp_neq",
    PointwiseMode.CMP_GT: "cmp_gt",
    PointwiseMode.CMP_GE: "cmp_ge",
    PointwiseMode.CMP_LT: "cmp_lt",
    PointwiseMode.CMP_LE: "cmp_le",
    PointwiseMode.BINARY_SELECT: "binary_select",
}


_ATTENTION_TYPES = frozenset(
    {DataType.HALF, DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2}
)


def _is_row_major(t: TensorAttributes) -> bool:
    return t.has_layout(contiguous_strides(t.dims))


def _cudnn_version(version: int) -> str:
    """91900 -> "9.19.0" (cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch)."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


#: cuDNN backend versions below which cuDNN frontend refuses a bottom-right causal mask unless
#: s_q and s_kv are multiples of 64, and at or below which it refuses one query (s_q == 1)
#: under a causal mask
_BOTTOM_RIGHT_ANY_LENGTH = 90600
_LAST_MASKED_DECODE = 90900


def _sdpa_reason(node: Node, where: str, backend_version: int | None) -> str | None:
    """Why CUDNN_ENGINE declines attention ``node``, or None.

    Mostly what cuDNN frontend's validation refuses (GRAPH_NOT_SUPPORTED, before any plan or
    GPU work) in a graph that ``Graph.sdpa`` can express, so that the planner moves on with a
    reason instead of a failed build. The rules were read in NVIDIA/cudnn-frontend's
    ``include/cudnn_frontend/node/sdpa_support_surface.h`` (``validate_sdpa_support_surface``,
    1.14 on) and ``node/scaled_dot_product_flash_attention.h`` (the SDPA node's
    ``pre_validate_node``: tensor layouts, and every rule before 1.14), on the fp16/bf16 path
    that ``pygraph.sdpa`` always takes (``mma_core_mode`` HALF; fp8 has ``pygraph.sdpa_fp8``).
    dnntune's ``cudnn`` extra asks for frontend 1.16 or newer, so a rule is used only where
    every release from 1.16 to 1.23 has it; ``backend_version`` (cuDNN's, e.g. 91900; None
    where unknown) turns on the rules that depend on it, which are skipped without it. What
    dnntune's own validation refuses (dropout, ALiBi, padding masks, sliding windows, right
    bounds other than 0, k/v heads that do not divide q heads) needs no rule here.
    """
    q, k, v = (node.inputs.get(f"{n}_tensor_uid") for n in "qkv")
    for f, t in (("q_tensor_uid", q), ("k_tensor_uid", k), ("v_tensor_uid", v)):
        if t is not None and t.data_type not in _ATTENTION_TYPES:
            # cuDNN frontend 1.16 to 1.23 do not check q/k/v's type (pygraph.sdpa's HALF path
            # takes any); cuDNN 9.19 accepted a float32 graph and then faulted on the GPU
            return (
                f"cuDNN's fused attention takes fp16, bf16 or fp8 q/k/v; {f} is "
                f"{t.data_type.json_name if t.data_type else 'unset'} ({where})"
            )
    if q is None or k is None or v is None or len(q.dims) != 4 or len(v.dims) != 4:
        return None  # validation refuses these; nothing for cuDNN to say
    d_qk, d_v = q.dims[3], v.dims[3]
    if d_qk % 8 or d_v % 8:
        # cuDNN frontend 1.9 to 1.23 refuse head dims that are not multiples of 8, whatever
        # the cuDNN version (1.14 on: sdpa_support_surface.h, its fp16/bf16 branch; before:
        # the SDPA node's pre_validate_node). The upper limit is not a frontend rule from
        # 1.12 on: it refuses d > 256 (d > 128 on Ampere, on Blackwell below 9.9) only on
        # cuDNN 9.9 and older, so none is checked here (cuDNN's documented matrix for 9.18.1
        # says d <= 256; past it cuDNN's own support check decides)
        return (
            f"cuDNN frontend refuses attention whose head dims are not multiples of 8 (d_qk "
            f"{d_qk}, d_v {d_v}), so CUDNN_ENGINE does not run it; zero-pad q, k and v along "
            f"the head dim to a multiple of 8 with attn_scale set to 1/sqrt({d_qk}) (the "
            f"default would use the padded size) and slice o, or use another engine ({where})"
        )
    o = node.outputs.get("o_tensor_uid")
    for f, t in (
        ("q_tensor_uid", q),
        ("k_tensor_uid", k),
        ("v_tensor_uid", v),
        ("o_tensor_uid", o),
    ):
        if t is not None and not t.is_virtual and len(t.strides) == 4 and t.strides[3] != 1:
            # cuDNN frontend 1.9 to 1.23 refuse q, k, v or o whose last (head) dim has a
            # stride other than 1 (the SDPA node's pre_validate_node; o again after inference)
            return (
                f"cuDNN frontend refuses attention tensors whose head dim (the last) is not "
                f"contiguous; {f} has strides {list(t.strides)}, so CUDNN_ENGINE does not run "
                f"it; give it a layout with stride 1 on the head dim ([B, H, S, D] or a "
                f"[B, S, H, D] buffer), or use another engine ({where})"
            )
    mask = node.inputs.get("attn_mask_tensor_uid")
    if mask is not None and mask.data_type is DataType.BOOLEAN:
        # cuDNN frontend 1.9 to 1.23 refuse a boolean bias (the mask is lowered as the bias)
        return (
            f"CUDNN_ENGINE takes additive (floating-point) attention masks only, not boolean "
            f"ones ({where}); convert the mask to 0/-inf"
        )
    sq, skv = q.dims[2], k.dims[2]
    top_left, bottom_right = causal_flags(node)
    if bottom_right and sq > skv > 0:
        # cuDNN frontend 1.9 to 1.23 refuse it in validation (GRAPH_NOT_SUPPORTED) unless
        # a padding mask is set, which dnntune does not model: say so before any GPU work
        return (
            f"cuDNN frontend refuses a bottom-right causal mask with more queries than keys "
            f"(s_q {sq} > s_kv {skv}; it asks to slice q to s_q == s_kv), so CUDNN_ENGINE "
            f"does not run it; the first {sq - skv} query rows see no key, which the "
            f"reference and the engines that run it give as 0 (stats -inf) ({where})"
        )
    if bottom_right and mask is not None:
        # cuDNN frontend 1.9 to 1.23 refuse a bottom-right causal mask together with a bias
        # (and with ALiBi or dropout, which dnntune does not take), whatever the cuDNN
        # version and the lengths (sdpa_support_surface.h's common checks, 1.14 on)
        if sq == skv:
            instead = (
                "with s_q == s_kv the top-left causal_mask is the same mask, and cuDNN takes "
                "it with an attn_mask"
            )
        else:
            instead = (
                f"fold the causal mask into attn_mask (-inf where key j > i + {skv - sq}) and "
                "drop causal_mask_bottom_right, or use another engine"
            )
        return (
            f"cuDNN frontend refuses a bottom-right causal mask (causal_mask_bottom_right) "
            f"together with an additive attn_mask (its bias), so CUDNN_ENGINE does not run "
            f"it; {instead} ({where})"
        )
    if backend_version is None:
        return None
    if bottom_right and backend_version < _BOTTOM_RIGHT_ANY_LENGTH and (sq % 64 or skv % 64):
        # cuDNN frontend 1.10 to 1.23: a bottom-right causal mask needs s_q and s_kv multiples
        # of 64 on cuDNN below 9.6.0 (1.9 asked it of every cuDNN version)
        return (
            f"cuDNN frontend refuses a bottom-right causal mask unless s_q and s_kv are "
            f"multiples of 64 on cuDNN below 9.6.0 (this is {_cudnn_version(backend_version)}; "
            f"s_q {sq}, s_kv {skv}), so CUDNN_ENGINE does not run it; upgrade cuDNN to 9.6 or "
            f"newer, or use another engine ({where})"
        )
    if sq == 1 and (top_left or bottom_right) and backend_version <= _LAST_MASKED_DECODE:
        # cuDNN frontend 1.12 to 1.23: one query (decode) with a causal mask (a right bound
        # set, as the lowering does for either alignment) is refused on cuDNN 9.9.0 and older
        which = "causal_mask_bottom_right" if bottom_right else "causal_mask"
        hint = (
            "; over one query a bottom-right mask keeps every key, so the graph without it is "
            "the same"
            if bottom_right
            else ""
        )
        return (
            f"cuDNN frontend refuses a causal mask ({which}) over a single query (s_q 1) on "
            f"cuDNN 9.9 and older (this is {_cudnn_version(backend_version)}), so "
            f"CUDNN_ENGINE does not run it; upgrade cuDNN to 9.10 or newer, or use another "
            f"engine{hint} ({where})"
        )
    return None


def _node_reason(node: Node, graph: OpGraph, backend_version: int | None) -> str | None:
    where = f"node {node.name!r} ({node.kind.value})"
    if node.kind not in SUPPORTED_KINDS:
        return f"CUDNN_ENGINE does not lower {node.kind.value} nodes ({where})"
    if node.kind is OpKind.POINTWISE:
        mode = node.params.get("operation")
        if mode not in POINTWISE_METHODS:
            return f"CUDNN_ENGINE has no cuDNN pointwise mode for {mode} ({where})"
        if mode is PointwiseMode.ELU_FWD and node.params.get("elu_alpha") not in (None, 1.0):
            return f"cuDNN's ELU has no alpha parameter; elu_alpha must be 1 ({where})"
        beta = node.params.get("softplus_beta")
        if mode is PointwiseMode.SOFTPLUS_FWD and beta not in (None, 1.0):
            return f"cuDNN's softplus has no beta parameter; softplus_beta must be 1 ({where})"
    if (
        node.kind is OpKind.CONV_FPROP
        or node.kind is OpKind.CONV_DGRAD
        or (node.kind is OpKind.CONV_WGRAD)
    ):
        mode = node.params.get("conv_mode")
        if mode not in (None, ConvMode.CROSS_CORRELATION, ConvMode.CONVOLUTION):
            return f"unknown convolution mode {mode} ({where})"
    if node.kind is OpKind.SDPA:
        reason = _sdpa_reason(node, where, backend_version)
        if reason:
            return reason
    if node.kind is OpKind.REDUCTION:
        for f, t in (*node.inputs.items(), *node.outputs.items()):
            if t is not None and not t.is_virtual and list(t.strides) != contiguous_strides(t.dims):
                # cuDNN 9.19 on the H200 (dnntune's conformance sweep, issue 20): a column-major
                # 8192x4096 amax wrote past its output, and a [65536, 1] x with stride 65536 on
                # its size-1 dimension raised cudaErrorInvalidAddressSpace, which poisons the
                # process's CUDA context; row-major reductions were fine or refused by cuDNN.
                return (
                    f"CUDNN_ENGINE lowers reductions of packed row-major tensors only (cuDNN 9.19 "
                    f"wrote out of bounds on other layouts); {f} has strides {list(t.strides)} "
                    f"({where})"
                )
    if node.kind in (OpKind.LAYERNORM, OpKind.RMSNORM):
        x = node.inputs["x_tensor_uid"]
        y = node.outputs.get("y_tensor_uid")
        assert x is not None
        if x.is_virtual:
            return f"CUDNN_ENGINE lowers norms of graph inputs only; x is an intermediate ({where})"
        if y is None or y.is_virtual:
            return (
                f"CUDNN_ENGINE lowers norms without epilogues: y must be a graph output ({where})"
            )
        for f, t in (*node.inputs.items(), ("y_tensor_uid", y)):
            if f != "epsilon_tensor_uid" and t is not None and not _is_row_major(t):
                return f"CUDNN_ENGINE lowers norms of row-major tensors only; {f} ({where})"
        count = int(node.params.get("normalized_dim_count") or len(x.dims) - 1)
        feats = math.prod(x.dims[len(x.dims) - count :])
        for f in ("scale_tensor_uid", "bias_tensor_uid"):
            t = node.inputs.get(f)
            if t is not None and t.numel != feats:
                return (
                    f"CUDNN_ENGINE needs a full {f.removesuffix('_tensor_uid')} of {feats} values "
                    f"(no broadcasting inside the normalized dims), got dims {t.dims} ({where})"
                )
    del graph
    return None


def unsupported_reason(graph: OpGraph, backend_version: int | None = None) -> str | None:
    """Why CUDNN_ENGINE cannot lower ``graph`` (op kinds, modes, layouts, what cuDNN frontend
    refuses in validation, a graph its plans compute wrongly), or None. ``backend_version``
    (cuDNN's, as ``cudnn.backend_version()`` gives it) also applies the rules that depend on
    it; without it they are left to cuDNN."""
    for node in graph.nodes:
        reason = _node_reason(node, graph, backend_version)
        if reason:
            return reason
    return _single_pixel_conv_reason(graph)


#: pointwise modes that are an activation (not an add of a bias or a residual)
_ACTIVATION_MODES = frozenset(POINTWISE_METHODS) - {
    PointwiseMode.ADD,
    PointwiseMode.SUB,
    PointwiseMode.MUL,
    PointwiseMode.DIV,
    PointwiseMode.IDENTITY,
}


def _single_pixel_conv_reason(graph: OpGraph) -> str | None:
    """Why a convolution whose output is one pixel per channel (every spatial dim 1: the 1x1
    convolutions of a squeeze-excitation block, over the pooled map) followed by an activation
    is refused, or None. On the H100 with cuDNN 9.19 every plan cuDNN offered for such a graph
    (its heuristic plan and engine configs 1-5) returned NaN or zeros in most of the output, in
    fp16 and bf16, NCHW and NHWC, batch 2 to 32, with and without a bias (session 39: 64 SE
    graphs through ``dnntune run`` and ``tune``, about 1,500 ``dtt.conv2d`` calls); the same
    convolutions over a 2x2 map were right. Float32 was not measured and is refused alike: such
    a convolution is tiny, and another engine runs it."""
    activations = [
        n
        for n in graph.nodes
        if n.kind is OpKind.POINTWISE and n.params.get("operation") in _ACTIVATION_MODES
    ]
    if not activations:
        return None
    for node in graph.nodes:
        if node.kind is not OpKind.CONV_FPROP:
            continue
        y = node.outputs.get("y_tensor_uid")
        if y is not None and len(y.dims) > 2 and all(d == 1 for d in y.dims[2:]):
            return (
                f"cuDNN 9.19's plans returned NaN or zeros for a convolution to a 1x1 output "
                f"followed by an activation ({node.name!r} with "
                f"{activations[0].params['operation'].name}, the squeeze-excitation block's "
                "form; every plan cuDNN offered, on the H100), so CUDNN_ENGINE does not run it"
            )
    return None


def has_fp32_dot(graph: OpGraph) -> bool:
    """True if a convolution or matmul reads float32 tensors (where TF32 would round them)."""
    return any(
        node.kind in _DOT_KINDS
        and any(
            t is not None and t.data_type is DataType.FLOAT and not t.is_scalar
            for t in node.inputs.values()
        )
        for node in graph.nodes
    )


def has_fp32_matmul(graph: OpGraph) -> bool:
    """True if a matmul reads float32 tensors."""
    return any(
        node.kind is OpKind.MATMUL
        and any(
            t is not None and t.data_type is DataType.FLOAT and not t.is_scalar
            for t in node.inputs.values()
        )
        for node in graph.nodes
    )


#: why a float32 matmul is declined while ``cudnn.allow_tf32`` is 0
FP32_MATMUL_TF32 = (
    "cuDNN's float32 matmul plans ran with TF32-level error on the H200 (cuDNN 9.19) even with "
    "the TF32 numerical notes deselected, so with cudnn.allow_tf32=0 CUDNN_ENGINE does not run "
    "float32 matmuls; set cudnn.allow_tf32=1 to allow TF32 (and loosen the tolerance), or use "
    "another engine"
)


def excluded_numeric_notes(graph: OpGraph, allow_tf32: bool) -> tuple[str, ...]:
    """The numerical notes whose engine configs a build leaves out: :data:`TF32_NUMERIC_NOTES`
    for a float32 convolution or matmul unless ``cudnn.allow_tf32`` is 1, else none (fp16 and
    bf16 graphs need their tensor cores, and TF32 is not a question for them)."""
    if allow_tf32 or not has_fp32_dot(graph):
        return ()
    return TF32_NUMERIC_NOTES
