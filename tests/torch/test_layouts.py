"""dnntune.torch's ops give their outputs the memory layout PyTorch's ops give theirs, for the
layouts models feed them: a layout that differs makes the next op copy (a reshape of a
transposed attention output) or run in another layout (a channels-last model fed NCHW images).
Each case runs twice: through dnntune's graph, and through PyTorch's op as the winner
(``Kernel.native``), the second call of a signature through its memo."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch import runtime

CL = torch.channels_last


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True, params=["dnntune", "native"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    native = request.param == "native"
    monkeypatch.setattr(runtime.Kernel, "native", property(lambda self: native))
    return str(request.param)


def _close(a: torch.Tensor, e: torch.Tensor) -> None:
    """float32 on CUDA computes convolutions and matmuls in TF32 (10 mantissa bits) on both
    sides, by different algorithms: the tolerance ``reference.tolerance_for`` gives a TF32 plan"""
    tol = 5e-3 if a.is_cuda else 1e-3
    torch.testing.assert_close(a, e, atol=tol, rtol=tol)


def _same(ours: Callable[[], torch.Tensor], theirs: torch.Tensor) -> None:
    for _ in range(2):  # the first call builds the signature's plan, the second takes its memo
        y = ours()
        assert y.stride() == theirs.stride(), (y.stride(), theirs.stride())
        _close(y, theirs)


def _cl(t: torch.Tensor, on: bool) -> torch.Tensor:
    return t.to(memory_format=CL) if on else t


@pytest.mark.parametrize("x_cl", [False, True])
@pytest.mark.parametrize("w_cl", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_conv2d_layout(device: str, x_cl: bool, w_cl: bool, k: int) -> None:
    """Channels-last if the input or the weight is, as PyTorch decides: a model converted with
    ``.to(memory_format=torch.channels_last)`` and fed NCHW images runs channels-last from its
    first convolution on, its input converted once."""
    g = torch.Generator().manual_seed(k)
    x = _cl(torch.randn(2, 8, 9, 9, generator=g).to(device), x_cl)
    w = _cl(torch.randn(6, 8, k, k, generator=g).to(device), w_cl)
    b = torch.randn(6, generator=g).to(device)
    theirs = F.conv2d(x, w, b, 1, k // 2)
    _same(lambda: dtt.conv2d(x, w, b, 1, k // 2), theirs)
    _same(lambda: dtt.conv2d(x, w, b, 1, k // 2, activation="relu"), torch.relu(theirs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("w_cl", [False, True])
@pytest.mark.parametrize("k", [3, 5])
def test_conv2d_with_a_residual_in_half_precision(
    device: str, dtype: torch.dtype, w_cl: bool, k: int
) -> None:
    """A channels-last input and residual with a weight that is not (a model fed channels-last
    images, not converted itself): the weight is made channels-last, as PyTorch's cuDNN call
    makes it. Left NCHW, cuDNN's heuristic plan for the half-precision graph with its residual
    epilogue returned errors of 5-33 on the H200 (session 35; the model conformance sweep's
    seeds 8, 9, 11 and 21)."""
    if device == "cpu" and dtype is torch.float16:
        pytest.skip("the CPU half-precision case is bfloat16's")
    g = torch.Generator().manual_seed(k)
    x = _cl(torch.randn(2, 16, 8, 8, generator=g), True).to(device, dtype)
    w = _cl((0.3 * torch.randn(16, 16, k, k, generator=g)), w_cl).to(device, dtype)
    b = torch.randn(16, generator=g).to(device, dtype)
    r = _cl(torch.randn(2, 16, 8, 8, generator=g), True).to(device, dtype)
    exact = F.conv2d(x.double(), w.double(), b.double(), 1, k // 2) + r.double()
    for activation in (None, "relu"):
        want = torch.relu(exact) if activation else exact
        for _ in range(2):  # the plan, then the memo
            y = dtt.conv2d(x, w, b, 1, k // 2, activation=activation, residual=r)
            assert y.is_contiguous(memory_format=CL)
            torch.testing.assert_close(y.double(), want, atol=0.15, rtol=0.05)


def test_a_channels_last_input_gives_the_kernel_a_channels_last_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dnntune.torch import functional as dtf

    seen: list[bool] = []
    build = dtf.conv2d_kernel

    def spy(x: torch.Tensor, w: torch.Tensor, *args: object) -> object:
        seen.append(w.is_contiguous(memory_format=CL))
        return build(x, w, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(dtf, "conv2d_kernel", spy)
    x = _cl(torch.randn(2, 8, 9, 9), True)
    w = torch.randn(6, 8, 3, 3)
    dtt.conv2d(x, w, None, 1, 1)
    assert seen == [True]
    assert w.is_contiguous()  # the caller's weight is left as it is


def test_conv2d_layout_when_training(device: str) -> None:
    x = torch.randn(2, 4, 7, 7, device=device, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device=device).to(memory_format=CL).requires_grad_()
    y = dtt.conv2d(x, w, None, 1, 1, activation="relu")
    ref = torch.relu(F.conv2d(x, w, None, 1, 1))
    assert y.is_contiguous(memory_format=CL) and y.stride() == ref.stride()
    grad = torch.randn_like(ref)
    ours = torch.autograd.grad(y, (x, w), grad)
    theirs = torch.autograd.grad(ref, (x, w), grad)
    for a, e in zip(ours, theirs, strict=True):
        _close(a, e)


@pytest.mark.parametrize("operand", ["weight", "input", "both"])
def test_strided_channels_last_conv_trains_with_exact_gradients(operand: str) -> None:
    """PyTorch's CPU (oneDNN) weight gradient of a strided channels-last convolution is wrong
    (torch 2.13: a 1x1 filter at stride 2 over 12x12 gives a wrong gradient on every call, over
    8x8 on some; with one thread it has corrupted the heap; eager PyTorch as well; found by
    benchmarks/model_conformance.py): dnntune's calls are exact, and lay the gradients out
    channels-last, as PyTorch's channels-last convolution does. (PyTorch's own backward is
    never run here: it could corrupt the test process's heap.)"""
    g = torch.Generator().manual_seed(3)
    for size in (12, 8, 8, 8):
        x = _cl(torch.randn(3, 4, size, size, generator=g), operand != "weight")
        w = _cl(torch.randn(8, 4, 1, 1, generator=g), operand != "input")
        x.requires_grad_(), w.requires_grad_()
        y = dtt.conv2d(x, w, None, 2, 0)
        assert y.stride() == F.conv2d(x.detach(), w.detach(), None, 2, 0).stride()
        dy = torch.randn(y.shape, generator=g).contiguous(memory_format=CL)  # as a layer's
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        assert dx.is_contiguous(memory_format=CL) and dw.is_contiguous(memory_format=CL)
        x64, w64, dy64 = (t.detach().double().contiguous() for t in (x, w, dy))
        exact = torch.nn.grad.conv2d_weight(x64, w.shape, dy64, 2)
        torch.testing.assert_close(dw.double(), exact, atol=1e-4, rtol=1e-4)
        exact = torch.nn.grad.conv2d_input(x.shape, w64, dy64, 2)
        torch.testing.assert_close(dx.double(), exact, atol=1e-4, rtol=1e-4)
    # a gradient penalty differentiates the input's gradient again
    (dx,) = torch.autograd.grad(dtt.conv2d(x, w, None, 2, 0), x, dy, create_graph=True)
    (dw,) = torch.autograd.grad(dx.square().sum(), w)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = F.conv2d(x64, w64, None, 2, 0)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double(), create_graph=True)
    (dw64,) = torch.autograd.grad(dx64.square().sum(), w64)
    torch.testing.assert_close(dw.double(), dw64, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_linear_and_norm_layouts(device: str, layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = {
        "contiguous": lambda: torch.randn(2, 5, 32, generator=g),
        "transposed": lambda: torch.randn(5, 2, 32, generator=g).transpose(0, 1),
        "sliced": lambda: torch.randn(2, 5, 64, generator=g)[..., :32],
    }[layout]().to(device)
    w, b = torch.randn(16, 32, generator=g).to(device), torch.randn(16, generator=g).to(device)
    s, sb = torch.randn(32, generator=g).to(device), torch.randn(32, generator=g).to(device)
    _same(lambda: dtt.linear(x, w, b), F.linear(x, w, b))
    _same(lambda: dtt.layer_norm(x, (32,), s, sb), F.layer_norm(x, (32,), s, sb))
    _same(lambda: dtt.rms_norm(x, (32,), s), F.rms_norm(x, (32,), s))


def test_rms_norm_keeps_a_channels_last_layout(device: str) -> None:
    """PyTorch's rms_norm lays its output out as its input; on dnntune's kernel path a
    channels-last input came back contiguous (training audit, session 55)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, 5, generator=g).to(device).contiguous(memory_format=CL)
    s = torch.randn(5, generator=g).to(device)
    _same(lambda: dtt.rms_norm(x, (5,), s), F.rms_norm(x, (5,), s))


@pytest.mark.parametrize("x_cl", [False, True])
def test_batch_norm_and_pooling_layouts(device: str, x_cl: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = _cl(torch.randn(2, 8, 9, 9, generator=g).to(device), x_cl)
    mean, var = torch.randn(8, generator=g).to(device), torch.rand(8, generator=g).to(device)
    s, b = torch.randn(8, generator=g).to(device), torch.randn(8, generator=g).to(device)
    var = var + 0.5
    _same(lambda: dtt.batch_norm(x, mean, var, s, b, False), F.batch_norm(x, mean, var, s, b))
    _same(lambda: dtt.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))
    _same(lambda: dtt.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1))
    _same(lambda: dtt.avg_pool2d(x, 9), F.avg_pool2d(x, 9))


def test_attention_layout_of_a_qkv_view(device: str) -> None:
    """A query viewed from a QKV projection: the output is [B, S, H, D] in memory, as PyTorch's
    (a row-major query's output is left out: PyTorch's CUDA kernels differ among themselves)."""
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(2, 5, 3 * 3 * 8, generator=g).to(device)
    q, k, v = qkv.reshape(2, 5, 3, 3, 8).permute(2, 0, 3, 1, 4).unbind(0)
    _same(
        lambda: dtt.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )


class _ChannelsLastNet(nn.Module):
    """Convolutions with batch norms, a residual, a pool and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.down = nn.Conv2d(8, 16, 1, stride=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = self.down(torch.relu(self.body(y) + y))
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


def test_a_channels_last_model_fed_nchw_images_runs_channels_last(tmp_path: Path) -> None:
    """``model.to(memory_format=torch.channels_last)`` fed NCHW images: every convolution of the
    optimized model gives the layout the eager model's gives (channels-last from the first on),
    and the same numbers."""
    torch.manual_seed(0)
    ref = _ChannelsLastNet()
    randomize_batch_norms(ref)
    ref = ref.eval().to(memory_format=CL)  # type: ignore[call-overload]  # (stubs lack it)
    model = copy.deepcopy(ref)
    x = torch.randn(2, 3, 12, 12)  # NCHW
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")

    def conv_strides(m: nn.Module) -> dict[str, tuple[int, ...]]:
        seen: dict[str, tuple[int, ...]] = {}
        hooks = [
            c.register_forward_hook(
                lambda _m, _a, out, name=name: seen.__setitem__(name, out.stride())
            )
            for name, c in m.named_modules()
            if isinstance(c, nn.Conv2d)
        ]
        with torch.no_grad():
            y = m(x)
        for h in hooks:
            h.remove()
        seen["output"] = y.stride()
        torch.testing.assert_close(y, expected, atol=1e-4, rtol=1e-4)
        return seen

    with torch.no_grad():
        expected = ref(x)
    eager = conv_strides(ref)
    assert all(s[1] == 1 for name, s in eager.items() if name != "output")  # channels-last
    assert conv_strides(model) == eager


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_a_recorded_strided_channels_last_conv_is_pytorchs_op() -> None:
    """While PyTorch records a program, the CPU guard above stays out of it: the program holds
    PyTorch's convolution, as the user wrote it, and no Python function of dnntune's."""

    class Strided(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 4, 1, 1).to(memory_format=CL))

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return dtt.conv2d(t, self.weight, None, 2, 0)

    x = torch.randn(2, 4, 12, 12).to(memory_format=CL)
    graph = str(torch.jit.trace(Strided(), x).graph)
    assert "aten::_convolution" in graph and "PythonOp" not in graph


class _SqueezeExcite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(x, 1))))
        return x * F.hardsigmoid(s)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_squeeze_excitation_optimized_on_channels_last_at_other_batches_and_layouts(
    device: str, batch: int, tmp_path: Path
) -> None:
    """The model conformance sweep's seed 21 on the H100 (session 36): optimized on one
    channels-last image in bfloat16, its squeeze-excitation block was wrong at batch 2 (error
    1.0 of the output's magnitude; batches 1 and 3 right), fed NCHW or channels-last, with or
    without CUDA graphs; the blocks before it were right. Which kernel gave it was not
    isolated (no device time was left); every heuristic plan is now checked on its first call
    (:func:`dnntune.torch.runtime._checked_heuristic`)."""
    torch.manual_seed(0)
    ref = _SqueezeExcite().to(device, torch.bfloat16).eval()
    model = copy.deepcopy(ref)
    example = _cl(torch.randn(1, 16, 8, 8), True).to(device, torch.bfloat16)
    dtt.optimize(
        model, (example,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=False
    )
    exact = copy.deepcopy(ref).double()
    for channels_last in (False, True):
        x = _cl(torch.randn(batch, 16, 8, 8), channels_last).to(device, torch.bfloat16)
        with torch.no_grad():
            want = exact(x.double())
            for _ in range(2):  # the plan, then the memo
                torch.testing.assert_close(model(x).double(), want, atol=0.05, rtol=0.05)
