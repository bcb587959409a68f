"""Heuristics: a chain of policies that order the applicable engines, as in hipDNN.

Each policy may decline (return None); the first that applies wins. The default order is the
Config policy (override file and exact-match cache, registered by ``dnntune.overrides``), the
learned ranking (``HeuristicMode.B`` only: :mod:`dnntune.backend.learned`), then static
ordering. ``DNNTUNE_HEUR_POLICY_ORDER`` changes the order: full names
(``SelectionHeuristic::Config``), short names (``Config``, ``Learned``, ``StaticOrdering`` or
``static``; any case) or decimal ids; an unknown name is left out with a warning (once per
name) that lists the known ones.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dnntune import settings
from dnntune.backend.engine import Engine, engine_id
from dnntune.backend.learned import Decline, Problem, op_class_of, rank_engines
from dnntune.errors import ConfigFileError, InvalidValueError
from dnntune.graph.node import OpKind

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "heuristic_modes",
    "is_short_attention",
    "CONFIG_POLICY",
    "LEARNED_POLICY",
    "SHORT_ATTENTION_KEYS",
    "SHORT_ATTENTION_PROBLEMS",
    "STATIC_POLICY",
    "HeuristicMode",
    "HeuristicPolicy",
    "PolicyDecision",
    "order_engines",
    "problem_preference",
    "register_policy",
    "registered_policies",
    "static_preference",
]

_log = logging.getLogger(__name__)

CONFIG_POLICY = "SelectionHeuristic::Config"
STATIC_POLICY = "SelectionHeuristic::StaticOrdering"
LEARNED_POLICY = "SelectionHeuristic::Learned"
DEFAULT_ORDER = (CONFIG_POLICY, LEARNED_POLICY, STATIC_POLICY)


class HeuristicMode(enum.Enum):
    """FALLBACK: the safest engine first. A: the engine expected fastest first (static order).
    B: the learned ranking from tuning history where it has seen similar problems, else A."""

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
#: attention over at most this many keys (a window: Swin's 49), in at least
#: SHORT_ATTENTION_PROBLEMS (batch x heads) problems, runs TRITON_ENGINE's kernel first.
#: Swin-T's windows at batch 32 (768-6144 problems; H100, session 48, device clock): Triton's
#: small tiles 35-99 µs a call against cuDNN's tuned plans 31-267 and its heuristic plan
#: through PyTorch 60-358. Longer sequences keep cuDNN first (the kernel is not offered for
#: them: providers/triton/attention_match.MAX_KEYS), and so do fewer problems (a batch of one
#: sequence: not measured)
SHORT_ATTENTION_KEYS = 64
SHORT_ATTENTION_PROBLEMS = 512
_A_SHORT_SDPA = ("TRITON_ENGINE", "CUDNN_ENGINE", "TORCH_ENGINE", "TORCH_COMPILE_ENGINE")


def static_preference(
    op_class: str, cuda: bool, mode: HeuristicMode, *, short_attention: bool = False
) -> tuple[str, ...]:
    """The static preference list of engine names for an op class (B's fallback is A's);
    ``short_attention``: the attention is a window's (:func:`is_short_attention`)."""
    if mode is HeuristicMode.FALLBACK:
        return _FALLBACK_ORDER
    if not cuda:
        return _A_CPU
    return _A_SHORT_SDPA if short_attention and op_class == "sdpa" else _A_CUDA[op_class]


def problem_preference(problem: Problem, cuda: bool, mode: HeuristicMode) -> tuple[str, ...]:
    """:func:`static_preference` for a learned-ranking problem (its op class and, for an
    attention, its sizes): the order ``train`` compares with and ``predict`` ranks, the same
    as :func:`static_order` gives the problem's graph."""
    d = problem.dims
    short = (
        problem.op_class == "sdpa"
        and {"batch", "heads", "seq_kv"} <= d.keys()
        and is_short_attention(d["batch"], d["heads"], d["seq_kv"])
    )
    return static_preference(problem.op_class, cuda, mode, short_attention=short)


