"""An optimized model's settings (its policy, override file, ranking clock: what ``optimize``
was given) are in force through its forward, put there by a context variable. Work of the
model's that runs outside that forward must run under them too, not under the process's
(``dtt.configure``): the backward pass of dnntune's training kernels, which autograd runs
after the forward has returned."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import (
    Gpt2Mlp,
    SequentialBottleneck,
    VitBlock,
    kernel_plan,
    randomize_batch_norms,
)

import dnntune as dt
import dnntune.torch as dtt
from dnntune.backend.engine import Plan
from dnntune.torch import _subclass, runtime
from dnntune.torch._subclass import StandIn
from dnntune.torch.config import current


def _record_choices(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str | None]]:
    """Every kernel choice from now on as (graph, policy, override file) in force there, each
    choice taking its kernel path (``kernel_plan``: dnntune's training kernels run)."""
    seen: list[tuple[str, str, str | None]] = []

    def heuristic(graph: dt.Graph, handle: dt.Handle) -> Plan:
        seen.append((graph.name, current().policy, current().overrides))
        return kernel_plan(graph, handle)

    monkeypatch.setattr(runtime, "_heuristic", heuristic)
    return seen


_MODELS = {
    "linear": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (4, 16)),
    "conv2d": (
        lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)),
        (2, 3, 8, 8),
    ),
}


@pytest.mark.parametrize("kind", list(_MODELS))
def test_backward_chooses_its_kernels_under_the_models_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The dgrad and wgrad kernels of a training step are chosen in ``backward``, which
    autograd runs after the model's forward returned: they were chosen under the process's
    policy and override file, not the model's."""
    seen = _record_choices(monkeypatch)
    dtt.configure(policy="heuristic", overrides=tmp_path / "process.json")
    ours = str(tmp_path / "model.json")
    make, shape = _MODELS[kind]
    torch.manual_seed(0)
    ref = make()
    model = copy.deepcopy(ref)
    x = torch.randn(*shape)
    dtt.optimize(model, (x,), policy="cached", overrides=ours, check_speed=False)
    seen.clear()
    for m in (model, ref):
        m.train()
        m(x).pow(2).sum().backward()
    backward = [s for s in seen if s[0].endswith(("_dgrad", "_wgrad"))]
    assert backward, seen  # the step ran dnntune's backward kernels
    assert all(s[1:] == ("cached", ours) for s in backward), backward
    for mine, theirs in zip(model.parameters(), ref.parameters(), strict=True):
        assert mine.grad is not None
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)


class _Net(nn.Module):
    """A fused Sequential (conv, batch norm, ReLU), a residual block around one, a ViT block
    (layer norms, attention, MLP; its forward rewritten), GPT-2's MLP (``Conv1D`` stand-ins)
    and an RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.res = SequentialBottleneck(8)
        self.block = VitBlock(16)
        self.gpt = Gpt2Mlp(16)
        self.rms = nn.RMSNorm(16)

    def forward(self, img: torch.Tensor, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.res(self.stem(img)), self.rms(self.gpt(self.block(seq)))


def _arguments_of_each_module(model: nn.Module, *inputs: torch.Tensor) -> dict[str, Any]:
    """Each submodule's arguments in ``model``'s forward of ``inputs`` (an eager model)."""
    calls: dict[str, Any] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _, args, name=name: calls.setdefault(name, args))
        for name, m in model.named_modules()
        if name
    ]
    with torch.no_grad():
        model(*inputs)
    for hook in hooks:
        hook.remove()
    return calls


def test_every_module_called_on_its_own_runs_under_the_models_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each module of an optimized model called on its own, outside the model's forward,
    chooses its kernels under the model's policy and override file. Only the swapped Conv2d
    and Linear were bound to them: a fused Sequential, a rewritten block, a norm and a
    ``Conv1D`` stand-in chose under the process's (an audit)."""
    seen = _record_choices(monkeypatch)
    dtt.configure(policy="heuristic", overrides=tmp_path / "process.json")
    ours = str(tmp_path / "model.json")
    torch.manual_seed(0)
    ref = _Net().eval()
    randomize_batch_norms(ref)
    model = copy.deepcopy(ref)
    example = (torch.randn(2, 3, 8, 8), torch.randn(2, 5, 16))
    dtt.optimize(model, example, policy="cached", overrides=ours, check_speed=False)
    theirs = dict(ref.named_modules())
    chose, wrong = set(), {}
    for name, args in _arguments_of_each_module(
        ref, *(torch.randn(3, *x.shape[1:]) for x in example)
    ).items():
        runtime.cache().clear()  # each call chooses its kernels afresh
        seen.clear()
        with torch.no_grad():
            out = dict(model.named_modules())[name](*args)
            expected = theirs[name](*args)
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
        chose.update([name] if seen else [])
        if any(s[1:] != ("cached", ours) for s in seen):
            wrong[name] = seen[:]
    assert not wrong, wrong
    # each kind chose kernels on its own: a fused Sequential, a block around one, a rewritten
    # block, its attention and norms, a Conv1D stand-in, an RMSNorm
    kinds = {"stem", "res", "res.body", "block", "block.attn", "block.norm1", "gpt.c_fc", "rms"}
    assert kinds <= chose, kinds - chose
    assert all(isinstance(dict(model.named_modules())[n], StandIn) for n in ("stem", "block"))


def test_a_module_call_is_pytorchs_own_call_besides_the_settings() -> None:
    """``call_in_model_settings`` writes out ``nn.Module.__call__`` (``_wrapped_call_impl``:
    a ``module.compile()``'s call, else ``_call_impl``) instead of calling it, to cost no
    frame more per module call: a PyTorch whose module call does more must be followed."""
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl
    code = nn.Module._wrapped_call_impl.__code__
    assert set(code.co_names) == {"_compiled_call_impl", "_call_impl"}, code.co_names
    assert StandIn.__dict__.get("__call__") is None  # each stand-in class carries its own
    stand_ins = [c for c in (dtt.modules.DnnTuneLinear, dtt.modules.DnnTuneConv2d)]
    assert all(c.__call__ is _subclass.call_in_model_settings for c in stand_ins)


class _LeafTracer(torch.fx.Tracer):
    """Records each module ``optimize`` swapped as one call (a leaf)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, StandIn) and not isinstance(m, nn.Sequential)


def test_torch_fx_still_sees_each_module_call(tmp_path: Path) -> None:
    """``torch.fx``'s tracer patches ``nn.Module.__call__`` to record module calls; a stand-in's
    own ``__call__`` runs that patched call, so a tracer that keeps dnntune's modules whole
    records them as ``call_module`` (not traced through, unseen)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32)).eval()
    x = torch.randn(2, 16)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "o.json", check_speed=False)
    graph = _LeafTracer().trace(model)
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"}
    assert called == {"0", "1"}, called
