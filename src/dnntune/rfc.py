"""The RFC 0013 data types (sections 6.1 and 6.2.2) as dataclasses with snake_case fields.

They sit below both `overrides/` (which writes results to files) and `autotune/` (which
produces them), so neither has to import the other for its vocabulary.
"""

from __future__ import annotations

import enum
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dnntune._rfc_values import budget_error, engine_ids, enum_field, whole_number_hint
from dnntune._rfc_values import member as enum_member
from dnntune.backend.heuristics import HeuristicMode
from dnntune.backend.knobs import Knob, KnobSetting, KnobValue, normalize_settings
from dnntune.errors import InvalidValueError

__all__ = [
    "AutotuneConfig",
    "AutotuneRankingFn",
    "AutotuneResult",
    "AutotuneStorageConfig",
    "AutotuneStrategy",
    "CacheWriteOutcome",
    "EngineConfigInfo",
    "EngineSweepSpec",
    "EngineVariant",
    "KnobSweepAxis",
    "PlanSpec",
    "PrimingFailurePolicy",
    "TuneMode",
]


class TuneMode(enum.Enum):
    STANDARD = "standard"
    EXHAUSTIVE = "exhaustive"


class AutotuneStrategy(enum.Enum):
    FIXED_AVERAGE = "fixed_average"
    RUN_UNTIL_STABLE = "run_until_stable"


class PrimingFailurePolicy(enum.Enum):
    ABORT_ON_PRIMING_FAILURE = "abort_on_priming_failure"
    BENCHMARK_UNPRIMED = "benchmark_unprimed"


class CacheWriteOutcome(enum.Enum):
    """What ``autotune_exhaustive_sweep`` did with the exact-match ranking cache."""

    WRITTEN = "written"
    UNCHANGED = "unchanged"
    DECLINED_DISABLED = "declined_disabled"
    DECLINED_UNKEYABLE = "declined_unkeyable"
    NOT_ATTEMPTED_PARTIAL_SWEEP = "not_attempted_partial_sweep"
    NOT_ATTEMPTED_NO_SUCCESSFUL_ENGINE = "not_attempted_no_successful_engine"
    #: the sweep was timed while its threads waited for a CPU core a quarter of the time or
    #: more: a ranking later runs would follow without timing is not made of such times
    NOT_ATTEMPTED_BUSY_CPU = "not_attempted_busy_cpu"


