"""``dnntune.torch.configure``: the one place the PyTorch integration is configured.

Values not set here come from the ``DNNTUNE_*`` environment (through ``dnntune.settings``):
the override file defaults to ``DNNTUNE_HEUR_CONFIG_PATH``.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from dnntune import settings
from dnntune.errors import InvalidValueError

__all__ = ["Policy", "TorchConfig", "configure", "current"]

Policy = Literal["heuristic", "tune", "cached"]
RankingMetric = Literal["latency", "device", "throughput"]
Mode = Literal["standard", "exhaustive"]
_POLICIES = ("heuristic", "tune", "cached")


@dataclass(frozen=True)
class TorchConfig:
    """How dnntune.torch picks plans.

    Attributes:
        policy: "heuristic" (override file / exact cache / static order; never benchmarks),
            "tune" (autotune on first sight of a shape, persist the winner; a winner the
            override file holds from an earlier tune on this device, clock and mode is reused
            without tuning), "cached" (a
            decision stored in this process or in the override file, else the heuristic pick;
            never benchmarks).
        overrides: override file read by "heuristic"/"cached" and written by "tune"
            (default ``DNNTUNE_HEUR_CONFIG_PATH``).
        verify: check tuned candidates against the reference (autotune's ``verify``), and
            every heuristic or override-file plan on its first call (``_plan_check``).
        cache_size: plans kept per process (least recently used are dropped).
        warmup_iterations / timed_iterations: the "tune" policy's benchmark settings.
        sweep: with "tune", candidates beyond each engine's default plan: cuDNN's top
            plans (``cudnn.engine_config``), as ``cudnn.benchmark`` does for an eager
            convolution, and each engine's small knob spaces one knob at a time (memory
            format, intermediate type, SDPA backend, Triton's tuning policy). Off by default:
            on the H200 it made first-run tuning 4-7x longer (ResNet-like stack 3 s to 20 s,
            LLaMA-like prefill block 5 s to 36 s) for no end-to-end gain there.
        ranking_metric: what "tune" ranks candidates by: "latency" (one call on an idle
            device, host submit included), "device" (kernel time alone: what a CUDA-graph
            replay pays) or "throughput" (calls issued back to back, host submit and kernels
            overlapping: about max(host, device) per call, what an uncaptured forward pass
            pays per layer; warm cache only). ``optimize(cuda_graph=True)`` sets "device".
        mode: "standard" or "exhaustive" (RFC 0013 §6.4: before timing, each engine that has
            its own search runs it once as a priming plan, so cuDNN's plan search fills its
            find db and Triton's config search its perf db, and the timed plans use what they
            found; like ``torch.backends.cudnn.benchmark`` for every op; longer first run).
    """

    policy: Policy = "heuristic"
    overrides: str | None = None
    verify: bool = True
    cache_size: int = 256
    warmup_iterations: int = 2
    timed_iterations: int = 10
    sweep: bool = False
    ranking_metric: RankingMetric = "latency"
    mode: Mode = "standard"

    @property
    def tuning_key(self) -> tuple[str, str, bool, bool]:
        """What a decision depends on besides the graph: the clock, the mode, the knob sweep
        (a decision made on one clock is no answer for another) and ``verify`` (a plan kept
        unchecked under ``verify=False``, a tune's winner or a heuristic plan, is no answer
        for settings that check every plan: it ran wrong numbers there before)."""
        return (self.ranking_metric, self.mode, self.sweep, self.verify)

    def override_path(self) -> Path | None:
        if self.overrides:
            return Path(self.overrides)
        return settings.heur_config_path()


_lock = threading.Lock()
_config = TorchConfig()


#: the settings an optimized module was optimized with, in force while its forward runs
_scoped: contextvars.ContextVar[TorchConfig | None] = contextvars.ContextVar(
    "dnntune_torch_config", default=None
)


def current() -> TorchConfig:
    """The settings in force: those of the optimized module whose forward is running (each
    ``optimize`` binds its own), else the process-wide ones of :func:`configure`."""
    scoped = _scoped.get()
    return _config if scoped is None else scoped


#: the settings in force through an optimized model's forward, or None outside every one
scope_in_force = _scoped.get

#: where ``optimize`` binds its settings on each module it swapped, fused or wrapped: such a
#: module called outside its model's forward runs under them too (``_subclass.
#: call_in_model_settings``; a checkpointed layer recomputed in the backward pass: under the
#: process's settings it built another kernel there, and the recomputed forward saved other
#: tensors than the forward had, a ``CheckpointError``)
LAYER_CONFIG = "_dnntune_layer_config"


def enter_scope(config: TorchConfig) -> contextvars.Token[TorchConfig | None]:
    """Put ``config`` in force until :func:`exit_scope` (an optimized module's forward)."""
    return _scoped.set(config)


def exit_scope(token: contextvars.Token[TorchConfig | None]) -> None:
    _scoped.reset(token)


def process_settings() -> TorchConfig:
    """The process-wide settings (those of :func:`configure`), whatever module's are in force."""
    return _config


def configure(
    *,
    policy: Policy | None = None,
    overrides: str | Path | None = None,
    verify: bool | None = None,
    cache_size: int | None = None,
    warmup_iterations: int | None = None,
    timed_iterations: int | None = None,
    sweep: bool | None = None,
    ranking_metric: RankingMetric | None = None,
    mode: Mode | None = None,
) -> TorchConfig:
    """Change the integration's settings (only the ones given); returns the new settings.

    Raises:
        InvalidValueError: for an unknown policy, mode or ranking metric, a cache size or
            timed iteration count below 1, a negative warmup count, or an override path that
            is a folder.
    """
    global _config
    with _lock:
        _config = changed(
            _config,
            policy=policy,
            overrides=overrides,
            verify=verify,
            cache_size=cache_size,
            warmup_iterations=warmup_iterations,
            timed_iterations=timed_iterations,
            sweep=sweep,
            ranking_metric=ranking_metric,
            mode=mode,
        )
        return _config


def changed(
    base: TorchConfig,
    *,
    policy: Policy | None = None,
    overrides: str | Path | None = None,
    verify: bool | None = None,
    cache_size: int | None = None,
    warmup_iterations: int | None = None,
    timed_iterations: int | None = None,
    sweep: bool | None = None,
    ranking_metric: RankingMetric | None = None,
    mode: Mode | None = None,
) -> TorchConfig:
    """``base`` with the settings given changed (None: kept as in ``base``), checked as
    :func:`configure` checks them; nothing is put in force.

    Raises:
        InvalidValueError: for an unknown policy, mode or ranking metric, a cache size or
            timed iteration count below 1, a negative warmup count, or an override path that
            is a folder.
    """
    typed: tuple[tuple[str, object, type], ...] = (
        ("cache_size", cache_size, int),
        ("warmup_iterations", warmup_iterations, int),
        ("timed_iterations", timed_iterations, int),
        ("verify", verify, bool),
        ("sweep", sweep, bool),
    )
    for name, given, kind in typed:
        wrong = type(given) is not kind and not (kind is int and _integer(given))
        if given is not None and wrong:
            raise InvalidValueError(f"{name} must be {_KINDS[kind]}, got {given!r}")
    if policy is not None and policy not in _POLICIES:
        raise InvalidValueError(f"policy must be one of {', '.join(_POLICIES)}, got {policy!r}")
    if cache_size is not None and cache_size < 1:
        raise InvalidValueError(f"cache_size must be >= 1, got {cache_size}")
    if warmup_iterations is not None and warmup_iterations < 0:
        raise InvalidValueError(f"warmup_iterations must be >= 0, got {warmup_iterations}")
    if timed_iterations is not None and timed_iterations < 1:
        raise InvalidValueError(f"timed_iterations must be >= 1, got {timed_iterations}")
    if overrides is not None and Path(overrides).is_dir():
        raise InvalidValueError(
            f"overrides {str(overrides)!r} is a folder; give the override file's path "
            "(e.g. dnntune_overrides.json)"
        )
    if mode is not None and mode not in ("standard", "exhaustive"):
        raise InvalidValueError(f"mode must be 'standard' or 'exhaustive', got {mode!r}")
    if ranking_metric is not None and ranking_metric not in ("latency", "device", "throughput"):
        raise InvalidValueError(
            f"ranking_metric must be 'latency', 'device' or 'throughput', got {ranking_metric!r}"
        )
    changes: dict[str, object] = {}
    for name, value in (
        ("policy", policy),
        ("verify", verify),
        ("cache_size", cache_size),
        ("warmup_iterations", warmup_iterations),
        ("timed_iterations", timed_iterations),
        ("sweep", sweep),
        ("ranking_metric", ranking_metric),
        ("mode", mode),
    ):
        if value is not None:
            changes[name] = value
    if overrides is not None:
        changes["overrides"] = str(overrides)
    return replace(base, **changes)  # type: ignore[arg-type]


_KINDS = {int: "an integer", bool: "True or False"}


def _integer(value: object) -> bool:
    """An integer that is not a bool (``numpy.int64`` too: it has ``__index__``)."""
    return not isinstance(value, bool) and hasattr(value, "__index__")


def reset() -> None:
    """Back to the defaults (tests)."""
    global _config
    with _lock:
        _config = TorchConfig()
