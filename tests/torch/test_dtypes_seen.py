"""Forwards that branch on a tensor's dtype (transformers' encoder layers of Whisper, BART,
T5 and 28 more families: ``if hidden_states.dtype == torch.float16: clamp``) are traced with
the dtypes an example forward saw, and the rewritten forward runs only for calls of those
dtypes, outside autocast."""

from __future__ import annotations

import copy
import operator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx, nn
from torch_models import optimize_as_it_runs

from dnntune.torch._dtypes_seen import DtypesSeen, conditions_of, dtype_of
from dnntune.torch._dtypes_seen import record as _record
from dnntune.torch._trace_guard import TRACE_GUARD
from dnntune.torch._tracing import reads_dtype


class _Attention(nn.Module):
    """Returns a tuple, as transformers' attention modules do."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        h = torch.tanh(x)
        h = self.proj(h)
        return h, None


class EncoderLayer(nn.Module):
    """Whisper's encoder layer (transformers 5.17), its shape kept: the residual adds, the
    MLP's activation, and the clamp of float16 states at the end."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = _Attention(d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.attn(self.norm1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=0.1, training=self.training)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.act(self.fc1(self.norm2(hidden_states)))
        hidden_states = self.fc2(hidden_states)
        hidden_states = residual + hidden_states
        if hidden_states.dtype == torch.bfloat16:  # float16's clamp, taken on the CPU
            clamp_value = torch.finfo(hidden_states.dtype).eps * 64  # 0.5
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        return hidden_states


class _ClampsInAHelper(EncoderLayer):
    """Branches on the dtype in a method its forward calls."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self._clamped(hidden_states + self.fc2(self.act(self.fc1(hidden_states))))

    def _clamped(self, h: torch.Tensor) -> torch.Tensor:
        if h.dtype == torch.float32:
            h = h.clamp(-0.5, 0.5)
        return h


class _Encoder(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(d), EncoderLayer(d)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _UnknownDtype(EncoderLayer):
    """Branches on the dtype of an op's result that is not followed (a matmul's: its dtype
    is not what the example saw of any module): not traced."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.matmul(self.fc2(self.act(self.fc1(hidden_states))), torch.eye(16))
        if out.dtype == torch.float32:
            out = out * 2
        return hidden_states + out


def record(root: nn.Module, call: Any) -> DtypesSeen:
    return _record(root, call, reads_dtype)


def _fused(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if TRACE_GUARD in m.__dict__]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layer_that_branches_on_its_dtype_is_fused_and_matches(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    ref = _Encoder().eval().to(dtype)
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 16, dtype=dtype)
    report = optimize_as_it_runs(model, x, tmp_path / "ov.json")
    assert _fused(model) == ["layers.0", "layers.1"]
    text = str(report)
    assert "fc1: Linear + gelu" in text and "fc2: Linear + residual add" in text
    assert "layers.1: attn + residual add" in report.fusions
    assert conditions_of(model.layers[0]) == ((0, "hidden_states", dtype),)
    with torch.no_grad():
        want, got = ref(x), model(x)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol * want.abs().max().item(), rtol=tol)
    if dtype == torch.bfloat16:  # the clamp ran: the trace took the branch the example took
        assert got.abs().max().item() == 0.5


def test_a_branch_in_a_method_the_forward_calls_is_traced(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _ClampsInAHelper().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 16)
    report = optimize_as_it_runs(model, x, tmp_path / "ov.json")
    assert report.fusions == ["<root>: fc2 + residual add", "<root>: fc1 + gelu"]
    with torch.no_grad():
        got = model(x)
    torch.testing.assert_close(got, ref(x))
    assert got.abs().max().item() == 0.5


def test_a_call_of_other_dtypes_or_under_autocast_runs_the_own_forward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Encoder().eval()
    optimize_as_it_runs(model, torch.randn(2, 5, 16), tmp_path / "ov.json")
    layer = model.layers[0]
    guard = layer.__dict__[TRACE_GUARD]
    x = torch.randn(2, 5, 16)
    assert guard.holds(layer, (x,), {})
    assert guard.holds(layer, (), {"hidden_states": x})
    assert not guard.holds(layer, (x.double(),), {})
    assert not guard.holds(layer, (), {"hidden_states": x.bfloat16()})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not guard.holds(layer, (x,), {})
    # a model cast after optimize takes the branch of its new dtype, through its own forward
    ref = copy.deepcopy(model).bfloat16()
    with torch.no_grad():
        y = ref(x.bfloat16())
    assert y.abs().max().item() == 0.5


