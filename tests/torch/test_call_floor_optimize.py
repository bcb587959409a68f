"""optimize() on the CPU does not compile torch.compile candidates for layers already faster
than a compiled call can be (the measured call floor, ``autotune.call_floor``; issue 25)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dnntune.torch as dtt
from dnntune.providers import torch_compile
from dnntune.providers._torch.call_floor import dynamo_floor_ms
from dnntune.torch import runtime


def test_optimize_compiles_no_torch_compile_candidate_for_small_layers(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tiny linear layers (a few us a call on TORCH_ENGINE) under the real engines and the
    real floor: each tune records its torch.compile candidate as skipped for its floor, no
    Inductor compile starts, and the optimized model still computes what eager does."""
    compiles: list[str] = []
    real_compile = torch_compile.TorchCompileEngine.compile

    def counted(self: Any, graph: Any, *args: Any) -> Any:
        compiles.append(graph.name)
        return real_compile(self, graph, *args)

    monkeypatch.setattr(torch_compile.TorchCompileEngine, "compile", counted)
    tunes: list[Any] = []
    real_tune = runtime._tune

    def recorded(build: Any, *args: Any) -> Any:
        out = real_tune(build, *args)
        tunes.append(build.graph.last_autotune_results)
        return out

    monkeypatch.setattr(runtime, "_tune", recorded)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    model.eval()
    x = torch.randn(2, 4)
    expected = model(x)
    dtt.optimize(model, (x,), policy="tune", overrides=tmp_path / "ov.json", cuda_graph=False)
    assert tunes, "no layer was tuned"
    floor = dynamo_floor_ms("cpu")
    assert floor is not None and floor > 0.0
    for results in tunes:
        compiled = [r for r in results if r.engine_name == torch_compile.NAME]
        assert compiled, "the torch.compile candidate was not offered"
        for r in compiled:
            assert r.failure_kind == "floor", r.error_message
            assert "measured call floor" in r.error_message
        winner = results[0]
        assert winner.succeeded and winner.min_time_ms * 1.1 < floor
    assert compiles == []
    torch.testing.assert_close(model(x), expected)
