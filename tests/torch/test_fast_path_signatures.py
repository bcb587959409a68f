"""The fast path's keys and caches (issue 22, item 2): a call whose signature differs from the
one seen before in anything (a stride, a dtype, a device, a shape, an option) takes the checked
path and gives the right answer; a swapped module whose weights change between calls is right;
training mode runs as PyTorch does. Engines: the ``engine`` fixture of ``test_fast_path``
("views": TORCH_ENGINE's plan through dnntune's kernel path; "pointers": a plan that, like
cuDNN's and Triton's, reads only the addresses of its tensors)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_fast_path import _prepared, engine  # noqa: F401  (engine: a fixture used below)
from torch import nn
from torch.nn.utils import parametrize

import dnntune.torch as dtt
from dnntune.torch._support import DnnTuneFallbackWarning

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    torch.testing.assert_close(got, want, **TOL)


def test_conv2d_signature_changes_after_the_first_call(engine: str) -> None:  # noqa: F811
    w, b = torch.randn(6, 4, 3, 3), torch.randn(6)
    x = torch.randn(2, 4, 7, 7)
    with torch.no_grad():
        for _ in range(2):
            _close(dtt.conv2d(x, w, b, 1, 1, activation="relu"), F.relu(F.conv2d(x, w, b, 1, 1)))
        seen = len(_prepared("conv2d"))
        nhwc = x.contiguous(memory_format=torch.channels_last)  # same shape, other strides
        _close(dtt.conv2d(nhwc, w, b, 1, 1, activation="relu"), F.relu(F.conv2d(x, w, b, 1, 1)))
        assert len(_prepared("conv2d")) == seen + 1  # its own signature, checked and prepared
        x3 = torch.randn(3, 4, 7, 7)  # another batch
        _close(dtt.conv2d(x3, w, b, 1, 1, activation="relu"), F.relu(F.conv2d(x3, w, b, 1, 1)))
        _close(dtt.conv2d(x, w, None, 1, 1), F.conv2d(x, w, None, 1, 1))  # no bias
        _close(dtt.conv2d(x, w, b, 2, 1), F.conv2d(x, w, b, 2, 1))  # another stride
        wt = w.transpose(0, 1).contiguous().transpose(0, 1)  # the weight in another layout
        _close(dtt.conv2d(x, wt, b, 1, 1), F.conv2d(x, w, b, 1, 1))
        with pytest.warns(DnnTuneFallbackWarning, match="dtype"):
            got = dtt.conv2d(x.double(), w.double(), b.double(), 1, 1, activation="relu")
        _close(got, F.relu(F.conv2d(x.double(), w.double(), b.double(), 1, 1)))
        with pytest.warns(DnnTuneFallbackWarning, match="meta"):  # another device
            got = dtt.conv2d(x.to("meta"), w.to("meta"), b.to("meta"), 1, 1)
        assert got.device.type == "meta" and got.shape == (2, 6, 7, 7)
        # a list where a tuple was: unhashable, not memoized, still right
        _close(dtt.conv2d(x, w, b, [1, 1], [1, 1]), F.conv2d(x, w, b, 1, 1))
        _close(dtt.conv2d(x, w, b, 1, 1, activation="relu"), F.relu(F.conv2d(x, w, b, 1, 1)))


def test_linear_signature_changes_after_the_first_call(engine: str) -> None:  # noqa: F811
    w, b = torch.randn(12, 16), torch.randn(12)
    x = torch.randn(5, 16)
    with torch.no_grad():
        for _ in range(2):
            _close(dtt.linear(x, w, b, activation="gelu"), F.gelu(F.linear(x, w, b)))
        xt = torch.randn(16, 5).t()  # other strides
        _close(dtt.linear(xt, w, b, activation="gelu"), F.gelu(F.linear(xt, w, b)))
        x3 = torch.randn(2, 5, 16)  # another rank
        for _ in range(2):
            _close(dtt.linear(x3, w, b), F.linear(x3, w, b))
        wt = w.t().contiguous().t()  # a transposed weight
        _close(dtt.linear(x, wt, b, activation="gelu"), F.gelu(F.linear(x, w, b)))
        _close(dtt.linear(x, w, None), F.linear(x, w))
        with pytest.warns(DnnTuneFallbackWarning, match="dtype"):
            got = dtt.linear(x.double(), w.double(), b.double())
        _close(got, F.linear(x.double(), w.double(), b.double()))
        _close(dtt.linear(x, w, b, activation="gelu"), F.gelu(F.linear(x, w, b)))


def test_norm_signature_changes_after_the_first_call(engine: str) -> None:  # noqa: F811
    x = torch.randn(6, 4, 8)
    w, bias = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        for shape in ((4, 8), [4, 8], (4, 8)):  # a list is read as the tuple it holds
            _close(dtt.layer_norm(x, shape, w, bias), F.layer_norm(x, (4, 8), w, bias))
        wt = torch.randn(8, 4).t()  # the same shape in another (non-contiguous) layout
        _close(dtt.layer_norm(x, (4, 8), wt, bias), F.layer_norm(x, (4, 8), wt, bias))
        _close(dtt.layer_norm(x, (4, 8), wt, bias), F.layer_norm(x, (4, 8), wt, bias))
        _close(dtt.layer_norm(x, (4, 8), None, bias), F.layer_norm(x, (4, 8), None, bias))
        _close(dtt.layer_norm(x, (4, 8), w, bias, 1e-3), F.layer_norm(x, (4, 8), w, bias, 1e-3))
        xs = x[:, :, ::1].transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous input
        for _ in range(2):
            _close(dtt.layer_norm(xs, (4, 8), w, bias), F.layer_norm(xs, (4, 8), w, bias))
        _close(dtt.layer_norm(x, 8, w[0], None), F.layer_norm(x, (8,), w[0], None))
        for eps in (1e-6, None, None):
            _close(dtt.rms_norm(x, (4, 8), w, eps), F.rms_norm(x, (4, 8), w, eps))
        _close(dtt.rms_norm(x, (4, 8), wt, 1e-6), F.rms_norm(x, (4, 8), wt, 1e-6))
        with pytest.warns(DnnTuneFallbackWarning, match="dtype"):
            got = dtt.layer_norm(x.double(), (4, 8), w.double(), bias.double())
        _close(got, F.layer_norm(x.double(), (4, 8), w.double(), bias.double()))


def test_pooling_and_attention_signature_changes(engine: str) -> None:  # noqa: F811
    img = torch.randn(1, 4, 8, 8)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.randn(8, 8)
    with torch.no_grad():
        for _ in range(2):
            _close(dtt.max_pool2d(img, 2), F.max_pool2d(img, 2))
            _close(dtt.avg_pool2d(img, 2), F.avg_pool2d(img, 2))
        seen = len(_prepared("max_pool2d"))
        _close(dtt.max_pool2d(img, [2, 2]), F.max_pool2d(img, 2))  # a list: not memoized
        assert len(_prepared("max_pool2d")) == seen
        _close(dtt.max_pool2d(img, 3, 1, 1), F.max_pool2d(img, 3, 1, 1))
        nhwc = img.contiguous(memory_format=torch.channels_last)
        _close(dtt.max_pool2d(nhwc, 2), F.max_pool2d(img, 2))
        with pytest.warns(DnnTuneFallbackWarning, match="ceil_mode"):  # an option it lacks
            _close(dtt.max_pool2d(img, 3, ceil_mode=True), F.max_pool2d(img, 3, ceil_mode=True))
        _close(dtt.max_pool2d(img, 2), F.max_pool2d(img, 2))  # the first signature again
        _close(
            dtt.avg_pool2d(img, 3, 1, 1, count_include_pad=False),
            F.avg_pool2d(img, 3, 1, 1, count_include_pad=False),
        )
        for _ in range(2):
            want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            _close(dtt.scaled_dot_product_attention(q, k, v, is_causal=True), want)
        want = F.scaled_dot_product_attention(q, k, v, mask)
        _close(dtt.scaled_dot_product_attention(q, k, v, mask), want)
        _close(dtt.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
        kt = k.transpose(1, 2).contiguous().transpose(1, 2)  # other strides
        want = F.scaled_dot_product_attention(q, kt, v, is_causal=True)
        _close(dtt.scaled_dot_product_attention(q, kt, v, is_causal=True), want)


def test_gradients_wanted_after_inference_calls_take_autograd(engine: str) -> None:  # noqa: F811
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    with torch.no_grad():
        dtt.linear(x, w, b)
        dtt.layer_norm(x, (16,))
    wg = w.clone().requires_grad_()
    y = dtt.linear(x, wg, b)  # gradients wanted: another signature
    y.sum().backward()
    assert wg.grad is not None
    torch.testing.assert_close(wg.grad, torch.ones(4, 8).t() @ x, **TOL)
    xg = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DnnTuneFallbackWarning)  # an expected route (session 15)
        out = dtt.layer_norm(xg, (16,))
    out.square().sum().backward()
    assert xg.grad is not None


# ---- swapped modules --------------------------------------------------------------------------
class _Scale(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 2.0


def _models() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(16, 12), nn.GELU()),
        nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 8)),
        nn.Sequential(nn.RMSNorm(16, eps=1e-6), nn.Linear(16, 8, bias=False)),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["linear+gelu", "layernorm", "rmsnorm"])
def test_module_weights_changed_replaced_or_parametrized(engine: str, index: int) -> None:  # noqa: F811
    model = _models()[index].eval()
    eager = copy.deepcopy(model)
    dtt.optimize(model, policy="heuristic", overrides=None, check_speed=False)
    x = torch.randn(5, 16)

    def both(fn: Any) -> None:
        for m in (model, eager):
            fn(m)

    with torch.no_grad():
        _close(model(x), eager(x))
        both(lambda m: [p.mul_(0.5) for p in m.parameters()])  # in place
        _close(model(x), eager(x))
        new = torch.randn_like(eager[0].weight)
        both(lambda m: setattr(m[0], "weight", nn.Parameter(new.clone())))  # replaced
        _close(model(x), eager(x))
        at = 0 if index == 0 else -1  # the model's Linear
        shape = tuple(model[at].weight.shape)
        both(lambda m: setattr(m[at].weight, "data", torch.randn(shape) + 1))
        eager[at].weight.data.copy_(model[at].weight.data)
        _close(model(x), eager(x))  # a .data assignment (no version bump)
    both(lambda m: parametrize.register_parametrization(m[0], "weight", _Scale()))
    with torch.no_grad():
        _close(model(x), eager(x))  # the parametrized weight, not the raw parameter


def test_folded_batch_norm_cache_sees_every_change(engine: str) -> None:  # noqa: F811
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.eval()
    eager = copy.deepcopy(model)
    dtt.optimize(model, policy="heuristic", overrides=None, check_speed=False)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        for _ in range(2):
            _close(model(x), eager(x))
        for m in (model, eager):  # a .data assignment: same object, same version, new memory
            m[1].running_var.data = torch.rand(8) + 0.5
        eager[1].running_var.data.copy_(model[1].running_var.data)
        _close(model(x), eager(x))
        for m in (model, eager):
            m[1].eps = 1e-2
        _close(model(x), eager(x))
        twin = copy.deepcopy(model)  # a copy of a run model carries its cache: still right
        twin_eager = copy.deepcopy(eager)
        _close(twin(x), twin_eager(x))
        del model
        for m in (twin, twin_eager):
            m[1].register_buffer("running_mean", torch.zeros(8))  # swapped after the original died
        _close(twin(x), twin_eager(x))
        # a dtype change (Module.to assigns .data): dnntune falls back, the fold is redone
        twin.double()
        twin_eager.double()
        with pytest.warns(DnnTuneFallbackWarning, match="dtype"):
            _close(twin(x.double()), twin_eager(x.double()))


def test_training_mode_runs_as_pytorch_and_eval_sees_the_updates(engine: str) -> None:  # noqa: F811
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(128, 4)
    )
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 4, 4)
    model.eval()
    dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    eager.eval()
    with torch.no_grad():
        _close(model(x), eager(x))
    model.train()
    eager.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        for m, o in ((model, opt), (eager, opt_eager)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL)  # same gradients, same steps
    for m in (model, eager):
        m.eval()
    with torch.no_grad():
        for _ in range(2):
            _close(model(x), eager(x))  # the fold and the kernels see the trained weights
