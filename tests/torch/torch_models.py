"""Helpers shared by the dnntune.torch tests."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import dnntune as dt
import dnntune.torch as dtt
from dnntune.backend.engine import Plan
from dnntune.torch import OptimizeReport


def randomize_batch_norms(model: nn.Module) -> None:
    """Give every BatchNorm2d non-trivial statistics and affine parameters (in place; those
    it keeps: a batch norm may track no running statistics, or have no affine parameters)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                if m.running_mean is not None and m.running_var is not None:
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 1.5)
                if m.weight is not None and m.bias is not None:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)


class SequentialBottleneck(nn.Module):
    """``relu(body(x) + x)`` with ``body`` a Sequential: conv, BN, ReLU, conv, BN."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


def kernel_plan(graph: dt.Graph, handle: dt.Handle, name: str = "TORCH_ENGINE") -> Plan:
    """``name``'s default plan for ``graph`` (TORCH_ENGINE's where that engine cannot run it),
    marked as not PyTorch's own op: dnntune.torch then takes its kernel path, as with a cuDNN
    or Triton winner (patch it in as ``dnntune.torch.runtime._heuristic``)."""
    graph.build_operation_graph(handle)
    try:
        graph.create_execution_plan_ext(name)
        graph.check_support()
        graph.build_plans()
    except dt.DnnTuneError:  # a graph this GPU engine cannot run
        graph.create_execution_plan_ext("TORCH_ENGINE")
        graph.check_support()
        graph.build_plans()
    plan = graph.active_plan
    assert plan is not None
    plan.runs_eager_ops = False
    return plan


def eval_pair(make: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    """A reference model in eval mode with non-trivial batch norms, and its copy."""
    torch.manual_seed(0)
    ref = make().eval()
    randomize_batch_norms(ref)
    return ref, copy.deepcopy(ref)


def optimized_copy(
    make: Callable[[], nn.Module], overrides: Path
) -> tuple[nn.Module, nn.Module, OptimizeReport]:
    """(the eager model in eval mode, an optimized deep copy of it, the report): ``optimize``
    with the heuristic plans and no example inputs, seeded."""
    torch.manual_seed(0)
    ref = make().eval()
    model = copy.deepcopy(ref)
    report = dtt.optimize(model, policy="heuristic", overrides=overrides)
    return ref, model, report


def optimize_to_replay(model: nn.Module, overrides: Path) -> OptimizeReport:
    """``optimize`` in place to replay CUDA graphs: the heuristic plans, no speed check."""
    return dtt.optimize(
        model, policy="heuristic", overrides=overrides, cuda_graph=True, check_speed=False
    )


def optimize_as_it_runs(model: nn.Module, x: torch.Tensor, overrides: Path) -> OptimizeReport:
    """``optimize`` with the heuristic plans and nothing timed or recorded (no speed check, no
    refine, no CUDA graph): for a test of what runs, not of which is faster on a model this
    small, that counts the Python calls a replay would not make."""
    return dtt.optimize(
        model,
        (x,),
        policy="heuristic",
        overrides=overrides,
        check_speed=False,
        refine=False,
        cuda_graph=False,
    )


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal within fp32 reordering (1e-4): what a fused or folded layer changes."""
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d`` (timm.layers.norm_act): the batch norm, then an activation,
    in one BatchNorm2d subclass with its own forward."""

    def __init__(self, c: int) -> None:
        super().__init__(c)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(super().forward(x))


class VitMlp(nn.Module):
    """timm's ``Mlp``: ``fc1``, GELU, dropout, ``fc2``, dropout."""

    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(0.1)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class VitAttention(nn.Module):
    """timm's ``Attention`` in its form: ``qkv``, SDPA, ``proj``, dropout; an optional mask."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.1)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(b, n, c)))


class VitBlock(nn.Module):
    """timm's ``Block`` in its form: layer scale and drop path are ``nn.Identity``."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = VitAttention(dim)
        self.ls1 = nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = VitMlp(dim)
        self.ls2 = nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        x = x + self.drop_path1(
            self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal))
        )
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class NewGELU(nn.Module):  # transformers' NewGELUActivation (GPT-2's gelu_new)
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))
        return 0.5 * input * (1.0 + torch.tanh(inner))


class Conv1D(nn.Module):
    """transformers' ``Conv1D`` (GPT-2's linear layer, its weight stored [in, out]), in its
    module and under its name, with its arithmetic; dnntune does not import transformers."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.randn(nx, nf) / nx**0.5)
        self.bias = nn.Parameter(torch.randn(nf) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)  # noqa: RUF005 (transformers writes it so)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


Conv1D.__module__ = "transformers.pytorch_utils"


class SiluMlp(nn.Module):
    """A transformer's MLP ending in a Linear: ``down(silu(up(x)))``."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.act = nn.SiLU()
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Gpt2Mlp(nn.Module):
    """GPT-2's MLP: ``c_fc``, ``gelu_new`` written out, ``c_proj``, dropout."""

    def __init__(self, d: int = 16, h: int = 64, conv: type[nn.Module] = Conv1D) -> None:
        super().__init__()
        self.c_fc = conv(h, d)
        self.c_proj = conv(d, h)
        self.act = NewGELU()
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        return self.dropout(hidden_states)


def count_fused_tail(monkeypatch: Any, layer: nn.Module) -> list[int]:
    """A list that gets one item each time ``layer``'s ``fused_tail`` runs (the rewritten
    forward took its fused residual add)."""
    seen: list[int] = []
    real = layer.fused_tail

    def spy(*args: Any) -> torch.Tensor | None:
        seen.append(1)
        out: torch.Tensor | None = real(*args)
        return out

    monkeypatch.setattr(layer, "fused_tail", spy)
    return seen
