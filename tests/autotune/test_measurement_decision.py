"""Issue 8, bullet 3: close contenders are re-measured interleaved and decided beyond noise."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.autotune import WinnerMargin, winner_margin
from dnntune.autotune.decision import (
    compare_paired,
    critical_value,
    estimate_ms,
    relative_noise,
)
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_B, FAKE_ENGINE_C

WS = testing.ESTIMATED_WORKSPACE_BYTES


def _tune(
    timings: Mapping[str, Any],
    order: list[str],
    noise: float = 0.0,
    seed: int = 0,
    **config: Any,
) -> tuple[list[dt.AutotuneResult], dt.Graph]:
    names = sorted(set(order))
    with testing.fake_engines(names=names, timings=timings, noise=noise, seed=seed):
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_engines(order)
        pack = testing.make_pack(g)
        ws = torch.empty(WS, dtype=torch.uint8)
        results = g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(**config))
        return results, g


@pytest.mark.parametrize(("difference", "noise"), [(0.04, 0.05), (0.03, 0.03), (0.05, 0.05)])
def test_noisy_pair_truly_faster_wins(difference: float, noise: float) -> None:
    """A and C differ by 3-5 %, every sample has 3-5 % Gaussian noise; 100 seeded trials."""
    wins = rechecked = 0
    for seed in range(100):
        order = [FAKE_ENGINE_C, FAKE_ENGINE_A] if seed % 2 else [FAKE_ENGINE_A, FAKE_ENGINE_C]
        timings = {FAKE_ENGINE_A: 1.0, FAKE_ENGINE_C: 1.0 + difference}
        results, _ = _tune(timings, order, noise=noise, seed=seed)
        wins += results[0].engine_name == FAKE_ENGINE_A
        rechecked += results[0].recheck_rounds > 0
    assert wins >= 95
    assert rechecked >= 50  # the decision is made on interleaved samples, not the first pass


def test_clear_winner_is_separated_without_recheck() -> None:
    results, g = _tune({}, [FAKE_ENGINE_C, FAKE_ENGINE_A])  # 2.0 ms and 1.0 ms
    w = results[0]
    assert w.engine_name == FAKE_ENGINE_A and w.recheck_rounds == 0
    assert w.separated is True and w.decision_time_ms == w.min_time_ms == 1.0
    m = winner_margin(results)
    assert m.winner is w and m.runner_up is results[1]
    assert m.margin == pytest.approx(1.0) and m.separated and m.noise == 0.0
    assert g.last_autotune_summary is not None and g.last_autotune_summary.margin == m


def test_exact_tie_is_rechecked_and_not_separated() -> None:
    results, _ = _tune({FAKE_ENGINE_C: 1.0}, [FAKE_ENGINE_A, FAKE_ENGINE_C])
    assert [r.recheck_rounds for r in results] == [5, 5]  # tied after the minimum rounds
    assert all(len(r.recheck_samples_ms) == 5 for r in results)
    assert all(r.iterations_run == len(r.samples_ms) for r in results)
    m = winner_margin(results)
    assert m.margin == pytest.approx(0.0) and not m.separated
    assert results[0].separated is False


def test_rounds_are_adaptive() -> None:
    """A noisy tie keeps sampling (up to the maximum); a clear 2 % gap stops at the minimum."""
    noisy, _ = _tune(
        {FAKE_ENGINE_C: 1.0}, [FAKE_ENGINE_A, FAKE_ENGINE_C], noise=0.05, recheck_max_rounds=12
    )
    assert max(r.recheck_rounds for r in noisy) > 5
    assert all(r.recheck_rounds <= 12 for r in noisy)
    clear, _ = _tune({FAKE_ENGINE_C: 1.02}, [FAKE_ENGINE_A, FAKE_ENGINE_C])
    assert [r.recheck_rounds for r in clear] == [5, 5]
    assert clear[0].engine_name == FAKE_ENGINE_A and clear[0].separated is True


def test_noisy_candidate_outside_the_fixed_band_is_still_rechecked() -> None:
    # C's best sample is 8 % above A's, but both swing by +-15 %: the band widens
    timings = {FAKE_ENGINE_A: [1.0, 1.3, 1.15], FAKE_ENGINE_C: [1.08, 1.35, 1.2]}
    results, _ = _tune(timings, [FAKE_ENGINE_A, FAKE_ENGINE_C])
    assert all(r.recheck_rounds > 0 for r in results)


def test_recheck_within_zero_disables_it() -> None:
    results, _ = _tune({FAKE_ENGINE_C: 1.0}, [FAKE_ENGINE_A, FAKE_ENGINE_C], recheck_within=0.0)
    assert all(r.recheck_rounds == 0 and not r.recheck_samples_ms for r in results)


def test_contenders_are_ranked_first_by_their_interleaved_samples() -> None:
    # B's first pass got lucky (0.9 once); interleaved, it is the slowest of the three
    timings = {
        FAKE_ENGINE_A: 1.0,
        FAKE_ENGINE_C: 1.01,
        FAKE_ENGINE_B: [1.05, 1.05, 0.9, 1.05, 1.05, 1.05, 1.05, 1.05],
    }
    results, _ = _tune(
        timings,
        [FAKE_ENGINE_B, FAKE_ENGINE_A, FAKE_ENGINE_C],
        strategy=dt.AutotuneStrategy.FIXED_AVERAGE,
        timed_iterations=3,
    )
    by = {r.engine_name: r for r in results}
    assert by[FAKE_ENGINE_B].min_time_ms == pytest.approx(0.9)  # the lucky sample stays in min
    assert results[0].engine_name == FAKE_ENGINE_A
    assert [r.rank for r in results] == [0, 1, 2]
    assert by[FAKE_ENGINE_B].decision_time_ms > by[FAKE_ENGINE_A].decision_time_ms


def test_ranking_fn_still_has_the_last_word() -> None:
    def slowest_first(results: list[dt.AutotuneResult]) -> None:
        results.sort(key=lambda r: -r.min_time_ms)

    results, _ = _tune(
        {FAKE_ENGINE_C: 1.01}, [FAKE_ENGINE_A, FAKE_ENGINE_C], ranking_fn=slowest_first
    )
    assert results[0].engine_name == FAKE_ENGINE_C
    assert winner_margin(results).separated is False  # the winner is the slower one


# ---- the statistics -------------------------------------------------------------------------
def test_paired_comparison() -> None:
    a = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]
    b = [x * 1.05 for x in a]  # 5 % slower in every round, however noisy the rounds are
    cmp = compare_paired(a, b)
    assert cmp.rounds == 6 and cmp.kept == 4 and cmp.margin == pytest.approx(0.05)
    assert cmp.noise == pytest.approx(0.0, abs=1e-12) and cmp.separated()
    assert not compare_paired(b, a).separated()
    tied = compare_paired(a, list(a))
    assert tied.equivalent() and not tied.separated()
    assert compare_paired([1.0], [2.0]).noise == math.inf


def test_one_preempted_round_is_trimmed() -> None:
    a = [1.0] * 10
    b = [1.03, 1.029, 1.031, 1.03, 1.028, 1.032, 1.03, 1.031, 1.029, 0.5]  # round 10 hiccup
    assert compare_paired(a, b).separated()


def test_critical_value_widens_for_few_rounds() -> None:
    assert critical_value(5) > critical_value(10) > critical_value(100) > 2.576
    assert critical_value(1) == math.inf


def test_relative_noise_pools_candidates() -> None:
    assert relative_noise([1.0]) == 0.0
    assert relative_noise([1.0, 1.0, 1.0]) == 0.0
    one = relative_noise([0.9, 1.1])
    assert one == pytest.approx(math.sqrt(0.02))
    assert relative_noise([0.9, 1.1], [1.8, 2.2]) == pytest.approx(one)
    assert estimate_ms([1.0, 4.0]) == pytest.approx(2.0)
    assert estimate_ms([]) == 0.0


def test_winner_margin_edge_cases() -> None:
    assert winner_margin([]) == WinnerMargin(None, None, None, False, 0.0)
    only = dt.AutotuneResult(engine_name="X", succeeded=True, rank=0, min_time_ms=1.0)
    failed = dt.AutotuneResult(engine_name="Y", succeeded=False, rank=-1)
    m = winner_margin([only, failed])
    assert m.winner is only and m.runner_up is None and m.separated and m.margin is None
    close = dt.AutotuneResult(engine_name="Z", succeeded=True, rank=1, min_time_ms=1.01)
    only.samples_ms, close.samples_ms = [1.0, 1.1, 0.95], [1.01, 1.12, 0.96]
    m = winner_margin([only, close])
    assert m.margin == pytest.approx(0.01) and not m.separated and m.noise > 0.01


def _built_in(name: str, ms: float) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(name=name, result=SimpleNamespace(compile_time_ms=ms))


@pytest.mark.parametrize(
    ("leader_ms", "other_ms", "moved"),
    [
        (570.0, 1.2, True),  # torch.compile against a Triton launch: rebuild cost decides
        (15.0, 1.0, False),  # 15x, but only 14 ms more: not worth overriding the estimate
        (30.0, 5.0, False),  # 25 ms more, but only 6x
        (1.0, 570.0, False),  # the leader is already the cheap one
    ],
)
def test_a_tie_goes_to_the_plan_much_cheaper_to_build(
    leader_ms: float, other_ms: float, moved: bool
) -> None:
    from dnntune.autotune.recheck import _cheaper_build_first

    leader, other = _built_in("COMPILE", leader_ms), _built_in("TRITON", other_ms)
    tied = [leader, other]
    assert _cheaper_build_first(tied) is moved
    assert tied[0] is (other if moved else leader)


@pytest.mark.parametrize(
    ("verdict", "speedup", "margin", "separated"),
    [
        ("kept_default_slower", 0.54, 1.0 / 0.54 - 1.0, True),  # the default 1.85x faster
        ("kept_default_unsure", 0.98, 1.0 / 0.98 - 1.0, False),
        ("kept_default_tie", 1.004, 1.0 / 1.004 - 1.0, False),
    ],
)
def test_a_default_kept_over_the_sweeps_winner_has_the_confirmations_margin(
    verdict: str, speedup: float, margin: float, separated: bool
) -> None:
    # as confirm_against_default leaves them: the default first (speedup 1.0), the sweep's
    # winner second with its speedup over the default from the interleaved rounds; the sweep's
    # times still put the challenger ahead (2.0 ms against 1.08 ms)
    default = dt.AutotuneResult(
        engine_name="TORCH", succeeded=True, rank=0, decision_time_ms=2.0, min_time_ms=2.0
    )
    challenger = dt.AutotuneResult(
        engine_name="COMPILE", succeeded=True, rank=1, decision_time_ms=1.08, min_time_ms=1.08
    )
    default.confirmation = challenger.confirmation = verdict
    default.speedup_vs_default, challenger.speedup_vs_default = 1.0, speedup
    default.confirm_noise = challenger.confirm_noise = 0.03
    m = winner_margin([challenger, default])
    assert m.winner is default and m.runner_up is challenger
    assert m.margin == pytest.approx(margin)
    assert m.separated is separated and m.noise == pytest.approx(0.03)