@dataclass
class AutotuneResult:
    """One candidate's outcome. Every candidate gets exactly one (RFC 6.3.1)."""

    engine_id: int = -1
    engine_name: str = ""
    knob_settings: list[KnobSetting] = field(default_factory=list)
    min_time_ms: float = 0.0
    avg_time_ms: float = 0.0
    stddev_ms: float = 0.0
    iterations_run: int = 0
    converged: bool = False
    rank: int = -1
    succeeded: bool = False
    error_message: str = ""
    workspace_size: int = 0
    estimated_workspace_size: int = 0
    compiled_plan_index: int = -1
    mode_used: TuneMode = TuneMode.STANDARD
    supports_exhaustive: bool = False
    ran_exhaustive: bool = False
    exhaustive_not_run_reason: str = ""
    strategy_used: AutotuneStrategy = AutotuneStrategy.RUN_UNTIL_STABLE
    # dnntune extensions
    excluded_by_caller: bool = False
    #: reached the timing loop (hipDNN's ``benchmarked``)
    benchmarked: bool = False
    median_time_ms: float = 0.0
    #: mean after dropping the slow tail (MAD rule); autotune_exhaustive_sweep ranks on it
    robust_time_ms: float = 0.0
    #: the clocks (DESIGN "Measurement"): min call latency of one execute on an idle device,
    #: min per-launch time of back-to-back launches behind a stall gate, and (when ranked on)
    #: min per-call time of back-to-back calls without a gate (host and device overlapping);
    #: ``min_time_ms`` is the one ``AutotuneConfig.ranking_metric`` names
    latency_ms: float = 0.0
    device_time_ms: float = 0.0
    throughput_ms: float = 0.0
    verified: bool | None = None
    max_abs_error: float | None = None
    compile_time_ms: float = 0.0
    priming_time_ms: float = 0.0
    benchmark_time_ms: float = 0.0
    cov: float = 0.0
    cache_mode: str = "warm"
    timer_kind: str = ""
    launches_per_sample: int = 1
    plan_name: str = ""
    #: why it failed, as a category: "timeout", "oom", "crash", "verification", "error",
    #: or "unsupported" (the engine cannot run this variant here, such as a CUDA-only knob value
    #: on the CPU: an expected outcome, not a failure of the engine) ("" while it has not
    #: failed); ``error_message`` has the details
    failure_kind: str = ""
    #: interleaved re-measurement rounds this candidate took part in (0: not re-measured)
    recheck_rounds: int = 0
    #: the time the decision compared: the re-measured estimate for close contenders (the
    #: trimmed geometric mean of their interleaved samples), else the first pass's median
    #: (``min_time_ms`` with ``ranking_statistic="min"``)
    decision_time_ms: float = 0.0
    #: this candidate is the default: the plan ``AutotuneConfig.baseline``'s heuristics pick
    is_default: bool = False
    #: on the winner only: how the decision was confirmed against the default plan
    #: (``dnntune.autotune.confirm``): "confirmed", "winner_is_default", "kept_default_tie",
    #: "kept_default_slower", "kept_default_unsure", "default_failed", "no_default",
    #: "not_checked" ("" before the session decides)
    confirmation: str = ""
    #: on the winner only: default time / this plan's time in the confirmation's interleaved
    #: rounds (None: not measured against the default)
    speedup_vs_default: float | None = None
    #: on the winner only: interleaved rounds of the confirmation, the relative standard error
    #: of its speedup, and the clock's own per-sample noise there (robust relative spread)
    confirm_rounds: int = 0
    confirm_noise: float = 0.0
    clock_noise: float = 0.0
    #: its timing stopped after its first samples because even the fastest of them was clearly
    #: slower than the best candidate so far (``AutotuneConfig.abandon_slow``); its result
    #: keeps those samples (it still succeeded, ranked on them)
    abandoned: bool = False
    #: on the winner only: whether it beat the runner-up beyond noise (None: no runner-up)
    separated: bool | None = None
    #: on the winner only: the relative noise of that comparison (0.01 = 1 %)
    separation_noise: float = 0.0
    samples_ms: list[float] = field(default_factory=list, repr=False)
    #: the interleaved re-measurement samples (a subset of ``samples_ms``), round by round
    recheck_samples_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def knobs(self) -> dict[str, KnobValue]:
        return {s.knob_id: s.value for s in self.knob_settings}


AutotuneRankingFn = Callable[[list[AutotuneResult]], None]


