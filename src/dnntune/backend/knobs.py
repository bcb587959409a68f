"""Knobs: typed, constrained engine settings (``global.*`` reserved, ``<provider>.<name>`` own).

Mirrors hipDNN's knob model: a value is an int, a float or a string; a constraint limits it;
``validate`` says which knob is wrong and which values are allowed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dnntune.errors import InvalidValueError

__all__ = [
    "BENCHMARKING",
    "DETERMINISTIC",
    "WORKSPACE_SIZE_LIMIT",
    "FloatConstraint",
    "IntConstraint",
    "Knob",
    "KnobSetting",
    "KnobValue",
    "KnobValueType",
    "StringConstraint",
    "allows_tf32",
    "benchmarking_knob",
    "deterministic_knob",
    "normalize_settings",
    "settings_from_mapping",
    "workspace_limit_knob",
]

KnobValue = int | float | str

BENCHMARKING = "global.benchmarking"
WORKSPACE_SIZE_LIMIT = "global.workspace_size_limit"
DETERMINISTIC = "global.deterministic"
GLOBAL_PREFIX = "global."


class KnobValueType(enum.Enum):
    INT64 = "int"
    FLOAT64 = "double"
    STRING = "string"

    @classmethod
    def of(cls, value: KnobValue) -> KnobValueType:
        if isinstance(value, bool):
            return cls.INT64
        if isinstance(value, int):
            return cls.INT64
        if isinstance(value, float):
            return cls.FLOAT64
        if isinstance(value, str):
            return cls.STRING
        raise InvalidValueError(f"knob value {value!r} must be an int, a float or a string")


@dataclass(frozen=True)
class IntConstraint:
    """Inclusive range with a step from ``min_value``; or an explicit set of valid values."""

    min_value: int = -(2**63)
    max_value: int = 2**63 - 1
    step: int = 1
    valid_values: frozenset[int] = frozenset()

    def check(self, value: int) -> str | None:
        if self.valid_values:
            if value not in self.valid_values:
                return f"allowed values: {sorted(self.valid_values)}"
            return None
        if not self.min_value <= value <= self.max_value:
            return f"allowed range: {self.min_value}..{self.max_value}"
        if self.step > 1 and (value - self.min_value) % self.step:
            return f"must be {self.min_value} plus a multiple of {self.step}"
        return None

    def describe(self) -> str:
        if self.valid_values:
            return "{" + ", ".join(str(v) for v in sorted(self.valid_values)) + "}"
        step = f" step {self.step}" if self.step > 1 else ""
        return f"{self.min_value}..{self.max_value}{step}"


@dataclass(frozen=True)
class FloatConstraint:
    min_value: float = float("-inf")
    max_value: float = float("inf")

    def check(self, value: float) -> str | None:
        if not self.min_value <= value <= self.max_value:
            return f"allowed range: {self.min_value}..{self.max_value}"
        return None

    def describe(self) -> str:
        return f"{self.min_value}..{self.max_value}"


@dataclass(frozen=True)
class StringConstraint:
    valid_values: frozenset[str] = frozenset()
    max_length: int = -1

    def check(self, value: str) -> str | None:
        if self.valid_values and value not in self.valid_values:
            return f"allowed values: {sorted(self.valid_values)}"
        if self.max_length >= 0 and len(value) > self.max_length:
            return f"at most {self.max_length} characters"
        return None

    def describe(self) -> str:
        if self.valid_values:
            return "{" + ", ".join(sorted(self.valid_values)) + "}"
        return "any string"


Constraint = IntConstraint | FloatConstraint | StringConstraint


@dataclass(frozen=True)
class KnobSetting:
    """A knob id with a value. Hashable; settings lists are compared order-independently."""

    knob_id: str
    value: KnobValue

    @property
    def value_type(self) -> KnobValueType:
        return KnobValueType.of(self.value)

    def __str__(self) -> str:
        return f"{self.knob_id}={self.value}"


@dataclass(frozen=True)
class Knob:
    """An engine's knob: id, description, value type, default and constraint."""

    knob_id: str
    description: str
    value_type: KnobValueType
    default_value: KnobValue
    constraint: Constraint = field(default_factory=IntConstraint)
    is_deprecated: bool = False
    #: the values are in the engine's order of preference (a ranked plan index), so a bounded
    #: sweep tries the first few instead of skipping the knob
    ranked: bool = False
    #: a nonzero value lets float32 convolutions and matmuls compute in TF32 (10 mantissa
    #: bits), so such a plan is checked with ``reference.tolerance_for(..., tf32=True)``
    tf32: bool = False
    #: values that run the provider's own search (``torch.compile``'s max-autotune): what
    #: EXHAUSTIVE mode's priming (``global.benchmarking``) runs, so variant enumeration leaves
    #: them to it instead of putting a search of tens of seconds into every sweep
    search_values: frozenset[KnobValue] = frozenset()
    #: values whose build writes or deletes the engine's persistent records (a perf db, a
    #: find db): never a variant, since a sweep must not change what later builds read
    persistent_values: frozenset[KnobValue] = frozenset()
    #: values that, with every other knob at its default, build the very plan the default
    #: value builds (a pin of the value the default config already has; a policy that decides
    #: as the default does): a single-knob variant of one is a duplicate of the default
    default_plan_values: frozenset[KnobValue] = frozenset()
    #: values that, with every other knob at its default, launch the default's kernels and
    #: change only how they are submitted (``torch.compile``'s reduce-overhead: Inductor's
    #: kernels replayed through a CUDA graph): on the device clock they time as the default
    #: does, so a sweep ranked on that clock (``bench --oracle``'s) leaves them out
    same_kernel_values: frozenset[KnobValue] = frozenset()
    #: the identity of the plan a full set of knob values (every knob of the engine, resolved)
    #: builds, or None where it cannot be known without building (for ``cudnn.engine_config``:
    #: cuDNN's engine config, engine id and knobs, that the index names in its heuristic
    #: mode's list): two settings with one identity build one plan
    plan_key: Callable[[Mapping[str, KnobValue]], Hashable | None] | None = field(
        default=None, compare=False, repr=False
    )

    def validate(self, setting: KnobSetting, engine_name: str = "") -> None:
        """Raise InvalidValueError naming the knob and the allowed values if ``setting`` is bad."""
        where = f"engine {engine_name}: " if engine_name else ""
        value = setting.value
        vtype = KnobValueType.of(value)
        if vtype is not self.value_type and not (
            self.value_type is KnobValueType.FLOAT64 and vtype is KnobValueType.INT64
        ):
            raise InvalidValueError(
                f"{where}knob {self.knob_id}: expected a {self.value_type.value} value, "
                f"got {value!r}"
            )
        problem = self.constraint.check(value)  # type: ignore[arg-type]
        if problem:
            raise InvalidValueError(
                f"{where}knob {self.knob_id}: value {value!r} is invalid; {problem}"
            )

    def describe(self) -> str:
        return (
            f"{self.value_type.value}, {self.constraint.describe()}, default {self.default_value}"
        )


