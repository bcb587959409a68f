"""Tensors dnntune's plans do not take run PyTorch's own op, as the layer would without
dnntune: nested tensors (jagged and strided layouts), sparse COO and CSR inputs, tensor
subclasses (``__torch_function__`` ones, wrapper subclasses such as DTensor), which keep their
type. (A fifth audit: LayerNorm and Linear crashed on nested tensors and Linear on sparse ones,
inside dnntune; a subclass came back as a plain tensor from dnntune's kernel path.)"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map
from torch_models import kernel_plan

import dnntune.torch as dtt
from dnntune.torch import runtime


class Logged(torch.Tensor):
    """A ``__torch_function__`` subclass (its type survives PyTorch's ops)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


class Wrapper(torch.Tensor):
    """A wrapper subclass, as DTensor is: no storage of its own, ops run on ``elem``."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Wrapper:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device
        )

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def unwrap(t: Any) -> Any:
            return t.elem if isinstance(t, Wrapper) else t

        def wrap(t: Any) -> Any:
            return Wrapper(t) if isinstance(t, torch.Tensor) else t

        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))


@pytest.fixture(params=["native", "kernel"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """PyTorch's op as the winner (the CPU's heuristic pick), or dnntune's kernel path (what a
    cuDNN or Triton winner takes on a GPU)."""
    if request.param == "kernel":
        monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    dtt.configure(policy="heuristic", overrides="does-not-exist.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)  # a fallback is expected
        warnings.filterwarnings("ignore", "The PyTorch API of nested tensors is in prototype")
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        yield request.param


def _nested(layout: torch.layout) -> Callable[[torch.Tensor], torch.Tensor]:
    """A [B, S, ...] tensor as a nested tensor of two ragged sequences."""

    def make(t: torch.Tensor) -> torch.Tensor:
        parts = [t[0, :3], t[1, : t.shape[1]]]
        return torch.nested.nested_tensor(parts, layout=layout)

    return make


KINDS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "logged": lambda t: t.as_subclass(Logged),
    "wrapper": Wrapper,
    "jagged": _nested(torch.jagged),
    "nested_strided": _nested(torch.strided),
    # a sparse matrix: the [B, S, K] input's rows, half of them zero
    "sparse_coo": lambda t: t.reshape(-1, t.shape[-1]).relu().to_sparse(),
    "sparse_csr": lambda t: t.reshape(-1, t.shape[-1]).relu().to_sparse_csr(),
}


def _plain(t: Any) -> Any:
    """Values to compare: dense, unwrapped, nested tensors' pieces concatenated."""
    if isinstance(t, Wrapper):
        return t.elem
    if t.is_nested:
        return torch.cat([p.reshape(-1) for p in t.unbind()])
    if t.layout is not torch.strided:
        return t.to_dense()
    return t.as_subclass(torch.Tensor)


OPS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[[], list[Any]]]] = {
    # name: (dnntune op, PyTorch op, arguments: the first is the input made of another kind)
    "linear": (
        dtt.linear,
        F.linear,
        lambda: [torch.randn(2, 5, 8), torch.randn(6, 8), torch.randn(6)],
    ),
    "layer_norm": (
        dtt.layer_norm,
        F.layer_norm,
        lambda: [torch.randn(2, 5, 8), (8,), torch.randn(8), torch.randn(8)],
    ),
    "rms_norm": (dtt.rms_norm, F.rms_norm, lambda: [torch.randn(2, 5, 8), (8,), torch.randn(8)]),
    "conv2d": (
        dtt.conv2d,
        F.conv2d,
        lambda: [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4), 1, 1],
    ),
    "sdpa": (
        dtt.scaled_dot_product_attention,
        F.scaled_dot_product_attention,
        lambda: [torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)],
    ),
    "batch_norm": (
        dtt.batch_norm,
        F.batch_norm,
        lambda: [torch.randn(2, 3, 6, 6), torch.randn(3), torch.rand(3) + 0.5],
    ),
    "max_pool2d": (dtt.max_pool2d, F.max_pool2d, lambda: [torch.randn(2, 3, 6, 6), 2]),
    "avg_pool2d": (dtt.avg_pool2d, F.avg_pool2d, lambda: [torch.randn(2, 3, 6, 6), 2]),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("op", list(OPS))
