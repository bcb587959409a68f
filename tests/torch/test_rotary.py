"""transformers' rotate-half ``apply_rotary_pos_emb`` routed to one kernel a tensor inside
optimized models (CUDA), recognised by its source; every other call, form and device runs the
function as written."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import _rotary_forms as forms
import _rotary_interleaved as interleaved
import _rotary_partial as partial
import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch._rotary import ROTARY, is_rotate_half_form, rotary_form, rotary_modules

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Model(nn.Module):
    def __init__(self, attention: type[nn.Module]) -> None:
        super().__init__()
        self.attn = attention()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.attn(x, cos, sin)


def test_the_rotate_half_form_is_recognised_by_its_source() -> None:
    assert is_rotate_half_form(vars(forms))
    assert not is_rotate_half_form(vars(interleaved))  # its rotate_half interleaves
    assert rotary_modules(_Model(forms.Attention)) == [forms.__name__]
    assert rotary_modules(_Model(interleaved.Attention)) == []
    assert rotary_modules(nn.Linear(2, 2)) == []
    assert rotary_form(vars(forms)) is False  # LLaMA's
    assert rotary_form(vars(partial)) is True  # Phi-3's partial rotary
    assert rotary_form(vars(interleaved)) is None


def test_transformers_llama_is_recognised() -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    assert rotary_form(vars(llama)) is False
    for name in ("phi3", "gpt_neox"):  # their partial rotaries, written two ways
        module = pytest.importorskip(f"transformers.models.{name}.modeling_{name}")
        assert rotary_form(vars(module)) is True, name
    config = llama.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=1
    )
    assert rotary_modules(llama.LlamaModel(config)) == [llama.__name__]


def _routed(module: Any, tmp_path: Path) -> tuple[nn.Module, nn.Module, Any]:
    """(the eager model, an optimized copy, the router) of an attention of ``module``, whose
    route the report lists."""
    torch.manual_seed(0)
    ref = _Model(module.Attention).eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert f"{module.__name__}.{ROTARY}: one kernel a tensor (CUDA)" in report.fusions
    return ref, model, vars(module)[ROTARY]


def test_optimize_routes_it_and_the_cpu_runs_the_function_as_written(tmp_path: Path) -> None:
    ref, model, router = _routed(forms, tmp_path)
    assert type(router).__name__ == "_Router" and router.__wrapped__ is not None
    assert is_rotate_half_form(vars(forms))  # routed, still recognised (a second optimize)
    assert rotary_modules(ref) == [forms.__name__]
    x = torch.randn(2, 6, 32)
    cos, sin = forms.rotary_tables(6, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x, cos, sin), ref(x, cos, sin), atol=1e-5, rtol=1e-5)
    assert not router.checked  # the CPU never takes the kernel
    # a call outside an optimized forward: the function as written
    q = torch.randn(1, 2, 6, 8)
    got = forms.apply_rotary_pos_emb(q, q, cos, sin)
    want = (q * cos[:, None] + forms.rotate_half(q) * sin[:, None],) * 2
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_partial_rotary_is_routed(tmp_path: Path) -> None:
    ref, model, router = _routed(partial, tmp_path)
    assert router.partial is True
    x = torch.randn(2, 6, 32)
    cos, sin = forms.rotary_tables(6, 10)  # 10 of the heads' 16 columns rotated
    with torch.no_grad():
        torch.testing.assert_close(model(x, cos, sin), ref(x, cos, sin), atol=1e-5, rtol=1e-5)


def test_the_interleaved_form_is_not_routed(tmp_path: Path) -> None:
    model = _Model(interleaved.Attention).eval()
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert not [f for f in report.fusions if ROTARY in f]
    assert type(vars(interleaved)[ROTARY]).__name__ == "function"


def _eager(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotate-half embedding in float64 (of the first ``cos.shape[-1]`` columns)."""
    q64, c, s = q.double(), cos.double()[:, None], sin.double()[:, None]
    r = cos.shape[-1]
    rot = q64[..., :r] * c + forms.rotate_half(q64[..., :r]) * s
    return torch.cat([rot, q64[..., r:]], dim=-1)


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("batch", "heads", "seq", "dim", "cos_batch", "rotated"), [
    (1, 16, 1, 128, 1, 128), (2, 4, 37, 64, 2, 64), (3, 2, 130, 96, 1, 96),
    (1, 8, 2048, 128, 1, 128), (1, 32, 1, 96, 1, 32), (2, 4, 37, 80, 2, 24),
])  # fmt: skip
def test_the_kernel_matches_float64(
    dtype: torch.dtype, batch: int, heads: int, seq: int, dim: int, cos_batch: int, rotated: int
) -> None:
    from dnntune.providers.triton.kernels.rotary import rotate_half_embedding

    torch.manual_seed(0)
    # the transposed view of a projection's output, as attention takes it
    q = torch.randn(batch, seq, heads, dim, device="cuda", dtype=dtype).transpose(1, 2)
    cos, sin = forms.rotary_tables(seq, rotated, cos_batch, device="cuda", dtype=dtype)
    got = rotate_half_embedding(q, cos, sin)
    assert got.stride() == q.stride()  # eager's layout
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got.double(), _eager(q, cos, sin), atol=tol * 4, rtol=tol)


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize(("module", "rotated"), [(forms, 8), (partial, 6)])
def test_an_optimized_model_runs_the_kernel_on_cuda(
    tmp_path: Path, graph: bool, module: Any, rotated: int
) -> None:
    torch.manual_seed(0)
    ref = _Model(module.Attention).eval().to("cuda", torch.bfloat16)
    model = copy.deepcopy(ref)
    x = torch.randn(2, 40, 32, device="cuda", dtype=torch.bfloat16)
    cos, sin = forms.rotary_tables(40, rotated, device="cuda", dtype=torch.bfloat16)
    report = dtt.optimize(
        model, (x, cos, sin), policy="heuristic", overrides=tmp_path / "ov.json",
        cuda_graph=graph, check_speed=False,
    )  # fmt: skip
    assert f"{module.__name__}.{ROTARY}: one kernel a tensor (CUDA)" in report.fusions
    assert any(vars(module)[ROTARY].checked.values())
    with torch.no_grad():
        torch.testing.assert_close(model(x, cos, sin), ref(x, cos, sin), atol=3e-2, rtol=3e-2)
    # with autograd: the function as written (the kernel has no backward)
    x.requires_grad_(True)
    model.attn.train()
    model(x, cos, sin).float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