def benchmarking_knob() -> Knob:
    return Knob(
        BENCHMARKING,
        "1: the engine runs its own internal search when built (first build slower)",
        KnobValueType.INT64,
        0,
        IntConstraint(0, 1),
    )


def workspace_limit_knob(default: int = 2**62) -> Knob:
    return Knob(
        WORKSPACE_SIZE_LIMIT,
        "largest workspace in bytes the engine may use; plans needing more are not chosen",
        KnobValueType.INT64,
        default,
        IntConstraint(0, 2**63 - 1),
    )


def deterministic_knob() -> Knob:
    return Knob(
        DETERMINISTIC,
        "1: use only deterministic algorithms",
        KnobValueType.INT64,
        0,
        IntConstraint(0, 1),
    )


def settings_from_mapping(
    mapping: Mapping[str, KnobValue] | Iterable[KnobSetting],
) -> list[KnobSetting]:
    """Accept a dict ``{knob_id: value}`` or KnobSettings; return KnobSettings."""
    if isinstance(mapping, Mapping):
        return [KnobSetting(k, v) for k, v in mapping.items()]
    return [s if isinstance(s, KnobSetting) else KnobSetting(*s) for s in mapping]


def normalize_settings(settings: Sequence[KnobSetting]) -> tuple[KnobSetting, ...]:
    """Sorted by knob id (order-independent identity); a repeated knob keeps the last value."""
    last: dict[str, KnobSetting] = {}
    for s in settings:
        last[s.knob_id] = s
    return tuple(sorted(last.values(), key=lambda s: s.knob_id))


def allows_tf32(knobs: Sequence[Knob], values: Mapping[str, KnobValue]) -> bool:
    """True if ``values`` sets a :attr:`Knob.tf32` knob of ``knobs`` to a nonzero value."""
    return any(k.tf32 and bool(values.get(k.knob_id, k.default_value)) for k in knobs)
