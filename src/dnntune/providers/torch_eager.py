"""TORCH_ENGINE: the graph run node by node with ATen ops, as a PyTorch user would write it.

It runs every operation of the IR on CPU and CUDA and is the engine of last resort. Its knobs:

* ``torch.memory_format`` (``preserve`` | ``channels_last``; convolution graphs): convert
  convolution operands to channels_last (NHWC) before the convolution.
* ``torch.allow_tf32`` (0 | 1; convolution, matmul and attention graphs): TF32 for float32
  math on CUDA, set around each run and restored after.
* ``torch.sdpa_backend`` (``auto`` | ``flash`` | ``efficient`` | ``cudnn`` | ``math``; attention
  graphs): the one SDPA kernel family allowed. A family the device or graph cannot use is
  refused at build time with NotSupportedError.
* ``torch.cuda_graph`` (0 | 1): on CUDA, capture the plan in a CUDA graph on the first execute
  with a set of buffers and replay it afterwards. The knob validates on any device (knob
  validation does not know the device); building a plan with it on the CPU raises
  NotSupportedError.
* ``torch.intermediate_type`` (``graph`` | ``io``; graphs with fp16/bf16 io and wider
  intermediates): ``io`` holds intermediates in the io type, as eager code would, instead of
  the graph's intermediate type. Between separate ATen calls a float32 intermediate costs a
  conversion and twice the memory traffic; measured on the H200, a BERT-large fp16
  matmul+bias+gelu ran 2.4x slower than eager that way. The default stays exact to the graph;
  tuning (``dnntune tune --sweep-knobs``) tries ``io`` and keeps it only if it verifies.
* ``torch.conv_as_gemm`` (0 | 1; graphs with a forward convolution over non-overlapping
  patches: stride equal to the filter, no padding, dilation or groups): ``1`` runs such a
  convolution as one GEMM over its gathered patches, the bias in the GEMM's epilogue. cuDNN's
  kernels for a 3-channel bf16 patch embedding (ViT-B/16's 16x16 at stride 16) were
  non-tensor-core on the H100 (271 us at batch 32, where the GEMM's K is 768: 68 us as the
  GEMM); tuning tries it as a suggested variant for patches of :data:`SUGGESTED_PATCH` filter
  elements or more, and keeps it only if it wins and verifies.
* ``global.deterministic`` (0 | 1): deterministic algorithms only, for the run.
* ``global.benchmarking`` (0 | 1; CUDA convolution graphs only): cuDNN benchmark mode. The
  build runs the plan once with ``torch.backends.cudnn.benchmark`` on, so cuDNN's own algorithm
  search happens there (the EXHAUSTIVE-mode priming), and runs keep benchmark mode on so the
  algorithm found is used.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from dnntune.backend.engine import Engine, Plan
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import (
    BENCHMARKING,
    DETERMINISTIC,
    IntConstraint,
    Knob,
    KnobSetting,
    KnobValue,
    KnobValueType,
    StringConstraint,
    benchmarking_knob,
    deterministic_knob,
)
from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.types import DataType
from dnntune.providers._torch import LoweringOptions, dummy_args, lower
from dnntune.providers._torch.conv import is_patch_conv
from dnntune.providers._torch.cuda_graph import CudaGraphRunner
from dnntune.providers._torch.flags import (
    SDPA_BACKENDS,
    Flag,
    benchmark_flags,
    deterministic_flags,
    sdpa_backend_flags,
    tf32_flags,
    with_flags,
)
from dnntune.providers._torch.plan import ProgramPlan
from dnntune.providers._torch.support import (
    check_graph,
    graph_kinds,
    has_fp32_dot,
    on_cuda,
    trial_run,
)

__all__ = ["TorchEngine", "engines"]

_log = logging.getLogger(__name__)

NAME = "TORCH_ENGINE"
MEMORY_FORMAT = "torch.memory_format"
ALLOW_TF32 = "torch.allow_tf32"
SDPA_BACKEND = "torch.sdpa_backend"
CUDA_GRAPH = "torch.cuda_graph"
INTERMEDIATE_TYPE = "torch.intermediate_type"
CONV_AS_GEMM = "torch.conv_as_gemm"

_META = torch.device("meta")
_CONV = frozenset({OpKind.CONV_FPROP, OpKind.CONV_DGRAD, OpKind.CONV_WGRAD})
_DOT = _CONV | {OpKind.MATMUL, OpKind.SDPA}
#: SDPA kernel families that exist on the CPU
_CPU_SDPA = frozenset({"auto", "flash", "math"})


def _bool_knob(knob_id: str, description: str) -> Knob:
    return Knob(knob_id, description, KnobValueType.INT64, 0, IntConstraint(0, 1))


_MEMORY_FORMAT_KNOB = Knob(
    MEMORY_FORMAT,
    "layout of convolution operands: preserve the caller's, or convert to channels_last",
    KnobValueType.STRING,
    "preserve",
    StringConstraint(frozenset({"preserve", "channels_last"})),
)
_TF32_KNOB = Knob(
    ALLOW_TF32,
    "1: TF32 tensor-core math for float32 conv/matmul on CUDA",
    KnobValueType.INT64,
    0,
    IntConstraint(0, 1),
    tf32=True,
)
_SDPA_KNOB = Knob(
    SDPA_BACKEND,
    "the SDPA kernel family (auto lets PyTorch choose)",
    KnobValueType.STRING,
    "auto",
    StringConstraint(frozenset({"auto", *SDPA_BACKENDS})),
)
_CUDA_GRAPH_KNOB = _bool_knob(
    CUDA_GRAPH, "1: capture the plan in a CUDA graph on first execute and replay it (CUDA only)"
)


_INTERMEDIATE_KNOB = Knob(
    INTERMEDIATE_TYPE,
    "graph: intermediates in the graph's intermediate type (exact to the graph); io: in its "
    "fp16/bf16 io type, as eager PyTorch code would (less memory traffic)",
    KnobValueType.STRING,
    "graph",
    StringConstraint(frozenset({"graph", "io"})),
)


_CONV_AS_GEMM_KNOB = _bool_knob(
    CONV_AS_GEMM,
    "1: a convolution over non-overlapping patches (stride = filter, no padding) as one GEMM",
)


#: the smallest patch (filter elements) for which a tune tries ``torch.conv_as_gemm`` unasked.
#: H100, bf16, 32x3x224x224, device time: 16x16 ran 68 us as the GEMM against cuDNN's 271
#: (32x32: 42 against 486), where the 4x4 stem of Swin-T and ConvNeXt-T ran 57.5 us on cuDNN's
#: best plan and the GEMM was not the winner: its gather copies runs of 4 elements
SUGGESTED_PATCH = 64


def _patch_convs(graph: OpGraph) -> list[Node]:
    return [node for node in graph.nodes if is_patch_conv(node)]


def _has_patch_conv(graph: OpGraph | None) -> bool:
    """True when the graph has a forward convolution :func:`is_patch_conv` accepts (or is
    unknown: every knob is listed then)."""
    return graph is None or bool(_patch_convs(graph))


def _patch_size(node: Node) -> int:
    w = node.inputs["w_tensor_uid"]
    assert w is not None
    return math.prod(w.dims[2:])


def _narrow_intermediates_possible(graph: OpGraph | None) -> bool:
    """True when the graph has a floating intermediate wider than its floating io type."""
    if graph is None:
        return True
    io = graph.io_data_type
    if io is None or not io.is_floating:
        return False
    return any(
        t.is_virtual
        and t.data_type is not None
        and t.data_type.is_floating
        and t.data_type.itemsize > io.itemsize
        for t in graph.tensors
    )


def _cpu_channels_last_defect(graph: OpGraph) -> str:
    """Why channels_last must not run ``graph`` on the CPU ('' when it may).

    PyTorch's CPU bfloat16 weight gradient of a grouped, dilated convolution in channels_last
    returns garbage (values near 1e20, or NaN; torch 2.13, found by dnntune's conformance
    tier): that variant is refused there, the default layout runs the graph correctly.
    """
    for node in graph.nodes:
        if node.kind is not OpKind.CONV_WGRAD:
            continue
        x, dw = node.inputs.get("x_tensor_uid"), node.outputs.get("dw_tensor_uid")
        if x is None or dw is None or x.data_type is not DataType.BFLOAT16:
            continue
        grouped = len(x.dims) > 1 and len(dw.dims) > 1 and x.dims[1] != dw.dims[1]
        dilated = any(d > 1 for d in node.params.get("dilation") or [1])
        if grouped and dilated:
            return (
                "gives wrong weight gradients on the CPU for a grouped, dilated bfloat16 "
                "convolution (a PyTorch CPU defect); use the default memory format"
            )
    return ""


class TorchEngine(Engine):
    """PyTorch eager: one ATen call (or a few) per node."""

    name = NAME
    compile_cost = 1.0  # lowering to eager calls
    provider = "torch"

    def suggested_variants(self, graph: OpGraph) -> list[dict[str, KnobValue]]:
        # the graph's float32 intermediates cost a widening pass per pointwise op over the
        # whole tensor; the io-typed program is what eager code runs (verification bounds the
        # error), and it was 1.4-2.5x faster on the H200's fused-epilogue GEMMs and norms
        # (channels_last for NCHW half convolutions was suggested too until the H200 showed
        # the transposes around it cost more than cuDNN's NHWC kernel saves: 124 us against
        # 68 us for cuDNN's NCHW plan on ResNet-50 res2a 3x3, fp16)
        variants: list[dict[str, KnobValue]] = []
        narrow = _narrow_intermediates_possible(graph)
        if narrow:
            variants.append({INTERMEDIATE_TYPE: "io"})
        # a CUDA convolution (fprop, dgrad, wgrad) also with cuDNN's own algorithm search, what
        # eager PyTorch runs under cudnn.benchmark: without it the candidates could miss that
        # algorithm (session 5: a 7x7 stem's wgrad took 978 us on the tuned plan against 325 us
        # in eager with cudnn.benchmark on the H200)
        kinds = graph_kinds(graph)
        if kinds is not None and kinds & _CONV and on_cuda(graph):
            variants.append({BENCHMARKING: 1})
            if narrow:
                variants.append({INTERMEDIATE_TYPE: "io", BENCHMARKING: 1})
        # a patch embedding of large patches as one GEMM (see the module docstring), on any
        # device: the tune measures whether it beats the convolution kernels there
        if any(_patch_size(node) >= SUGGESTED_PATCH for node in _patch_convs(graph)):
            variants.append({CONV_AS_GEMM: 1})
            if narrow:
                variants.append({CONV_AS_GEMM: 1, INTERMEDIATE_TYPE: "io"})
        return variants

    devices = ("cpu", "cuda")

    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        check_graph(self.name, graph, handle.device)
        # lowering raises NotSupportedError naming a node it cannot run; on the meta device it
        # allocates nothing (masks and constants are built for real only by compile())
        lower(graph, _META)

    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        kinds = graph_kinds(graph)

        def has(ops: frozenset[OpKind]) -> bool:
            return kinds is None or bool(kinds & ops)

        out: list[Knob] = []
        if has(_CONV):
            out.append(_MEMORY_FORMAT_KNOB)
        if has(_DOT):
            out.append(_TF32_KNOB)
        if has(frozenset({OpKind.SDPA})):
            out.append(_SDPA_KNOB)
        if _narrow_intermediates_possible(graph):
            out.append(_INTERMEDIATE_KNOB)
        if _has_patch_conv(graph):
            out.append(_CONV_AS_GEMM_KNOB)
        out += [_CUDA_GRAPH_KNOB, deterministic_knob()]
        # cuDNN's internal search exists only for convolutions on CUDA
        if kinds is None or (has(_CONV) and on_cuda(graph)):
            out.append(benchmarking_knob())
        return out

    def settings_unsupported(
        self, graph: OpGraph, settings: Sequence[KnobSetting], handle: Handle
    ) -> str | None:
        device = handle.device
        if device.type == "cuda":
            return None
        values = self.resolve_settings(settings, graph)
        if values.get(CUDA_GRAPH, 0):
            return (
                f"{self.name}: {CUDA_GRAPH}=1 needs a CUDA device, the handle is on {device}; "
                f"use {CUDA_GRAPH}=0 on the CPU"
            )
        backend = str(values.get(SDPA_BACKEND, "auto"))
        if backend not in _CPU_SDPA:
            return (
                f"{self.name}: {SDPA_BACKEND}={backend} is not available on the CPU "
                f"(CPU kernels: {', '.join(sorted(_CPU_SDPA))})"
            )
        return None

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        self.validate_knobs(knob_settings, graph)
        values = self.resolve_settings(knob_settings, graph)
        device = handle.device
        cuda = device.type == "cuda"
        check_graph(self.name, graph, device)
        why = self.settings_unsupported(graph, knob_settings, handle)
        if why is not None:
            raise NotSupportedError(why)
        cuda_graph = bool(values.get(CUDA_GRAPH, 0))
        backend = str(values.get(SDPA_BACKEND, "auto"))
        flags: list[Flag] = []
        if cuda and has_fp32_dot(graph):
            flags += tf32_flags(bool(values.get(ALLOW_TF32, 0)))
        if values.get(DETERMINISTIC):
            flags += deterministic_flags()
        if values.get(BENCHMARKING):
            flags += benchmark_flags()
        flags += sdpa_backend_flags(backend)
        channels_last = values.get(MEMORY_FORMAT) == "channels_last"
        patch_gemm = bool(values.get(CONV_AS_GEMM, 0))
        if channels_last and not cuda:
            why = _cpu_channels_last_defect(graph)
            if why:
                raise NotSupportedError(f"{self.name}: {MEMORY_FORMAT}=channels_last {why}")
        # Knobs that can fail only when run (a backend that refuses the shapes, an op with no
        # deterministic kernel, a capture) get a trial run now; the benchmarking trial is
        # also the priming: cuDNN's search runs and caches its choice.
        trial = (
            backend != "auto"
            or bool(values.get(DETERMINISTIC))
            or bool(values.get(BENCHMARKING))
            or cuda_graph
        )
        attempts = [False, True] if backend != "auto" and _has_gqa(graph) else [False]
        error: NotSupportedError | None = None
        for repeat_kv in attempts:
            options = LoweringOptions(
                channels_last=channels_last,
                sdpa_repeat_kv=repeat_kv,
                io_intermediates=values.get(INTERMEDIATE_TYPE) == "io",
                patch_gemm=patch_gemm,
            )
            program = lower(graph, device, options)
            run = with_flags(program.run, flags)
            runner = CudaGraphRunner(run, device) if cuda_graph else run
            if trial:
                try:
                    trial_run(self.name, graph, runner, dummy_args(graph, program.arg_uids, device))
                except NotSupportedError as exc:
                    error = exc
                    continue
                if isinstance(runner, CudaGraphRunner):
                    runner.clear()  # the trial's capture holds dummy buffers
            metadata = {
                "ops": [k.value for k in program.kinds],
                "flags": [f"{f.name}={f.value}" for f in flags],
                "sdpa_repeat_kv": repeat_kv,
                "intermediate_type": values.get(INTERMEDIATE_TYPE, "graph"),
                "conv_as_gemm": patch_gemm,
            }
            plan = ProgramPlan(self, knob_settings, program.arg_uids, runner, metadata=metadata)
            plan.runs_eager_ops = not (flags or channels_last or cuda_graph or patch_gemm)
            return plan
        assert error is not None
        raise error


def _has_gqa(graph: OpGraph) -> bool:
    for node in graph.nodes:
        q, k = node.inputs.get("q_tensor_uid"), node.inputs.get("k_tensor_uid")
        if node.kind is OpKind.SDPA and q is not None and k is not None and q.dims[1] != k.dims[1]:
            return True
    return False


def engines() -> list[Engine]:
    """The engines of the ``torch`` provider (loaded lazily by the registry)."""
    return [TorchEngine()]