def test_an_input_dnntune_does_not_take_runs_pytorchs_op(op: str, kind: str, path: str) -> None:
    ours, theirs, make_args = OPS[op]
    torch.manual_seed(0)
    args = make_args()
    for first in (True, False):  # a first call, then one that may come from the call memo
        if not first:
            ours(*args)  # a plain call of the signature first: its memo entry
        inputs = [KINDS[kind](args[0]), *args[1:]]
        if op == "sdpa":  # every one of query, key and value of the kind
            inputs[1:3] = [KINDS[kind](a) for a in args[1:3]]
        try:
            want = theirs(*inputs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError):
            pytest.skip(f"PyTorch's {op} does not take this kind of tensor either")
        got = ours(*inputs)
        assert type(got) is type(want)
        assert got.layout == want.layout and got.is_nested == want.is_nested
        torch.testing.assert_close(_plain(got), _plain(want))


def test_a_subclass_weight_runs_pytorchs_op(path: str) -> None:
    """A parameter of a subclass (a quantized or sharded weight) is another signature."""
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)
    dtt.linear(x, w, b)  # the plain signature first: its memo entry
    for sub in (w.as_subclass(Logged), Wrapper(w)):
        want = F.linear(x, sub, b)
        got = dtt.linear(x, sub, b)
        assert type(got) is type(want)
        torch.testing.assert_close(_plain(got), _plain(want))


class Layers(nn.Module):
    """What the audit ran nested and sparse tensors through, and a residual linear."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.rms = nn.RMSNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.fc(self.ln(x))  # a fused residual add in the traced forward
        return self.rms(h)


def _optimized_with(
    ref: nn.Module, kind: str, tmp_path: Path, refused: tuple[type[Exception], ...]
) -> tuple[nn.Module, Any, Any]:
    """(``ref`` optimized on a plain input, an input of ``kind``, ``ref``'s output for it);
    skips when PyTorch's own layers refuse that kind (``refused``)."""
    torch.manual_seed(0)
    ref.eval()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 8)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False)
    inputs = KINDS[kind](x)
    with torch.no_grad():
        try:
            want = ref(inputs)
        except refused:
            pytest.skip("PyTorch's layers do not take this kind of tensor either")
    return model, inputs, want


@pytest.mark.parametrize("kind", ["jagged", "nested_strided", "logged", "wrapper"])
def test_an_optimized_model_takes_what_its_layers_take(
    kind: str, path: str, tmp_path: Path
) -> None:
    # PyTorch's RMSNorm does not take a strided-layout nested tensor: skipped
    model, inputs, want = _optimized_with(Layers(), kind, tmp_path, (RuntimeError,))
    with torch.no_grad():
        for _ in range(2):
            got = model(inputs)
            assert type(got) is type(want)
            torch.testing.assert_close(_plain(got), _plain(want))


@pytest.mark.parametrize("kind", ["jagged", "nested_strided", "sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("layer", ["linear", "layer_norm"])
def test_an_optimized_layer_takes_nested_and_sparse_inputs(
    layer: str, kind: str, path: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    ref = nn.Linear(8, 8) if layer == "linear" else nn.LayerNorm(8)
    model, inputs, want = _optimized_with(ref, kind, tmp_path, (RuntimeError, NotImplementedError))
    with torch.no_grad():
        torch.testing.assert_close(_plain(model(inputs)), _plain(want))


@pytest.mark.parametrize("kind", ["logged", "wrapper"])
def test_a_fold_of_subclass_parameters_runs_pytorchs_ops(
    kind: str, path: str, tmp_path: Path
) -> None:
    """A conv + batch norm whose weight is a subclass (a sharded or quantized weight): the
    fold's cache tracks plain tensors by address, so the pair runs as PyTorch runs it."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    model = copy.deepcopy(ref)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False)
    for m in (ref, model):
        m[0].weight = nn.Parameter(KINDS[kind](m[0].weight.detach()))
    with torch.no_grad():
        want = ref(x)
        for _ in range(2):
            got = model(x)
            assert type(got) is type(want)
            torch.testing.assert_close(_plain(got), _plain(want), atol=1e-5, rtol=1e-5)
