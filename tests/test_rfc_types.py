"""AutotuneConfig.validate() checks the fields' types (an audit's findings): an enum field takes
its member or the RFC's spelling of its value, counts take ints only, and a field of the wrong
type is an InvalidValueError naming it, not an AttributeError or TypeError deep in autotune."""

from __future__ import annotations

import enum
from typing import Any

import pytest

import dnntune as dt
from dnntune.autotune.preconditions import check_config
from dnntune.backend.heuristics import HeuristicMode
from dnntune.errors import InvalidValueError

ENUM_FIELDS: list[tuple[str, type[enum.Enum]]] = [
    ("mode", dt.TuneMode),
    ("strategy", dt.AutotuneStrategy),
    ("priming_failure_policy", dt.PrimingFailurePolicy),
    ("baseline", HeuristicMode),
]
ENUM_VALUES = [(name, member) for name, enum_type in ENUM_FIELDS for member in enum_type]

INT_FIELDS = [
    "warmup_iterations",
    "timed_iterations",
    "max_iterations",
    "window_size",
    "recheck_rounds",
    "recheck_max_rounds",
    "confirm_rounds",
    "confirm_max_rounds",
    "worker_input_seed",
]


@pytest.mark.parametrize(("name", "member"), ENUM_VALUES, ids=lambda v: str(v))
def test_an_enum_field_takes_its_value_string_as_the_member(name: str, member: enum.Enum) -> None:
    config = dt.AutotuneConfig(**{name: member.value})
    assert getattr(config, name) is member  # at once, before validate()
    config.validate()
    assert getattr(config, name) is member


@pytest.mark.parametrize(("name", "member"), ENUM_VALUES, ids=lambda v: str(v))
def test_an_enum_string_set_after_construction_becomes_the_member(
    name: str, member: enum.Enum
) -> None:
    config = dt.AutotuneConfig()
    setattr(config, name, member.value)
    config.validate()
    assert getattr(config, name) is member


def test_the_audit_s_run_until_stable_string_gets_the_rfc_constraint_error() -> None:
    """validate() compared ``strategy is AutotuneStrategy...``: a string skipped the check."""
    config = dt.AutotuneConfig(strategy="run_until_stable", window_size=1, max_iterations=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="window_size must be >= 2, got 1"):
        config.validate()
    with pytest.raises(InvalidValueError, match=r"max_iterations \(0\) must be >= window_size"):
        dt.AutotuneConfig(strategy="run_until_stable", max_iterations=0).validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="timed_iterations must be >= 1"):
        dt.AutotuneConfig(strategy="fixed_average", timed_iterations=0).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "enum_type"), ENUM_FIELDS)
@pytest.mark.parametrize("value", ["keep_going", "", 1, 0.5, dt.CacheWriteOutcome.WRITTEN])
def test_a_wrong_enum_value_lists_the_valid_ones(
    name: str, enum_type: type[enum.Enum], value: Any
) -> None:
    with pytest.raises(InvalidValueError) as info:
        dt.AutotuneConfig(**{name: value}).validate()
    message = str(info.value)
    assert f"AutotuneConfig.{name} must be one of" in message and repr(value) in message
    for member in enum_type:
        assert f"{enum_type.__name__}.{member.name} ({member.value!r})" in message


def test_an_enum_string_in_the_wrong_case_suggests_the_right_one() -> None:
    with pytest.raises(InvalidValueError, match=r"got 'EXHAUSTIVE'; did you mean 'exhaustive'\?"):
        dt.AutotuneConfig(mode="EXHAUSTIVE").validate()  # type: ignore[arg-type]


def test_baseline_none_still_means_no_confirmation() -> None:
    config = dt.AutotuneConfig(baseline=None)
    config.validate()
    assert config.baseline is None


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("value", [2.5, 3.0, True, False, "3", None])
def test_a_count_must_be_an_int(name: str, value: Any) -> None:
    config = dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, **{name: value})
    with pytest.raises(InvalidValueError, match=f"AutotuneConfig.{name} must be an int, got"):
        config.validate()


def test_a_float_count_suggests_a_whole_number() -> None:
    config = dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=2.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"got 2.5 \(float\); pass a whole number such"):
        config.validate()


def test_numpy_ints_are_counts() -> None:
    np = pytest.importorskip("numpy")
    dt.AutotuneConfig(timed_iterations=np.int64(5), warmup_iterations=np.int32(2)).validate()


@pytest.mark.parametrize(
    "name",
    [
        "stability_threshold",
        "recheck_within",
        "confirm_budget_ms",
        "confirm_min_gain",
        "budget_confirm_share",
        "abandon_margin",
        "rtol",
        "atol",
        "candidate_timeout_s",
        "time_budget_s",
    ],
)
@pytest.mark.parametrize("value", ["0.1", True, [0.1]])
def test_a_number_field_must_be_an_int_or_float(name: str, value: Any) -> None:
    with pytest.raises(InvalidValueError, match=f"AutotuneConfig.{name} must be an int or float"):
        dt.AutotuneConfig(**{name: value}).validate()


@pytest.mark.parametrize("name", ["verify", "isolate", "abandon_slow"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_a_switch_must_be_a_bool(name: str, value: Any) -> None:
    with pytest.raises(InvalidValueError, match=f"AutotuneConfig.{name} must be True or False"):
        dt.AutotuneConfig(**{name: value}).validate()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ranking_fn": "fastest"}, "ranking_fn must be a function"),
        ({"worker_setup": 3}, "worker_setup must be a 'module:function' string"),
        ({"worker_setup_args": [1]}, "worker_setup_args must be a dict"),
    ],
)
def test_other_fields_of_the_wrong_type_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        dt.AutotuneConfig(**kwargs).validate()


def test_check_config_refuses_a_wrong_type_before_any_work() -> None:
    """autotune() calls check_config first: the audit's inputs fail there, by name."""
    with pytest.raises(InvalidValueError, match="priming_failure_policy must be one of"):
        check_config(dt.AutotuneConfig(priming_failure_policy="keep_going"))  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="timed_iterations must be an int"):
        check_config(
            dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=2.5)  # type: ignore[arg-type]
        )
    config = check_config(dt.AutotuneConfig(mode="exhaustive"))  # type: ignore[arg-type]
    assert config.mode is dt.TuneMode.EXHAUSTIVE


def test_the_nan_checks_still_hold() -> None:
    with pytest.raises(InvalidValueError, match="confirm_min_gain must be a finite number"):
        dt.AutotuneConfig(confirm_min_gain=float("nan")).validate()
