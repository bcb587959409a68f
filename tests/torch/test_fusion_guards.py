"""What fusion must not change, and what its report says: subclasses of the fused layers
(timm's ``BatchNormAct2d``, a LoRA linear, a weight-standardized conv) run their own forward;
an add written in place into the residual keeps writing it; random numbers a forward draws in
Python are not frozen by the trace; backward hooks fire; a number as the "residual" runs; a
failed ``optimize`` leaves the model as it was; ``report.fusions`` lists the Sequential
fusions, and a second ``optimize`` reports what still runs. (A third audit; CPU.)"""

from __future__ import annotations

import copy
import random
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import BatchNormAct2d, assert_close, eval_pair

import dnntune.torch as dtt


def _optimize(model: nn.Module, tmp_path: Path, inputs: Any = None) -> dtt.OptimizeReport:
    return dtt.optimize(
        model, inputs, policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False
    )


# ---- subclasses of the fused layers run their own forward -------------------------------------
class _StdConv2d(nn.Conv2d):
    """timm's weight-standardized conv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _LoRALinear(nn.Linear):
    """A linear with a low-rank update in its own forward (loralib's ``Linear``)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__(d_in, d_out)
        self.lora_a = nn.Parameter(torch.randn(2, d_in))
        self.lora_b = nn.Parameter(torch.randn(d_out, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + x @ self.lora_a.t() @ self.lora_b.t()


class _Subclasses(nn.Module):
    """Each fusion's pattern, with a subclass in place of the PyTorch layer."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), BatchNormAct2d(8))
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = BatchNormAct2d(8)
        self.std = _StdConv2d(8, 8, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 1), BatchNormAct2d(8))
        self.head = nn.Sequential(_StdConv2d(8, 8, 1), nn.ReLU())
        self.fc1 = _LoRALinear(8, 16)
        self.fc2 = _LoRALinear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(self.seq(x)))  # conv + batch norm: folded if it were plain
        y = F.relu(self.std(y) + y)  # a conv branch and its residual
        y = self.head(F.relu(self.body(y) + y))  # a Sequential branch ending in a batch norm
        h = y.mean((2, 3))
        return h + self.fc2(F.gelu(self.fc1(h)))  # linear + activation, linear + residual


def test_subclasses_of_the_fused_layers_run_their_own_forward(tmp_path: Path) -> None:
    """They were fused as the PyTorch class they derive from: a BatchNormAct2d folded into the
    conv lost its ReLU (max error 1.8), and the report listed fusions that never ran."""
    ref, model = eval_pair(_Subclasses)
    x = torch.randn(2, 4, 8, 8)
    report = _optimize(model, tmp_path, (x,))
    assert report.fusions == []
    assert "fused" not in str(report)
    assert {r.name for r in report.swapped} == {"seq.0", "conv", "body.0"}  # the plain convs
    assert all(not r.fused and r.folded_into is None for r in report.swapped)
    with torch.no_grad():
        assert_close(model(x), ref(x))


# ---- in-place adds ------------------------------------------------------------------------------
class _InPlaceResidual(nn.Module):
    """``x += self.fc(x)``: the add writes the input, which ``identity`` (and the caller's
    tensor) still refer to."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        x += self.fc(x)
        return F.relu(self.fc2(x)) * identity


class _AddInPlace(_InPlaceResidual):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        x.add_(self.fc(x))
        return F.relu(self.fc2(x)) * identity


class _WrittenBetween(_InPlaceResidual):
    """A write between a layer's call and its activation: fused at the activation, the layer
    would read the written input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        x.mul_(2)
        return F.relu(h) + self.fc2(x)


@pytest.mark.parametrize(
    ("make", "fused"),
    [
        (_InPlaceResidual, ["<root>: fc2 + relu"]),
        (_AddInPlace, ["<root>: fc2 + relu"]),
        (_WrittenBetween, ["<root>: fc2 + residual add"]),
    ],
)
def test_adds_written_in_place_keep_writing(
    make: Callable[[], nn.Module], fused: list[str], tmp_path: Path
) -> None:
    """The trace recorded ``x += y`` as ``x + y`` and the rewrite fused it: the output differed
    by 4.9 and the caller's tensor was no longer written."""
    ref, model = eval_pair(make)
    report = _optimize(model, tmp_path)
    assert report.fusions == fused
    x = torch.randn(2, 8)
    with torch.no_grad():
        mine, theirs = x.clone(), x.clone()
        assert_close(model(mine), ref(theirs))
        assert_close(mine, theirs)  # the caller's tensor, written by the forward in both


class _TorchvisionTail(nn.Module):
    """``out = bn(conv(x)); out += identity``: the write goes to the branch's own output, which
    nothing else refers to, so the fused call may stand for it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.bn(self.conv(x))
        out += identity
        return torch.relu(out) * identity


def test_an_in_place_add_into_the_branch_output_is_fused(tmp_path: Path) -> None:
    ref, model = eval_pair(_TorchvisionTail)
    assert _optimize(model, tmp_path).fusions == ["<root>: conv + bn + residual add + relu"]
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        mine = x.clone()
        assert_close(model(mine), ref(x))
        torch.testing.assert_close(mine, x, atol=0, rtol=0)  # the input is not written


# ---- random numbers drawn in Python -------------------------------------------------------------
class _LayerDrop(nn.Module):
    """LayerDrop / stochastic depth decided in Python: a trace would freeze one draw."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.rng = random.Random(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.draw() < 0.5:
            return x
        return x + self.fc(x)

    def draw(self) -> float:
        return random.random()


class _TorchDraw(_LayerDrop):
    def draw(self) -> float:
        return float(torch.rand(()))


class _NumpyDraw(_LayerDrop):
    def draw(self) -> float:
        return float(np.random.rand())


class _OwnGenerator(_LayerDrop):
    def draw(self) -> float:
        return self.rng.random()


def _seed() -> None:
    """Seeds whose first draw is above 0.5: the training trace keeps the layer (and was fused)."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(1)


def _states(model: _LayerDrop) -> list[Any]:
    return [
        random.getstate(),
        torch.get_rng_state().tolist(),
        np.random.get_state()[1].tolist(),  # type: ignore[index]
        model.rng.getstate(),
    ]


@pytest.mark.parametrize("make", [_LayerDrop, _TorchDraw, _NumpyDraw, _OwnGenerator])
def test_a_forward_that_draws_random_numbers_in_python_is_not_traced(
    make: Callable[[], _LayerDrop], tmp_path: Path
) -> None:
    """The optimized model never dropped the layer (0 % of training calls against 48 %)."""
    ref = make().train()
    model = copy.deepcopy(ref)
    _seed()
    before = _states(model)
    assert _optimize(model, tmp_path).fusions == []
    assert _states(model) == before  # the trace drew none of the user's random numbers
    x = torch.randn(2, 8)
    drops: list[list[bool]] = []
    for m in (ref, model):
        _seed()
        m.rng.seed(0)
        with torch.no_grad():
            drops.append([torch.equal(m(x), x) for _ in range(32)])
    assert drops[0] == drops[1] and any(drops[0]) and not all(drops[0])


# ---- backward hooks ------------------------------------------------------------------------------
class _Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x).mean((2, 3))
        return h + self.fc2(F.gelu(self.fc1(h)))


_HOOKED = ("features.0", "features.1", "fc1", "fc2")


@pytest.mark.parametrize("kind", ["full", "pre", "global", "global pre"])
def test_backward_hooks_fire_on_fused_layers(kind: str, tmp_path: Path) -> None:
    """Saliency and Grad-CAM tools in eval mode: full backward hooks never fired on a fused
    layer (only forward hooks sent its call through PyTorch's modules)."""
    ref, model = eval_pair(_Hooked)
    x = torch.randn(2, 3, 8, 8)
    assert len(_optimize(model, tmp_path, (x,)).fusions) == 3
    fired: list[list[str]] = []
    grads = []
    for m in (ref, model):
        names = {id(sub): name for name, sub in m.named_modules()}
        seen: list[str] = []
        fired.append(seen)

        def hook(module: nn.Module, *args: Any, _names: Any = names, _seen: Any = seen) -> None:
            if _names.get(id(module)) in _HOOKED:
                _seen.append(_names[id(module)])

        handles: list[Any] = []
        if kind == "global":
            handles.append(nn.modules.module.register_module_full_backward_hook(hook))
        elif kind == "global pre":
            handles.append(nn.modules.module.register_module_full_backward_pre_hook(hook))
        for name in _HOOKED:
            sub = m.get_submodule(name)
            if kind == "full":
                handles.append(sub.register_full_backward_hook(hook))
            elif kind == "pre":
                handles.append(sub.register_full_backward_pre_hook(hook))
        try:
            image = x.clone().requires_grad_()
            m(image).sum().backward()
            grads.append(image.grad)
        finally:
            for handle in handles:
                handle.remove()
    assert sorted(fired[1]) == sorted(fired[0]) == sorted(_HOOKED)
    assert grads[0] is not None and grads[1] is not None
    assert_close(grads[1], grads[0])


# ---- a number as the residual ---------------------------------------------------------------
class _Shift(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
        y = F.relu(self.conv(x) + shift)
        return self.fc(y.mean((2, 3))) + shift


class _AnnotatedShift(_Shift):
    def forward(self, x: torch.Tensor, shift: float) -> torch.Tensor:  # type: ignore[override]
        y = F.relu(self.conv(x) + shift)  # a string annotation here (future annotations)
        return self.fc(y.mean((2, 3))) + shift


class _UntypedShift(nn.Module):
    """An argument a trace cannot tell from a tensor: the rewrite fuses the adds, and the fused
    calls take PyTorch's ops whenever it is a number."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, shift: Any) -> torch.Tensor:
        y = F.relu(self.conv(x) + shift)
        z = self.bn(self.conv2(y)) + shift
        return self.fc(z.mean((2, 3))) + shift


@pytest.mark.parametrize("with_inputs", [True, False])
def test_a_number_added_to_a_layer_is_no_residual(with_inputs: bool, tmp_path: Path) -> None:
    """optimize() and the forward raised AttributeError: 'float' object has no attribute
    'device'."""
    x = torch.randn(2, 4, 6, 6)
    for make in (_Shift, _AnnotatedShift):
        ref, model = eval_pair(make)
        report = _optimize(model, tmp_path, (x, 0.5) if with_inputs else None)
        assert report.fusions == []  # annotated as (or defaulting to) a number: no residual
        with torch.no_grad():
            assert_close(model(x, 0.5), ref(x, 0.5))
    ref, model = eval_pair(_UntypedShift)
    report = _optimize(model, tmp_path, (x, 0.5) if with_inputs else None)
    assert report.fusions == [
        "<root>: conv + residual add + relu",
        "<root>: conv2 + bn + residual add",
        "<root>: fc + residual add",
    ]
    with torch.no_grad():
        assert_close(model(x, 0.5), ref(x, 0.5))
        assert_close(model(x, 2), ref(x, 2))


# ---- a failed optimize -------------------------------------------------------------------------
class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 16), nn.GELU())
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.seq(x))


def _dnntune_state(model: nn.Module) -> list[tuple[type, list[str], int]]:
    return [
        (type(m), sorted(k for k in m.__dict__ if k.startswith("_dnntune")), len(m._forward_hooks))
        for m in model.modules()
    ]


def test_an_optimize_that_raises_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    """The example forward raised (inputs of the wrong shape) after the classes were swapped:
    the model was left half optimized, with optimize()'s attribution hooks on every layer."""
    ref, model = eval_pair(_Mlp)
    bad = torch.randn(2, 5)
    before = _dnntune_state(model)
    # PyTorch's error alone: no fallback warning blames dnntune for a wrong shape
    with pytest.raises(RuntimeError):
        _optimize(model, tmp_path, (bad,))
    assert _dnntune_state(model) == before
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert_close(model(x), ref(x))
    # a second optimize that raises leaves the first one's model as it was
    report = _optimize(model, tmp_path, (x,))
    optimized = _dnntune_state(model)
    with pytest.raises(RuntimeError):
        _optimize(model, tmp_path, (bad,))
    assert _dnntune_state(model) == optimized
    assert _optimize(model, tmp_path, (x,)).fusions == report.fusions
    with torch.no_grad():
        assert_close(model(x), ref(x))


# ---- what the report lists ---------------------------------------------------------------------
class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        h = F.relu(self.body(y) + y).mean((2, 3))
        return F.silu(self.fc(self.mlp(h)))


_MIXED_FUSIONS = [
    "<root>: body + residual add + relu",
    "<root>: fc + silu",
    "stem: 0 + 1 + relu",
    "body: 0 + 1",
    "mlp: 0 + gelu",
]


def test_report_fusions_lists_the_sequential_fusions(tmp_path: Path) -> None:
    """They were only in the per-module lines of str(report)."""
    ref, model = eval_pair(_Mixed)
    x = torch.randn(2, 3, 8, 8)
    report = _optimize(model, tmp_path, (x,))
    assert report.fusions == _MIXED_FUSIONS
    for line in _MIXED_FUSIONS:
        assert f"fused: {line}" in str(report)
    fused = {r.name: r.fused for r in report.swapped}
    assert fused["stem.0"] == ["stem.1 (batchnorm, folded)", "stem.2 (relu)"]
    assert fused["mlp.0"] == ["mlp.1 (gelu)"]
    folded = {r.name: r.folded_into for r in report.swapped if r.folded_into}
    assert folded == {"stem.1": "stem.0", "body.1": "body.0"}
    with torch.no_grad():
        assert_close(model(x), ref(x))


def test_a_second_optimize_reports_the_fusions_that_still_run(tmp_path: Path) -> None:
    """The root's class is optimize()'s routing wrapper after the first: the second reported
    no Sequential fusion (``0: Linear``) and no traced one, though they all ran."""
    ref, model = eval_pair(_Mixed)
    x = torch.randn(2, 3, 8, 8)
    first = _optimize(model, tmp_path, (x,))
    second = _optimize(model, tmp_path, (x,))
    assert second.fusions == first.fusions == _MIXED_FUSIONS
    assert [(r.name, r.fused, r.folded_into) for r in second.swapped] == [
        (r.name, r.fused, r.folded_into) for r in first.swapped
    ]
    with torch.no_grad():
        assert_close(model(x), ref(x))
    seq = nn.Sequential(nn.Linear(16, 32), nn.GELU()).eval()
    x = torch.randn(4, 16)
    _optimize(seq, tmp_path, (x,))
    second = _optimize(seq, tmp_path, (x,))
    assert second.fusions == ["<root>: 0 + gelu"]
    assert second.swapped[0].fused == ["1 (gelu)"]
    assert "0: Linear + 1 (gelu)" in str(second)


def test_a_sequential_wrapped_unfused_is_not_fused_under_the_wrapper(tmp_path: Path) -> None:
    """A Sequential that had nothing to fuse runs optimize()'s routing wrapper of its own
    forward: a fused class on top would drop the wrapper, so a later optimize leaves it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Identity()).eval()
    x = torch.randn(4, 16)
    assert _optimize(model, tmp_path, (x,)).fusions == []
    routed = type(model)
    model[1] = nn.GELU()
    assert _optimize(model, tmp_path, (x,)).fusions == []
    assert type(model) is routed
    with torch.no_grad():
        assert_close(model(x), F.gelu(F.linear(x, model[0].weight, model[0].bias)))


class _ConfigBranch(nn.Module):
    """Branches on a config object it keeps (Hugging Face style)."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.config = types.SimpleNamespace(residual=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.residual:
            return F.relu(self.c(x) + x)
        return F.relu(self.c(x))


def _residual_of(module: nn.Module) -> bool:
    return bool(module.config.residual)  # type: ignore[union-attr]


class _ConfigInHelper(_ConfigBranch):
    """Reads its config in a function it hands ``self`` to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _residual_of(self):
            return F.relu(self.c(x) + x)
        return F.relu(self.c(x))


class _ConfigInProperty(_ConfigBranch):
    """Reads its config through a property."""

    @property
    def residual(self) -> bool:
        return bool(self.config.residual)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.residual:
            return F.relu(self.c(x) + x)
        return F.relu(self.c(x))


class _ConfigInParent(_ConfigBranch):
    """Its parent's forward reads the config, through ``super()``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class _ConfigInDict(_ConfigBranch):
    """Reads its config out of its ``__dict__``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.__dict__["config"].residual:
            return F.relu(self.c(x) + x)
        return F.relu(self.c(x))


USE_RESIDUAL = True


class _GlobalBranch(nn.Module):
    """Branches on a module-level flag."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if USE_RESIDUAL:
            return F.relu(self.c(x) + x)
        return F.relu(self.c(x))


def _branching_pair(
    cls: type[nn.Module], tmp_path: Path
) -> tuple[Any, nn.Module, torch.Tensor, dtt.OptimizeReport]:
    """(the optimized model, an untouched copy, an input, the report)."""
    torch.manual_seed(0)
    model = cls().eval()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 8, 6, 6)
    return model, ref, x, _optimize(model, tmp_path, (x,))


@pytest.mark.parametrize(
    "cls",
    [
        _ConfigBranch,
        _ConfigInHelper,
        _ConfigInProperty,
        _ConfigInParent,
        _ConfigInDict,
        _GlobalBranch,
    ],
)
def test_a_branch_on_state_the_guard_cannot_check_is_not_fused(
    cls: type[nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace froze `if self.config.residual:` and `if USE_RESIDUAL:`: flipping either after
    optimize changed nothing (an error of 3.9; new-user audit, session 15)."""
    model, ref, x, report = _branching_pair(cls, tmp_path)
    assert not report.fusions
    if cls is not _GlobalBranch:
        model.config.residual = ref.config.residual = False  # type: ignore[union-attr]
    else:
        monkeypatch.setattr(sys.modules[__name__], "USE_RESIDUAL", False)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


class _ConfigUnread(_ConfigBranch):
    """Keeps its config and never reads it in its forward (transformers' LlamaMLP)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.c(x) + x)


def test_a_config_the_forward_never_reads_does_not_stop_fusion(tmp_path: Path) -> None:
    model, ref, x, report = _branching_pair(_ConfigUnread, tmp_path)
    assert report.fusions == ["<root>: c + residual add + relu"]
    model.config.residual = False  # type: ignore[union-attr]  # read by nothing: no change
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


class _ListBranch(nn.Module):
    """Branches on a list of numbers it keeps (Swin keeps its window size as a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.sizes = [1, 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sizes[0] == 1:
            return F.relu(self.c(x) + x)
        return F.relu(self.c(x))


def test_a_list_of_numbers_is_fused_and_compared_by_value(tmp_path: Path) -> None:
    model, ref, x, report = _branching_pair(_ListBranch, tmp_path)
    assert report.fusions
    model.sizes[0] = ref.sizes[0] = 2  # in place: the guard kept a copy
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


class _TracedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.up = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)) + x)
        return F.gelu(self.up(y.mean((2, 3))))


def test_the_report_names_what_each_traced_layer_took_in(tmp_path: Path) -> None:
    """A traced fusion showed only on its `fused:` line; the layer's own line named none
    (new-user audit, session 15), unlike a Sequential's `0: Conv2d + 1 (batchnorm, folded)`."""
    torch.manual_seed(0)
    model = _TracedBlock().eval()
    report = _optimize(model, tmp_path, (torch.randn(2, 8, 6, 6),))
    lines = str(report).splitlines()
    assert any(
        line.strip().startswith("conv1: Conv2d + bn1 (batchnorm, folded) + residual add + relu")
        for line in lines
    ), lines
    assert any(line.strip().startswith("up: Linear + gelu") for line in lines), lines
