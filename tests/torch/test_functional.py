"""dnntune.torch functional ops against the PyTorch ops they replace (CPU; gpu-marked on CUDA)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import dnntune.torch as dtt
from dnntune.torch import runtime

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _close(a: torch.Tensor, b: torch.Tensor, **tol: float) -> None:
    torch.testing.assert_close(a, b, **(tol or TOL))


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True, params=["dnntune", "native"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: "dnntune" runs every selected kernel through its dnntune graph;
    "native" takes the path used when the winner is PyTorch's own op as eager code runs it
    (``Kernel.native``): PyTorch's op is called directly, and trains through its autograd."""
    native = request.param == "native"
    monkeypatch.setattr(runtime.Kernel, "native", property(lambda self: native))
    return str(request.param)


def test_conv2d_matches_torch(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 9, 9, generator=g).to(device)
    w = torch.randn(12, 4, 3, 3, generator=g).to(device)  # groups=2
    b = torch.randn(12, generator=g).to(device)
    r = torch.randn(2, 12, 5, 5, generator=g).to(device)
    y = dtt.conv2d(x, w, b, stride=2, padding=(1, 1), dilation=1, groups=2)
    _close(y, F.conv2d(x, w, b, 2, 1, 1, 2))
    fused = dtt.conv2d(x, w, b, 2, 1, 1, 2, activation="relu", residual=r)
    _close(fused, torch.relu(F.conv2d(x, w, b, 2, 1, 1, 2) + r))


def test_conv2d_channels_last_layout_kept(device: str) -> None:
    x = torch.randn(1, 8, 6, 6, device=device).to(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 1, 1, device=device).to(memory_format=torch.channels_last)
    y = dtt.conv2d(x, w)
    _close(y, F.conv2d(x, w))
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_linear_with_activation_and_batch_dims(device: str) -> None:
    x = torch.randn(2, 3, 16, device=device)
    w = torch.randn(8, 16, device=device)
    b = torch.randn(8, device=device)
    _close(dtt.linear(x, w, b), F.linear(x, w, b))
    _close(dtt.linear(x, w, b, activation="gelu"), F.gelu(F.linear(x, w, b)))
    _close(dtt.linear(x, w, None, activation="silu"), F.silu(F.linear(x, w)))


def test_conv2d_and_linear_backward_match_torch(device: str, path: str) -> None:
    # "native": the forward's winner is PyTorch's own op, so training runs PyTorch's op and
    # autograd; "dnntune": any other winner, backward on dnntune dgrad/wgrad/matmul graphs
    native = path == "native"
    x = torch.randn(2, 4, 7, 7, device=device, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device=device, requires_grad=True)
    b = torch.randn(6, device=device, requires_grad=True)
    y = dtt.conv2d(x, w, b, stride=2, padding=1, activation="relu")
    grad = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, w, b), grad)
    ref_y = torch.relu(F.conv2d(x, w, b, 2, 1))
    theirs = torch.autograd.grad(ref_y, (x, w, b), grad)
    for a, e in zip(ours, theirs, strict=True):
        _close(a, e, atol=1e-3, rtol=1e-3)

    xl = torch.randn(5, 16, device=device, requires_grad=True)
    wl = torch.randn(8, 16, device=device, requires_grad=True)
    bl = torch.randn(8, device=device, requires_grad=True)
    yl = dtt.linear(xl, wl, bl)
    gl = torch.randn_like(yl)
    ours = torch.autograd.grad(yl, (xl, wl, bl), gl)
    theirs = torch.autograd.grad(F.linear(xl, wl, bl), (xl, wl, bl), gl)
    for a, e in zip(ours, theirs, strict=True):
        _close(a, e, atol=1e-3, rtol=1e-3)
    grads = {"conv2d_dgrad", "conv2d_wgrad", "torch_linear_dgrad", "torch_linear_wgrad"}
    ops = {key[0][0] for key in runtime.cache()._items}
    assert ops & grads == (set() if native else grads), ops
    # a [1, out] bias (F.linear broadcasts it): its gradient in its own shape, in either grad
    # mode of the backward (create_graph: PyTorch's differentiable ops)
    row = torch.randn(1, 8, device=device, requires_grad=True)
    for create_graph in (False, True):
        (ours_db,) = torch.autograd.grad(
            dtt.linear(xl, wl, row), row, gl, create_graph=create_graph
        )
        (theirs_db,) = torch.autograd.grad(F.linear(xl, wl, row), row, gl)
        assert ours_db.shape == (1, 8)
        _close(ours_db, theirs_db, atol=1e-3, rtol=1e-3)


