"""Activation modules written out in Python (CLIP's QuickGELU, GPT-2's tanh GELU formula, a
``Swish``) are recognised by what their forward computes and run as a linear's or conv's
epilogue; anything else is left as it runs."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import Conv1D, Gpt2Mlp, NewGELU, optimized_copy

import dnntune.torch as dtt
from dnntune.torch import functional as dtf
from dnntune.torch._activations import activation_name


class QuickGELU(nn.Module):  # CLIP's, open_clip's, transformers' QuickGELUActivation
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class FastGELU(nn.Module):  # transformers' FastGELUActivation: a 10-digit constant
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input**2)))


class Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.sigmoid()


class ErfGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class Swish2(nn.Module):  # a swish of another slope: no activation of dnntune's
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(2.0 * x)


class ByMode(nn.Module):  # computes another function in eval mode
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) if self.training else torch.relu(x)


class ClassBeta(nn.Module):  # reads a class attribute (a setting: matched with its value)
    beta = 1.702

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


class InstanceBeta(nn.Module):  # reads a setting of its own
    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


class Learned(nn.Module):  # a parameter
    def __init__(self) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


USE_SWISH = True


class GlobalFlag(nn.Module):  # a global a trace would freeze
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) if USE_SWISH else torch.relu(x)


class InPlace(nn.Module):  # writes its input
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(torch.sigmoid(x))


class TimmSwish(nn.Module):  # timm's: in place where asked
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(x.sigmoid()) if self.inplace else x.mul(x.sigmoid())


class KeptFunction(nn.Module):  # a function kept on the instance: not a plain setting
    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.sigmoid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


class Clamped(nn.Module):  # not elementwise ops of the allowed kinds
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0)


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (QuickGELU, "quick_gelu"),
        (NewGELU, "gelu_tanh"),
        (FastGELU, "gelu_tanh"),
        (Swish, "silu"),
        (ErfGELU, "gelu"),
        (Swish2, None),
        (ByMode, None),
        (ClassBeta, "quick_gelu"),
        (InstanceBeta, "silu"),
        (TimmSwish, "silu"),
        (KeptFunction, None),
        (Learned, None),
        (GlobalFlag, None),
        (InPlace, None),
        (Clamped, None),
        (nn.Identity, None),
    ],
)
def test_a_written_activation_is_named_by_what_it_computes(
    cls: type[nn.Module], name: str | None
) -> None:
    assert activation_name(cls()) == name


def test_a_setting_is_matched_with_its_value_now() -> None:
    """A slope or an ``inplace`` flag, of the instance or of the class, changed after it was
    matched: the next answer is for the new value."""
    assert activation_name(InstanceBeta(1.702)) == "quick_gelu"
    assert activation_name(InstanceBeta(2.0)) is None
    assert activation_name(TimmSwish(inplace=True)) is None  # writes its input
    module = ClassBeta()
    assert activation_name(module) == "quick_gelu"
    try:
        ClassBeta.beta = 1.0
        assert activation_name(module) == "silu"
        module.beta = 3.0  # the instance's own now shadows the class's
        assert activation_name(module) is None
    finally:
        ClassBeta.beta = 1.702


def test_an_attribute_its_forward_never_reads_does_not_matter() -> None:
    """transformers marks every module ``_is_hf_initialized``; no forward reads it."""
    module = QuickGELU()
    module._is_hf_initialized = True
    assert activation_name(module) == "quick_gelu"
    beta = InstanceBeta()
    beta._is_hf_initialized = True
    assert activation_name(beta) == "silu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quick_gelu_as_an_epilogue_matches_the_written_form(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 32, dtype=dtype)
    w = torch.randn(16, 32, dtype=dtype) / 32**0.5
    b = torch.randn(16, dtype=dtype)
    y = dtf.linear(x, w, b, activation="quick_gelu")
    exact = F.linear(x.double(), w.double(), b.double())
    exact = exact * torch.sigmoid(1.702 * exact)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.double(), exact, atol=tol, rtol=tol)
    c = torch.randn(2, 4, 6, 6, dtype=dtype)
    k = torch.randn(8, 4, 3, 3, dtype=dtype) / 6
    out = dtf.conv2d(c, k, None, padding=1, activation="quick_gelu")
    ref = F.conv2d(c.double(), k.double(), padding=1)
    torch.testing.assert_close(out.double(), ref * torch.sigmoid(1.702 * ref), atol=tol, rtol=tol)


def _spy_linear(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    seen: list[str | None] = []
    original = dtf.linear

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs.get("activation"))
        return original(*args, **kwargs)

    monkeypatch.setattr(dtf, "linear", spy)
    return seen


class _ClipMlp(nn.Module):
    """CLIP's MLP: fc1, its activation module, fc2."""

    def __init__(self, act: nn.Module, d: int = 16, h: int = 64) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)
        self.activation_fn = act

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quick = _ClipMlp(QuickGELU())
        self.new = _ClipMlp(NewGELU())
        self.swish = _ClipMlp(Swish())
        self.other = _ClipMlp(Swish2())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.other(self.swish(self.new(self.quick(x))))


