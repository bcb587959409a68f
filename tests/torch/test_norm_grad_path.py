"""A norm module runs PyTorch's own forward when gradients are wanted, and looks its
parameters up only when grad mode is on (``nn.Module.__getattr__`` cost 1 µs per inference
call on the CPU): a parametrized weight, which is not in ``_parameters``, still counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import dnntune.torch as dtt


class _Scale(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 2.0


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_a_parametrized_norm_weight_gets_its_gradient(kind: str) -> None:
    torch.manual_seed(0)

    def model() -> nn.Sequential:
        norm = nn.LayerNorm(16) if kind == "layer" else nn.RMSNorm(16)
        return nn.Sequential(nn.Linear(16, 16), norm)

    eager, tuned = model(), model()
    tuned.load_state_dict(eager.state_dict())
    x = torch.randn(4, 16)
    dtt.optimize(tuned.eval(), example_inputs=(x,), policy="heuristic", check_speed=False)
    assert type(tuned[1]).__name__.startswith("DnnTune")
    for m in (eager, tuned):  # parametrized after optimize: the weight becomes a property
        parametrize.register_parametrization(m[1], "weight", _Scale())
    eager.eval()
    for m in (eager, tuned):
        m[0].requires_grad_(False)  # only the norm's weight wants a gradient; x does not
        m(x).square().sum().backward()
    want = eager[1].parametrizations.weight.original.grad
    got = tuned[1].parametrizations.weight.original.grad
    assert want is not None and got is not None
    torch.testing.assert_close(got, want)


def test_inference_reads_no_parameter_through_getattr(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    tuned = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16)).eval()
    dtt.optimize(tuned, example_inputs=(x,), policy="heuristic", check_speed=False)
    norm = tuned[1]
    looked_up: list[str] = []
    real = nn.Module.__getattr__

    def spy(self: nn.Module, name: str) -> object:
        if self is norm:
            looked_up.append(name)
        return real(self, name)

    monkeypatch.setattr(nn.Module, "__getattr__", spy)
    with torch.no_grad():
        norm(x)
    assert "weight" not in looked_up[:1]  # grad mode off: _grad_wanted reads nothing