def is_short_attention(batch: int, heads: int, keys: int) -> bool:
    """Attention over at most :data:`SHORT_ATTENTION_KEYS` keys in at least
    :data:`SHORT_ATTENTION_PROBLEMS` (batch x heads) problems: many windows."""
    return keys <= SHORT_ATTENTION_KEYS and batch * heads >= SHORT_ATTENTION_PROBLEMS


def static_order(
    graph: OpGraph, handle: Handle, candidates: Sequence[Engine], mode: HeuristicMode
) -> list[Engine]:
    """Sort candidates by the static preference list; unknown engines keep their order, last."""
    if mode is HeuristicMode.FALLBACK or not handle.is_cuda:
        preferred = static_preference("other", handle.is_cuda, mode)
    else:
        op_class = op_class_of(graph.core_node().kind)
        short = _short_attention(graph)
        preferred = static_preference(op_class, True, mode, short_attention=short)
    rank = {name: i for i, name in enumerate(preferred)}
    indexed = list(enumerate(candidates))
    indexed.sort(key=lambda item: (rank.get(item[1].name, len(rank)), item[0]))
    return [e for _, e in indexed]


def _short_attention(graph: OpGraph) -> bool:
    """Whether the graph's core node is a window's attention (:func:`is_short_attention`)."""
    node = graph.core_node()
    if node.kind is not OpKind.SDPA:
        return False
    q, k = node.inputs.get("q_tensor_uid"), node.inputs.get("k_tensor_uid")
    if q is None or k is None or len(q.dims) != 4 or len(k.dims) != 4:
        return False
    return is_short_attention(q.dims[0], q.dims[1], k.dims[2])


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


class LearnedOrderingPolicy:
    """HeuristicMode.B: the learned ranking (:mod:`dnntune.backend.learned`) of the candidates.

    Declines for every other mode, with fewer than two candidates, when no model is configured
    or shipped, when the graph is outside what the model has seen, and when the model file is
    unusable (a warning naming the file and what to try, once per file and problem); the chain
    then falls through to static ordering (A's order). The candidates are handed to the model
    in the static order, which orders the engines it has no data for.
    """

    name = LEARNED_POLICY

    def __init__(self) -> None:
        self._reported: set[str] = set()

    def order(
        self, graph: OpGraph, handle: Handle, candidates: Sequence[Engine], mode: HeuristicMode
    ) -> PolicyDecision | None:
        if mode is not HeuristicMode.B or len(candidates) < 2:
            return None
        static = static_order(graph, handle, candidates, HeuristicMode.A)
        try:
            result, path = rank_engines(graph, handle.device_signature(), [e.name for e in static])
        except ConfigFileError as exc:
            level = logging.DEBUG if str(exc) in self._reported else logging.WARNING
            self._reported.add(str(exc))
            _log.log(level, "heuristics: learned model unusable: %s", exc)
            return None
        if isinstance(result, Decline):
            _log.info("heuristics: learned ranking declined for %r: %s", graph.name, result.reason)
            return None
        by_name = {e.name: e for e in candidates}
        return PolicyDecision(
            [by_name[n] for n in result.engines],
            self.name,
            result.reason,
            matched={
                "source": "learned_model",
                "path": str(path),
                "confidence": result.confidence,
                "scores": dict(result.scores),
                "neighbours": [n.label for n in result.neighbours],
                "suggested_knobs": dict(result.knobs),
            },
        )


# ---- the chain ------------------------------------------------------------------------------
_POLICIES: dict[str, HeuristicPolicy] = {
    STATIC_POLICY: StaticOrderingPolicy(),
    LEARNED_POLICY: LearnedOrderingPolicy(),
}


def register_policy(policy: HeuristicPolicy) -> None:
    """Make a policy available to the chain under ``policy.name`` (replacing one of that name)."""
    _POLICIES[policy.name] = policy