def test_sdpa_causal_mask_and_gqa(device: str) -> None:
    q = torch.randn(1, 4, 6, 8, device=device)
    k = torch.randn(1, 2, 6, 8, device=device)
    v = torch.randn(1, 2, 6, 8, device=device)
    ours = dtt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    _close(ours, F.scaled_dot_product_attention(q, kk, vv, is_causal=True))
    mask = torch.randn(1, 1, 6, 6, device=device)
    _close(
        dtt.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=0.3),
        F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=0.3),
    )


def test_sdpa_output_is_laid_out_as_its_query(device: str, path: str) -> None:
    """A query viewed from a QKV projection ([B, S, 3, H, D] permuted to [B, H, S, D], as ViT,
    BERT and LLaMA blocks make it) gives an output laid out [B, S, H, D] in memory, as PyTorch's
    fused kernels give theirs: the block's transpose and reshape back to [B, S, H*D] are then
    views, not a copy per block. A row-major query keeps a row-major output. ("native": PyTorch's
    op runs the call and lays out its output itself; its efficient kernel on CUDA gives
    [B, S, H, D] even for a row-major query.)"""
    b, s, h, d = 2, 5, 3, 8
    qkv = torch.randn(b, s, 3 * h * d, device=device)
    q, k, v = qkv.reshape(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    ours = dtt.scaled_dot_product_attention(q, k, v)
    _close(ours, F.scaled_dot_product_attention(q, k, v))
    assert ours.transpose(1, 2).is_contiguous(), ours.stride()
    merged = ours.transpose(1, 2).reshape(b, s, h * d)
    assert merged.data_ptr() == ours.data_ptr()  # a view
    plain = dtt.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())
    _close(plain, ours)
    assert plain.is_contiguous() or path == "native"


def test_sdpa_output_layout_rules() -> None:
    from dnntune.torch.graphs import layout_like

    bshd = torch.empty(2, 5, 3, 8).transpose(1, 2)
    assert layout_like(bshd, [2, 3, 5, 8]) == [120, 8, 24, 1]
    assert layout_like(torch.empty(2, 3, 5, 8), [2, 3, 5, 8]) == [120, 40, 8, 1]
    # one query position (decode): heads and positions tie, dim order kept (row-major)
    assert layout_like(torch.empty(2, 3, 1, 8), [2, 3, 1, 8]) == [24, 8, 8, 1]
    # a head dimension that is not innermost: row-major
    d_outer = torch.empty(2, 8, 3, 5).permute(0, 2, 3, 1)
    assert layout_like(d_outer, [2, 3, 5, 8]) == [120, 40, 8, 1]
    # the value's head dimension sizes the output
    assert layout_like(bshd, [2, 3, 5, 16]) == [240, 16, 48, 1]


