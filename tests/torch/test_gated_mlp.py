"""A gated MLP's multiply (LLaMA's ``down(act(gate(x)) * up(x))``) as the up projection's
epilogue: ``up_proj``'s graph multiplies by the activated gate, one pass over the product
instead of a GEMM output written, read again and multiplied; wherever the fused call would not
stand for the forward (training, another shape or type, a hook), PyTorch's ops as written."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import kernel_plan, optimized_copy

from dnntune.torch import runtime


class GatedMlp(nn.Module):
    """LLaMA's MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d: int = 16, hidden: int = 40) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class UpFirst(GatedMlp):
    """The product written the other way round, with ``torch.mul``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.mul(self.up_proj(x), F.silu(self.gate_proj(x))))


class ScaledBy(GatedMlp):
    """A multiply by an argument of the forward (a gate computed elsewhere)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gate * self.up_proj(x))


@pytest.fixture(autouse=True)
def kernel_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every heuristic plan on dnntune's kernel path (TORCH_ENGINE's graph on the CPU)."""
    monkeypatch.setattr(runtime, "_heuristic", kernel_plan)


def _spy(monkeypatch: pytest.MonkeyPatch, layer: nn.Module) -> list[bool]:
    """One item per ``fused_multiply`` call of ``layer``: whether it ran the fused graph."""
    seen: list[bool] = []
    real = layer.fused_multiply

    def spy(*args: Any) -> torch.Tensor | None:
        out: torch.Tensor | None = real(*args)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(layer, "fused_multiply", spy)
    return seen


@pytest.mark.parametrize("make", [GatedMlp, UpFirst], ids=["gate-first", "up-first"])
def test_the_multiply_is_the_up_projections_epilogue(
    make: type[nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, report = optimized_copy(make, tmp_path / "ov.json")
    assert [str(f) for f in report.fusions] == [
        "<root>: gate_proj + silu",
        "<root>: up_proj + multiply",
    ]
    assert "up_proj: Linear + multiply" in str(report)
    seen = _spy(monkeypatch, model.up_proj)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert seen == [True]


def test_a_multiply_by_an_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, model, report = optimized_copy(ScaledBy, tmp_path / "ov.json")
    assert [str(f) for f in report.fusions] == ["<root>: up_proj + multiply"]
    seen = _spy(monkeypatch, model.up_proj)
    x, gate = torch.randn(3, 16), torch.randn(3, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x, gate), ref(x, gate), atol=1e-5, rtol=1e-5)
        # a gate that broadcasts, or of another type: PyTorch's ops, as written
        row = torch.randn(40)
        torch.testing.assert_close(model(x, row), ref(x, row), atol=1e-5, rtol=1e-5)
        narrow = gate.bfloat16()  # float32 times bfloat16: float32
        torch.testing.assert_close(model(x, narrow), ref(x, narrow), atol=1e-5, rtol=1e-5)
    assert seen == [True, False, False]


def test_training_runs_pytorchs_ops_with_their_gradients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, _ = optimized_copy(GatedMlp, tmp_path / "ov.json")
    ref.train()
    model.train()
    seen = _spy(monkeypatch, model.up_proj)
    x = torch.randn(2, 5, 16, requires_grad=True)
    ours = torch.autograd.grad(model(x).square().sum(), (x, model.up_proj.weight))
    theirs = torch.autograd.grad(ref(x).square().sum(), (x, ref.up_proj.weight))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert seen == [False]


class UsedTwice(GatedMlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_proj(x)
        return self.down_proj(F.silu(self.gate_proj(x)) * up) + up.sum(-1, keepdim=True)


class TimesNumber(GatedMlp):
    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return self.down_proj(self.up_proj(x) * scale)


class InPlace(GatedMlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x))
        h *= self.up_proj(x)
        return self.down_proj(h)


@pytest.mark.parametrize("make", [UsedTwice, TimesNumber, InPlace])
def test_other_multiplies_are_left_as_written(make: type[nn.Module], tmp_path: Path) -> None:
    ref, model, report = optimized_copy(make, tmp_path / "ov.json")
    assert not any("multiply" in str(f) for f in report.fusions)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


def test_a_hooked_up_projection_runs_unfused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = GatedMlp().eval()
    seen: list[int] = []
    model = ref.__class__()
    model.load_state_dict(ref.state_dict())
    model.eval().up_proj.register_forward_hook(lambda *_: seen.append(1))
    from dnntune.torch import optimize

    report = optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert [str(f) for f in report.fusions] == ["<root>: gate_proj + silu"]
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert seen == [1]  # the user's hook sees its module's call


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_cuda_the_fused_mlp_matches_eager(
    dtype: torch.dtype, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make() -> nn.Module:
        return GatedMlp(256, 688).cuda().to(dtype)

    ref, model, report = optimized_copy(make, tmp_path / "ov.json")
    assert "<root>: up_proj + multiply" in [str(f) for f in report.fusions]
    seen = _spy(monkeypatch, model.up_proj)
    x = torch.randn(4, 64, 256, device="cuda", dtype=dtype)
    with torch.no_grad():
        want, got = ref(x), model(x)
        exact = copy.deepcopy(ref).double()(x.double())
    assert seen == [True]
    error, eager_error = (float((t.double() - exact).abs().max()) for t in (got, want))
    assert error <= 2 * eager_error + 1e-3
