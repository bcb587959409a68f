"""Bench statistics and analytic FLOP/byte counts."""

from __future__ import annotations

import math

import pytest

import dnntune as dt
from dnntune.bench.metrics import graph_metrics
from dnntune.measure.stats import percentile, summarize


def test_summarize_known_values() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert s.n == 4
    assert s.min_ms == 1.0 and s.max_ms == 4.0
    assert s.mean_ms == pytest.approx(2.5)
    assert s.median_ms == pytest.approx(2.5)
    assert s.std_ms == pytest.approx(math.sqrt(1.25))  # population stddev
    assert s.cov == pytest.approx(math.sqrt(1.25) / 2.5)
    assert s.p25_ms == pytest.approx(1.75) and s.p75_ms == pytest.approx(3.25)
    assert s.iqr_ms == pytest.approx(1.5)
    assert s.p95_ms is None  # fewer than 20 samples


def test_summarize_edges() -> None:
    with pytest.raises(ValueError):
        summarize([])
    one = summarize([2.0])
    assert one.std_ms == 0.0 and one.cov == 0.0 and one.median_ms == 2.0
    zeros = summarize([0.0, 0.0])
    assert zeros.cov == 0.0  # no division by zero
    many = summarize([float(i) for i in range(1, 101)])
    assert many.p95_ms == pytest.approx(percentile(sorted(float(i) for i in range(1, 101)), 95))


def test_conv_and_matmul_flops() -> None:
    g = dt.Graph("c", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [2, 8, 10, 10])
    w = g.tensor("W", [16, 4, 3, 3])  # 2 groups
    y = g.conv_fprop(x, w, padding=1)
    y.set_output(True)
    g.validate()
    m = graph_metrics(g)
    assert m.flops == 2 * 2 * 16 * (4 * 3 * 3) * 10 * 10
    assert m.io_bytes == 4 * (2 * 8 * 100 + 16 * 4 * 9 + 2 * 16 * 100)
    assert m.tflops(1.0) == pytest.approx(m.flops / 1e-3 / 1e12)

    g2 = dt.Graph("m", io_data_type=dt.DataType.HALF, compute_data_type=dt.DataType.FLOAT)
    a = g2.tensor("A", [3, 4, 5])
    b = g2.tensor("B", [5, 6])
    c = g2.matmul(a, b)
    c.set_output(True)
    g2.validate()
    assert graph_metrics(g2).flops == 2 * 3 * 4 * 6 * 5


def test_causal_sdpa_counts_lower_triangle() -> None:
    g = dt.Graph("s", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    q = g.tensor("Q", [1, 2, 4, 8])
    k = g.tensor("K", [1, 2, 4, 8])
    v = g.tensor("V", [1, 2, 4, 8])
    (o,) = g.sdpa(q, k, v, causal_mask=True)
    o.set_output(True)
    g.validate()
    assert graph_metrics(g).flops == 2 * 1 * 2 * (1 + 2 + 3 + 4) * (8 + 8)
