"""Data structures (RFC 6.1, 6.2.2, 10.2): defaults, validation, PlanSpec identity."""

from __future__ import annotations

import pytest

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import InvalidValueError
from dnntune.rfc import PlanSpec


def test_config_defaults_match_rfc() -> None:
    c = dt.AutotuneConfig()
    assert c.mode is dt.TuneMode.STANDARD
    assert c.strategy is dt.AutotuneStrategy.RUN_UNTIL_STABLE
    assert (c.warmup_iterations, c.timed_iterations, c.max_iterations, c.window_size) == (
        1,
        10,
        100,
        3,
    )
    assert c.stability_threshold == pytest.approx(0.05)
    assert c.engine_id_filter == [] and c.ranking_fn is None
    assert c.priming_failure_policy is dt.PrimingFailurePolicy.ABORT_ON_PRIMING_FAILURE
    assert c.verify is True
    c.validate()


def test_result_defaults_match_rfc() -> None:
    r = dt.AutotuneResult()
    assert (r.engine_id, r.rank, r.compiled_plan_index) == (-1, -1, -1)
    assert not r.succeeded and not r.converged and not r.ran_exhaustive
    assert r.mode_used is dt.TuneMode.STANDARD
    assert r.strategy_used is dt.AutotuneStrategy.RUN_UNTIL_STABLE
    assert r.verified is None and r.excluded_by_caller is False


def test_storage_and_engine_types_defaults() -> None:
    assert dt.AutotuneStorageConfig() == dt.AutotuneStorageConfig("", False)
    info = dt.EngineConfigInfo()
    assert info.engine_id == -1 and info.knobs == () and not info.supports_exhaustive
    assert dt.EngineVariant().knob_settings == {}
    assert dt.EngineSweepSpec().axes == ()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"warmup_iterations": -1}, "warmup_iterations"),
        (
            {"strategy": dt.AutotuneStrategy.FIXED_AVERAGE, "timed_iterations": 0},
            "timed_iterations",
        ),
        ({"window_size": 1}, "window_size"),
        ({"max_iterations": 2, "window_size": 3}, "max_iterations"),
        ({"stability_threshold": 0.0}, "stability_threshold"),
        ({"stability_threshold": 1.0}, "stability_threshold"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        dt.AutotuneConfig(**kwargs).validate()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "name", ["recheck_within", "confirm_budget_ms", "confirm_min_gain", "rtol", "atol"]
)
@pytest.mark.parametrize("value", [NAN, INF, -1.0])
def test_config_refuses_values_that_are_not_finite_or_negative(name: str, value: float) -> None:
    """NaN compared false against 0 and slipped through: a NaN confirm_min_gain discarded a 2x
    winner, a NaN rtol failed every correct candidate (an audit's findings)."""
    with pytest.raises(InvalidValueError, match=f"{name} must be a finite number >= 0"):
        dt.AutotuneConfig(**{name: value}).validate()


@pytest.mark.parametrize("value", [NAN, INF, 0.0, -1.0])
def test_config_refuses_a_candidate_timeout_that_is_not_a_positive_number(value: float) -> None:
    with pytest.raises(InvalidValueError, match="candidate_timeout_s must be a finite"):
        dt.AutotuneConfig(candidate_timeout_s=value).validate()


def test_run_until_stable_params_ignored_for_fixed_average() -> None:
    dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, window_size=1).validate()


def test_plan_spec_knob_order_does_not_matter() -> None:
    a = PlanSpec(7, [KnobSetting("x", 1), KnobSetting("y", "s")])
    b = PlanSpec(7, [KnobSetting("y", "s"), KnobSetting("x", 1)], estimated_workspace_size=99)
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


def test_plan_spec_differs_by_engine_or_value() -> None:
    base = PlanSpec(7, [KnobSetting("x", 1)])
    assert base != PlanSpec(8, [KnobSetting("x", 1)])
    assert base != PlanSpec(7, [KnobSetting("x", 2)])
    assert base != PlanSpec(7, [])
    assert PlanSpec(7) == PlanSpec(7, [])