_INTERPRETED = """
import sys
import torch
from dnntune.providers.triton.kernels.rotary import rotate_half_embedding

sys.path.insert(0, sys.argv[1])
import _rotary_forms as forms

worst = 0.0
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1.6e-2)):
    for b, h, s, d, cb, r in ((1, 4, 1, 16, 1, 16), (2, 3, 5, 12, 2, 12), (1, 2, 7, 20, 1, 8)):
        torch.manual_seed(0)
        q = torch.randn(b, s, h, d, dtype=dtype).transpose(1, 2)
        cos, sin = forms.rotary_tables(s, r, cb, dtype=dtype)
        got = rotate_half_embedding(q, cos, sin)
        assert got.stride() == q.stride()
        q64, c, n = q.double(), cos.double()[:, None], sin.double()[:, None]
        want = torch.cat([q64[..., :r] * c + forms.rotate_half(q64[..., :r]) * n, q64[..., r:]], -1)
        err = float((got.double() - want).abs().max() / max(1.0, float(want.abs().max())))
        assert err <= tol, (dtype, b, h, s, d, cb, r, err)
        worst = max(worst, err)
print("ok", worst)
"""


def test_the_kernel_in_tritons_interpreter(tmp_path: Path) -> None:
    """Where Triton is installed without a GPU: the kernel run by Triton's CPU interpreter
    (``TRITON_INTERPRET=1``, in a process of its own, as the variable is read when the kernel
    is defined) against float64, full and partial rotaries, broadcast and per-batch tables."""
    from interpreter import run_interpreted

    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the kernel itself")
    script = tmp_path / "interpreted.py"
    script.write_text(_INTERPRETED)
    here = Path(__file__).resolve().parent
    result = run_interpreted([str(script), str(here)], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")
