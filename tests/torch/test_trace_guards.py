"""What a fused or folded forward may not freeze: batch-norm statistics a training forward
updates, plain attributes and argument types the trace read, the grad mode and autocast of a
``with`` block, lists a forward fills, an inference-mode fold, a Sequential subclass's own
forward, and SDPA's broadcast of one key/value head. (A second audit, session 12; CPU.)"""

from __future__ import annotations

import collections
import copy
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import assert_close, eval_pair

import dnntune.torch as dtt


def _optimize(model: nn.Module, tmp_path: Path, inputs: Any = None) -> dtt.OptimizeReport:
    return dtt.optimize(
        model, inputs, policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False
    )


class _Block(nn.Module):
    """torchvision's spelling, traced: ``relu(bn(conv(x)))`` and a Sequential stem."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(self.stem(x))))


def test_a_training_forward_refreshes_the_fold(tmp_path: Path) -> None:
    """PyTorch's batch-norm kernel updates the running statistics without counting versions:
    eval, one training forward, eval again must read the new statistics."""
    ref, model = eval_pair(_Block)
    x = torch.randn(2, 3, 8, 8)
    _optimize(model, tmp_path, (x,))
    with torch.no_grad():
        assert_close(model(x), ref(x))
        for m in (model, ref):
            m.train()
            m(x * 3 + 1)  # new statistics
            m.eval()
        assert_close(model(x), ref(x))


def test_an_inference_mode_fold_serves_a_later_call_that_needs_gradients(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    ref = ref.eval().requires_grad_(False)
    model = copy.deepcopy(ref)
    _optimize(model, tmp_path)
    x = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        model(x)  # the fold is first made here
    grads = []
    for m in (model, ref):
        image = x.clone().requires_grad_()
        m(image).sum().backward()  # a saliency map: gradients of the input
        grads.append(image.grad)
    assert_close(grads[0], grads[1])


class _LoRA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(16, 16)
        self.lora_a = nn.Linear(16, 4, bias=False)
        self.lora_b = nn.Linear(4, 16, bias=False)
        self.scaling = 2.0
        self.disable_adapter = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if not self.disable_adapter:
            out = out + self.lora_b(self.lora_a(x)) * self.scaling
        return out


def test_plain_attributes_the_trace_read_are_read_on_every_call(tmp_path: Path) -> None:
    ref = _LoRA().eval()
    model = copy.deepcopy(ref)
    report = _optimize(model, tmp_path)
    assert report.fusions == ["<root>: base + residual add"]
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert_close(model(x), ref(x))
        model.scaling = ref.scaling = 0.5
        assert_close(model(x), ref(x))
        model.disable_adapter = ref.disable_adapter = True
        assert_close(model(x), ref(x))
        model.disable_adapter = ref.disable_adapter = False  # back to the traced values
        model.scaling = ref.scaling = 2.0
        assert_close(model(x), ref(x))


class _Up(nn.Module):
    """A decoder stage that takes ``x`` or ``(x, skip)``, as UNet and FPN code does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()

    def forward(self, inputs: Any) -> torch.Tensor:
        if isinstance(inputs, tuple | list):
            inputs = torch.cat(list(inputs), dim=1)
        return self.act(self.bn(self.conv(inputs)))


def test_an_argument_the_trace_did_not_stand_for_runs_the_modules_own_forward(
    tmp_path: Path,
) -> None:
    ref = _Up().eval()
    model = copy.deepcopy(ref)
    assert _optimize(model, tmp_path).fusions == ["<root>: conv + bn + relu"]
    x, skip = torch.randn(2, 8, 8, 8), torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        assert_close(model(torch.cat([x, skip], 1)), ref(torch.cat([x, skip], 1)))
        assert_close(model((x, skip)), ref((x, skip)))


