"""Heuristics: a chain of policies that order the applicable engines, as in hipDNN.

Each policy may decline (return None); the first that applies wins. The default order is the
Config policy (override file and exact-match cache, registered by ``dnntune.overrides``) then
static ordering. ``DNNTUNE_HEUR_POLICY_ORDER`` changes the order (names or decimal ids).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dnntune import settings
from dnntune.backend.engine import Engine, engine_id
from dnntune.graph.node import OpKind

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "CONFIG_POLICY",
    "STATIC_POLICY",
    "HeuristicMode",
    "HeuristicPolicy",
    "PolicyDecision",
    "order_engines",
    "register_policy",
    "registered_policies",
]

_log = logging.getLogger(__name__)

CONFIG_POLICY = "SelectionHeuristic::Config"
STATIC_POLICY = "SelectionHeuristic::StaticOrdering"
DEFAULT_ORDER = (CONFIG_POLICY, STATIC_POLICY)


class HeuristicMode(enum.Enum):
    """FALLBACK: the safest engine first. A: the engine expected fastest first."""

    FALLBACK = "fallback"
    A = "a"
    B = "b"


@dataclass
class PolicyDecision:
    """The ordered engines a policy chose and why (shown by the CLI and logs)."""

    engines: list[Engine]
    policy: str
    reason: str = ""
    #: set by the Config policy when it matched a stored decision
    matched: dict[str, object] = field(default_factory=dict)


class HeuristicPolicy(Protocol):
    name: str

    def order(
        self, graph: OpGraph, handle: Handle, candidates: Sequence[Engine], mode: HeuristicMode
    ) -> PolicyDecision | None:
        """Return the candidates reordered (a permutation or subset), or None to decline."""
        ...


# ---- static ordering ------------------------------------------------------------------------
#: FALLBACK: most robust first. A (per device and op kind): expected fastest first. The CUDA
#: order follows the H200 runs of 2026-11-29 (benchmarks/RESULTS.md): cuDNN's fused GEMM
#: epilogues won 7 of 9 GEMMs (the ATen matmul+bias+activation chain was up to 2.9x slower).
#: Norms: with the byte-sized configs of session 2, Triton's layernorm ran 65536x1024 bf16 in
#: 72 us against cuDNN's 79-86 us, and reached 86-88% of copy bandwidth on the two large
#: shapes. Pooling: TRITON_ENGINE's NHWC kernel (verified on the H200, speed not yet measured)
#: goes first, since ATen's NHWC average pool ran 10x slower than Inductor's Triton one.
_FALLBACK_ORDER = ("TORCH_ENGINE", "TORCH_COMPILE_ENGINE", "CUDNN_ENGINE", "TRITON_ENGINE")
_A_CUDA: dict[str, tuple[str, ...]] = {
    "conv": ("CUDNN_ENGINE", "TORCH_ENGINE", "TORCH_COMPILE_ENGINE", "TRITON_ENGINE"),
    "sdpa": ("CUDNN_ENGINE", "TORCH_ENGINE", "TORCH_COMPILE_ENGINE", "TRITON_ENGINE"),
    "norm": ("TRITON_ENGINE", "CUDNN_ENGINE", "TORCH_COMPILE_ENGINE", "TORCH_ENGINE"),
    "pool": ("TRITON_ENGINE", "TORCH_ENGINE", "CUDNN_ENGINE", "TORCH_COMPILE_ENGINE"),
    "pointwise": ("TRITON_ENGINE", "TORCH_COMPILE_ENGINE", "TORCH_ENGINE", "CUDNN_ENGINE"),
    "matmul": ("CUDNN_ENGINE", "TORCH_ENGINE", "TRITON_ENGINE", "TORCH_COMPILE_ENGINE"),
    "other": ("TORCH_ENGINE", "CUDNN_ENGINE", "TRITON_ENGINE", "TORCH_COMPILE_ENGINE"),
}
_A_CPU = ("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")


def _op_class(graph: OpGraph) -> str:
    kind = graph.core_node().kind
    if kind in (OpKind.CONV_FPROP, OpKind.CONV_DGRAD, OpKind.CONV_WGRAD):
        return "conv"
    if kind is OpKind.SDPA:
        return "sdpa"
    if kind in (OpKind.LAYERNORM, OpKind.RMSNORM):
        return "norm"
    if kind is OpKind.MATMUL:
        return "matmul"
    if kind is OpKind.POINTWISE:
        return "pointwise"
    if kind is OpKind.RESAMPLE:
        return "pool"
    return "other"


def static_order(
    graph: OpGraph, handle: Handle, candidates: Sequence[Engine], mode: HeuristicMode
) -> list[Engine]:
    """Sort candidates by the static preference list; unknown engines keep their order, last."""
    if mode is HeuristicMode.FALLBACK:
        preferred: tuple[str, ...] = _FALLBACK_ORDER
    elif handle.is_cuda:
        preferred = _A_CUDA[_op_class(graph)]
    else:
        preferred = _A_CPU
    rank = {name: i for i, name in enumerate(preferred)}
    indexed = list(enumerate(candidates))
    indexed.sort(key=lambda item: (rank.get(item[1].name, len(rank)), item[0]))
    return [e for _, e in indexed]


class StaticOrderingPolicy:
    name = STATIC_POLICY

    def order(
        self, graph: OpGraph, handle: Handle, candidates: Sequence[Engine], mode: HeuristicMode
    ) -> PolicyDecision | None:
        if not candidates:
            return None
        return PolicyDecision(
            static_order(graph, handle, candidates, mode), self.name, f"static order ({mode.value})"
        )


# ---- the chain ------------------------------------------------------------------------------
_POLICIES: dict[str, HeuristicPolicy] = {STATIC_POLICY: StaticOrderingPolicy()}


def register_policy(policy: HeuristicPolicy) -> None:
    """Make a policy available to the chain under ``policy.name`` (replacing one of that name)."""
    _POLICIES[policy.name] = policy


def registered_policies() -> dict[str, HeuristicPolicy]:
    return dict(_POLICIES)


def _resolve_order() -> list[HeuristicPolicy]:
    tokens = settings.heur_policy_order() or list(DEFAULT_ORDER)
    by_id = {engine_id(name): p for name, p in _POLICIES.items()}
    out: list[HeuristicPolicy] = []
    for token in tokens:
        policy = _POLICIES.get(token)
        if policy is None:
            try:
                policy = by_id.get(int(token))
            except ValueError:
                policy = None
        if policy is None:
            _log.debug("heuristics: unknown policy %r in order; skipped", token)
            continue
        if policy not in out:
            out.append(policy)
    return out


def order_engines(
    graph: OpGraph,
    handle: Handle,
    candidates: Sequence[Engine],
    mode: HeuristicMode = HeuristicMode.FALLBACK,
    policies: Sequence[HeuristicPolicy] | None = None,
) -> PolicyDecision:
    """Run the policy chain; if every policy declines, keep the candidates' order."""
    for policy in policies if policies is not None else _resolve_order():
        try:
            decision = policy.order(graph, handle, candidates, mode)
        except Exception as exc:  # a policy bug must never break plan creation
            _log.warning("heuristics: policy %s raised %s; declining", policy.name, exc)
            continue
        if decision is None:
            continue
        ids = {e.id for e in candidates}
        if any(e.id not in ids for e in decision.engines) or len(
            {e.id for e in decision.engines}
        ) != len(decision.engines):
            _log.warning(
                "heuristics: policy %s returned engines that are not candidates; ignored",
                policy.name,
            )
            continue
        return decision
    return PolicyDecision(list(candidates), "none", "every policy declined; registration order")


PolicyFactory = Callable[[], HeuristicPolicy]
