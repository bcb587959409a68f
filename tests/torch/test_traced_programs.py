"""An optimized model recorded by PyTorch (``torch.jit.trace``, ``torch.export``,
``torch.compile``, ``torch.fx.symbolic_trace``) records PyTorch's own ops on its parameters:
never a cached folded weight as a constant, never a fake tensor's address. (A fifth audit: a
trace under ``no_grad`` kept the conv + batch-norm fold as constants, 3.1 off after
``load_state_dict``; a grad-mode trace failed its check; ``torch.export`` under ``no_grad`` or
with frozen parameters crashed reading a fake tensor's data pointer.)"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import kernel_plan, randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch import runtime


class Residual(nn.Module):
    """conv + BN + ReLU (a traced fold), then conv + BN + residual + ReLU (a folded tail)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class Block(nn.Module):
    """LayerNorm, Linear, attention, a residual Linear, RMSNorm, Linear + GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)
        self.rms = nn.RMSNorm(16)
        self.up = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 5, 16)
        x = x + self.out(a)
        return F.gelu(self.up(self.rms(x)))


def _conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        Residual(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 4),
    )


def _make(seed: int, which: str) -> nn.Module:
    torch.manual_seed(seed)
    model = _conv_net() if which == "conv" else Block()
    randomize_batch_norms(model)
    return model.eval()


def _input(which: str) -> torch.Tensor:
    return torch.randn(2, 3, 8, 8) if which == "conv" else torch.randn(2, 5, 16)


class Outer(nn.Module):
    """The module optimize() is given; the tests record its child (the routing wrapper that
    optimize() puts on the root's forward is not what they are about)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.fixture(params=["native", "kernel"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """PyTorch's op as the winner (the CPU's heuristic pick), or dnntune's kernel path (what a
    cuDNN or Triton winner takes on a GPU)."""
    if request.param == "kernel":
        monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        yield request.param


def _optimized(which: str, tmp_path: Path) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    ref = _make(0, which)
    outer = Outer(copy.deepcopy(ref))
    x = _input(which)
    dtt.optimize(outer, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False)
    with torch.no_grad():
        outer(x)  # folds cached, prepared calls remembered
    return ref, outer.inner, x


def _modes(frozen: str, model: nn.Module) -> AbstractContextManager[object]:
    if frozen == "requires_grad_(False)":
        model.requires_grad_(False)
    return torch.no_grad() if frozen == "no_grad" else torch.enable_grad()


MODES = ["no_grad", "requires_grad_(False)", "grad"]


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("which", ["conv", "block"])
@pytest.mark.parametrize("frozen", MODES)
def test_a_jit_trace_follows_the_parameters_it_is_given(
    which: str, frozen: str, path: str, tmp_path: Path
) -> None:
    _, model, x = _optimized(which, tmp_path)
    with _modes(frozen, model):
        traced = torch.jit.trace(model, x)  # its own check: the same graph twice
    new = _make(1, which)
    traced.load_state_dict(new.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(traced(x), new(x), atol=1e-4, rtol=1e-4)


def _no_constants(program: torch.export.ExportedProgram) -> None:
    """Every tensor the program reads is a parameter or buffer of the model (a cached fold
    would be a lifted constant)."""
    assert not program.constants, list(program.constants)


@pytest.mark.parametrize("which", ["conv", "block"])
@pytest.mark.parametrize("frozen", MODES)
@pytest.mark.parametrize("strict", [False, True])
def test_torch_export_records_pytorchs_ops(
    which: str, frozen: str, strict: bool, path: str, tmp_path: Path
) -> None:
    ref, model, x = _optimized(which, tmp_path)
    with _modes(frozen, model):
        program = torch.export.export(model, (x,), strict=strict)
    _no_constants(program)
    module = program.module()
    with torch.no_grad():
        torch.testing.assert_close(module(x), ref(x), atol=1e-4, rtol=1e-4)
    new = _make(1, which)
    kept = module.state_dict()  # a strict export drops the unused num_batches_tracked
    module.load_state_dict({k: v for k, v in new.state_dict().items() if k in kept})
    with torch.no_grad():
        torch.testing.assert_close(module(x), new(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("which", ["conv", "block"])
@pytest.mark.parametrize("frozen", ["no_grad", "grad"])
def test_torch_compile_traces_the_whole_forward(
    which: str, frozen: str, path: str, tmp_path: Path
) -> None:
    """No graph break in dnntune's modules and calls (``fullgraph``), PyTorch's result."""
    ref, model, x = _optimized(which, tmp_path)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with _modes(frozen, model):
        got = compiled(x)
    torch.testing.assert_close(got, ref(x), atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


LEAVES: list[tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = [
    (lambda: nn.Conv2d(3, 8, 3, padding=1), lambda: torch.randn(2, 3, 8, 8)),
    (lambda: nn.BatchNorm2d(3), lambda: torch.randn(2, 3, 8, 8)),
    (lambda: nn.Linear(16, 8), lambda: torch.randn(2, 5, 16)),
    (lambda: nn.LayerNorm(16), lambda: torch.randn(2, 5, 16)),
    (lambda: nn.RMSNorm(16), lambda: torch.randn(2, 5, 16)),
]


@pytest.mark.parametrize(("make", "make_x"), LEAVES, ids=["conv", "bn", "linear", "ln", "rms"])
@pytest.mark.parametrize("grad", [False, True])
def test_fx_symbolic_trace_of_a_swapped_layer(
    make: Callable[[], nn.Module],
    make_x: Callable[[], torch.Tensor],
    grad: bool,
    path: str,
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    ref = make().eval()
    randomize_batch_norms(ref)
    x = make_x()
    outer = Outer(copy.deepcopy(ref))
    dtt.optimize(outer, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False)
    with torch.set_grad_enabled(grad):
        graph = torch.fx.symbolic_trace(outer.inner)
    with torch.no_grad():
        torch.testing.assert_close(graph(x), ref(x), atol=1e-5, rtol=1e-5)


class CallsOps(nn.Module):
    """A forward that calls dnntune's functional ops itself, and a Linear + GELU child pair
    that optimize()'s fusion rewrites (the rewritten forward is made from an fx trace)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = dtt.linear(x, self.w, activation="relu")
        h = dtt.layer_norm(h, (8,))
        h = dtt.scaled_dot_product_attention(
            h.view(1, 1, 2, 8), h.view(1, 1, 2, 8), h.view(1, 1, 2, 8)
        )
        return F.gelu(self.fc(h.view(2, 8)))


def test_fx_records_dnntunes_ops_as_calls(path: str, tmp_path: Path) -> None:
    """Under torch.fx a dnntune op is one call in the graph: a forward made from the graph
    (optimize()'s rewrite, a user's GraphModule) still calls it, not PyTorch's op."""
    torch.manual_seed(0)
    ref = CallsOps().eval()
    outer = Outer(copy.deepcopy(ref))
    x = torch.randn(2, 8)
    report = dtt.optimize(
        outer, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False
    )
    assert report.fusions == ["inner: fc + gelu"]
    # traced from a plain parent: the rewritten forward takes ``*args``, which fx traces as
    # one proxy at the root
    graph = torch.fx.symbolic_trace(Outer(outer.inner))
    targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
    assert {dtt.linear, dtt.layer_norm, dtt.scaled_dot_product_attention} <= targets
    with torch.no_grad():
        torch.testing.assert_close(graph(x), ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(outer(x), ref(x), atol=1e-5, rtol=1e-5)


class _RoutedRoot(nn.Module):
    """A root whose forward calls a routed function (SDPA) and a fused Linear + GELU: the
    optimized root's class wraps its forward (routing, the trace guard)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(F.gelu(self.fc(x)))
        q = h[None, None]  # [1, 1, S, D]
        return F.scaled_dot_product_attention(q, q, q)[0, 0]


@pytest.mark.parametrize("how", ["fx", "compile", "export_strict"])
def test_a_program_recorded_from_the_optimized_root(how: str, tmp_path: Path) -> None:
    """The root's wrappers (routing, trace guard) take ``(*args, **kwargs)`` and read
    dnntune's per-call state: ``torch.fx`` could not make the root's inputs, and Dynamo
    stopped at a ContextVar (``fullgraph`` and strict export failed). While PyTorch records,
    they call the wrapped forward."""
    torch.manual_seed(0)
    ref = _RoutedRoot().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 16)
    report = dtt.optimize(
        model, (x,), policy="heuristic", overrides=tmp_path / "o.json", check_speed=False
    )
    assert report.fusions, report  # the root's forward was rewritten
    with torch.no_grad():
        if how == "fx":
            got = torch.fx.symbolic_trace(model)(x)
        elif how == "compile":
            torch._dynamo.reset()
            got = torch.compile(model, fullgraph=True, backend="eager")(x)
            torch._dynamo.reset()
        else:
            got = torch.export.export(model, (x,), strict=True).module()(x)
        torch.testing.assert_close(got, ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)  # still dnntune's
