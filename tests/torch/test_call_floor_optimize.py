"""optimize() on the CPU does not compile torch.compile candidates for layers already faster
than a compiled call can be (the measured call floor, ``autotune.call_floor``; issue 25)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dnntune.torch as dtt
from dnntune.providers import torch_compile
from dnntune.providers._torch.call_floor import dynamo_floor_ms


def test_optimize_compiles_no_torch_compile_candidate_for_small_layers(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, layer_tunes: list[list[Any]]
) -> None:
    """Two tiny linear layers (a few us a call on TORCH_ENGINE) under the real engines and the
    real floor: each tune whose best other candidate is faster than the floor (by the margin)
    records its torch.compile candidate as skipped for its floor, and no Inductor compile
    starts for it; the optimized model still computes what eager does. The rule is checked
    against the times each tune measured, so a busy CPU that slows a layer past the floor
    (and rightly builds its candidate) does not fail the test."""
    compiles: list[str] = []
    real_compile = torch_compile.TorchCompileEngine.compile

    def counted(self: Any, graph: Any, *args: Any) -> Any:
        compiles.append(graph.name)
        return real_compile(self, graph, *args)

    monkeypatch.setattr(torch_compile.TorchCompileEngine, "compile", counted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    model.eval()
    x = torch.randn(2, 4)
    expected = model(x)
    dtt.optimize(model, (x,), policy="tune", overrides=tmp_path / "ov.json", cuda_graph=False)
    assert layer_tunes, "no layer was tuned"
    floor = dynamo_floor_ms("cpu")
    assert floor is not None and floor > 0.0
    built = 0
    for results in layer_tunes:
        compiled = [r for r in results if r.engine_name == torch_compile.NAME]
        assert compiled, "the torch.compile candidate was not offered"
        # the results are ranked: the first other one is the best the rule compared against
        best = next(
            r.min_time_ms for r in results if r.engine_name != torch_compile.NAME and r.succeeded
        )
        for r in compiled:
            if best * 1.1 < floor:
                assert r.failure_kind == "floor", r.error_message
                assert "measured call floor" in r.error_message
            else:
                assert r.failure_kind != "floor", r.error_message
                built += 1
    assert len(compiles) == built
    torch.testing.assert_close(model(x), expected)