class _Distill(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.teacher = nn.Linear(16, 16)
        self.student = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = F.relu(self.teacher(x))
        return F.relu(self.student(x)) + t


def test_a_forward_with_a_with_block_is_not_rewritten(tmp_path: Path) -> None:
    ref = _Distill().eval()
    model = copy.deepcopy(ref)
    assert _optimize(model, tmp_path).fusions == []
    x = torch.randn(4, 16)
    model(x).sum().backward()
    assert model.teacher.weight.grad is None  # still frozen by the with block
    assert model.student.weight.grad is not None


class _AsksArgument(nn.Module):
    """Asks whether an argument is a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 8)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if isinstance(bias, torch.Tensor):
            h = h * 3
        return x + h


class _AsksTuple(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if isinstance(bias, (int, torch.Tensor)):
            h = h * 3
        return x + h


class _AsksParameter(_AsksArgument):
    """transformers' T5 feed-forward asks ``isinstance(self.wo.weight, torch.Tensor)``."""

    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if not isinstance(self.fc2.weight, nn.Parameter):
            h = h * 3
        return x + h


class _AsksIsTensor(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if torch.is_tensor(bias):
            h = h * 3
        return x + h


class _AsksType(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if type(bias) is torch.Tensor:
            h = h * 3
        return x + h


class _AsksHasattr(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if hasattr(bias, "keys"):  # a dict's, not a tensor's
            h = h * 3
        return x + h


class _AsksGetattr(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        return x + h * getattr(bias, "scale_factor", 1.0)  # a proxy has every attribute


class _AsksIdentity(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if bias is x:  # one tensor passed twice
            h = h * 3
        return x + h


class _AsksCallable(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if callable(bias):
            h = h * 3
        return x + h


class _AsksGradMode(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        if torch.is_grad_enabled():
            h = h * 3
        return x + h


class _CatchesErrors(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        h = self.body(x)
        try:
            h = h + bias
        except RuntimeError:  # a bias of another length: left out, as this forward says
            h = h * 1
        return x + h


def _scaled_if_tensor(h: torch.Tensor, bias: Any) -> torch.Tensor:
    """A module-level helper the forward below calls: its Python runs in the trace too."""
    return h * 3 if isinstance(bias, torch.Tensor) else h


class _AsksInAHelper(_AsksArgument):
    def forward(self, x: torch.Tensor, bias: Any) -> torch.Tensor:
        return x + _scaled_if_tensor(self.body(x), bias)


def _not_rewritten(make: type[nn.Module], tmp_path: Path) -> tuple[nn.Module, nn.Module]:
    """(the eager block, its optimized copy), asserting that nothing of it was fused."""
    ref = make().eval()
    model = copy.deepcopy(ref)
    assert _optimize(model, tmp_path, (torch.randn(2, 8), torch.randn(8))).fusions == []
    return ref, model


def test_a_forward_that_catches_errors_is_not_rewritten(tmp_path: Path) -> None:
    """A trace runs the ``try`` body on proxies, which raise nothing; a call whose add raised
    would have raised in the rewritten forward instead of taking the handler."""
    ref, model = _not_rewritten(_CatchesErrors, tmp_path)
    x, short = torch.randn(2, 8), torch.randn(3)
    with torch.no_grad():
        assert_close(model(x, short), ref(x, short))


def test_a_forward_that_reads_the_grad_mode_is_not_rewritten(tmp_path: Path) -> None:
    """``if torch.is_grad_enabled():`` traced under optimize's grad mode kept that branch for
    every call: under ``no_grad`` an error of 1.03."""
    ref, model = _not_rewritten(_AsksGradMode, tmp_path)
    x, bias = torch.randn(2, 8), torch.randn(8)
    with torch.no_grad():
        assert_close(model(x, bias), ref(x, bias))
    assert_close(model(x, bias), ref(x, bias))


@pytest.mark.parametrize(
    "make",
    [
        _AsksArgument,
        _AsksTuple,
        _AsksParameter,
        _AsksIsTensor,
        _AsksType,
        _AsksHasattr,
        _AsksGetattr,
        _AsksIdentity,
        _AsksCallable,
        _AsksInAHelper,
    ],
)
def test_a_forward_that_asks_if_a_value_is_a_tensor_is_not_rewritten(
    tmp_path: Path, make: type[nn.Module]
) -> None:
    """A trace runs ``isinstance`` on a proxy, which is no tensor: the rewritten forward took
    the branch of a non-tensor for every call (an error of 0.86 on such a block; T5's
    feed-forward with its float32 ``wo`` raised in bfloat16). ``type``, ``hasattr``,
    ``getattr``, ``callable`` and ``is`` of an argument get the proxy's answers too, in the
    forward and in a module-level function it calls (an error of 0.56 there)."""
    ref, model = _not_rewritten(make, tmp_path)
    x, bias = torch.randn(2, 8), torch.randn(8)
    with torch.no_grad():
        assert_close(model(x, bias), ref(x, bias))
        assert_close(model(x, x), ref(x, x))


class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.recorded: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        self.recorded.append(h.detach())
        return self.fc2(h)


def test_a_forward_that_fills_a_list_is_not_rewritten_and_keeps_no_proxy(tmp_path: Path) -> None:
    model = _Recorder().eval()
    x = torch.randn(2, 16)
    assert _optimize(model, tmp_path, (x,)).fusions == []
    assert len(model.recorded) == 1 and isinstance(model.recorded[0], torch.Tensor)
    with torch.no_grad():
        model(x)
    assert len(model.recorded) == 2  # every call still records


class _Scaled(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x) * self.scale


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


def test_a_sequential_subclass_with_its_own_forward_runs_it(tmp_path: Path) -> None:
    ref, model = eval_pair(_Residual)
    x = torch.randn(2, 8, 8, 8)
    _optimize(model, tmp_path, (x,))
    with torch.no_grad():
        assert_close(model(x), ref(x))


def test_one_key_value_head_broadcast_over_the_query_heads_runs_pytorchs_op() -> None:
    q = torch.randn(2, 4, 6, 8)
    k, v = torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="key/value heads broadcast"):
        got = dtt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(got, want)
    with warnings.catch_warnings(), pytest.raises(RuntimeError):  # PyTorch's own error
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)
        dtt.scaled_dot_product_attention(q, torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8))


class _Shortcut(nn.Module):
    """A class-level flag the forward reads through ``self`` (set per instance later)."""

    use_shortcut = True

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.conv(x))
        if self.use_shortcut:
            out = out + x
        return F.relu(out)


def test_a_class_attribute_the_trace_read_is_read_on_every_call(tmp_path: Path) -> None:
    """Set on the instance after optimize, it shadows the class's value the trace froze: the
    rewritten forward ran the shortcut all the same (new-user audit, session 18: an error of
    3.7)."""
    ref = _Shortcut().eval()
    model = copy.deepcopy(ref)
    assert _optimize(model, tmp_path).fusions  # the rewrite ran
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        assert_close(model(x), ref(x))
        model.use_shortcut = ref.use_shortcut = False
        assert_close(model(x), ref(x))


class _Helper(nn.Module):
    """The teacher's no_grad block sits in a method the forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.teacher = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x) + self.teacher_features(x))

    def teacher_features(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = self.teacher(x)
            return out


_FLAGS = {"shortcut": True}


class _GlobalTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        if _FLAGS["shortcut"]:
            out = out + x
        return F.relu(out)


def test_python_a_trace_drops_in_a_called_method_or_a_global_table_is_not_rewritten(
    tmp_path: Path,
) -> None:
    """A with-block in a method the forward calls (the frozen teacher trained: its gradient
    read 3,071 instead of None), and a global dict of flags (frozen: an error of 4.1) keep the
    module's own forward (new-user audit, session 18)."""
    helper = _Helper().eval()
    assert _optimize(helper, tmp_path).fusions == []
    helper.train()
    helper(torch.randn(2, 8, 6, 6)).sum().backward()
    assert helper.teacher.weight.grad is None and helper.conv.weight.grad is not None
    ref = _GlobalTable().eval()
    model = copy.deepcopy(ref)
    assert _optimize(model, tmp_path).fusions == []
    x = torch.randn(2, 8, 6, 6)
    _FLAGS["shortcut"] = False
    try:
        with torch.no_grad():
            assert_close(model(x), ref(x))
    finally:
        _FLAGS["shortcut"] = True


class _Loop(nn.Module):
    """Residual linears in a loop over a ModuleList, a ModuleDict below a plain child, and a
    ParameterList of scales: a trace unrolls each loop."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.enc = nn.Module()
        self.enc.blocks = nn.ModuleDict({"a": nn.Linear(16, 16), "b": nn.Linear(16, 16)})
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(16) * 1.5)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        for block in self.enc.blocks.values():
            x = x + block(x)
        for scale in self.scales:
            x = x * scale
        return x


def _grow(m: nn.Module) -> None:
    m.layers.append(nn.Linear(16, 16))


def _shrink(m: nn.Module) -> None:
    del m.layers[1]


def _shorter(m: nn.Module) -> None:
    m.layers = nn.ModuleList([m.layers[0]])


def _dict_add(m: nn.Module) -> None:
    m.enc.blocks["c"] = nn.Linear(16, 16)


def _dict_pop(m: nn.Module) -> None:
    m.enc.blocks.pop("a")


def _scale_added(m: nn.Module) -> None:
    m.scales.append(nn.Parameter(torch.full((16,), 3.0)))


def _item_replaced(m: nn.Module) -> None:
    m.layers[1] = nn.Identity()


@pytest.mark.parametrize(
    "edit", [_grow, _shrink, _shorter, _dict_add, _dict_pop, _scale_added, _item_replaced]
)
def test_a_container_changed_after_optimize_runs_as_it_is_now(edit: Any, tmp_path: Path) -> None:
    """A layer appended to a ModuleList the forward loops over after ``optimize`` was skipped
    (an error of 2.1), one deleted raised AttributeError, and so for a ModuleDict or a
    ParameterList (new-user audit, session 55): the guard now holds what each container
    below the module held at the trace."""
    torch.manual_seed(0)
    ref = _Loop().eval()
    model = copy.deepcopy(ref)
    assert _optimize(model, tmp_path).fusions  # the loops were traced and fused
    x = torch.randn(4, 16)
    torch.manual_seed(1)
    edit(model)
    torch.manual_seed(1)
    edit(ref)
    with torch.no_grad():
        assert_close(model(x), ref(x))


def _alike_before_and_after(
    make: Any,
    change: Any,
    shape: tuple[int, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dtt.OptimizeReport:
    """``make()``'s model and its optimized copy give the same output on an input of
    ``shape``, before and after ``change(model, monkeypatch)`` is made to both; the report."""
    torch.manual_seed(0)
    ref = make().eval()
    model = copy.deepcopy(ref)
    report = _optimize(model, tmp_path)
    x = torch.randn(shape)
    with torch.no_grad():
        assert_close(model(x), ref(x))
        change(model, monkeypatch)
        change(ref, monkeypatch)
        assert_close(model(x), ref(x))
    return report


#: a user's config module, named in a forward through the module (``if cfg.USE_RES:``)
_CFG = types.ModuleType("user_config")
_CFG.USE_RES = True


def _act(h: torch.Tensor) -> torch.Tensor:
    return F.relu(h)


def _outer(h: torch.Tensor) -> torch.Tensor:
    return _act(h) * 2


class _ConfigFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _CFG.USE_RES:
            return x + self.fc(x)
        return self.fc(x)


class _CallsHelper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + _act(self.fc(x))


class _NestedHelper(_CallsHelper):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + _outer(self.fc(x))


class _ChildFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.fc.use_res = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc.use_res:
            return x + self.fc(x)
        return self.fc(x)


@pytest.mark.parametrize(
    ("make", "change", "rewritten"),
    [
        (_ConfigFlag, lambda m, mp: mp.setattr(_CFG, "USE_RES", False), False),
        (_CallsHelper, lambda m, mp: mp.setattr(__name__ + "._act", torch.tanh), True),
        (_NestedHelper, lambda m, mp: mp.setattr(__name__ + "._act", torch.tanh), True),
        (_ChildFlag, lambda m, mp: setattr(m.fc, "use_res", False), True),
    ],
    ids=["config_module_flag", "helper_reassigned", "nested_helper_reassigned", "child_flag"],
)
def test_state_a_trace_froze_beyond_the_modules_own_attributes_is_checked(
    make: Any, change: Any, rewritten: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag of a user's module named through it (``cfg.USE_RES``), a module-level helper
    function (or one it calls) reassigned, a child's flag (``self.fc.use_res``): flipped after
    ``optimize``, each changed nothing, errors of 0.88-2.7 (new-user audit, session 55). The
    first keeps the module's own forward (no guard reads a module's globals cheaply); the
    others are guarded: a call after the change runs the module's own forward."""
    report = _alike_before_and_after(make, change, (4, 16), tmp_path, monkeypatch)
    assert bool(report.fusions) is rewritten


class _BufferFlag(nn.Module):
    """A branch on a buffer, and a step counter kept in one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("negate", torch.tensor(False))
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        if self.negate:
            h = -h
        self.steps += 1
        return h


class _Ema(nn.Module):
    """An exponential moving average updated in place each call, added to the output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        self.ema.mul_(0.5).add_(h.mean(0))
        return h + self.ema


class _OrderedOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        return collections.OrderedDict(hidden=F.relu(self.fc(x)))


@pytest.mark.parametrize("make", [_BufferFlag, _Ema, _OrderedOut])
def test_buffers_read_or_updated_and_dict_subclasses_run_as_eager(
    make: Any, tmp_path: Path
) -> None:
    """A trace read a buffer's value (``if self.negate:``: flipped later, nothing changed, an
    error of 2.2), wrote an in-place update once while tracing (a step counter that never
    counted, an EMA that lost its ``mul_``), and returned an ``OrderedDict`` as a plain dict
    (transformers' ``ModelOutput`` lost its attributes) (new-user audit, session 55)."""
    torch.manual_seed(0)
    ref = make().eval()
    model = copy.deepcopy(ref)
    _optimize(model, tmp_path)
    x = torch.randn(2, 8)
    if isinstance(ref, _BufferFlag):
        ref.negate.fill_(True)
        model.negate.fill_(True)
    with torch.no_grad():
        for _ in range(3):
            want, got = ref(x), model(x)
            assert type(got) is type(want)
            if isinstance(want, dict):
                want, got = want["hidden"], got["hidden"]
            assert_close(got, want)
    assert_close(model.state_dict(), ref.state_dict())


_NEGATE = False
_SHAPE = (2, 4)
_BACKEND: str | None = None


def _post(h: torch.Tensor) -> torch.Tensor:
    return -h if _NEGATE else h


class _HelperFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _post(F.relu(self.fc(x)))


class _ShapeGlobal(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(x)).reshape(-1, *_SHAPE)


class _NoneGlobal(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return h * 3 if _BACKEND is not None else h


class _BackendsFlag(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return h if torch.backends.mkldnn.enabled else -h


class _TensorAttribute(_HelperFlag):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(8)  # a tensor, not a buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(x)) * (2.0 if bool(self.scale.all()) else 0.5)


def _closure_model() -> nn.Module:
    state = {"sign": 1.0}

    class _Closure(_HelperFlag):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.fc(x)) * state["sign"]

    model = _Closure()
    model.flip = lambda: state.update(sign=-1.0)  # type: ignore[assignment]
    return model


def _flip(name: str, value: Any) -> Any:
    return lambda m, mp: mp.setattr(f"{__name__}.{name}", value)


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (_HelperFlag, _flip("_NEGATE", True)),
        (_ShapeGlobal, _flip("_SHAPE", (4, 2))),
        (_NoneGlobal, _flip("_BACKEND", "x")),
        (_BackendsFlag, lambda m, mp: mp.setattr(torch.backends.mkldnn, "enabled", False)),
        (_TensorAttribute, lambda m, mp: m.scale.zero_()),
        (_closure_model, lambda m, mp: m.flip()),
    ],
    ids=["helper_flag", "shape_global", "none_global", "backends_flag", "tensor_attr", "closure"],
)
def test_python_state_a_trace_would_freeze_keeps_the_modules_forward(
    make: Any, change: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag read in a module-level helper, a global shape, dtype or None, a torch.backends
    flag, a tensor kept outside the buffers, a closure's variable: each was baked into the
    rewritten forward, and a change after ``optimize`` changed nothing (new-user audit round
    2, session 55: errors of 0.1 to 4.2, a wrong output shape). Such a module keeps its own
    forward."""
    torch.manual_seed(0)
    model = make().eval()
    assert _optimize(model, tmp_path).fusions == []
    x = torch.randn(2, 8)
    with torch.no_grad():
        before = model(x)
        change(model, monkeypatch)
        after = model(x)
    assert after.shape != before.shape or not torch.equal(after, before)


_ACT = F.gelu


def _flag_of(module: nn.Module) -> bool:
    return bool(module.NEGATE)  # type: ignore[attr-defined]


class _Alias(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ACT(self.fc(x))


class _Defaults(_HelperFlag):
    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return F.relu(self.fc(x)) * scale


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def get_scale(self) -> float:
        return self.scale


class _ChildMethod(_HelperFlag):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(x)) * self.k.get_scale()


class _ClassFlagViaHelper(_HelperFlag):
    NEGATE = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return -h if _flag_of(self) else h


def _patch_forward(m: nn.Module, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(_Defaults, "forward", lambda self, x, scale=2.0: -F.relu(self.fc(x)))


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (_Alias, _flip("_ACT", F.silu)),
        (_Defaults, lambda m, mp: mp.setattr(_Defaults.forward, "__defaults__", (3.0,))),
        (_Defaults, _patch_forward),
        (_ChildMethod, lambda m, mp: setattr(m.k, "scale", -2.0)),
        (_ClassFlagViaHelper, lambda m, mp: mp.setattr(_ClassFlagViaHelper, "NEGATE", True)),
    ],
    ids=["torch_alias", "defaults", "class_forward", "child_method", "class_flag_via_helper"],
)
def test_what_a_rewritten_forward_called_or_defaulted_to_is_checked(
    make: Any, change: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alias of PyTorch's function (``ACT = F.gelu``) reassigned, the forward's defaults
    set anew, the class's forward replaced, a child's attribute read through its method, a
    class flag read by a helper given ``self``: each changed nothing after ``optimize`` (new-user
    audit round 2, session 55: errors of 0.1 to 7.5). The rewrite stays, and a call after the
    change runs the module's own forward."""
    report = _alike_before_and_after(make, change, (2, 8), tmp_path, monkeypatch)
    assert report.fusions


def test_an_optimized_model_whose_forward_calls_a_helper_deep_copies(tmp_path: Path) -> None:
    """The guard of a forward that calls a module-level function holds the globals it is named
    in: ``copy.deepcopy`` of the model reached their module objects and raised "cannot pickle
    'module' object" (round-3 audit, session 55). The copy is guarded as the model is."""
    torch.manual_seed(0)
    model = _CallsHelper().eval()
    assert _optimize(model, tmp_path).fusions
    twin = copy.deepcopy(model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert_close(twin(x), model(x))


class _Post(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def post(self, h: Any) -> Any:
        return h * 2 if isinstance(h, torch.Tensor) else h


class _ChildMethodPitfall(_HelperFlag):
    def __init__(self) -> None:
        super().__init__()
        self.sub = _Post()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub.post(F.relu(self.fc(x))) + x


class _Util:
    @staticmethod
    def double(h: Any) -> Any:
        return h * 2 if isinstance(h, torch.Tensor) else h


class _StaticMethodPitfall(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Util.double(F.relu(self.fc(x))) + x


_CONFIG = types.SimpleNamespace(res=True)
_STATS = types.SimpleNamespace(calls=0)


class _GlobalObject(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return h + x if _CONFIG.res else h


class _Counts(_HelperFlag):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _STATS.calls += 1
        return F.relu(self.fc(x)) + x


class _ClassTable(_HelperFlag):
    TABLE = {"scale": 1.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(x)) * self.TABLE["scale"]


class _Options(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = types.SimpleNamespace(flag=True)


class _ChildConfig(_HelperFlag):
    def __init__(self) -> None:
        super().__init__()
        self.sub = _Options()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return h + x if self.sub.cfg.flag else h


class _Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class _WrittenActivation(_HelperFlag):
    def __init__(self) -> None:
        super().__init__()
        self.act = _Swish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def _nothing(m: nn.Module, mp: pytest.MonkeyPatch) -> None:
    pass


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (_ChildMethodPitfall, _nothing),
        (_StaticMethodPitfall, _nothing),
        (_GlobalObject, lambda m, mp: mp.setattr(_CONFIG, "res", False)),
        (_ClassTable, lambda m, mp: mp.setitem(_ClassTable.TABLE, "scale", 3.0)),
        (_ChildConfig, lambda m, mp: setattr(m.sub.cfg, "flag", False)),
        (_WrittenActivation, lambda m, mp: mp.setattr(_Swish, "forward", lambda s, x: x.tanh())),
    ],
    ids=["child_method", "static_method", "global_object", "class_table", "child_config", "swish"],
)
def test_python_reached_through_children_classes_and_objects_runs_as_eager(
    make: Any, change: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's method or a global class's static method the trace ran (an ``isinstance`` in
    it answered for a proxy: wrong with nothing changed), a global object's flag, a class-level
    table changed in place, a child's config object, a written-out activation class's forward
    replaced: errors of 0.36 to 2.8 against eager (round-3 audit, session 55)."""
    _alike_before_and_after(make, change, (4, 8), tmp_path, monkeypatch)


def test_a_forward_with_python_side_effects_runs_them_every_call(tmp_path: Path) -> None:
    """A counter on a global object (``STATS.calls += 1``) and a print: the rewritten forward
    ran them once, while tracing (round-3 audit, session 55). Such a forward is not rewritten."""
    model = _Counts().eval()
    _optimize(model, tmp_path)
    start = _STATS.calls
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 8))
    assert _STATS.calls == start + 3
