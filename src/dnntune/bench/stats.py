"""Compatibility names: bench's sample statistics are :mod:`dnntune.measure.stats`.

:class:`~dnntune.measure.SampleStats` is the one statistics type of the project; its
``to_dict`` writes the statistics object of ``results.json`` (``n``, ``mean_ms``,
``median_ms``, ``std_ms``, ``cov``, ``min_ms``, ``p25_ms``, ``p75_ms``, ``p95_ms``, ``max_ms``,
``iqr_ms``) as before. The names stay importable from here for ``benchmarks/``.
"""

from dnntune.measure.stats import SampleStats, percentile, summarize

__all__ = ["SampleStats", "percentile", "summarize"]
