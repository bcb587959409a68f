"""Every RFC 6.4 log category appears with the "autotune:" prefix."""

from __future__ import annotations

import logging

import pytest
from autotune_helpers import Pack, tune

import dnntune as dt


def test_log_categories(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, caplog: pytest.LogCaptureFixture
) -> None:
    graph.add_all_engines()
    with caplog.at_level(logging.DEBUG, logger="dnntune.autotune"):
        tune(
            graph,
            handle,
            pack,
            mode=dt.TuneMode.EXHAUSTIVE,
            priming_failure_policy=dt.PrimingFailurePolicy.BENCHMARK_UNPRIMED,
        )
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("dnntune.autotune")]
    assert messages and all(m.startswith("autotune: ") for m in messages)
    text = "\n".join(messages)
    for fragment in (
        "autotune: session start - 7 candidate(s) (plan-spec path), mode=EXHAUSTIVE, "
        "strategy=RUN_UNTIL_STABLE",
        "autotune: compilation - 1 compiled, 0 failed",  # the unprimed default, before priming
        "autotune: compilation - 7 compiled, 0 failed",
        "autotune: priming - 1 primed, 1 skipped (workspace), 1 failed",
        # EXHAUSTIVE also times the default (A) unprimed, first: 8 timed for 7 plan specs
        "autotune: EXHAUSTIVE: the default plan is also timed unprimed, as FAKE_ENGINE_A "
        "(unprimed default)",
        "autotune: benchmarking FAKE_ENGINE_A (unprimed default) (1/8)",
        "autotune: benchmarking FAKE_ENGINE_A (2/8)",
        "autotune: FAKE_ENGINE_A: min=1.0000 ms",
        "iterations=3 converged=True",
        "autotune: FAKE_ENGINE_A iteration 3: 1.0000 ms (CoV 0.0000)",
        "autotune: FAKE_ENGINE_FAILS failed: failed warmup",
        "autotune: ranking complete - 5 succeeded, 2 failed",
        # a tie: the unprimed default stays (the primed A ran no faster)
        "autotune: winner - FAKE_ENGINE_A (unprimed default) (ID",
    ):
        assert fragment in text, fragment
    failures = [r for r in caplog.records if "FAKE_ENGINE_FAILS failed" in r.getMessage()]
    assert failures and all(r.levelno == logging.WARNING for r in failures)


def test_library_never_prints(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, capsys: pytest.CaptureFixture[str]
) -> None:
    graph.add_all_engines()
    tune(graph, handle, pack)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