@dataclass
class AutotuneConfig:
    """How autotune() benchmarks (RFC 6.1 fields plus dnntune's measurement extensions).

    The extensions (verification, cache mode, ranking metric, the interleaved re-check of close
    contenders, timeouts and isolation) are described in docs/measurement.md.
    """

    mode: TuneMode = TuneMode.STANDARD
    strategy: AutotuneStrategy = AutotuneStrategy.RUN_UNTIL_STABLE
    warmup_iterations: int = 1
    timed_iterations: int = 10
    max_iterations: int = 100
    window_size: int = 3
    stability_threshold: float = 0.05
    engine_id_filter: list[int] = field(default_factory=list)
    ranking_fn: AutotuneRankingFn | None = None
    priming_failure_policy: PrimingFailurePolicy = PrimingFailurePolicy.ABORT_ON_PRIMING_FAILURE
    # ---- dnntune extensions (measurement you can trust) ----
    verify: bool = True
    rtol: float | None = None
    atol: float | None = None
    cache_mode: Literal["warm", "cold"] = "warm"
    ranking_metric: Literal["latency", "device", "throughput"] = "latency"
    recheck_within: float = 0.03
    #: interleaved re-measurement rounds: at least ``recheck_rounds``, then more (up to
    #: ``recheck_max_rounds``) while the leader is not separated from the others beyond noise
    recheck_rounds: int = 5
    recheck_max_rounds: int = 30
    #: the statistic of the first pass that ranks candidates outside the re-measured band:
    #: "median" (one lucky or unlucky sample cannot swing it) or "min" (the RFC's ranking)
    ranking_statistic: Literal["median", "min"] = "median"
    #: the heuristic mode whose pick is the default plan every winner must beat beyond noise
    #: in interleaved rounds (``dnntune.autotune.confirm``); None: no confirmation (RFC only)
    baseline: HeuristicMode | None = HeuristicMode.A
    #: interleaved rounds of the winner against the default: at least ``confirm_rounds``,
    #: then more until decided, ``confirm_max_rounds`` or ``confirm_budget_ms`` of wall time
    confirm_rounds: int = 10
    confirm_max_rounds: int = 400
    confirm_budget_ms: float = 2000.0
    #: the smallest gain over the default (0.01 = 1 %) worth switching plans for
    confirm_min_gain: float = 0.0
    #: deadline in seconds on each compile and each execute of a candidate (and the budget of
    #: its timed loop); a hang fails the candidate ("timed out"). None: no deadline
    candidate_timeout_s: float | None = None
    #: compile and time candidates in a worker process (plan-spec path only), so a crash fails
    #: one candidate instead of the tuner; see docs/measurement.md
    isolate: bool = False
    #: "module:function" called first thing in each isolate worker (register engines there)
    worker_setup: str | None = None
    #: keyword arguments of ``worker_setup`` (picklable)
    worker_setup_args: dict[str, Any] = field(default_factory=dict)
    #: seed of the inputs an isolate worker makes (``reference.make_inputs``); use the seed
    #: your variant pack came from so the worker verifies on the same data
    worker_input_seed: int = 0
    #: wall-time budget of the whole call in seconds (None: no budget). Candidates are tried
    #: cheap and likely first (the default plan, engines' default plans, then knob variants,
    #: by an estimate of compile cost); once the budget is spent the rest are skipped and
    #: recorded (``failure_kind="budget"``). A share is kept for the confirmation
    time_budget_s: float | None = None
    #: the share of ``time_budget_s`` kept for the confirmation against the default plan
    budget_confirm_share: float = 0.15
    #: stop timing a candidate once even the fastest of its first samples is slower than the
    #: best so far beyond ``abandon_margin`` and noise (never the default plan); and do not
    #: build one whose engine's measured call floor already is (``autotune.call_floor``)
    abandon_slow: bool = True
    #: a candidate is abandoned only when at least this much slower (0.10 = 10 %)
    abandon_margin: float = 0.10

    def __post_init__(self) -> None:
        # the RFC spells the enums' values ("exhaustive"); take them as the members, so that
        # ``config.mode is TuneMode.EXHAUSTIVE`` holds. Anything else is left for validate().
        for name, enum_type in _ENUM_FIELDS:
            member = enum_member(enum_type, getattr(self, name))
            if member is not None:
                setattr(self, name, member)
        baseline = enum_member(HeuristicMode, self.baseline)
        if baseline is not None:
            self.baseline = baseline

    def validate(self) -> None:
        """Raise InvalidValueError if a field has the wrong type or the parameters break RFC
        6.1's constraints.

        An enum field (``mode``, ``strategy``, ``priming_failure_policy``, ``baseline``) may
        also be given as its value's string (``"exhaustive"``); validate() replaces it with the
        member. Counts must be ints (not bools or floats), other numbers ints or floats.
        """
        self._check_types()
        if self.warmup_iterations < 0:
            raise InvalidValueError(f"warmup_iterations must be >= 0, got {self.warmup_iterations}")
        if self.strategy is AutotuneStrategy.FIXED_AVERAGE and self.timed_iterations < 1:
            raise InvalidValueError(f"timed_iterations must be >= 1, got {self.timed_iterations}")
        if self.strategy is AutotuneStrategy.RUN_UNTIL_STABLE:
            if self.window_size < 2:
                raise InvalidValueError(f"window_size must be >= 2, got {self.window_size}")
            if self.max_iterations < self.window_size:
                raise InvalidValueError(
                    f"max_iterations ({self.max_iterations}) must be >= window_size "
                    f"({self.window_size})"
                )
            if not 0.0 < self.stability_threshold < 1.0:
                raise InvalidValueError(
                    "stability_threshold must be in (0, 1) exclusive, got "
                    f"{self.stability_threshold}"
                )
        if self.cache_mode not in ("warm", "cold"):
            raise InvalidValueError(f"cache_mode must be 'warm' or 'cold', got {self.cache_mode!r}")
        if self.ranking_metric not in ("latency", "device", "throughput"):
            raise InvalidValueError(
                "ranking_metric must be 'latency', 'device' or 'throughput', got "
                f"{self.ranking_metric!r}"
            )
        if self.ranking_metric == "throughput" and self.cache_mode == "cold":
            raise InvalidValueError(
                "ranking_metric='throughput' times calls back to back, so the cache cannot be "
                "flushed between them; use cache_mode='warm' (or the 'latency' or 'device' "
                "clock for cold-cache timing)"
            )
        # `not (0 <= x < inf)` and not `x < 0`: NaN compares false both ways and slipped through
        for name in ("recheck_within", "confirm_budget_ms", "confirm_min_gain", "rtol", "atol"):
            value = getattr(self, name)
            if value is not None and not (0.0 <= value < math.inf):
                raise InvalidValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.candidate_timeout_s is not None and not (0.0 < self.candidate_timeout_s < math.inf):
            raise InvalidValueError(
                f"candidate_timeout_s must be a finite number of seconds > 0, got "
                f"{self.candidate_timeout_s!r}"
            )
        if self.recheck_rounds < 1:
            raise InvalidValueError(f"recheck_rounds must be >= 1, got {self.recheck_rounds}")
        if self.ranking_statistic not in ("median", "min"):
            raise InvalidValueError(
                f"ranking_statistic must be 'median' or 'min', got {self.ranking_statistic!r}"
            )
        if self.confirm_rounds < 2:
            raise InvalidValueError(f"confirm_rounds must be >= 2, got {self.confirm_rounds}")
        if self.confirm_max_rounds < self.confirm_rounds:
            raise InvalidValueError(
                f"confirm_max_rounds ({self.confirm_max_rounds}) must be >= confirm_rounds "
                f"({self.confirm_rounds})"
            )
        if self.recheck_max_rounds < self.recheck_rounds:
            raise InvalidValueError(
                f"recheck_max_rounds ({self.recheck_max_rounds}) must be >= recheck_rounds "
                f"({self.recheck_rounds})"
            )
        bad_budget = budget_error("time_budget_s", self.time_budget_s)
        if self.time_budget_s is not None and bad_budget is not None:
            raise InvalidValueError(bad_budget)
        if not 0.0 <= self.budget_confirm_share < 1.0:
            raise InvalidValueError(
                f"budget_confirm_share must be in [0, 1), got {self.budget_confirm_share}"
            )
        if not self.abandon_margin >= 0.0:
            raise InvalidValueError(f"abandon_margin must be >= 0, got {self.abandon_margin}")
        if self.worker_setup is not None:
            module, _, function = self.worker_setup.partition(":")
            if not module or not function:
                raise InvalidValueError(
                    f"worker_setup must be 'module:function', got {self.worker_setup!r}"
                )

    def _check_types(self) -> None:
        """Refuse a field of the wrong type (naming it, its value and what it takes) before any
        comparison can fail on it; an enum's string value becomes the member."""
        for name, enum_type in _ENUM_FIELDS:
            setattr(self, name, enum_field(name, getattr(self, name), enum_type))
        if self.baseline is not None:
            self.baseline = enum_field("baseline", self.baseline, HeuristicMode, "None")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidValueError(
                    f"AutotuneConfig.{name} must be an int, got {value!r} "
                    f"({type(value).__name__}){whole_number_hint(value)}"
                )
        for name, optional in _REAL_FIELDS:
            value = getattr(self, name)
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                what = "an int or float" + (" or None" if optional else "")
                raise InvalidValueError(
                    f"AutotuneConfig.{name} must be {what}, got {value!r} ({type(value).__name__})"
                )
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidValueError(
                    f"AutotuneConfig.{name} must be True or False, got {value!r} "
                    f"({type(value).__name__})"
                )
        self.engine_id_filter = engine_ids(self.engine_id_filter)
        if self.ranking_fn is not None and not callable(self.ranking_fn):
            raise InvalidValueError(
                "AutotuneConfig.ranking_fn must be a function of the list of results, or None, "
                f"got {self.ranking_fn!r}"
            )
        if self.worker_setup is not None and not isinstance(self.worker_setup, str):
            raise InvalidValueError(
                "AutotuneConfig.worker_setup must be a 'module:function' string or None, got "
                f"{self.worker_setup!r}"
            )
        if not isinstance(self.worker_setup_args, Mapping):
            raise InvalidValueError(
                "AutotuneConfig.worker_setup_args must be a dict of keyword arguments, got "
                f"{self.worker_setup_args!r}"
            )


