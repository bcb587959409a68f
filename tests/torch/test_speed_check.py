"""optimize()'s end-to-end check: the eager forward and the optimized one, side by side."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import speed


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def test_eval_mode_with_example_inputs_reports_both_forwards(tmp_path: Path) -> None:
    model = _model()
    x = torch.randn(4, 16)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    assert report.eager_forward_ms is not None and report.eager_forward_ms > 0
    assert report.forward_ms is not None and report.forward_ms > 0
    assert report.speedup == pytest.approx(report.eager_forward_ms / report.forward_ms)
    assert "forward on the example inputs" in str(report)


def test_the_check_is_skipped_in_training_mode_and_on_request(tmp_path: Path) -> None:
    x = torch.randn(4, 16)
    train = _model().train()
    report = dtt.optimize(train, (x,), policy="heuristic", overrides=tmp_path / "o.json")
    assert report.eager_forward_ms is None and report.speedup is None
    off = dtt.optimize(
        _model(), (x,), policy="heuristic", overrides=tmp_path / "o.json", check_speed=False
    )
    assert off.forward_ms is None and "forward on the example" not in str(off)
    assert dtt.optimize(_model(), policy="heuristic", overrides=None).forward_ms is None


def test_a_slower_optimized_forward_warns_with_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    times = iter([1.0, 2.0])  # eager, then optimized
    # the module, not the function of the same name that dnntune.torch exports
    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "forward_ms", lambda module, inputs: next(times))
    with pytest.warns(dtt.DnnTuneSlowerWarning, match=r"0\.50x.*cuda_graph=True"):
        report = dtt.optimize(
            _model(),
            (torch.randn(4, 16),),
            policy="heuristic",
            overrides=tmp_path / "o.json",
            refine=False,
            revert_if_slower=False,  # the default reverts instead of warning
        )
    assert report.speedup == pytest.approx(0.5)


def test_faster_or_within_noise_is_quiet() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        speed.warn_if_slower(1.0, 1.01, cuda_graph=False)
        speed.warn_if_slower(1.0, 0.5, cuda_graph=True)


def test_forward_ms_times_the_module_without_changing_it() -> None:
    model = _model()
    before = copy.deepcopy(model.state_dict())
    ms = speed.forward_ms(model, (torch.randn(2, 16),))
    assert ms > 0
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])


@pytest.mark.gpu
def test_the_check_on_cuda_with_graph_replay(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = _model().cuda().half()
    x = torch.randn(8, 16, device="cuda", dtype=torch.half)
    report = dtt.optimize(
        model, (x,), policy="tune", overrides=tmp_path / "o.json", cuda_graph=True
    )
    assert report.cuda_graph and report.forward_ms is not None and report.forward_ms > 0
    assert report.eager_forward_ms is not None and report.eager_forward_ms > 0
