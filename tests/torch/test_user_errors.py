"""A caller's own mistakes (an input of the wrong shape) against dnntune.torch on the CPU: they
raise PyTorch's error, with no fallback warning that blames dnntune, and leave the op's one
"dnntune cannot run it" warning for a real failure (new-user audit)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.errors import InvalidValueError
from dnntune.torch._support import reset_warnings


def test_wrong_shape_raises_pytorchs_error_without_a_fallback_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any DnnTuneFallbackWarning fails the test
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            dtt.linear(torch.randn(2, 7), torch.randn(4, 8))
        with pytest.raises(RuntimeError, match="too small"):
            dtt.max_pool2d(torch.randn(1, 3, 2, 2), 5)
    # a call dnntune's graphs do not take but PyTorch does (a 1-D weight) still warns: the
    # mistake above did not use up linear's one warning
    x, w = torch.randn(5, 7), torch.randn(7)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="dnntune cannot run it"):
        y = dtt.linear(x, w)
    torch.testing.assert_close(y, F.linear(x, w))


def test_optimize_with_wrong_example_shape_raises_without_a_fallback_warning() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            dtt.optimize(model, (torch.randn(2, 7),), policy="heuristic", overrides=None)
    assert type(model[0]) is nn.Linear  # left as it was


@pytest.mark.parametrize("fold", [False, True], ids=["conv", "conv+bn"])
def test_an_image_of_the_wrong_channel_count_raises_eagers_error(fold: bool) -> None:
    """An optimized model fed 3 channels where its conv takes 4 raised ``ValueError: conv2d:
    groups=1 does not match input channels 3``, blaming an argument the user never gave;
    eager raises PyTorch's RuntimeError, and so does the optimized model now."""
    layers = [nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4), nn.ReLU()] if fold else [nn.Conv2d(4, 4, 3)]
    model = nn.Sequential(*layers).eval()
    eager = copy.deepcopy(model)
    dtt.optimize(model, (torch.randn(2, 4, 5, 5),), policy="heuristic", overrides=None)
    wrong = torch.randn(2, 3, 5, 5)
    with pytest.raises(RuntimeError) as expected:
        eager(wrong)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        with pytest.raises(RuntimeError, match="to have 4 channels, but got 3") as raised:
            model(wrong)
    assert str(raised.value) == str(expected.value)


class _PreNormBlock(nn.Module):
    """A forward optimize rewrites (``fc + residual add``), with a layer norm in it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


@pytest.mark.parametrize("make", [_PreNormBlock, lambda: nn.RMSNorm(8)], ids=["block", "rms"])
def test_hidden_states_of_the_wrong_width_raise_eagers_error(make: Callable[[], nn.Module]) -> None:
    """An optimized block fed a width its layer norm does not take raised ``ValueError:
    layer_norm: normalized_shape (8,) does not match the last dims of input``; eager raises
    PyTorch's RuntimeError, and so does the optimized model now."""
    model = make().eval()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 8)
    # check_speed=False: every forward on dnntune's route (a new input shape would race the
    # routes, and PyTorch's route runs eager's code)
    dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    wrong = torch.randn(2, 3, 7)
    with torch.no_grad(), pytest.raises(RuntimeError) as expected:  # (with gradients
        eager(wrong)  # wanted the norm runs PyTorch's op: inference is the case)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        with pytest.raises(RuntimeError, match="expected input with shape") as raised:
            model(wrong)
    assert str(raised.value) == str(expected.value)


@pytest.mark.parametrize("check_speed", [True, False])
def test_optimize_names_the_example_forward_in_its_error(check_speed: bool) -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    with pytest.raises(RuntimeError) as info:
        dtt.optimize(
            model, (torch.randn(2, 7),), policy="heuristic", overrides=None, check_speed=check_speed
        )
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "example_inputs (Tensor[2, 7] float32 cpu)" in notes
    assert "left as it was" in notes


def test_torch_jit_script_of_an_optimized_model_says_what_to_do() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    plain = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own
        with pytest.raises(RuntimeError, match="Script the model before optimize") as info:
            torch.jit.script(model)
        assert isinstance(info.value, dtt.ScriptNotSupportedError)
        scripted = torch.jit.script(plain)  # the advice works
    with torch.no_grad():  # and the optimized model is as it was
        torch.testing.assert_close(model(x), scripted(x))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()


