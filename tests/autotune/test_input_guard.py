"""A plan that writes into an input it only reads fails verification; the caller's inputs stay
intact and later candidates are not poisoned (the cuDNN 9.19 norm engine 5 case, issue 20)."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.autotune import verification
from dnntune.errors import AutotuneError
from dnntune.testing import FAKE_ENGINE_A, FAKE_ENGINE_C, FAKE_ENGINE_CLOBBERS

WS = testing.ESTIMATED_WORKSPACE_BYTES


def _tune(
    names: list[str], timings: dict[str, float]
) -> tuple[list[dt.AutotuneResult], dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    with testing.fake_engines(names=names, timings=timings):
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        pack = testing.make_pack(g)
        before = {u: t.clone() for u, t in pack.items()}
        ws = torch.empty(WS, dtype=torch.uint8)
        try:
            results = g.autotune(handle, pack, ws, WS, dt.AutotuneConfig())
        except AutotuneError as exc:  # every candidate failed: the results are attached
            results = list(exc.results)
        return results, pack, before


def test_a_plan_that_writes_into_its_input_fails_and_the_inputs_are_restored() -> None:
    # the clobbering fake is scripted fastest: unnoticed, it would win
    names = [FAKE_ENGINE_CLOBBERS, FAKE_ENGINE_A, FAKE_ENGINE_C]
    timings = {FAKE_ENGINE_CLOBBERS: 0.01, FAKE_ENGINE_A: 0.5, FAKE_ENGINE_C: 0.2}
    results, pack, before = _tune(names, timings)
    by_engine = {r.engine_name: r for r in results}
    bad = by_engine[FAKE_ENGINE_CLOBBERS]
    assert not bad.succeeded
    assert bad.verified is False
    assert "wrote into its input" in bad.error_message
    assert "restored" in bad.error_message
    # the candidates after it ran on the caller's values and verified
    assert by_engine[FAKE_ENGINE_C].succeeded and by_engine[FAKE_ENGINE_C].verified
    assert by_engine[FAKE_ENGINE_A].succeeded and by_engine[FAKE_ENGINE_A].verified
    assert results[0].engine_name == FAKE_ENGINE_C
    outputs = {t.uid for t in testing.small_pointwise_graph().output_tensors()}
    for uid in set(before) - outputs:
        assert torch.equal(pack[uid], before[uid]), f"input uid {uid} was left changed"


def test_large_inputs_are_fingerprinted_and_only_the_culprit_is_blamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(verification, "SNAPSHOT_MAX_BYTES", 0)
    names = [FAKE_ENGINE_CLOBBERS, FAKE_ENGINE_C]
    results, _, _ = _tune(names, {FAKE_ENGINE_CLOBBERS: 0.01, FAKE_ENGINE_C: 0.2})
    bad = next(r for r in results if r.engine_name == FAKE_ENGINE_CLOBBERS)
    assert not bad.succeeded
    assert "NOT restored" in bad.error_message
    # the next candidate sees the changed input (a wrong output), but is not blamed for it
    other = next(r for r in results if r.engine_name == FAKE_ENGINE_C)
    assert "wrote into its input" not in other.error_message
