"""``optimize`` takes models and example inputs whose tensors ``torch.equal`` does not take: its
put-back of the buffers and example inputs after its own forwards compared them with it, so
it raised NotImplementedError for a model built on the meta device (deferred initialization:
``torch.device("meta")``, then ``to_empty`` and ``load_state_dict``), a sparse buffer (a graph
network's adjacency matrix), and a sparse or nested example input, which the layers
themselves take (new-user audit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import dnntune.torch as dtt


def _net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4)
    )


def test_a_model_on_the_meta_device_is_optimized_then_materialized(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _net().eval()
    with torch.no_grad():
        ref[1].running_mean.normal_()
        ref[1].running_var.uniform_(0.5, 2.0)
    with torch.device("meta"):
        model = _net().eval()
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == ["<root>: 0 + 1 + relu"]
    model.to_empty(device="cpu")
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)


class GraphLayer(nn.Module):
    """A graph convolution: its adjacency matrix is a sparse buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        adjacency = torch.eye(6) + torch.diag(torch.ones(5), 1)
        self.register_buffer("adjacency", adjacency.to_sparse())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.adjacency, self.fc(x))


class Message(nn.Module):
    """A layer applied to a sparse matrix product of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.sparse.mm(a, x))


def test_a_sparse_buffer_or_input_is_taken(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = GraphLayer().eval()
    x = torch.randn(6, 8)
    with torch.no_grad():
        want = model(x)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "a.json")
    assert model.adjacency.is_sparse
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-4)

    message = Message().eval()
    a = torch.randn(5, 6).relu().to_sparse()
    with torch.no_grad():
        want = message(a, x)
    dtt.optimize(message, (a, x), policy="heuristic", overrides=tmp_path / "b.json")
    with torch.no_grad():
        torch.testing.assert_close(message(a, x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore::dnntune.torch.DnnTuneFallbackWarning")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_a_nested_example_input_is_taken(layout: torch.layout, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 4)).eval()
    x = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=layout)
    with torch.no_grad():
        want = model(x)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    with torch.no_grad():
        got = model(x)
    for g, w in zip(got.unbind(), want.unbind(), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("example", [True, False])
def test_a_model_with_lazy_modules_is_optimized(example: bool, tmp_path: Path) -> None:
    """A lazy module's buffers refuse even ``numel`` before the first forward
    (``nn.LazyBatchNorm2d``): optimize raised ValueError taking its snapshot of them."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.LazyConv2d(8, 3, padding=1),
        nn.LazyBatchNorm2d(),
        nn.ReLU(),
        nn.Flatten(),
        nn.LazyLinear(4),
    ).eval()
    x = torch.randn(2, 3, 6, 6)
    dtt.optimize(model, (x,) if example else None, policy="heuristic", overrides=None)
    with torch.no_grad():
        got = model(x)  # materialized by now
    ref = _net().eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(got, ref(x), rtol=1e-4, atol=1e-4)
