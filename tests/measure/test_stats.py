"""measure.stats, BenchmarkStatistics (RFC 10.2): empty input, single value, uniform values, CoV
at mean 0."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnntune.measure.stats import (
    SampleStats,
    coefficient_of_variation,
    mean,
    median,
    percentile,
    population_stddev,
    robust_mean,
)


def test_empty_input_gives_zeros() -> None:
    assert mean([]) == 0.0
    assert median([]) == 0.0
    assert population_stddev([]) == 0.0
    assert coefficient_of_variation([]) == 0.0
    assert robust_mean([]) == 0.0
    assert SampleStats.of([]) == SampleStats()


def test_single_value() -> None:
    s = SampleStats.of([2.5])
    assert (s.count, s.min_ms, s.max_ms, s.mean_ms, s.median_ms) == (1, 2.5, 2.5, 2.5, 2.5)
    assert s.stddev_ms == 0.0
    assert s.cov == 0.0
    assert s.robust_mean_ms == 2.5


def test_uniform_values_have_no_spread() -> None:
    s = SampleStats.of([3.0] * 7)
    assert s.stddev_ms == 0.0
    assert s.cov == 0.0
    assert s.mean_ms == 3.0


def test_population_stddev_divides_by_n() -> None:
    assert population_stddev([1.0, 3.0]) == pytest.approx(1.0)  # sample stddev would be 1.414
    assert population_stddev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(2.0)


def test_cov_zero_mean_guard() -> None:
    assert coefficient_of_variation([0.0, 0.0, 0.0]) == 0.0
    assert coefficient_of_variation([-1.0, 1.0]) == 0.0  # mean exactly 0: no division


def test_cov_value() -> None:
    assert coefficient_of_variation([1.0, 3.0]) == pytest.approx(0.5)


def test_median_even_and_odd() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_robust_mean_drops_only_the_slow_tail() -> None:
    values = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 10.0]
    assert robust_mean(values) == pytest.approx(1.0, abs=0.01)
    fast_outlier = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 0.01]
    assert robust_mean(fast_outlier) == pytest.approx(mean(fast_outlier))


def test_robust_mean_with_zero_mad_is_plain_mean() -> None:
    assert robust_mean([1.0, 1.0, 1.0, 5.0]) == pytest.approx(2.0)


@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=50))
def test_mean_stays_in_range(values: list[float]) -> None:
    s = SampleStats.of(values)
    assert s.min_ms <= s.mean_ms <= s.max_ms
    assert s.min_ms <= s.median_ms <= s.max_ms
    assert s.stddev_ms >= 0.0 and math.isfinite(s.cov)
    assert s.min_ms <= s.robust_mean_ms <= s.max_ms


# ---- edge cases: infinities next to the interpolation point, identical samples -----------------
def test_percentile_on_a_sample_point_ignores_an_infinite_neighbour() -> None:
    # pos lands exactly on a sample; 0 * inf used to make the result NaN
    assert percentile([1.0, 2.0, math.inf], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, math.inf], 100 * 2 / 3) == pytest.approx(3.0)
    s = SampleStats.of([1.0, 2.0, 3.0, 4.0, math.inf])
    assert (s.p25_ms, s.p75_ms, s.median_ms) == (2.0, 4.0, 3.0)
    assert percentile([1.0, math.inf, math.inf], 75) == math.inf


@given(
    st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1, max_value=40),
)
def test_identical_samples_have_exactly_no_spread(value: float, n: int) -> None:
    # fsum(values)/n need not round back to value (0.1 * 3): a spread of 1e-16 came out
    values = [value] * n
    assert population_stddev(values) == 0.0
    assert coefficient_of_variation(values) == 0.0
    s = SampleStats.of(values)
    assert (s.stddev_ms, s.cov, s.iqr_ms) == (0.0, 0.0, 0.0)
    assert s.mean_ms == s.median_ms == s.robust_mean_ms == value


def test_identical_samples_examples() -> None:
    assert coefficient_of_variation([0.1, 0.1, 0.1]) == 0.0
    assert population_stddev([123.456] * 5) == 0.0