@pytest.mark.parametrize("shape", [(2, 1, 1, 6), (2, 1, 5, 6), (5, 6)])
def test_sdpa_boolean_mask_runs_pytorchs_op_quietly(
    device: str,
    shape: tuple[int, ...],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A boolean mask (True: attend), as Hugging Face models pass it: PyTorch's own op runs
    the call, with no fall-back warning (warnings are errors here), no dnntune plan, and one
    INFO line."""
    from dnntune.torch import _attention

    monkeypatch.setattr(_attention, "_noted", set())
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 5, 8, generator=g).to(device)
    k = torch.randn(2, 3, 6, 8, generator=g).to(device)
    v = torch.randn(2, 3, 6, 8, generator=g).to(device)
    mask = torch.rand(shape, generator=g) < 0.7
    mask[..., 0] = True  # every query attends to something
    mask = mask.to(device)
    with caplog.at_level("INFO", logger="dnntune.torch.functional"):
        for _ in range(2):
            _close(
                dtt.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            )
    assert not any(key[0][0] == "sdpa" for key in runtime.cache()._items)
    notes = [r for r in caplog.records if "boolean attn_mask" in r.getMessage()]
    assert len(notes) == 1


def test_norms_and_batchnorm_and_pooling(device: str) -> None:
    x = torch.randn(3, 5, 16, device=device)
    w, b = torch.randn(16, device=device), torch.randn(16, device=device)
    _close(dtt.layer_norm(x, (16,), w, b, 1e-5), F.layer_norm(x, (16,), w, b, 1e-5))
    _close(dtt.layer_norm(x, [5, 16]), F.layer_norm(x, [5, 16]))
    _close(dtt.rms_norm(x, (16,), w, 1e-6), F.rms_norm(x, (16,), w, 1e-6))
    img = torch.randn(2, 4, 9, 9, device=device)
    mean, var = torch.randn(4, device=device), torch.rand(4, device=device) + 0.5
    gamma, beta = torch.randn(4, device=device), torch.randn(4, device=device)
    _close(dtt.batch_norm(img, mean, var, gamma, beta), F.batch_norm(img, mean, var, gamma, beta))
    _close(dtt.max_pool2d(img, 3, 2, 1), F.max_pool2d(img, 3, 2, 1))
    _close(dtt.avg_pool2d(img, 3, 2, 1), F.avg_pool2d(img, 3, 2, 1))
    _close(
        dtt.avg_pool2d(img, 3, 2, 1, count_include_pad=False),
        F.avg_pool2d(img, 3, 2, 1, count_include_pad=False),
    )


def test_unsupported_dtype_falls_back_with_one_warning() -> None:
    x = torch.randn(2, 3, dtype=torch.float64)
    w = torch.randn(4, 3, dtype=torch.float64)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="float64"):
        y = dtt.linear(x, w)
    _close(y, F.linear(x, w))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dtt.linear(x, w)  # second time: no warning


def test_unmodelled_options_fall_back() -> None:
    img = torch.randn(1, 2, 7, 7)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="ceil_mode"):
        y = dtt.max_pool2d(img, 2, ceil_mode=True)
    _close(y, F.max_pool2d(img, 2, ceil_mode=True))


def test_bad_arguments_raise_like_torch() -> None:
    with pytest.raises(ValueError, match="activation"):
        dtt.linear(torch.randn(2, 3), torch.randn(4, 3), activation="swishy")
    with pytest.raises(RuntimeError, match="to have 8 channels, but got 4 channels"):
        dtt.conv2d(torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3, 3), groups=2)  # PyTorch's


def test_plan_cache_is_bounded_lru() -> None:
    dtt.configure(cache_size=2)
    w = torch.randn(4, 8)
    for m in (1, 2, 3, 4):
        dtt.linear(torch.randn(m, 8), w)
    assert len(runtime.cache()) == 2


def test_concurrent_callers_get_correct_results() -> None:
    w = torch.randn(8, 16)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(5):
                x = torch.randn(4, 16, generator=g)
                torch.testing.assert_close(dtt.linear(x, w), F.linear(x, w))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(runtime.cache()) == 1  # one build for the one signature


def test_linear_multiplier_forward_backward_memo_and_fallback(device: str) -> None:
    """``multiplier``: the result times a tensor of its shape, last (a gated MLP's up
    projection times its activated gate) as one graph; later calls of the signature through
    the call memo; gradients as PyTorch's; a multiplier of another shape runs PyTorch's ops."""
    x = torch.randn(2, 3, 16, device=device, requires_grad=True)
    w = torch.randn(8, 16, device=device, requires_grad=True)
    b = torch.randn(8, device=device, requires_grad=True)
    m = torch.randn(2, 3, 8, device=device, requires_grad=True)
    r = torch.randn(2, 3, 8, device=device)
    with torch.no_grad():
        for _ in range(3):  # the first call, then the memo's prepared call
            _close(dtt.linear(x, w, multiplier=m), F.linear(x, w) * m)
        _close(
            dtt.linear(x, w, b, activation="silu", residual=r, multiplier=m),
            F.silu(F.linear(x, w, b) + r) * m,
        )
    ours = torch.autograd.grad(dtt.linear(x, w, b, multiplier=m).square().sum(), (x, w, b, m))
    theirs = torch.autograd.grad((F.linear(x, w, b) * m).square().sum(), (x, w, b, m))
    for a, e in zip(ours, theirs, strict=True):
        _close(a, e, atol=1e-3, rtol=1e-3)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="multiplier of shape"), torch.no_grad():
        _close(dtt.linear(x, w, b, multiplier=m[:1]), F.linear(x, w, b) * m[:1])


def test_linear_residual_forward_backward_and_fallback(device: str) -> None:
    x = torch.randn(2, 3, 16, device=device, requires_grad=True)
    w = torch.randn(8, 16, device=device, requires_grad=True)
    b = torch.randn(8, device=device, requires_grad=True)
    r = torch.randn(2, 3, 8, device=device, requires_grad=True)
    with torch.no_grad():
        _close(dtt.linear(x, w, b, residual=r, activation="gelu"), F.gelu(F.linear(x, w, b) + r))
    ours = torch.autograd.grad(dtt.linear(x, w, b, residual=r).square().sum(), (x, w, b, r))
    theirs = torch.autograd.grad((F.linear(x, w, b) + r).square().sum(), (x, w, b, r))
    for a, e in zip(ours, theirs, strict=True):
        _close(a, e, atol=1e-3, rtol=1e-3)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="residual of shape"), torch.no_grad():
        _close(dtt.linear(x, w, b, residual=r[:1]), F.linear(x, w, b) + r[:1])