def registered_policies() -> dict[str, HeuristicPolicy]:
    return dict(_POLICIES)


#: unknown ``DNNTUNE_HEUR_POLICY_ORDER`` names already warned about (the order is resolved on
#: every heuristic query; one warning per name per process is enough, DEBUG after that)
_UNKNOWN_REPORTED: set[str] = set()


def _short_name(name: str) -> str:
    """``SelectionHeuristic::Config`` -> ``config``: the alias ``DNNTUNE_HEUR_POLICY_ORDER``
    accepts (any case), as hipDNN's docs and logs write the names."""
    return name.rsplit("::", 1)[-1].strip().lower()


#: the labels ``dnntune run`` prints for a policy, where they differ from the short name
_LABELS = {"static": STATIC_POLICY}


def _find_policy(token: str) -> HeuristicPolicy | None:
    """The policy a ``DNNTUNE_HEUR_POLICY_ORDER`` token names: its full name, its name without
    the ``SelectionHeuristic::`` prefix or the label ``dnntune run`` prints (``static``), in
    any case, or its decimal id; None if none."""
    policy = _POLICIES.get(token)
    if policy is not None:
        return policy
    wanted = token.strip().lower()
    if wanted in _LABELS and _LABELS[wanted] in _POLICIES:
        return _POLICIES[_LABELS[wanted]]
    for name, candidate in _POLICIES.items():
        if wanted in (name.lower(), _short_name(name)):
            return candidate
    try:
        number = int(token)
    except ValueError:
        return None
    return next((p for name, p in _POLICIES.items() if engine_id(name) == number), None)


def _labels_of(name: str) -> list[str]:
    return [label for label, full in _LABELS.items() if full == name]


def _resolve_order() -> list[HeuristicPolicy]:
    tokens = settings.heur_policy_order() or list(DEFAULT_ORDER)
    out: list[HeuristicPolicy] = []
    for token in tokens:
        policy = _find_policy(token)
        if policy is None:
            _warn_unknown_policy(token, tokens)
            continue
        if policy not in out:
            out.append(policy)
    return out


def _warn_unknown_policy(token: str, tokens: Sequence[str]) -> None:
    """Once per name: a misspelled policy is left out of the chain, and nothing else says so
    (with the Config policy left out, the override file is never read)."""
    level = logging.DEBUG if token in _UNKNOWN_REPORTED else logging.WARNING
    _UNKNOWN_REPORTED.add(token)
    known = ", ".join(
        f"{name} ({' or '.join([name.rsplit('::', 1)[-1], *_labels_of(name)])})"
        for name in _POLICIES
    )
    _log.log(
        level,
        "heuristics: DNNTUNE_HEUR_POLICY_ORDER=%s names %r, which is not a heuristic policy; "
        "it is left out of the chain. Known policies (full name, or the short name in "
        "parentheses, any case, or the decimal id): %s",
        ",".join(tokens),
        token,
        known,
    )


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


def heuristic_modes(modes: Sequence[HeuristicMode] | HeuristicMode) -> list[HeuristicMode]:
    """``create_execution_plans``' modes as a list: one mode as a list of it; anything that is
    not a HeuristicMode named (a new-user audit met ``TypeError: 'HeuristicMode' object is not
    iterable`` for ``create_execution_plans(HeuristicMode.A)``)."""
    if isinstance(modes, HeuristicMode):
        return [modes]
    listed = list(modes) if isinstance(modes, Sequence) and not isinstance(modes, str) else None
    if listed is None or not all(isinstance(m, HeuristicMode) for m in listed):
        names = ", ".join(f"HeuristicMode.{m.name}" for m in HeuristicMode)
        raise InvalidValueError(
            f"create_execution_plans: modes must be HeuristicMode values ({names}) or a list "
            f"of them, e.g. [HeuristicMode.A]; got {modes!r}"
        )
    return listed