@pytest.mark.parametrize(
    ("option", "given"),
    [
        ("check_speed", "no"),
        ("fuse", 0),
        ("revert_if_slower", "False"),
        ("refine", 1),
        ("refine", "yes"),
    ],
)
def test_an_on_off_option_other_than_true_or_false_is_refused(option: str, given: object) -> None:
    """optimize's on/off options were taken by their truth: ``check_speed="no"`` turned the
    check on, ``revert_if_slower="False"`` kept reverting (new-user audit). Each is refused,
    naming the option and the values it takes, before the model is touched."""
    model = _mlp()
    kinds = [type(m) for m in model.modules()]
    with pytest.raises(InvalidValueError, match=rf"optimize\({option}={given!r}\): expected True"):
        dtt.optimize(
            model, (torch.randn(2, 8),), policy="heuristic", overrides=None, **{option: given}
        )
    assert [type(m) for m in model.modules()] == kinds


def test_refine_none_is_still_the_default() -> None:
    model = _mlp()
    x = torch.randn(2, 8)
    want = model(x)
    dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=None, check_speed=False)
    torch.testing.assert_close(model(x), want)


@pytest.mark.parametrize("how", ["scripted", "traced"])
def test_optimize_of_a_torchscript_model_says_what_to_do(how: str) -> None:
    """A TorchScript model (``torch.jit.script``, ``trace``, ``load``) runs compiled code with
    no PyTorch layer classes to swap; ``optimize`` raised ``AttributeError: '_CachedForward'
    object has no attribute '__getattr__'`` from inside its traces (new-user audit). It now
    refuses it up front and says what to do."""
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own
        model = torch.jit.script(_mlp()) if how == "scripted" else torch.jit.trace(_mlp(), x)
    want = model(x)
    with pytest.raises(InvalidValueError, match="cannot change a TorchScript module") as info:
        dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert "optimize the eager model it was made from instead" in str(info.value)
    torch.testing.assert_close(model(x), want)


@pytest.mark.parametrize("how", ["scripted", "traced"])
def test_a_torchscript_submodule_is_left_as_it_is(how: str) -> None:
    """An eager model holding a TorchScript submodule: the same AttributeError, whatever the
    rest of the model was. Now the traces skip the TorchScript part, which runs its compiled
    code, and the eager layers around it are optimized (the Linear + GELU fused)."""
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own
        inner = torch.jit.script(_mlp()) if how == "scripted" else torch.jit.trace(_mlp(), x)
    model = nn.Sequential(inner, nn.Linear(4, 4), nn.GELU()).eval()
    eager = nn.Sequential(inner, copy.deepcopy(model[1]), nn.GELU()).eval()
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    assert model[0] is inner and isinstance(model[1], nn.Linear) and type(model[1]) is not nn.Linear
    assert report.fusions == ["<root>: 1 + gelu"]
    with torch.no_grad():
        for batch in (x, torch.randn(3, 8)):
            torch.testing.assert_close(model(batch), eager(batch))


def _bn_net() -> nn.Module:
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(512, 5)
    )
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 1.5)
        net[1].weight.uniform_(0.5, 1.5)
    return net.eval()


def test_example_inputs_made_under_inference_mode() -> None:
    """Inputs made under ``torch.inference_mode`` keep no version counter: optimize read it
    and raised RuntimeError before changing anything (new-user audit)."""
    torch.manual_seed(0)
    model = _bn_net()
    ref = copy.deepcopy(model)
    with torch.inference_mode():
        x = torch.randn(2, 3, 10, 10)
    dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)


def test_a_whole_script_under_inference_mode() -> None:
    """A model built, optimized and run under ``torch.inference_mode`` (its parameters and
    statistics inference tensors too): optimize raised, and the folded batch norm's cache read
    their versions inside the forward. A statistic changed there is seen by the next call."""
    torch.manual_seed(0)
    with torch.inference_mode():
        model = _bn_net()
        ref = copy.deepcopy(model)
        x = torch.randn(2, 3, 10, 10)
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
        assert report.fusions == ["<root>: 0 + 1 + relu"]
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
        model[1].running_mean.add_(1.0)
        ref[1].running_mean.add_(1.0)
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)


class _Float64Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2  # the line a fallback warning of fc names


def test_a_fallback_warning_names_the_callers_line() -> None:
    """The warning named a line of dnntune's own (``functional.py:361``): the user could not
    tell which of their calls fell back. Now the first line outside dnntune and PyTorch."""
    x, w = torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    with pytest.warns(dtt.DnnTuneFallbackWarning) as caught:
        dtt.linear(x, w)
    assert [r.filename for r in caught] == [__file__]
    reset_warnings()  # once per reason: the same one again
    model = _Float64Net().double().eval()
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="linear") as caught:
        dtt.optimize(
            model, (torch.randn(3, 4, dtype=torch.float64),), policy="heuristic", overrides=None
        )
    assert caught[0].filename == __file__
    line = Path(__file__).read_text().splitlines()[caught[0].lineno - 1]
    assert "self.fc(x) * 2" in line


