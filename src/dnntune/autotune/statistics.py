"""Compatibility names: the statistics live in :mod:`dnntune.measure.stats`.

``TimingStats`` was autotune's statistics type; it is now :class:`~dnntune.measure.SampleStats`,
the one type that bench and plan timing use too. The names stay importable from here for the
modules that still import them from ``dnntune.autotune.statistics``.
"""

from dnntune.measure.stats import (
    DEFAULT_OUTLIER_Z,
    SampleStats,
    coefficient_of_variation,
    mean,
    median,
    population_stddev,
    robust_mean,
)

#: the former name of :class:`~dnntune.measure.SampleStats`
TimingStats = SampleStats

__all__ = [
    "DEFAULT_OUTLIER_Z",
    "SampleStats",
    "TimingStats",
    "coefficient_of_variation",
    "mean",
    "median",
    "population_stddev",
    "robust_mean",
]
