"""A forward whose trace differs between training and eval mode (``F.dropout(x, p,
training=self.training)``, ``if self.training:``) is rewritten from its eval-mode trace, which
runs only while the module and every submodule is in eval mode; anything else runs the
module's own forward."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import _trace_guard, _tracing


class ModeDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        if self.training:  # the eval trace leaves this out
            y = y * 2
        return y


class FunctionalDropout(nn.Module):
    """Whisper's and OPT's layers: dropout written as a function of ``self.training``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p
        self.norm = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        h = F.gelu(self.fc1(self.norm(x)))
        h = F.dropout(h, p=self.p, training=self.training)
        h = self.fc2(h)
        h = F.dropout(h, p=self.p, training=self.training)
        return residual + h


def _optimized(make: type[nn.Module], tmp_path: Path) -> tuple[nn.Module, nn.Module, list[str]]:
    torch.manual_seed(0)
    ref = make().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    return ref, model, report.fusions


def _same(model: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    torch.manual_seed(3)  # the same dropout masks
    got = model(x)
    torch.manual_seed(3)
    torch.testing.assert_close(got, ref(x), atol=1e-5, rtol=1e-5)


def test_a_forward_that_branches_on_training_is_fused_from_its_eval_trace(tmp_path: Path) -> None:
    ref, model, fusions = _optimized(ModeDependent, tmp_path)
    assert fusions == ["<root>: fc + relu"]
    x = torch.randn(3, 8)
    with torch.no_grad():
        _same(model, ref, x)
        for m in (model, ref):
            m.train()
        _same(model, ref, x)  # training: the module's own forward, the branch taken


def test_functional_dropout_is_the_identity_in_the_eval_trace(tmp_path: Path) -> None:
    ref, model, fusions = _optimized(FunctionalDropout, tmp_path)
    # the dropouts (training=False in the eval trace) no longer stand between the layers and
    # the activation or the residual add
    assert sorted(fusions) == ["<root>: fc1 + gelu", "<root>: fc2 + residual add"]
    x = torch.randn(4, 8)
    with torch.no_grad():
        _same(model, ref, x)
    for m in (model, ref):
        m.train()
    _same(model, ref, x)  # dropout with p=0.5, as PyTorch draws it
    torch.manual_seed(4)
    model(x).sum().backward()
    torch.manual_seed(4)
    ref(x).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("part", ["self", "fc1"])
def test_one_module_put_in_training_runs_the_modules_own_forward(part: str, tmp_path: Path) -> None:
    """The model in eval mode with one of the block's modules in training (``model.fc1.train()``;
    the block itself, whose forward reads ``self.training``): the eval trace does not hold."""
    ref, model, _ = _optimized(FunctionalDropout, tmp_path)
    x = torch.randn(4, 8)
    for m in (model, ref):
        (m if part == "self" else m.get_submodule(part)).train()
    with torch.no_grad():
        _same(model, ref, x)


def test_a_copy_keeps_the_guard_on_its_own_modules_and_a_pickle_is_pytorchs(
    tmp_path: Path,
) -> None:
    ref, model, _ = _optimized(FunctionalDropout, tmp_path)
    x = torch.randn(4, 8)
    twin = copy.deepcopy(model)
    guard = twin.__dict__[_trace_guard.TRACE_GUARD]
    assert set(map(id, guard.eval_only)) == set(map(id, twin.modules()))
    loaded = pickle.loads(pickle.dumps(model))  # PyTorch's class, without dnntune's state
    assert type(loaded) is FunctionalDropout
    assert _trace_guard.TRACE_GUARD not in loaded.__dict__
    for copied in (twin, loaded):
        with torch.no_grad():
            _same(copied, ref, x)
        copied.train()  # the copy's flags, not the original's, decide
        ref.train()
        _same(copied, ref, x)
        ref.eval()


def test_a_large_module_that_branches_on_training_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tracing, "EVAL_ONLY_MODULES", 3)  # FunctionalDropout has 4 modules
    ref, model, fusions = _optimized(FunctionalDropout, tmp_path)
    assert fusions == []
    with torch.no_grad():
        _same(model, ref, torch.randn(4, 8))
