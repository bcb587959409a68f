"""A folded or fused layer computes exactly what PyTorch's modules compute, whatever the
caller does around it: a conv with another padding mode, a module called both inside a
Sequential and on its own, per-module train/eval flags, a batch norm without running
statistics, a float64 model. (A new-user audit's findings, session 12; all on the CPU.)"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import SequentialBottleneck, randomize_batch_norms

import dnntune.torch as dtt


def _optimized(make: Any, tmp_path: Path, x: torch.Tensor) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = make().eval()
    randomize_batch_norms(ref)
    model = copy.deepcopy(ref)
    dtt.optimize(
        model,
        (x,),
        policy="heuristic",
        overrides=tmp_path / "ov.json",
        check_speed=False,  # never reverted for speed: what runs is what is checked
    )
    return ref, model


def _same(ref: nn.Module, model: nn.Module, x: torch.Tensor, tol: float = 1e-4) -> None:
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "padding",
    [
        {"padding": 1, "padding_mode": "reflect"},
        # a string padding runs on dnntune (test_string_padding), not with another mode
        {"padding": "same", "padding_mode": "circular"},
    ],
)
def test_a_conv_that_runs_pytorchs_forward_keeps_its_batch_norm_and_activation(
    padding: dict[str, Any], tmp_path: Path
) -> None:
    def make() -> nn.Module:
        return nn.Sequential(nn.Conv2d(4, 8, 3, **padding), nn.BatchNorm2d(8), nn.ReLU())

    x = torch.randn(2, 4, 8, 8)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="padding"):  # PyTorch's conv runs
        ref, model = _optimized(make, tmp_path, x)
    _same(ref, model, x)


class _Shared(nn.Module):
    """One conv and one linear, each called in a Sequential with what follows it and alone."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.stem = nn.Sequential(self.conv, self.bn, nn.ReLU())
        self.fc = nn.Linear(8, 8)
        self.head = nn.Sequential(self.fc, nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x) + self.conv(x)
        return self.head(y) + self.fc(y)


def test_a_module_called_in_a_sequential_and_alone_runs_alone_as_itself(tmp_path: Path) -> None:
    x = torch.randn(2, 4, 8, 8)
    ref, model = _optimized(_Shared, tmp_path, x)
    _same(ref, model, x)


def _frozen_bn_fine_tuning(model: nn.Module) -> None:
    model.train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()


def test_each_modules_own_flag_decides_frozen_batch_norm_fine_tuning(tmp_path: Path) -> None:
    def make() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)
        )

    x = torch.randn(2, 4, 8, 8)
    ref, model = _optimized(make, tmp_path, x)
    for m in (ref, model):
        _frozen_bn_fine_tuning(m)
    torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    model(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    # the other way round: the model in eval mode, one activation module in training mode
    for m in (ref, model):
        m.eval()
        m[2].train()
    _same(ref, model, x)


def test_a_batch_norm_without_running_statistics_is_not_folded(tmp_path: Path) -> None:
    def make() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, track_running_stats=False), nn.ReLU()
        )

    x = torch.randn(2, 3, 8, 8)
    ref, model = _optimized(make, tmp_path, x)  # optimize's own example call must not fail
    _same(ref, model, x)


def test_a_float64_model_keeps_float64_precision(tmp_path: Path) -> None:
    def make() -> nn.Module:
        return nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).double()

    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    with warnings.catch_warnings():  # float64 runs PyTorch's ops (a one-time warning says so)
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)
        ref, model = _optimized(make, tmp_path, x)
        _same(ref, model, x, tol=1e-12)


def test_a_sequential_whose_children_changed_runs_them_as_pytorch(tmp_path: Path) -> None:
    def make() -> nn.Module:
        return nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())

    x = torch.randn(2, 4, 8, 8)
    ref, model = _optimized(make, tmp_path, x)
    for m in (ref, model):
        m[2] = nn.Tanh()  # the activation the fused graph took is replaced
    _same(ref, model, x)
    assert isinstance(model, nn.Sequential) and len(model) == 3


def test_a_residual_body_runs_as_two_conv_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body's first conv takes its batch norm and ReLU, its last conv its batch norm, the
    shortcut add and the ReLU: two conv graphs, no batch norm of its own."""
    from dnntune.torch import functional as dtf

    x = torch.randn(2, 8, 8, 8)
    ref, model = _optimized(SequentialBottleneck, tmp_path, x)
    calls: list[str] = []
    conv2d, batch_norm = dtf.conv2d, dtf.batch_norm

    def conv_spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(f"conv {kwargs.get('activation')} {kwargs.get('residual') is not None}")
        return conv2d(*args, **kwargs)

    def bn_spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append("batch_norm")
        return batch_norm(*args, **kwargs)

    monkeypatch.setattr(dtf, "conv2d", conv_spy)
    monkeypatch.setattr(dtf, "batch_norm", bn_spy)
    _same(ref, model, x)
    assert calls == ["conv relu False", "conv relu True"]


def test_the_report_says_where_a_folded_batch_norm_runs_and_counts_a_second_optimize(
    tmp_path: Path,
) -> None:
    x = torch.randn(2, 8, 8, 8)
    torch.manual_seed(0)
    ref = SequentialBottleneck().eval()
    randomize_batch_norms(ref)
    model = copy.deepcopy(ref)
    kw: dict[str, Any] = {"policy": "heuristic", "overrides": tmp_path / "ov.json"}
    report = dtt.optimize(model, (x,), check_speed=False, **kw)
    records = {r.name: r for r in report.swapped}
    assert records["body.1"].folded_into == "body.0"
    assert records["body.4"].folded_into == "body.3"
    assert "body.1: BatchNorm2d -> folded into body.0 (runs in its graph)" in str(report)
    assert "not run yet" not in str(report)
    again = dtt.optimize(model, (x,), check_speed=False, **kw)  # reported, not swapped twice
    assert [r.name for r in again.swapped] == [r.name for r in report.swapped]
    assert all(r.plans or r.folded_into for r in again.swapped)
    _same(ref, model, x)


class _TorchvisionStem(nn.Module):
    """torchvision's spelling: ``relu(bn1(conv1(x)))`` with modules, and a residual block end."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.seq = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.seq(self.relu(out))


def test_user_hooks_on_fused_modules_still_fire_with_pytorchs_values(tmp_path: Path) -> None:
    """A fused call skips its modules' own calls; a module with a hook of the user's (feature
    extraction, Grad-CAM) runs as PyTorch calls it, so each hook sees what it saw before."""
    x = torch.randn(2, 8, 8, 8)
    ref, model = _optimized(_TorchvisionStem, tmp_path, x)
    assert model.__class__ is not _TorchvisionStem  # its forward was rewritten (fused)

    def hook_all(m: nn.Module) -> dict[str, torch.Tensor]:
        seen: dict[str, torch.Tensor] = {}

        def keep(name: str) -> Any:
            def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
                seen.setdefault(name, out.clone())  # returns None: the output stays

            return hook

        for name in ("conv1", "bn1", "relu", "bn2", "seq.0", "seq.1", "seq.2"):
            m.get_submodule(name).register_forward_hook(keep(name))
        return seen

    want, got = hook_all(ref), hook_all(model)
    _same(ref, model, x)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-4, rtol=1e-4, msg=name)
