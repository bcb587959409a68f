"""What tuning inside ``optimize`` and at a new signature must not do to the user (a new-user
audit, session 15; each test failed before its fix): take their random numbers, tune again on
every call when the override file cannot take the winner, or ignore a corrupt file in
silence."""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch._support import reset_warnings


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5)]
    return nn.Sequential(*layers, nn.Linear(8 * 8 * 8, 4)).eval()


def test_tuning_takes_none_of_the_callers_random_numbers(tmp_path: Path) -> None:
    model = _model()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    state = torch.get_rng_state()
    dtt.optimize(model, (x,), policy="tune", overrides=tmp_path / "ov.json", refine=False)
    assert torch.equal(state, torch.get_rng_state())
    model.train()
    ref.train()
    torch.manual_seed(1)
    out = model(x)  # new training signatures are tuned here, between the seed and the dropout
    torch.manual_seed(1)
    torch.testing.assert_close(out, ref(x), atol=1e-4, rtol=1e-4)


def test_a_file_that_cannot_take_the_winner_keeps_it_in_memory(tmp_path: Path) -> None:
    reset_warnings()
    path = tmp_path / "ov.json"
    entry = {"op": "conv_fprop", "engine_name": "TORCH_ENGINE", "tensors": "oops"}
    path.write_text(json.dumps({"version": 2, "engine_overrides": [entry]}))
    before = path.read_text()
    model = _model()
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="kept for this process only"):
        dtt.optimize(model, (x,), policy="tune", overrides=path, check_speed=False, refine=False)
    calls = dtt.runtime_stats.autotune_calls
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        for _ in range(3):
            model(x)
    assert dtt.runtime_stats.autotune_calls == calls  # it tuned on every call before
    assert path.read_text() == before  # the file is the user's to fix


def test_a_corrupt_file_under_cached_is_said_once(tmp_path: Path) -> None:
    reset_warnings()
    path = tmp_path / "ov.json"
    path.write_text('{"version": 2, "engine_overrides": [')
    model = _model()
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="is unusable"):
        dtt.optimize(model, (x,), policy="cached", overrides=path, check_speed=False, refine=False)
    with torch.no_grad():
        torch.testing.assert_close(model(x), _model()(x), atol=1e-4, rtol=1e-4)


class _Counting(nn.Module):
    """Counts the samples it has seen in a buffer, in eval mode too (a streaming statistic)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.fc(x)


class _InPlaceInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x /= 2.0
        return self.fc(x)


@pytest.mark.parametrize("check_speed", [True, False])
def test_optimize_leaves_buffers_and_example_inputs_as_they_were(check_speed: bool) -> None:
    """optimize's own forwards (the example forward, timings, the side-by-side check) changed
    an eval-mode buffer (5,668 samples "seen" before any user forward) and an example input
    the forward divides in place (to zeros) (new-user audit, session 18)."""
    counting = _Counting().eval()
    dtt.optimize(
        counting, (torch.randn(4, 8),), policy="heuristic", overrides=None, check_speed=check_speed
    )
    assert counting.seen.item() == 0
    with torch.no_grad():
        counting(torch.randn(3, 8))
    assert counting.seen.item() == 3  # the user's forwards count
    x = torch.ones(3, 8)
    dtt.optimize(
        _InPlaceInput().eval(), (x,), policy="heuristic", overrides=None, check_speed=check_speed
    )
    assert torch.equal(x, torch.ones(3, 8))


class _Calls(nn.Module):
    """Keeps plain attributes its forward changes: a counter, the last shape, a flag, a mode
    string; and a list it fills (not put back: a container's contents are the model's)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls, self.scale, self.shape, self.mode, self.first = 0, 1.0, None, "new", True
        self._step = 0  # a private name is the model's state as much
        self.log: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self._step += 1
        self.scale *= 0.5
        self.shape, self.mode, self.first = tuple(x.shape), "ran", False
        self.log.append(x.shape[0])
        self.fc.seen = getattr(self.fc, "seen", 0) + 1  # a child's, where there was none
        return self.fc(x)


@pytest.mark.parametrize("check_speed", [True, False])
def test_optimize_leaves_plain_attributes_as_they_were(check_speed: bool) -> None:
    """optimize's own forwards changed a module's plain attributes (a call counter read 1,417
    after optimize; new-user audit): those that were there before are put back,
    and one added by its forwards stays (nothing to put back)."""
    model = _Calls().eval()
    dtt.optimize(
        model, (torch.randn(4, 8),), policy="heuristic", overrides=None, check_speed=check_speed
    )
    state = (model.calls, model._step, model.scale, model.shape, model.mode, model.first)
    assert state == (0, 0, 1.0, None, "new", True)
    assert model.log and model.fc.seen >= 1  # a list, and an attribute that was not there
    with torch.no_grad():
        model(torch.randn(3, 8))
    assert (model.calls, model.shape, model.first) == (1, (3, 8), False)  # the user's count


