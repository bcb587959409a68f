"""An optimized model inside a ``torch.func`` transform (``vmap``, ``grad`` over
``functional_call``, ``jacrev``: per-example gradients, ensembles, meta-learning) computes what
PyTorch's model computes: a transform's tensors are wrappers that only PyTorch's ops know how
to transform, so every dnntune op runs PyTorch's there, as under ``torch.compile``. On
dnntune's own kernel path (a cuDNN or Triton winner on a GPU; forced on the CPU here) ``vmap``
raised ExecutionError inside the user's forward (new-user audit)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jacrev, vmap
from torch_models import kernel_plan, randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch import runtime


@pytest.fixture(autouse=True)
def kernel_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every kernel is TORCH_ENGINE's plan marked as not PyTorch's own op (the kernel path)."""
    monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a transform is an expected route: no warning
        yield


def _pair(tmp_path: Path) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    ref = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(72, 16),
        nn.GELU(),
        nn.LayerNorm(16),
        nn.Linear(16, 4),
    ).eval()
    randomize_batch_norms(ref)
    model = copy.deepcopy(ref)
    x = torch.randn(2, 3, 6, 6)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    return ref, model, x


def test_vmap_of_an_optimized_model(tmp_path: Path) -> None:
    ref, model, x = _pair(tmp_path)
    xs = torch.randn(3, *x.shape)  # three batches of the example's shape (the memo's signature)
    with torch.no_grad():
        torch.testing.assert_close(vmap(model)(xs), vmap(ref)(xs), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)  # and after it


def test_per_example_gradients_of_an_optimized_model(tmp_path: Path) -> None:
    ref, model, x = _pair(tmp_path)

    def loss(m: nn.Module, params: dict[str, torch.Tensor], sample: torch.Tensor) -> torch.Tensor:
        return functional_call(m, params, (sample[None],)).square().sum()

    def per_example(m: nn.Module) -> dict[str, torch.Tensor]:
        params = {k: v.detach() for k, v in m.named_parameters()}
        return vmap(grad(lambda p, s: loss(m, p, s)), in_dims=(None, 0))(params, x)

    got, want = per_example(model), per_example(ref)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-3, msg=name)


def test_jacrev_through_an_optimized_layer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 4), nn.Tanh()).eval()
    model = copy.deepcopy(ref)
    x = torch.randn(5)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    torch.testing.assert_close(jacrev(model)(x), jacrev(ref)(x), rtol=1e-4, atol=1e-4)
