"""transformers' own modules on dnntune: its activation modules as a linear's epilogue, and its
RMSNorm (LlamaRMSNorm's form) as one ``rms_norm``. The classes here are written as transformers
writes them (its ``ACT2FN`` modules live in ``transformers.activations``); the GPU test takes
transformers' real LLaMA decoder layer where transformers is installed."""

from __future__ import annotations

import copy
import functools
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import dnntune.torch as dtt
from dnntune.torch import functional as dtf
from dnntune.torch._transformers import activation_of, rms_norm_like


class LlamaRMSNorm(nn.Module):
    """transformers' form: float32 statistics, the cast back, then the weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """Another norm of the same attributes: a weight of zeros scales by ``1 + weight``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (output * (1.0 + self.weight.float())).type_as(x)


class GELUActivation(nn.Module):
    def __init__(self, use_gelu_python: bool = False) -> None:
        super().__init__()
        self.act = self._gelu_python if use_gelu_python else F.gelu

    def _gelu_python(self, input: torch.Tensor) -> torch.Tensor:
        return input * 0.5 * (1.0 + torch.erf(input / 2.0**0.5))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.act(input)


class SiLUActivation(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.silu(input)


class GELUTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = functools.partial(F.gelu, approximate="tanh")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.act(input)


class _OtherSiLU(SiLUActivation):
    """The same name in another library: not transformers' class."""


for _cls in (GELUActivation, SiLUActivation, GELUTanh):
    _cls.__module__ = "transformers.activations"


class _Mlp(nn.Module):
    """LLaMA's decoder MLP behind its norm: ``down(act(gate(h)) * up(h))``."""

    def __init__(self, d: int = 16, act: nn.Module | None = None, norm: type = LlamaRMSNorm):
        super().__init__()
        self.norm = norm(d)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.act = act if act is not None else SiLUActivation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(self.act(self.gate(h)) * self.up(h))


def _optimized(model: nn.Module, x: torch.Tensor, tmp_path: Path) -> Any:
    return dtt.optimize(
        model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=False
    )


def _random_norm_weights(model: nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (LlamaRMSNorm, GemmaRMSNorm)):
                m.weight.normal_()


def test_activation_modules_are_known_by_their_class_and_function() -> None:
    assert activation_of(SiLUActivation()) == "silu"
    assert activation_of(GELUActivation()) == "gelu"
    assert activation_of(GELUTanh()) == "gelu_tanh"
    assert activation_of(GELUActivation(use_gelu_python=True)) is None  # erf in Python
    assert activation_of(_OtherSiLU()) is None  # a subclass: its module and forward differ
    odd = SiLUActivation()
    odd.forward = lambda input: input  # type: ignore[method-assign]  # set on the instance
    assert activation_of(odd) is None


def test_rms_norm_is_known_by_its_forward_and_attributes() -> None:
    assert rms_norm_like(LlamaRMSNorm(8))
    assert not rms_norm_like(GemmaRMSNorm(8))
    extra = LlamaRMSNorm(8)
    extra.bias = nn.Parameter(torch.zeros(8))  # a parameter the forward never reads
    assert not rms_norm_like(extra)
    wide = LlamaRMSNorm(8)
    wide.weight = nn.Parameter(torch.ones(2, 8))
    assert not rms_norm_like(wide)
    integral = LlamaRMSNorm(8)
    integral.variance_epsilon = 0
    assert not rms_norm_like(integral)


@pytest.mark.parametrize("act", [SiLUActivation, GELUActivation, GELUTanh])
def test_llama_mlp_runs_its_norm_and_activation_on_dnntune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, act: type[nn.Module]
) -> None:
    torch.manual_seed(0)
    model = _Mlp(act=act()).eval()
    _random_norm_weights(model)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 5, 16)
    report = _optimized(model, x, tmp_path)
    rows = {r.name: r for r in report.swapped}
    assert rows["norm"].kind == "LlamaRMSNorm"
    assert sorted(report.fusions) == [
        "<root>: down + residual add",
        f"<root>: gate + {activation_of(act())}",
        "<root>: up + multiply",
    ]
    seen: list[tuple[int, ...]] = []
    rms_norm = dtf.rms_norm

    def spy(x: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append(tuple(x.shape))
        return rms_norm(x, *args)

    monkeypatch.setattr(dtf, "rms_norm", spy)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert seen == [(2, 5, 16)]  # one rms_norm, not the norm's six passes


def test_other_norms_and_python_activations_stay_as_they_are(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Mlp(act=GELUActivation(use_gelu_python=True), norm=GemmaRMSNorm).eval()
    _random_norm_weights(model)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 5, 16)
    report = _optimized(model, x, tmp_path)
    assert "norm" not in {r.name for r in report.swapped}
    # no activation; the product is still up's epilogue
    assert report.fusions == ["<root>: down + residual add", "<root>: up + multiply"]
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "case",
    [
        "float32 weight",
        "gradients",
        "broadcast weight",
        "bfloat16",
        "float64",
        "traced",
        "transposed input",
    ],
)
def test_rms_norm_calls_dnntune_cannot_stand_for_run_the_modules_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    torch.manual_seed(0)
    norm = LlamaRMSNorm(16)
    _random_norm_weights(norm)
    ref = copy.deepcopy(norm)
    x = torch.randn(3, 16)
    _optimized(norm, x, tmp_path)
    calls: list[bool] = []
    rms_norm = dtf.rms_norm

    def spy(*args: Any) -> torch.Tensor:
        calls.append(True)
        return rms_norm(*args)

    monkeypatch.setattr(dtf, "rms_norm", spy)
    if case == "float32 weight":  # a bfloat16 input: transformers' forward gives float32
        x = x.bfloat16()
        with torch.no_grad():
            y = norm(x)
        assert y.dtype == torch.float32
        torch.testing.assert_close(y, ref(x), atol=0, rtol=0)
        assert not calls
    elif case == "gradients":
        x.requires_grad_(True)
        norm(x).sum().backward()
        assert norm.weight.grad is not None and x.grad is not None
        assert not calls
    elif case == "broadcast weight":  # one weight for every feature: broadcast, not a norm of 1
        for m in (norm, ref):
            m.weight = nn.Parameter(torch.full((1,), 2.0))
        with torch.no_grad():
            torch.testing.assert_close(norm(x), ref(x), atol=0, rtol=0)
        assert not calls
    elif case == "bfloat16":  # model and input in one type: dnntune's, within bfloat16's rounding
        norm.bfloat16()
        ref.bfloat16()
        with torch.no_grad():
            y = norm(x.bfloat16())
        assert y.dtype == torch.bfloat16 and calls
        torch.testing.assert_close(y, ref(x.bfloat16()), atol=2e-2, rtol=2e-2)
    elif case == "float64":  # transformers' forward computes in float32 even here, F.rms_norm
        norm.double()  # in float64: eager's numbers differed by float32's rounding (2e-7)
        ref.double()
        x = torch.randn(3, 16, dtype=torch.float64) * 100
        with torch.no_grad():
            y = norm(x)
        assert y.dtype == torch.float64
        torch.testing.assert_close(y, ref(x), atol=0, rtol=0)
        assert not calls
    elif case == "transposed input":  # transformers' arithmetic keeps the input's layout
        x = torch.randn(5, 3, 16).transpose(0, 1)  # (3, 5, 16), strides (16, 48, 1)
        with torch.no_grad():
            y = norm(x)
        assert y.stride() == ref(x).stride() == x.stride()  # the real sweep: LLaMA, session 37
        torch.testing.assert_close(y, ref(x), atol=0, rtol=0)
        assert not calls
    else:  # a program recorded from the module records the module's own arithmetic
        graph = fx.symbolic_trace(norm).graph
        assert "rsqrt" in str(graph) and not calls