def test_without_an_example_or_with_an_unknown_dtype_nothing_is_traced(tmp_path: Path) -> None:
    import dnntune.torch as dtt

    model = _Encoder().eval()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "a.json")
    assert _fused(model) == []  # no example forward: no dtype seen
    layer = _UnknownDtype().eval()
    optimize_as_it_runs(layer, torch.randn(2, 16), tmp_path / "b.json")
    assert _fused(layer) == []


class _AnyDtype(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2 if x.dtype == torch.float64 else self.inner(x)


def test_a_module_called_with_two_dtypes_has_none_seen() -> None:
    once = _AnyDtype()
    seen = record(once, lambda m: (m(torch.randn(2)), m(torch.randn(3))))
    assert seen.inputs[once] == {"x": torch.float32}
    assert seen.outputs[once.inner] == torch.float32
    twice = _AnyDtype()
    seen = record(twice, lambda m: (m(torch.randn(2)), m(torch.randn(2).double())))
    assert twice not in seen.inputs and twice.inner not in seen.outputs
    assert twice in seen.mixed and twice.inner in seen.mixed
    # nothing reads a dtype: no forward runs at all
    calls: list[int] = []
    record(nn.Sequential(nn.Linear(2, 2)), lambda m: calls.append(1))
    assert calls == []


def test_dtype_of_follows_the_ops_that_keep_a_dtype() -> None:
    layer = EncoderLayer()
    seen = DtypesSeen()
    seen.inputs[layer] = {"x": torch.bfloat16}
    seen.outputs[layer.fc1] = torch.bfloat16
    seen.outputs[layer.attn] = (torch.float32, None)
    g = fx.Graph()
    x = g.placeholder("x")
    fc1 = g.call_module("fc1", (x,))
    attn = g.call_module("attn", (x,))
    first, second = (g.call_function(operator.getitem, (attn, i)) for i in (0, 1))
    summed = g.call_function(operator.add, (fc1, 1.0))
    mixed = g.call_function(operator.add, (fc1, first))
    viewed = g.call_method("view", (summed, (2, -1)))
    to = g.call_method("to", (fc1, torch.float32))

    def of(node: Any) -> torch.dtype | None:
        return dtype_of(node, layer, seen)

    assert of(x) == torch.bfloat16 and of(fc1) == torch.bfloat16
    assert of(first) == torch.float32 and of(second) is None
    assert of(summed) == torch.bfloat16 and of(viewed) == torch.bfloat16
    assert of(mixed) is None  # two dtypes: promotion is not followed
    assert of(to) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_the_gpu_the_layer_is_fused_and_matches(tmp_path: Path, dtype: torch.dtype) -> None:
    """On CUDA the rewritten layers run dnntune's fused calls (the GEMMs with the activation
    and the residual add in their epilogues): compared with float64 math on the same weights
    (float16) or the layers' own forward (bfloat16, whose branch float64 does not take),
    within the low precision's tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    model = _Encoder(d=64).eval().to("cuda", dtype)
    # float64 math takes no branch; the bfloat16 layers clamp each layer's output, so their
    # reference is the layers' own forward in bfloat16
    reference = copy.deepcopy(model)
    if dtype != torch.bfloat16:
        reference = reference.double()
    x = torch.randn(4, 32, 64, device="cuda", dtype=dtype) * 0.1
    report = optimize_as_it_runs(model, x, tmp_path / "ov.json")
    assert "layers.0: fc2 + residual add" in report.fusions
    assert "layers.1: attn + residual add" in report.fusions
    with torch.no_grad():
        got = model(x)
        expected = reference(x.to(next(reference.parameters()).dtype))
    if dtype == torch.bfloat16:
        assert got.abs().max().item() == 0.5  # the fused layers took the branch
    torch.testing.assert_close(got.double(), expected.double(), rtol=2e-2, atol=2e-2)


def test_a_forward_that_raises_sees_nothing() -> None:
    def boom(m: nn.Module) -> None:
        raise RuntimeError("bad example")

    seen = record(_AnyDtype(), boom)
    assert seen.inputs == {} and seen.outputs == {}
