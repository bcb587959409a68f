"""Correctness before speed (seed 004): verification of every candidate against the reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from autotune_helpers import Pack, by_name, tune, workspace

import dnntune as dt
from dnntune import reference, testing
from dnntune.autotune.verification import Verifier, outputs_alias_inputs
from dnntune.backend.registry import get_registry
from dnntune.testing import (
    FAKE_ENGINE_A,
    FAKE_ENGINE_C,
    FAKE_ENGINE_WRONG,
    FakeEngine,
    FakeEngines,
    FakePlan,
)


def test_wrong_engine_never_wins(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.add_all_engines()
    results = tune(graph, handle, pack)
    wrong = by_name(results)[FAKE_ENGINE_WRONG]
    assert not wrong.succeeded and wrong.rank == -1
    assert wrong.error_message.startswith("failed verification: output Y")
    assert wrong.verified is False and wrong.max_abs_error == pytest.approx(1.0)
    assert not wrong.benchmarked and wrong.iterations_run == 0  # not timed at all
    assert results[0].engine_name == FAKE_ENGINE_A
    assert all(r.verified is True for r in results if r.succeeded)
    assert all(r.max_abs_error == 0.0 for r in results if r.succeeded)


def test_verify_false_lets_the_wrong_engine_win(
    graph: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    graph.add_all_engines()
    results = tune(graph, handle, pack, verify=False)
    assert results[0].engine_name == FAKE_ENGINE_WRONG and results[0].min_time_ms == 0.1
    assert all(r.verified is None and r.max_abs_error is None for r in results)


def test_loose_tolerance_accepts_the_offset(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engines([FAKE_ENGINE_WRONG, FAKE_ENGINE_C])
    results = tune(graph, handle, pack, atol=1.5, rtol=0.0)
    assert results[0].engine_name == FAKE_ENGINE_WRONG and results[0].verified is True
    assert results[0].max_abs_error == pytest.approx(1.0)


def test_only_one_of_rtol_atol_overrides(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.add_engines([FAKE_ENGINE_WRONG, FAKE_ENGINE_C])
    results = tune(graph, handle, pack, atol=0.5)
    assert by_name(results)[FAKE_ENGINE_WRONG].verified is False


class _LazyEngine(FakeEngine):
    """Writes nothing: passes only if something else already left the right answer in place."""

    def run(self, plan: FakePlan, pack: Mapping[int, torch.Tensor], workspace: Any) -> None:
        self.counters.executes[self.name] += 1
        self.clock.advance(0.01)


def test_no_candidate_passes_on_another_candidates_output(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    lazy = _LazyEngine("FAKE_LAZY", [], fakes.clock, fakes.timings, fakes.counters)
    y = graph.output_tensors()[0]
    # the caller's buffer already holds the right answer
    pack[y.uid].copy_(torch.relu(sum(pack[t.uid] for t in graph.input_tensors())))
    with get_registry().extra_engines([*fakes.engines.values(), lazy], exclusive=True):
        graph.add_engines([FAKE_ENGINE_C, "FAKE_LAZY"])
        results = by_name(tune(graph, handle, pack))
    assert not results["FAKE_LAZY"].succeeded
    assert "failed verification" in results["FAKE_LAZY"].error_message
    assert results["FAKE_LAZY"].max_abs_error == math.inf  # NaN-filled fresh buffer
    assert results[FAKE_ENGINE_C].succeeded


def test_reference_computed_once(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = reference.run

    def counting(g: Any, p: Any, **kw: Any) -> Any:
        calls["n"] += 1
        return real(g, p, **kw)

    graph.add_engines([FAKE_ENGINE_C, FAKE_ENGINE_A])
    verifier = Verifier(graph, pack, dt.AutotuneConfig())
    monkeypatch.setattr(reference, "run", counting)
    verifier.prepare()
    verifier.prepare()
    assert calls["n"] == 1


def test_in_place_graph_inputs_restored(handle: dt.Handle, fakes: FakeEngines) -> None:
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    pack = testing.make_pack(g)
    x_t, _ = g.input_tensors()
    y_t = g.output_tensors()[0]
    pack[y_t.uid] = pack[x_t.uid]  # y aliases x: every execute overwrites x
    original_x = pack[x_t.uid].clone()
    assert outputs_alias_inputs(g, pack)
    g.add_engines([FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_WRONG])
    results = by_name(tune(g, handle, pack))
    assert results[FAKE_ENGINE_A].verified is True
    assert results[FAKE_ENGINE_C].verified is True  # saw the original x, not A's result
    assert results[FAKE_ENGINE_WRONG].verified is False
    torch.testing.assert_close(pack[x_t.uid], original_x)  # restored at the end


def test_separate_buffers_are_not_in_place(graph: dt.Graph, pack: Pack) -> None:
    assert not outputs_alias_inputs(graph, pack)


def test_reference_failure_leaves_candidates_unverified(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dnntune import reference
    from dnntune.errors import NotSupportedError

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError("no reference for this op")

    graph.add_engines([FAKE_ENGINE_C])
    verifier = Verifier(graph, pack, dt.AutotuneConfig())
    monkeypatch.setattr(reference, "run", broken)
    verifier.prepare()
    assert verifier.unavailable and "no reference for this op" in verifier.unavailable
    assert "autotune: verification unavailable" in caplog.text
    verdict = verifier.check(lambda p: None, lambda: None)
    assert verdict.ok is None


def test_fresh_buffers_keep_layout(handle: dt.Handle, fakes: FakeEngines) -> None:
    g = testing.small_conv_graph()
    g.build_operation_graph(handle)
    pack = testing.make_pack(g)
    y = g.output_tensors()[0]
    # a channels-last output buffer
    pack[y.uid] = torch.empty_strided(pack[y.uid].shape, (8 * 36, 1, 48, 8)).zero_()
    verifier = Verifier(g, pack, dt.AutotuneConfig())
    fresh = verifier._fresh_pack()
    assert fresh[y.uid].stride() == pack[y.uid].stride()
    assert fresh[y.uid].data_ptr() != pack[y.uid].data_ptr()
    assert torch.isnan(fresh[y.uid]).all()
    assert all(fresh[t.uid] is pack[t.uid] for t in g.input_tensors())


def test_verification_on_a_conv_graph(handle: dt.Handle, fakes: FakeEngines) -> None:
    g = testing.small_conv_graph()
    g.build_operation_graph(handle)
    pack = testing.make_pack(g)
    g.add_all_engines()
    results = tune(g, handle, pack)
    assert results[0].engine_name == FAKE_ENGINE_A and results[0].verified
    assert by_name(results)[FAKE_ENGINE_WRONG].verified is False
    g.execute(handle, pack, workspace())


def test_the_absolute_tolerance_grows_with_the_callers_data(
    handle: dt.Handle, fakes: FakeEngines
) -> None:
    """The default tolerances are set for well-scaled inputs (RMS about 1). A caller's own data
    (a model's activations, RMS 400 here) rounds to absolute errors that many times larger
    where its terms cancel: the atol grows with the product of the operands' RMS, while a
    plan off by one, or by 5 %, still fails."""
    g = testing.small_conv_graph()
    g.build_operation_graph(handle)
    pack = testing.make_pack(g)
    assert reference.data_scale(g, pack) < 1.5  # well-scaled: the defaults as they are
    x_t = g.input_tensors()[0]
    y = g.output_tensors()[0]
    pack[x_t.uid].mul_(400.0)
    verifier = Verifier(g, pack, dt.AutotuneConfig())
    rms_x = float(pack[x_t.uid].square().mean().sqrt())
    w_rms = max(float(pack[t.uid].square().mean().sqrt()) for t in g.input_tensors()[1:2])
    assert verifier.scale == pytest.approx(rms_x * max(1.0, w_rms), rel=1e-3)
    expected = reference.run(g, pack)[y.uid]

    def giving(delta: float, gain: float = 1.0) -> Callable[[Any], None]:
        return lambda p: p[y.uid].copy_(expected * gain + delta)

    assert verifier.check(giving(3e-3), lambda: None).ok  # rounding at this scale
    plain = reference.check_outputs(g, {y.uid: expected + 3e-3}, {y.uid: expected})
    assert not plain.ok  # the same error at the well-scaled data's atol
    assert not verifier.check(giving(1.0), lambda: None).ok
    assert not verifier.check(giving(0.0, 1.05), lambda: None).ok
    stated = Verifier(g, pack, dt.AutotuneConfig(atol=1e-4))  # an atol given is the caller's
    assert stated.scale == 1.0 and not stated.check(giving(3e-3), lambda: None).ok