def test_written_activations_fuse_into_the_linear_before_them(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _Blocks().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == [
        "quick: fc1 + quick_gelu",
        "new: fc1 + gelu_tanh",
        "swish: fc1 + silu",
    ]
    called: list[str] = []
    for child in (model.quick, model.new, model.swish, model.other):
        child.activation_fn.register_forward_pre_hook(
            lambda m, args: called.append(type(m).__name__)
        )
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    # hooks on the activations: every fused call now runs them as written (as PyTorch would)
    assert called == ["QuickGELU", "NewGELU", "Swish", "Swish2"]


def test_fused_written_activations_run_fused_and_follow_a_replaced_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ref = _Blocks().eval()
    model = copy.deepcopy(ref)
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    seen = _spy_linear(monkeypatch)
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert [a for a in seen if a] == ["quick_gelu", "gelu_tanh", "silu"]
        # a child replaced after optimize: what runs is the new module
        model.quick.activation_fn = Swish2()
        ref.quick.activation_fn = Swish2()
        seen.clear()
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert [a for a in seen if a] == ["gelu_tanh", "silu"]
    model.train()
    ref.train()
    model(x).sum().backward()  # training: the modules as written, gradients as before
    ref(x).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quick_gelu_epilogue_on_cuda_in_bfloat16(tmp_path: Path) -> None:
    """cuDNN's swish with beta 1.702 as the GEMM's epilogue (or the plan the check keeps),
    within bfloat16's tolerance of the written form in float64."""
    torch.manual_seed(0)
    ref = _ClipMlp(QuickGELU(), d=256, h=1024).eval()
    model = copy.deepcopy(ref).cuda().to(torch.bfloat16)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == ["<root>: fc1 + quick_gelu"]
    x = torch.randn(4, 77, 256)
    with torch.no_grad():
        got = model(x.cuda().to(torch.bfloat16)).double().cpu()
        exact = ref.double()(x.double())
    torch.testing.assert_close(got, exact, atol=5e-2, rtol=5e-2)


def test_gpt2s_conv1d_runs_on_dnntune_with_its_gelu_as_the_gemms_epilogue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ref = Gpt2Mlp().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 16)
    report = dtt.optimize(
        model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False
    )
    assert report.fusions == ["<root>: c_fc + gelu_tanh"]
    swapped = {r.name: (r.kind, r.fused, bool(r.plans)) for r in report.swapped}
    assert swapped == {"c_fc": ("Conv1D", ["gelu_tanh"], True), "c_proj": ("Conv1D", [], True)}
    assert type(model.c_fc).__name__ == "Conv1D"
    seen = _spy_linear(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert seen == ["gelu_tanh", None]  # c_fc with its GELU, then c_proj
    # a hook on the layer: it runs on its own, then the GELU as written
    calls: list[int] = []
    handle = model.c_fc.register_forward_hook(lambda m, a, out: calls.append(1))
    seen.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert (seen, calls) == ([None, None], [1])
    handle.remove()
    # training: the layers' own addmm, the same gradients as eager
    model.train()
    ref.train()
    seen.clear()
    torch.manual_seed(1)
    model(x).sum().backward()
    torch.manual_seed(1)
    ref(x).sum().backward()
    assert seen == []
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_a_conv1d_changed_after_optimize_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its forward replaced on the instance, or its weight by one of another shape: the layer
    runs as it is now."""
    ref, model, _ = optimized_copy(Gpt2Mlp, tmp_path / "ov.json")
    seen = _spy_linear(monkeypatch)
    x = torch.randn(3, 16)
    with torch.no_grad():
        for m in (model, ref):
            m.c_fc.forward = lambda t, _m=m.c_fc: t @ _m.weight  # no bias now
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert seen == [None]  # c_proj alone
        seen.clear()
        for m in (model, ref):
            del m.c_fc.forward
            m.c_fc.bias = nn.Parameter(torch.ones(1))  # broadcasts in addmm: no Conv1D now
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert seen == [None]


def test_a_conv1ds_weight_replaced_or_written_is_what_runs(tmp_path: Path) -> None:
    """The stand-in keeps its weight's transposed view between calls: a weight written in
    place, given new data, or replaced by a new parameter is read as it is now."""
    ref, model, _ = optimized_copy(Gpt2Mlp, tmp_path / "ov.json")
    x = torch.randn(3, 16)
    edits = (
        lambda m: m.c_proj.weight.mul_(2.0),
        lambda m: setattr(m.c_proj.weight, "data", torch.ones(64, 16)),
        lambda m: setattr(m.c_fc, "weight", nn.Parameter(torch.full((16, 64), 0.1))),
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        for edit in edits:
            for m in (model, ref):
                edit(m)
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


def test_a_conv1d_stepped_by_an_optimizer_runs_with_grad_mode_on(tmp_path: Path) -> None:
    """The transposed view kept from a call under ``no_grad`` is made again once an optimizer
    step writes the weight: PyTorch refuses any use of it in grad mode after that write (the
    model sweep's GPT-2, seed 34: RuntimeError on the next forward)."""
    ref, model, _ = optimized_copy(Gpt2Mlp, tmp_path / "ov.json")
    x = torch.randn(3, 16)
    with torch.no_grad():
        model(x)  # the views are made here, under no_grad
    for m in (model, ref):
        for p in m.parameters():
            p.grad = torch.full_like(p, 0.5)
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)  # grad mode on
    model(x).sum().backward()


class _Gpt2MlpBlock(nn.Module):
    """GPT-2's MLP with its block's residual add: ``c_proj`` can take the add."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = Gpt2Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


@pytest.mark.parametrize("make", [Gpt2Mlp, _Gpt2MlpBlock])
def test_a_conv1d_fine_tuned_in_eval_mode_gets_its_weight_gradient(
    tmp_path: Path, make: Any
) -> None:
    """Gradients in eval mode (fine-tuning without dropout, input gradients): the fused
    calls (``c_fc`` with its GELU, ``c_proj`` with the residual add) read the weight's kept
    transposed view, which, made under ``optimize``'s ``no_grad`` forward, carried no gradient
    back to the weight: GPT-2's ``c_fc`` and ``c_proj`` weights got none (their biases did),
    an optimizer left them as they were, and the later steps' outputs went wrong. A view made
    with gradients is not used for a weight since frozen either (it would give it a gradient)."""
    torch.manual_seed(0)
    ref = make().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 5, 16)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    steps = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, ref)]
    for _ in range(3):
        for m, step in zip((model, ref), steps, strict=True):
            step.zero_grad()
            m(x).square().mean().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
        for step in steps:
            step.step()
    torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    for m in (model, ref):  # frozen since: no gradient for it
        m.zero_grad(set_to_none=True)
        for p in m.parameters():
            p.requires_grad_(p.dim() == 1)
        m(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)


class _NotConv1D(Conv1D):  # a subclass: a forward of its own, run as written
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_a_subclass_of_conv1d_is_left_alone(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Gpt2Mlp(conv=_NotConv1D).eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert report.fusions == []
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
