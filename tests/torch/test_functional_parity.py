"""dnntune.torch's functional ops behave as torch.nn.functional's on dnntune's own kernel path
(what a cuDNN or Triton winner takes on a GPU; forced on the CPU): double backward, a learned
attention bias, rms_norm's default epsilon, half inputs with float32 batch-norm statistics,
autocast, arguments PyTorch refuses, list arguments. (A fourth audit, session 12.)"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch_models import kernel_plan

import dnntune.torch as dtt
from dnntune.torch import runtime


@pytest.fixture(autouse=True)
def kernel_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every kernel is TORCH_ENGINE's plan marked as not PyTorch's own op: dnntune.torch takes
    its kernel path, and conv2d/linear train through its autograd functions."""

    monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    dtt.configure(policy="heuristic", overrides="does-not-exist.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)  # fallbacks are expected
        yield


def _close(a: torch.Tensor | None, b: torch.Tensor | None, tol: float = 1e-4) -> None:
    assert a is not None and b is not None
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_a_gradient_penalty_through_conv2d_matches_pytorch() -> None:
    """Double backward (WGAN-GP, R1): the input gradient, itself differentiated."""
    torch.manual_seed(0)
    x0, w0, b0 = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    grads = []
    for conv in (dtt.conv2d, F.conv2d):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        y = conv(torch.tanh(x), w, b, 1, 1)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        gx.square().sum().backward()
        grads.append((x.grad, w.grad, b.grad))
    for got, want in zip(*grads, strict=True):
        _close(got, want, 1e-3)


def test_a_regulariser_on_linear_parameter_gradients_matches_pytorch() -> None:
    torch.manual_seed(0)
    x, w0, b0 = torch.randn(5, 8), torch.randn(6, 8), torch.randn(6)
    grads = []
    for linear in (dtt.linear, F.linear):
        w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
        gw, gb = torch.autograd.grad(linear(x, w, b).square().sum(), (w, b), create_graph=True)
        (gw.square().sum() + gb.square().sum()).backward()
        grads.append((w.grad, b.grad))
    for got, want in zip(*grads, strict=True):
        _close(got, want, 1e-3)


def test_a_learned_attention_bias_gets_its_gradient() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    grads = []
    for sdpa in (dtt.scaled_dot_product_attention, F.scaled_dot_product_attention):
        bias = torch.zeros(1, 2, 5, 5, requires_grad=True)
        sdpa(q, k, v, attn_mask=bias).square().sum().backward()
        grads.append(bias.grad)
    _close(grads[0], grads[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_default_epsilon_is_the_one_pytorch_computes_with(dtype: torch.dtype) -> None:
    """eps None: float32's machine epsilon for half and bfloat16 inputs, as PyTorch's kernel
    (the input type's epsilon gave errors of 2-3 on unit outputs for small inputs)."""
    x = (torch.randn(4, 64) * 0.01).to(dtype)
    w = torch.ones(64, dtype=dtype)
    _close(dtt.rms_norm(x, (64,), w, None).float(), F.rms_norm(x, (64,), w, None).float(), 2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_input_with_float32_statistics_keeps_their_precision(dtype: torch.dtype) -> None:
    mean, var = torch.full((4,), 100.3), torch.full((4,), 0.01)
    x = (100.3 + 0.1 * torch.randn(2, 4, 3, 3)).to(dtype)
    want = F.batch_norm(x, mean, var, None, None, False, 0.0, 1e-5)
    _close(dtt.batch_norm(x, mean, var).float(), want.float(), 1e-2)


def test_autocast_gives_pytorchs_types() -> None:
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    q = torch.randn(1, 2, 4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert dtt.conv2d(x, w).dtype == F.conv2d(x, w).dtype == torch.bfloat16
        assert dtt.linear(q, torch.randn(8, 8)).dtype == torch.bfloat16
        assert dtt.scaled_dot_product_attention(q, q, q).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "call",
    [
        lambda: dtt.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(1)),
        lambda: dtt.conv2d(torch.randn(1, 2, 5, 5).bfloat16(), torch.randn(3, 2, 3, 3)),
        lambda: dtt.linear(torch.randn(2, 4).half(), torch.randn(3, 4)),
        lambda: dtt.scaled_dot_product_attention(
            torch.randn(1, 1, 4, 8).half(), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
        ),
        lambda: dtt.layer_norm(torch.randn(3, 5), (5,), torch.randn(5, 1)),
        lambda: dtt.layer_norm(torch.randn(3, 5), (5,), torch.randn(4)),
        lambda: dtt.layer_norm(torch.randn(3, 5), (5,), torch.randn(5), torch.randn(1, 5)),
        lambda: dtt.rms_norm(torch.randn(3, 5), (5,), torch.randn(5, 1)),
    ],
)
def test_arguments_pytorch_refuses_are_refused(call) -> None:  # type: ignore[no-untyped-def]
    """dnntune's graphs would broadcast or cast them; PyTorch's op raises its own error."""
    with pytest.raises(RuntimeError):
        call()


def test_list_arguments_and_an_empty_pooling_stride() -> None:
    """A list is no dict key: the first call of a signature with ``stride=[1, 1]`` raised a
    TypeError; ``stride=[]`` means the kernel size, as ``()`` and None do."""
    x, w = torch.randn(1, 2, 8, 8), torch.randn(3, 2, 3, 3)
    runtime.native_memo.clear()
    for _ in range(2):
        _close(dtt.conv2d(x, w, None, [1, 1], [1, 1]), F.conv2d(x, w, None, [1, 1], [1, 1]))
        _close(dtt.max_pool2d(x, 2, []), F.max_pool2d(x, 2, []))
        _close(dtt.avg_pool2d(x, [2, 2], []), F.avg_pool2d(x, [2, 2], []))


@pytest.mark.parametrize("shape", [(4, 4, 5), (2, 4, 3, 5, 5)])
def test_a_swapped_batch_norm_refuses_what_pytorchs_refuses(shape: tuple[int, ...]) -> None:
    """BatchNorm2d takes 4-D input only; its stand-in said nothing and normalised an unbatched
    (C, H, W) input along H (new-user audit, session 18)."""
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(4)).eval()
    dtt.optimize(model, policy="heuristic", overrides=None, check_speed=False)
    with torch.no_grad(), pytest.raises(ValueError, match="expected 4D input"):
        model(torch.randn(*shape))


class _ConvBnTail(torch.nn.Module):
    """A traced forward: conv, batch norm, the shortcut add and ReLU (one fused tail)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + x)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Sequential(
            torch.nn.Conv2d(4, 6, 3), torch.nn.BatchNorm2d(6), torch.nn.ReLU()
        ),
        _ConvBnTail,
    ],
    ids=["sequential", "residual-tail"],
)
def test_a_folded_batch_norm_refuses_an_unbatched_input_as_eager_does(make: type) -> None:
    """Conv2d takes an unbatched (C, H, W) input and BatchNorm2d refuses it: with the batch norm
    folded into the conv, the pair returned a tensor where eager raised (new-user audit,
    session 55). A batched input still runs folded, and matches."""
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = model(x)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    assert any(r.folded_into for r in report.swapped), "the batch norm is folded into the conv"
    with torch.no_grad():
        _close(model(x), expected)
        with pytest.raises(ValueError, match="expected 4D input"):
            model(torch.randn(4, 8, 8))