class _Float64Block(nn.Module):
    """A forward optimize rewrites (``fc + gelu`` fused), so its layers are called from
    torch.fx's generated code."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(self.norm(x)))


class _Float64Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _Float64Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + 1  # the line a fallback warning inside the block names


def test_a_fallback_warning_inside_a_rewritten_forward_names_the_users_line() -> None:
    """A layer called from a forward optimize rewrote: the warning named the generated code
    (``<eval_with_key>.13 from ...``, a line of dnntune's names:
    ``norm = self.norm(x)`` there, ``dnntune_torch_routing_...(transpose, ...)`` for
    attention); now the user's line that called the rewritten module."""
    model = _Float64Stack().double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.warns(dtt.DnnTuneFallbackWarning) as caught:
        dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert type(model.block) is not _Float64Block  # its forward is rewritten
    assert {str(r.message).split(":")[0] for r in caught} == {
        "dnntune.torch.layer_norm",
        "dnntune.torch.linear",
    }
    assert {r.filename for r in caught} == {__file__}
    lines = Path(__file__).read_text().splitlines()
    assert all("self.block(x) + 1" in lines[r.lineno - 1] for r in caught)


def test_a_reflect_padded_conv_given_a_wrong_input_raises_unwarned() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")).eval()
    dtt.optimize(model, policy="heuristic", overrides=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="channels"):
            model(torch.randn(1, 5, 8, 8))  # 5 channels for a conv of 3
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="padding_mode='reflect'"):
        model(torch.randn(1, 3, 8, 8))


def test_optimize_of_a_compiled_model_says_that_nothing_runs_on_dnntune() -> None:
    """``optimize(torch.compile(model))``: the compiled program runs PyTorch's ops in every
    dnntune op; the report named reasons that did not apply (autocast, empty tensors, a
    fallback warning that never came). Now a note says so and what to do."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    compiled = torch.compile(model, backend="eager")
    report = dtt.optimize(compiled, (torch.randn(2, 8),), policy="heuristic", overrides=None)
    assert any("compiled by torch.compile" in n for n in report.notes)
    assert "model._orig_mod" in str(report)


def _count_kernel_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one per kernel lookup of ``dnntune.torch.functional`` (a graph
    built or looked up again, as against a call memo hit)."""
    import sys

    functional = sys.modules["dnntune.torch.functional"]
    built: list[int] = []
    real = functional.kernel_for

    def counted(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(functional, "kernel_for", counted)
    return built


def test_a_signature_dnntune_cannot_run_is_not_built_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call dnntune's graphs refuse (a 1-D linear weight, which PyTorch takes) built its
    graph and failed on every call: 119 µs a call against PyTorch's 2 µs (new-user audit)."""

    built = _count_kernel_lookups(monkeypatch)
    x, w = torch.randn(5, 7), torch.randn(7)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="dnntune cannot run it"):
        dtt.linear(x, w)
    tries = len(built)
    for _ in range(3):
        torch.testing.assert_close(dtt.linear(x, w), F.linear(x, w))
    assert len(built) == tries  # PyTorch's op from the memo, nothing built again


def test_a_failed_optimize_leaves_no_attribution_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example forward raised inside a swapped module (a bare Linear given the wrong
    shape): its attribution was left in force for the rest of the thread, so every later
    dnntune call bypassed the call memo (built its kernel lookup again) and was attributed to
    that module (new-user audit; found by a test that passed alone and failed in the suite)."""

    from dnntune.torch import runtime

    with pytest.raises(RuntimeError):
        dtt.optimize(nn.Linear(8, 4), (torch.randn(2, 7),), policy="heuristic", overrides=None)
    runtime.module_plans.clear()
    built = _count_kernel_lookups(monkeypatch)
    x, w = torch.randn(3, 16), torch.randn(5, 16)
    dtt.linear(x, w)
    first = len(built)
    for _ in range(3):
        torch.testing.assert_close(dtt.linear(x, w), F.linear(x, w))
    assert len(built) == first  # the memo answers: nothing looked up again
    assert runtime.module_plans == {}  # and nothing attributed to the failed model's layer
