"""Gradient checkpointing through an optimized model: ``torch.utils.checkpoint`` without
reentrance (transformers' default for ``gradient_checkpointing_enable()`` since 4.35) runs a
layer's forward again in the backward pass and requires it to save the same tensors as the
forward did. That recomputation runs outside the model's forward, so dnntune's layers must
choose the same kernels there (under the model's settings, not the process's), and choosing a
kernel on a training forward's first call must record nothing for autograd."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch_models import kernel_plan

import dnntune as dt
import dnntune.torch as dtt
from dnntune.backend.engine import Plan
from dnntune.torch import runtime
from dnntune.torch.config import current


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    """Its blocks checkpointed in training, as transformers' ``GradientCheckpointingLayer``."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width), Block(width)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.training else block(x)
        return x


def _train_step_matches_eager(
    model: nn.Module, ref: nn.Module, x: torch.Tensor, tol: float = 1e-5
) -> None:
    for m in (model, ref):
        m.train()
        m(x).float().pow(2).mean().backward()
    for (name, mine), theirs in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None, name
        torch.testing.assert_close(mine.grad.float(), theirs.grad.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_checkpointed_blocks_train_on_the_kernel_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fuse: bool
) -> None:
    """The first training forward builds and verifies the linears' training kernels; that
    recorded autograd history and saved tensors, which the recomputation (the kernels built
    by then) did not save: a ``CheckpointError`` in the backward pass."""
    monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    torch.manual_seed(0)
    ref = Stack().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 16)
    dtt.optimize(
        model,
        (x,),
        policy="heuristic",
        overrides=tmp_path / "ov.json",
        check_speed=False,
        fuse=fuse,
    )
    for _ in range(2):  # the first step builds the training kernels, the second reuses them
        _train_step_matches_eager(model, ref, x)
        for m in (model, ref):
            m.zero_grad()


def test_a_recomputed_block_chooses_the_kernels_of_its_models_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the model's settings the linears' winner is PyTorch's op; under the process's
    (the recomputation ran outside the model's forward) a kernel of dnntune's, which saves
    other tensors: the recomputed forward must choose what the forward chose."""
    ours = tmp_path / "ov.json"

    def heuristic(graph: dt.Graph, handle: dt.Handle) -> Plan:
        plan = kernel_plan(graph, handle)
        plan.runs_eager_ops = str(current().overrides) == str(ours)
        return plan

    monkeypatch.setattr(runtime, "_heuristic", heuristic)
    torch.manual_seed(0)
    ref = Stack().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 16)
    dtt.optimize(model, (x,), policy="heuristic", overrides=ours, check_speed=False, fuse=False)
    _train_step_matches_eager(model, ref, x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_checkpointed_blocks_train_on_cuda(tmp_path: Path, dtype: torch.dtype) -> None:
    """The same on a GPU, with the engines the heuristic picks there (cuDNN, Triton)."""
    torch.manual_seed(0)
    ref = Stack(256).eval().cuda().to(dtype)
    model = copy.deepcopy(ref)
    x = torch.randn(64, 256, device="cuda", dtype=dtype)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False)
    for _ in range(2):
        _train_step_matches_eager(model, ref, x, 1e-4 if dtype == torch.float32 else 3e-2)
        for m in (model, ref):
            m.zero_grad()
