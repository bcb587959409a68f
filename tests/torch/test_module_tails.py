"""A residual add whose branch is a child module ending in a Linear (timm's ViT block: ``x +
drop_path(ls(mlp(norm(x))))``) runs as that Linear's epilogue, after the child's own forward up
to the Linear's input; anything the cut forward would not stand for runs the child as it is."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import VitBlock, VitMlp, optimized_copy

import dnntune.torch as dtt


def _optimized(tmp_path: Path, make: Any = VitBlock) -> tuple[nn.Module, nn.Module, Any]:
    return optimized_copy(make, tmp_path / "ov.json")


def _count_tails(monkeypatch: pytest.MonkeyPatch, *layers: nn.Module) -> list[str]:
    """The fused tails the layers run, by name, as they are called."""
    seen: list[str] = []
    for name, layer in zip(("first", "second"), layers, strict=False):
        real = layer.fused_tail

        def spy(*args: Any, _real: Any = real, _name: str = name) -> torch.Tensor | None:
            seen.append(_name)
            out: torch.Tensor | None = _real(*args)
            return out

        monkeypatch.setattr(layer, "fused_tail", spy)
    return seen


def test_a_blocks_adds_run_as_the_last_linears_epilogue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, report = _optimized(tmp_path)
    assert [str(f) for f in report.fusions] == [
        "<root>: attn + ls1 + drop_path1 (identity in eval) + residual add",
        "<root>: mlp + ls2 + drop_path2 (identity in eval) + residual add",
        "mlp: fc1 + gelu",
    ]
    seen = _count_tails(monkeypatch, model.attn.proj, model.mlp.fc2)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert seen == ["first", "second"]
        seen.clear()
        torch.testing.assert_close(model(x, None, False), ref(x), atol=1e-5, rtol=1e-5)
        assert seen == ["first", "second"]
        seen.clear()
        causal = model(x, is_causal=True)
        torch.testing.assert_close(causal, ref(x, is_causal=True), atol=1e-5, rtol=1e-5)
        assert seen == ["first", "second"], "is_causal is an argument of the cut forward"
        assert not torch.allclose(causal, ref(x), atol=1e-3)


def test_a_mask_runs_the_attentions_own_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the block only hands ``attn_mask`` on to its attention (a pass-through parameter): the
    # block's rewritten forward runs with a mask too, the MLP's add fused; the attention,
    # whose forward branches on the mask, runs its own forward and PyTorch's add
    ref, model, _ = _optimized(tmp_path)
    seen = _count_tails(monkeypatch, model.attn.proj, model.mlp.fc2)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(5, 5).masked_fill(torch.eye(5, dtype=torch.bool), float("-inf"))
    with torch.no_grad():
        got = model(x, attn_mask=mask)
        torch.testing.assert_close(got, ref(x, attn_mask=mask), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(got, ref(x), atol=1e-3)
    assert seen == ["second"]


def test_training_runs_each_module_and_matches_eager_gradients(tmp_path: Path) -> None:
    ref, model, _ = _optimized(tmp_path)
    for m in (ref, model):
        m.train()
        for d in m.modules():
            if isinstance(d, nn.Dropout):
                d.p = 0.0
    x = torch.randn(2, 5, 16)
    model(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_hooks_and_a_replaced_forward_run_the_child_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, _ = _optimized(tmp_path)
    seen = _count_tails(monkeypatch, model.attn.proj, model.mlp.fc2)
    x = torch.randn(2, 5, 16)
    calls: list[str] = []
    with torch.no_grad():
        for name in ("mlp", "mlp.fc2", "mlp.drop2", "ls2"):
            target = model.get_submodule(name)
            handle = target.register_forward_hook(lambda m, i, o, n=name: calls.append(n))
            seen.clear()
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
            assert seen == ["first"], f"a hook on {name}: its add runs unfused"
            handle.remove()
        assert calls == ["mlp", "mlp.fc2", "mlp.drop2", "ls2"]

        doubled = model.mlp.forward
        model.mlp.forward = lambda h: 2 * doubled(h)  # type: ignore[method-assign]
        expected = ref(x) + ref.mlp(ref.norm2(x + ref.attn(ref.norm1(x))))
        seen.clear()
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
        assert seen == ["first"]


def test_a_setting_the_cut_forward_read_is_checked_again(tmp_path: Path) -> None:
    ref, model, _ = _optimized(tmp_path)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        model.attn.heads = ref.attn.heads = 4  # reshapes differently: the head would be stale
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


class VitMlpScaled(VitMlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x))) * 0.5  # more after the Linear


class VitMlpWrites(VitMlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(self.act(self.fc1(x)))
        x.mul_(2.0)  # a write after the Linear, which a cut forward would skip
        return out


@pytest.mark.parametrize("mlp", [VitMlpScaled, VitMlpWrites])
def test_a_child_that_does_more_after_its_linear_is_no_tail(mlp: Any, tmp_path: Path) -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.mlp = mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(self.norm(x))

    ref, model, report = _optimized(tmp_path, Block)
    assert not any("residual" in str(f) for f in report.fusions)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


def test_a_residual_laid_out_otherwise_keeps_eagers_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eager's add lays its output out as the residual; a fused GEMM writes a contiguous one,
    so a residual of another layout (a [seq, batch, hidden] stream seen as [batch, seq, hidden])
    is added by PyTorch (the model sweep's T5 encoder, seed 5: strides (448, 64, 1) against
    eager's (64, 256, 1))."""
    ref, model, _ = _optimized(tmp_path)
    seen = _count_tails(monkeypatch, model.attn.proj, model.mlp.fc2)
    x = torch.randn(5, 2, 16).transpose(0, 1)
    with torch.no_grad():
        got, want = model(x), ref(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.stride() == want.stride() != got.contiguous().stride()
    assert seen == ["first", "second"]  # asked, and declined


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_vit_block_on_cuda_in_bfloat16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both adds as GEMM epilogues on the GPU (cuDNN's or Triton's plan, or the plan the
    first-call check keeps), within bfloat16's tolerance of the block in float64."""
    torch.manual_seed(0)
    ref = VitBlock(256).eval()
    model = copy.deepcopy(ref).cuda().to(torch.bfloat16)
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    assert sum("residual add" in str(f) for f in report.fusions) == 2
    seen = _count_tails(monkeypatch, model.attn.proj, model.mlp.fc2)
    x = torch.randn(8, 197, 256)
    with torch.no_grad():
        got = model(x.cuda().to(torch.bfloat16)).double().cpu()
        exact = ref.double()(x.double())
    assert seen == ["first", "second"]
    torch.testing.assert_close(got, exact, atol=6e-2, rtol=5e-2)


class _MlpWritesItsInput(VitMlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)  # its input, written before the Linear
        return self.fc2(self.act(self.fc1(x)))


def test_a_child_that_writes_in_place_is_no_tail(tmp_path: Path) -> None:
    """The fused call would run the child where the parent adds, after the parent's ops in
    between: a child that writes in place keeps its own call where it was."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.mlp = _MlpWritesItsInput()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.norm(x)
            y = self.mlp(h)
            z = h * 2.0  # read after the child wrote it, before the add
            return x + y + z

    ref, model, report = _optimized(tmp_path, Block)
    assert not any("mlp" in str(f) and "residual" in str(f) for f in report.fusions)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