def test_an_optimized_rms_norm_saves_as_its_own_class(tmp_path: Path) -> None:
    norm = LlamaRMSNorm(16)
    _optimized(norm, torch.randn(3, 16), tmp_path)
    assert type(norm) is not LlamaRMSNorm and isinstance(norm, LlamaRMSNorm)
    buffer = io.BytesIO()
    torch.save(norm, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is LlamaRMSNorm
    assert type(pickle.loads(pickle.dumps(norm))) is LlamaRMSNorm
    # a second optimize keeps the stand-in and reports it again
    report = _optimized(norm, torch.randn(3, 16), tmp_path)
    assert [r.kind for r in report.swapped] == ["LlamaRMSNorm"]


@pytest.mark.gpu
def test_transformers_llama_layer_runs_its_norms_on_dnntune_on_cuda(tmp_path: Path) -> None:
    """transformers' own LlamaDecoderLayer in bfloat16: both RMSNorms on dnntune, the gate's
    SiLU in its GEMM, within bfloat16's tolerance of eager."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = pytest.importorskip("transformers").LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=1000,
        max_position_embeddings=256,
        use_cache=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = llama.LlamaModel(config).to("cuda", torch.bfloat16).eval()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    report = dtt.optimize(
        model,
        (ids,),
        policy="heuristic",
        overrides=tmp_path / "ov.json",
        check_speed=False,
        refine=False,
        cuda_graph=False,
    )
    kinds = [r.kind for r in report.swapped]
    assert kinds.count("LlamaRMSNorm") == 3  # two per layer and the model's last
    assert any("gate_proj + silu" in f for f in report.fusions)
    with torch.no_grad():
        y = model(ids).last_hidden_state
        torch.testing.assert_close(y, ref(ids).last_hidden_state, atol=6e-2, rtol=5e-2)
