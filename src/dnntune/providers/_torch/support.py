"""What the torch engines share besides the interpreter: support checks and trial runs."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind
from dnntune.graph.types import DataType

__all__ = ["FLOAT_ONLY", "check_graph", "graph_kinds", "has_fp32_dot", "on_cuda", "trial_run"]

_log = logging.getLogger(__name__)

#: operations whose tensors must be floating point in ATen
FLOAT_ONLY = frozenset(
    {
        OpKind.CONV_FPROP,
        OpKind.CONV_DGRAD,
        OpKind.CONV_WGRAD,
        OpKind.LAYERNORM,
        OpKind.RMSNORM,
        OpKind.BATCHNORM,
        OpKind.BATCHNORM_INFERENCE,
        OpKind.BATCHNORM_BACKWARD,
        OpKind.SDPA,
        OpKind.RESAMPLE,
    }
)
_DOT = frozenset(
    {OpKind.CONV_FPROP, OpKind.CONV_DGRAD, OpKind.CONV_WGRAD, OpKind.MATMUL, OpKind.SDPA}
)
_FP8 = frozenset({DataType.FP8_E4M3, DataType.FP8_E5M2})


def graph_kinds(graph: OpGraph | None) -> frozenset[OpKind] | None:
    """The operation kinds of ``graph`` (None for "any graph")."""
    return None if graph is None else frozenset(n.kind for n in graph.nodes)


def on_cuda(graph: OpGraph | None) -> bool:
    """Whether ``graph`` runs on CUDA: its handle's device, else whether a GPU is present."""
    if graph is not None and getattr(graph, "is_built", False):
        return bool(graph.handle.is_cuda)  # type: ignore[attr-defined]
    return torch.cuda.is_available()


def has_fp32_dot(graph: OpGraph) -> bool:
    """True if a convolution, matmul or attention reads float32 data (where TF32 matters)."""
    for node in graph.nodes:
        if node.kind in _DOT and any(
            t is not None and t.data_type is DataType.FLOAT and not t.is_scalar
            for t in node.inputs.values()
        ):
            return True
    return False


def check_graph(engine: str, graph: OpGraph, device: torch.device) -> None:
    """Raise NotSupportedError if ATen ops cannot run ``graph`` on ``device``."""
    if device.type not in ("cpu", "cuda"):
        raise NotSupportedError(f"{engine} runs on cpu and cuda, not {device.type}")
    for t in graph.tensors:
        if t.data_type in _FP8:
            raise NotSupportedError(
                f"{engine}: {t.describe()}: fp8 tensors have no ATen eager kernels; "
                "try CUDNN_ENGINE or TRITON_ENGINE"
            )
    for node in graph.nodes:
        if node.kind not in FLOAT_ONLY:
            continue
        for field_name, operand in node.inputs.items():
            if operand is None or operand.is_scalar or operand.data_type is None:
                continue
            if operand.data_type.is_floating:
                continue
            if field_name == "attn_mask_tensor_uid" and operand.data_type is DataType.BOOLEAN:
                continue
            raise NotSupportedError(
                f"{engine}: node {node.name!r} ({node.kind.value}): {field_name}: "
                f"{operand.data_type.json_name} data is not supported; use a floating-point type"
            )


def trial_run(
    engine: str,
    graph: OpGraph,
    run: Callable[[Sequence[torch.Tensor]], Any],
    args: Sequence[torch.Tensor],
) -> None:
    """Run once on ``args`` so that failures surface at build time as NotSupportedError.

    Warnings raised while trying (kernel-selection notes, compiler chatter) are logged, not
    raised: a build that works must not fail because the caller turns warnings into errors.
    """
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            run(args)
    except Exception as exc:
        # compiler errors put the cause a few lines down: keep the first few non-empty lines
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = " | ".join(lines[:4])[:600] or type(exc).__name__
        where = args[0].device if args else "?"
        raise NotSupportedError(
            f"{engine}: graph {graph.name!r} failed a trial run on {where}: "
            f"{type(exc).__name__}: {reason}"
        ) from exc
    for w in caught:
        _log.debug("%s: trial run warning: %s", engine, w.message)