_ENUM_FIELDS: tuple[tuple[str, type[enum.Enum]], ...] = (
    ("mode", TuneMode),
    ("strategy", AutotuneStrategy),
    ("priming_failure_policy", PrimingFailurePolicy),
)
#: the counts of AutotuneConfig: ints only (a bool or a float is a mistake, not a count)
_INT_FIELDS = (
    "warmup_iterations",
    "timed_iterations",
    "max_iterations",
    "window_size",
    "recheck_rounds",
    "recheck_max_rounds",
    "confirm_rounds",
    "confirm_max_rounds",
    "worker_input_seed",
)
#: (name, None allowed) of AutotuneConfig's other numbers: an int or a float
_REAL_FIELDS = (
    ("stability_threshold", False),
    ("rtol", True),
    ("atol", True),
    ("recheck_within", False),
    ("confirm_budget_ms", False),
    ("confirm_min_gain", False),
    ("candidate_timeout_s", True),
    ("time_budget_s", True),
    ("budget_confirm_share", False),
    ("abandon_margin", False),
)
_BOOL_FIELDS = ("verify", "isolate", "abandon_slow")


@dataclass
class AutotuneStorageConfig:
    """Where autotune() writes the winner (an engine-override config file, RFC 6.5).

    ``file_path``: a string or path ("" writes nothing). ``delete_all_existing_file_content``:
    True replaces the file, False (the default) merges into it; exactly a bool, since a string
    such as "false" would read as true and wipe the other graphs' entries."""

    file_path: str = ""
    delete_all_existing_file_content: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidValueError naming a field of the wrong type (the fields may be assigned
        after construction; autotune() checks again)."""
        path = self.file_path
        if isinstance(path, os.PathLike):
            self.file_path = path = os.fspath(path)
        if not isinstance(path, str):
            raise InvalidValueError(
                f"AutotuneStorageConfig.file_path must be a path (str or os.PathLike), got "
                f"{type(path).__name__} {path!r}"
            )
        flag = self.delete_all_existing_file_content
        if not isinstance(flag, bool):
            raise InvalidValueError(
                "AutotuneStorageConfig.delete_all_existing_file_content must be True (replace "
                f"the file) or False (merge into it, the default), got {type(flag).__name__} "
                f"{flag!r}"
            )


@dataclass(frozen=True)
class EngineConfigInfo:
    """Read-only snapshot of an engine for inspection and filtering (nothing compiled)."""

    engine_id: int = -1
    engine_name: str = ""
    knobs: tuple[Knob, ...] = ()
    supports_exhaustive: bool = False
    estimated_workspace_size: int = 0


@dataclass
class EngineVariant:
    """An engine id with explicit knob settings (a dict, as the RFC's std::map)."""

    engine_id: int = -1
    knob_settings: Mapping[str, KnobValue] = field(default_factory=dict)


@dataclass
class KnobSweepAxis:
    knob_id: str
    values: Sequence[KnobValue] = ()


@dataclass
class EngineSweepSpec:
    """A Cartesian product over ``axes``, each combination merged with ``fixed_settings``."""

    engine_id: int = -1
    axes: Sequence[KnobSweepAxis] = ()
    fixed_settings: Mapping[str, KnobValue] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanSpec:
    """An autotuning candidate: (engine id, knob settings). Knob order does not matter."""

    engine_id: int
    knob_settings: tuple[KnobSetting, ...] = ()
    estimated_workspace_size: int = 0

    def __init__(
        self,
        engine_id: int,
        knob_settings: Sequence[KnobSetting] = (),
        estimated_workspace_size: int = 0,
    ) -> None:
        object.__setattr__(self, "engine_id", int(engine_id))
        object.__setattr__(self, "knob_settings", normalize_settings(knob_settings))
        object.__setattr__(self, "estimated_workspace_size", int(estimated_workspace_size))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanSpec):
            return NotImplemented
        return self.engine_id == other.engine_id and self.knob_settings == other.knob_settings

    def __hash__(self) -> int:
        return hash((self.engine_id, self.knob_settings))