class _Failing(_Calls):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        super().forward(x)
        raise ValueError("the example inputs do not fit")


def test_a_failed_optimize_leaves_plain_attributes_as_they_were() -> None:
    model = _Failing().eval()
    with pytest.raises(ValueError, match="do not fit"):
        dtt.optimize(model, (torch.randn(4, 8),), policy="heuristic", overrides=None)
    assert (model.calls, model.mode) == (0, "new")


def test_a_lazy_module_keeps_the_sizes_its_first_forward_set() -> None:
    """A lazy module's sizes are plain attributes (``in_features`` is 0 until its first
    forward, inside optimize): they are not put back."""
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU()).eval()
    dtt.optimize(model, (torch.randn(2, 8),), policy="heuristic", overrides=None)
    assert (model[0].in_features, model[0].out_features) == (8, 4)


def _lazy_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d(), nn.ReLU())


@pytest.mark.parametrize("mode", ["train", "eval, batch norm in train", "eval"])
def test_a_lazy_batch_norms_statistics_are_those_of_the_users_forwards(mode: str) -> None:
    """A lazy batch norm's running statistics have no values before its first forward, so
    optimize took no copy of them: in training mode they kept what optimize's own forwards
    made of them (new-user audit). They read as materialized (zeros, ones), and the module
    stays materialized, a BatchNorm2d: the user's forwards then move them as on PyTorch's."""
    model, ref = _lazy_net(), _lazy_net()  # the same weights (a lazy module has no deepcopy)
    for m in (model, ref):
        m.train(mode == "train")
        m[1].train(mode != "eval")
    x = torch.randn(2, 3, 8, 8)
    dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    bn = model[1]
    assert type(bn) is nn.BatchNorm2d and bn.num_features == 4
    assert torch.equal(bn.running_mean, torch.zeros(4))
    assert torch.equal(bn.running_var, torch.ones(4))
    assert bn.num_batches_tracked.item() == 0
    y = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(y), ref(y), atol=1e-5, rtol=1e-5)
    for name, buffer in ref[1].named_buffers():
        torch.testing.assert_close(getattr(bn, name), buffer, atol=1e-6, rtol=1e-6)


def test_a_reverted_lazy_module_stays_what_its_first_forward_made_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reverted (slower), the modules went back to the classes they had before optimize:
    ``LazyBatchNorm2d`` and ``LazyLinear``, holding materialized tensors."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d(), nn.Flatten(), nn.LazyLinear(2))
    clock = iter([1.0, 2.0])  # eager, then optimized: slower
    monkeypatch.setattr(
        sys.modules["dnntune.torch.optimize"], "forward_ms", lambda module, inputs: next(clock)
    )
    report = dtt.optimize(
        model.eval(), (torch.randn(2, 3, 8, 8),), policy="heuristic", overrides=None, refine=False
    )
    assert report.reverted
    assert [type(m) for m in model] == [nn.Conv2d, nn.BatchNorm2d, nn.Flatten, nn.Linear]


@pytest.mark.parametrize("fails", [False, True])
def test_a_training_mode_optimize_takes_none_of_the_callers_random_numbers(fails: bool) -> None:
    """The example forward of a model in training mode draws its dropout masks (and a
    LayerDrop's Python numbers): after optimize a seeded run drew other numbers than without
    it (new-user audit). Put back when optimize returns, and when it raises."""
    import random

    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.drop(self.fc(x))
            if random.random() < 2.0:  # a LayerDrop-style Python draw, always taken
                y = y * 2
            return y.view(-1, 3) if fails else y

    def draws(optimized: bool) -> tuple[torch.Tensor, float]:
        torch.manual_seed(0)
        random.seed(0)
        model = Drop().train()
        if optimized:
            x = torch.randn(4, 8)
            try:
                dtt.optimize(model, (x,), policy="heuristic", overrides=None)
            except RuntimeError:
                assert fails
        else:
            torch.randn(4, 8)
        return torch.rand(3), random.random()

    plain, optimized = draws(False), draws(True)
    torch.testing.assert_close(optimized[0], plain[0])
    assert optimized[1] == plain[1]
