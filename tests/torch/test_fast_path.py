"""dnntune.torch's fast path (issue 22): a signature seen before runs its prepared call.

Every later call must still be right: new input buffers, weights updated in place or replaced,
a buffer freed and another tensor at its address. On the CPU the plans are TORCH_ENGINE's,
taken through dnntune's kernel path ("views": the kernel gets the views it was built with) or
through a plan that, like cuDNN's and Triton's, reads only the addresses of its tensors
("pointers": the kernel gets the op's raw tensors). On CUDA (gpu-marked) the plans are
CUDNN_ENGINE's and TRITON_ENGINE's.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import kernel_plan

import dnntune as dt
import dnntune.torch as dtt
from dnntune.backend.engine import BoundCall, Plan
from dnntune.torch import runtime
from dnntune.torch._support import DnnTuneFallbackWarning

TOL = {"atol": 1e-4, "rtol": 1e-4}


_ADDRESS_PLANS: list[_AddressPlan] = []


class _AddressPlan(Plan):
    """Reads only where its tensors start: rebuilds each one with the graph's dims and strides
    at that address (as cuDNN and Triton kernels do) and runs the TORCH_ENGINE plan on them."""

    takes_pointers = True

    def __init__(self, inner: Plan, graph: dt.Graph) -> None:
        super().__init__(inner.engine, inner.knob_settings, inner.workspace_size)
        self.inner = inner
        self.layouts = {t.uid: (list(t.dims), list(t.strides)) for t in graph.io_tensors()}
        #: the shapes of the tensors of each call (the op's raw tensors on the direct path)
        self.shapes: list[tuple[tuple[int, ...], ...]] = []
        _ADDRESS_PLANS.append(self)

    def execute(self, variant_pack: Any, workspace: Any, stream: Any = None) -> None:
        raise AssertionError("dnntune.torch runs bound calls")

    def bind(self, uids: Sequence[int]) -> BoundCall:
        layouts = [self.layouts[u] for u in uids]
        inner = self.inner.bind(uids)

        def call(tensors: Sequence[torch.Tensor], workspace: torch.Tensor | None) -> None:
            self.shapes.append(tuple(tuple(t.shape) for t in tensors))
            # the memory as it is: a lazy negative view's bit is not read (as cuDNN's kernels)
            raw = [torch._neg_view(t) if t.is_neg() else t for t in tensors]
            at = [t.as_strided(d, s) for t, (d, s) in zip(raw, layouts, strict=True)]
            inner(at, workspace)

        return call


@pytest.fixture(
    params=[
        "views",
        "pointers",
        pytest.param("CUDNN_ENGINE", marks=pytest.mark.gpu),
        pytest.param("TRITON_ENGINE", marks=pytest.mark.gpu),
    ]
)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every kernel dnntune.torch selects is this engine's default plan (never PyTorch's op)."""
    kind = str(request.param)
    name = "TORCH_ENGINE" if kind in ("views", "pointers") else kind
    if kind not in ("views", "pointers"):
        from dnntune.backend.registry import get_registry

        try:
            get_registry().get(name).check_available()
        except dt.DnnTuneError as exc:
            pytest.skip(f"{name}: {exc}")

    def build(graph: dt.Graph, handle: dt.Handle) -> Plan:
        plan = kernel_plan(graph, handle, name)
        return _AddressPlan(plan, graph) if kind == "pointers" else plan

    monkeypatch.setattr(runtime, "_heuristic", build)
    dtt.configure(policy="heuristic", overrides="does-not-exist.json")
    yield kind


def _device(engine: str) -> str:
    return "cpu" if engine in ("views", "pointers") else "cuda"


def _tol(engine: str) -> dict[str, float]:
    return TOL if _device(engine) == "cpu" else {"atol": 2e-2, "rtol": 2e-2}


def _dtype(engine: str) -> torch.dtype:
    return torch.float32 if _device(engine) == "cpu" else torch.float16


def _prepared(key_op: str) -> list[Any]:
    """The prepared calls the memo holds for ``key_op`` (under the current config)."""
    entry = runtime.native_memo._calls.get(id(dtt.config.current()))
    assert entry is not None
    return [v for k, v in entry[1].items() if k[0] == key_op]


def test_conv2d_new_buffers_in_place_updates_and_reused_addresses(engine: str) -> None:
    dev, dtype, tol = _device(engine), _dtype(engine), _tol(engine)
    kw: dict[str, Any] = {"device": dev, "dtype": dtype}
    x = torch.randn(2, 8, 6, 6, **kw)
    w, b = torch.randn(8, 8, 3, 3, **kw), torch.randn(8, **kw)

    def check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> None:
        got = dtt.conv2d(x, w, b, 1, 1, activation="relu")
        torch.testing.assert_close(got, F.relu(F.conv2d(x, w, b, 1, 1)), **tol)

    with torch.no_grad():
        check(x, w, b)
        assert _prepared("conv2d"), "the signature's prepared call is remembered"
        check(torch.randn_like(x), w, b)  # new input buffer
        w.mul_(0.5)  # weights updated in place (an optimizer step, load_state_dict)
        b.add_(1.0)
        check(x, w, b)
        check(x, w.clone(), b.clone())  # weights replaced by other tensors
        # a buffer freed and another tensor at its address
        storage = torch.empty(x.numel() * 2, **kw)
        first = storage[: x.numel()].view_as(x).copy_(x)
        check(first, w, b)
        del first
        second = storage[: x.numel()].view_as(x).normal_()
        check(second, w, b)
    if engine == "pointers":  # later calls passed the bias as given, not as [1, C, 1, 1] (the
        # first of the seven runs is the heuristic plan's check, :func:`runtime._checked_heuristic`)
        assert ((8,) in _ADDRESS_PLANS[-1].shapes[-1]) and len(_ADDRESS_PLANS[-1].shapes) == 7


def test_linear_3d_inputs_and_weight_updates(engine: str) -> None:
    dev, dtype, tol = _device(engine), _dtype(engine), _tol(engine)
    kw: dict[str, Any] = {"device": dev, "dtype": dtype}
    w, b = torch.randn(24, 16, **kw), torch.randn(24, **kw)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 5, 16, **kw)
            got = dtt.linear(x, w, b, activation="gelu")
            assert got.shape == (2, 5, 24) and got.is_contiguous()
            torch.testing.assert_close(got, F.gelu(F.linear(x, w, b)), **tol)
            w.add_(0.25)
        if engine == "pointers":  # the weight as given (not transposed), the input as 3-D
            assert _ADDRESS_PLANS[-1].shapes[-1][:2] == ((2, 5, 16), (24, 16))
        r = torch.randn(2, 5, 24, **kw)
        for _ in range(2):
            got = dtt.linear(x, w, None, residual=r)
            torch.testing.assert_close(got, F.linear(x, w) + r, **tol)
        # a non-contiguous input: its prepared call copies it, as the first call did
        xt = torch.randn(16, 10, **kw).t()
        for _ in range(2):
            torch.testing.assert_close(dtt.linear(xt, w, b), F.linear(xt, w, b), **tol)


def test_norms_sdpa_and_pooling_seen_twice(engine: str) -> None:
    dev, dtype, tol = _device(engine), _dtype(engine), _tol(engine)
    kw: dict[str, Any] = {"device": dev, "dtype": dtype}
    lw, lb = torch.randn(32, **kw), torch.randn(32, **kw)
    q, k, v = (torch.randn(1, 2, 16, 32, **kw) for _ in range(3))
    img = torch.randn(1, 4, 8, 8, **kw)
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(4, 32, **kw)
            torch.testing.assert_close(
                dtt.layer_norm(x, (32,), lw, lb), F.layer_norm(x, (32,), lw, lb), **tol
            )
            torch.testing.assert_close(
                dtt.layer_norm(x, (32,)), F.layer_norm(x, (32,)), **tol
            )  # no weight, no bias: constants the prepared call holds
            torch.testing.assert_close(
                dtt.rms_norm(x, [32], lw, 1e-6), F.rms_norm(x, [32], lw, 1e-6), **tol
            )
            torch.testing.assert_close(
                dtt.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v, is_causal=True),
                **tol,
            )
            torch.testing.assert_close(dtt.max_pool2d(img, 2), F.max_pool2d(img, 2), **tol)
            lw.mul_(1.5)  # in place: seen by the next call
            q = q + step  # a new buffer


def test_module_with_folded_batch_norm_sees_statistics_updates(engine: str) -> None:
    dev, dtype, tol = _device(engine), _dtype(engine), _tol(engine)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    model = model.to(device=dev, dtype=dtype).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    eager = _copy(model)
    dtt.optimize(model, policy="heuristic", overrides=None, check_speed=False)
    x = torch.randn(2, 4, 6, 6, device=dev, dtype=dtype)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x), eager(x), **tol)
        for m in (model, eager):  # statistics and weights changed in place
            m[1].running_var.mul_(3.0)
            m[0].weight.mul_(-1.0)
        torch.testing.assert_close(model(x), eager(x), **tol)
        new_var = torch.rand_like(model[1].running_var) + 0.5  # a swapped buffer
        model[1].running_var = new_var
        eager[1].running_var = new_var.clone()
        torch.testing.assert_close(model(x), eager(x), **tol)


def _copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


def test_pytorch_forced_modules_and_attribution_bypass_the_memo(engine: str) -> None:
    if engine != "views":
        pytest.skip("the memo's bypass does not depend on the engine")
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    with torch.no_grad():
        dtt.linear(x, w)
        (call,) = _prepared("linear")
        with runtime.using_module("layer"):  # optimize() building its report
            dtt.linear(x, w)
        assert runtime.module_plans.get("layer")
        dtt.linear(x, w)  # a memo hit: the call site's entry is made
        from dnntune.torch import functional

        assert functional._linear_sites
        runtime.cache().clear()  # cleared with the kernel cache, and the sites' entries too
        assert runtime.native_memo.lookup(("linear",)) is None
        assert not functional._linear_sites
        dtt.linear(x, w)
        assert _prepared("linear") and _prepared("linear")[0] is not call


def test_gradients_wanted_never_take_an_inference_call(engine: str) -> None:
    if engine != "views":
        pytest.skip("independent of the engine")
    x = torch.randn(4, 16)
    w = torch.randn(8, 16, requires_grad=True)
    with torch.no_grad():
        dtt.layer_norm(x, (16,))
        dtt.linear(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DnnTuneFallbackWarning)  # an expected route: no warning
        y = dtt.layer_norm(x.requires_grad_(), (16,))  # another signature: PyTorch's autograd
    assert y.requires_grad
    out = dtt.linear(x, w)
    out.sum().backward()
    assert w.grad is not None


@pytest.mark.parametrize(
    ("cuda_graph", "ranking_metric", "clock"),
    [(False, None, "latency"), (True, None, "latency"), (True, "device", "device")],
)
def test_uncaptured_tuning_ranks_on_call_latency(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    cuda_graph: bool,
    ranking_metric: Any,
    clock: str,
) -> None:
    """Decided in the conditions of use: an uncaptured forward pays each layer's host submit,
    so it tunes on the clock that includes it: without cuda_graph, and with it when the
    forward cannot be replayed (here: on the CPU), unless the caller chose the clock."""
    clocks: list[str] = []
    real = dt.Graph.autotune

    def spy(self: dt.Graph, *args: Any, **kwargs: Any) -> Any:
        config = args[4] if len(args) > 4 else kwargs.get("config")
        clocks.append(config.ranking_metric)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(dt.Graph, "autotune", spy)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    dtt.optimize(
        model,
        (torch.randn(4, 16),),
        policy="tune",
        overrides=tmp_path / "o.json",
        check_speed=False,
        cuda_graph=cuda_graph,
        ranking_metric=ranking_metric,
    )
    assert clocks and clocks[-1] == clock
    clocks.clear()
    with torch.no_grad():
        model(torch.randn(3, 16))  # a new shape, tuned in the forward that will run it
    assert clocks and set(clocks) == {clock}


def test_call_sites_follow_every_change_of_signature(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call site (an op's weight; attention and pooling: the op) runs its last signature
    after one C++ tensor check (:class:`dnntune.torch._memo.Recent`), without the memo's key;
    any other input shape, dtype, layout, missing tensor or option takes the memo again, and
    every answer is PyTorch's."""
    dev, dtype, tol = _device(engine), _dtype(engine), _tol(engine)
    kw: dict[str, Any] = {"device": dev, "dtype": dtype}
    w, b = torch.randn(16, 32, **kw), torch.randn(16, **kw)
    lw, lb = torch.randn(32, **kw), torch.randn(32, **kw)
    cw, cb = torch.randn(8, 4, 3, 3, **kw), torch.randn(8, **kw)
    q, k, v = (torch.randn(1, 2, 16, 32, **kw) for _ in range(3))
    mask = torch.randn(1, 1, 16, 16, **kw)
    img = torch.randn(1, 4, 8, 8, **kw)
    x2, x3 = torch.randn(4, 32, **kw), torch.randn(2, 3, 32, **kw)
    xt = torch.randn(32, 4, **kw).t()  # another layout of the same shape
    calls: list[tuple[Any, Any]] = [
        (lambda: dtt.linear(x2, w, b), lambda: F.linear(x2, w, b)),
        (lambda: dtt.linear(x3, w, b), lambda: F.linear(x3, w, b)),
        (lambda: dtt.linear(xt, w, b), lambda: F.linear(xt, w, b)),
        (lambda: dtt.linear(x2, w), lambda: F.linear(x2, w)),
        (lambda: dtt.linear(x2, w, b, activation="relu"), lambda: F.relu(F.linear(x2, w, b))),
        (lambda: dtt.layer_norm(x2, (32,), lw, lb), lambda: F.layer_norm(x2, (32,), lw, lb)),
        (lambda: dtt.layer_norm(x2, (32,), lw), lambda: F.layer_norm(x2, (32,), lw)),
        (lambda: dtt.layer_norm(x3, (32,), lw, lb), lambda: F.layer_norm(x3, (32,), lw, lb)),
        (
            lambda: dtt.layer_norm(x2, (32,), lw, lb, eps=1e-2),
            lambda: F.layer_norm(x2, (32,), lw, lb, eps=1e-2),
        ),
        (lambda: dtt.rms_norm(x2, (32,), lw, 1e-6), lambda: F.rms_norm(x2, (32,), lw, 1e-6)),
        (lambda: dtt.rms_norm(x3, (32,), lw, 1e-6), lambda: F.rms_norm(x3, (32,), lw, 1e-6)),
        (lambda: dtt.conv2d(img, cw, cb, 1, 1), lambda: F.conv2d(img, cw, cb, 1, 1)),
        (lambda: dtt.conv2d(img, cw, cb, 2, 1), lambda: F.conv2d(img, cw, cb, 2, 1)),
        (lambda: dtt.conv2d(img, cw, None, 1, 0), lambda: F.conv2d(img, cw, None, 1, 0)),
        (
            lambda: dtt.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        (
            lambda: dtt.scaled_dot_product_attention(q, k, v, mask),
            lambda: F.scaled_dot_product_attention(q, k, v, mask),
        ),
        (
            lambda: dtt.scaled_dot_product_attention(q, k, v, scale=0.5),
            lambda: F.scaled_dot_product_attention(q, k, v, scale=0.5),
        ),
        (lambda: dtt.max_pool2d(img, 2), lambda: F.max_pool2d(img, 2)),
        (lambda: dtt.max_pool2d(img, 3, 1), lambda: F.max_pool2d(img, 3, 1)),
        (lambda: dtt.avg_pool2d(img, 2), lambda: F.avg_pool2d(img, 2)),
    ]
    with torch.no_grad():
        for ours, theirs in calls:  # each signature seen once: the memo has them all
            torch.testing.assert_close(ours(), theirs(), **tol)
        keys: list[Any] = []
        lookup = runtime.native_memo.lookup
        monkeypatch.setattr(
            runtime.native_memo, "lookup", lambda key: keys.append(key) or lookup(key)
        )
        for _ in range(2):  # every site switches signature on every call: the memo answers
            for ours, theirs in calls:
                torch.testing.assert_close(ours(), theirs(), **tol)
        assert keys  # the sites' checks failed over to the memo
        dtt.linear(x3, w, b)  # each site back to one signature (its entry made once)
        dtt.layer_norm(x2, (32,), lw, lb)
        keys.clear()
        for _ in range(3):  # one signature per site, again and again: no memo key is built
            torch.testing.assert_close(dtt.linear(x3, w, b), F.linear(x3, w, b), **tol)
            torch.testing.assert_close(
                dtt.layer_norm(x2, (32,), lw, lb), F.layer_norm(x2, (32,), lw, lb), **tol
            )
            lw.add_(0.25)  # in place: seen by the next call
        assert keys == []
        dtt.configure(policy="heuristic", overrides="does-not-exist.json")  # another config
        torch.testing.assert_close(dtt.linear(x3, w, b), F.linear(x3, w, b), **tol)
        assert keys  # the site's entry was made under the old config
    # gradients wanted from the same site: PyTorch's autograd, never the inference call
    wg = w.clone().requires_grad_()
    out = dtt.linear(x3, wg, b)
    out.sum().backward()
    assert out.requires_grad and wg.grad is not None


def test_a_lazy_negative_view_never_takes_a_prepared_call(engine: str) -> None:
    """The memo's key does not hold the negative bit: a lazy negative view of a signature seen
    before ran its prepared call, and a plan reading the memory read the values before the
    negation (audit, session 18). It runs PyTorch's op, which resolves it."""
    dev, dtype, tol = _device(engine), _dtype(engine), _tol(engine)
    kw: dict[str, Any] = {"device": dev, "dtype": dtype}
    x, w, b = torch.randn(4, 32, **kw), torch.randn(16, 32, **kw), torch.randn(16, **kw)
    lw = torch.randn(32, **kw)
    img = torch.randn(1, 4, 8, 8, **kw)
    q = torch.randn(1, 2, 16, 32, **kw)
    with torch.no_grad():
        for _ in range(2):  # the memo and the call site hold the plain signatures
            dtt.linear(x, w, b)
            dtt.layer_norm(x, (32,), lw)
            dtt.rms_norm(x, (32,), lw)
            dtt.max_pool2d(img, 2)
            dtt.scaled_dot_product_attention(q, q, q)
        lazy = torch._neg_view(x)
        assert lazy.is_neg()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DnnTuneFallbackWarning)
            for ours, theirs in (
                (lambda: dtt.linear(lazy, w, b), lambda: F.linear(lazy, w, b)),
                (lambda: dtt.linear(x, torch._neg_view(w), b), lambda: F.linear(x, -w, b)),
                (lambda: dtt.layer_norm(lazy, (32,), lw), lambda: F.layer_norm(-x, (32,), lw)),
                (lambda: dtt.rms_norm(lazy, (32,), lw), lambda: F.rms_norm(-x, (32,), lw)),
                (lambda: dtt.max_pool2d(torch._neg_view(img), 2), lambda: F.max_pool2d(-img, 2)),
                (
                    lambda: dtt.scaled_dot_product_attention(torch._neg_view(q), q, q),
                    lambda: F.scaled_dot_product_attention(-q, q, q),
                ),
            ):
                for _ in range(2):
                    torch.testing.assert_close(ours(), theirs(), **tol)


def test_one_memo_key_for_two_kinds_of_tensors_keeps_an_entry_for_each(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer norm's key holds neither its weight's type nor its requires_grad: a module's
    Parameter and a detached copy of it share one key. Each gets the call-site entry its own
    tensors pass; with one entry per key the module's calls failed its check and built the key
    on every call (slower than before the entries; session 18)."""
    if engine != "views":
        pytest.skip("independent of the engine")
    ln = nn.LayerNorm(32).eval()
    weight, bias = ln.weight.detach(), ln.bias.detach()
    model = _copy(ln)
    dtt.optimize(model, policy="heuristic", overrides=None, check_speed=False)
    x = torch.randn(4, 32)
    keys: list[Any] = []
    lookup = runtime.native_memo.lookup
    monkeypatch.setattr(runtime.native_memo, "lookup", lambda key: keys.append(key) or lookup(key))
    with torch.no_grad():
        for _ in range(3):  # both seen, both hit the memo, each site gets its entry
            dtt.layer_norm(x, (32,), weight, bias)
            model(x)
        keys.clear()
        for _ in range(3):
            torch.testing.assert_close(dtt.layer_norm(x, (32,), weight, bias), ln(x), **TOL)
            torch.testing.assert_close(model(x), ln(x), **TOL)
    assert keys == []


def test_kept_workspaces_on_two_streams_and_in_a_recorded_graph(engine: str) -> None:
    """The norms' plans that need a workspace (cuDNN's) share one buffer per stream: calls on
    another stream and a recorded graph replayed beside eager calls stay right."""
    if _device(engine) == "cpu":
        pytest.skip("CUDA streams and graphs")
    dtype, tol = _dtype(engine), _tol(engine)
    kw: dict[str, Any] = {"device": "cuda", "dtype": dtype}
    w, b = torch.randn(256, **kw), torch.randn(256, **kw)
    xs = [torch.randn(64, 256, **kw) for _ in range(4)]
    with torch.no_grad():
        want = [F.layer_norm(x, (256,), w, b) for x in xs]
        for x, ref in zip(xs, want, strict=True):  # the signature's prepared call
            torch.testing.assert_close(dtt.layer_norm(x, (256,), w, b), ref, **tol)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = [dtt.layer_norm(x, (256,), w, b) for x in xs]
        torch.cuda.current_stream().wait_stream(side)
        for g, ref in zip(got, want, strict=True):
            torch.testing.assert_close(g, ref, **tol)
        static = xs[0].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = dtt.layer_norm(static, (256,), w, b)
        for x, ref in zip(xs, want, strict=True):
            static.copy_(x)
            graph.replay()
            eager = dtt.layer_norm(xs[-1], (256,), w, b)  # the stream's kept buffer meanwhile
            torch.testing.assert_close(out, ref, **tol)
            torch.testing.assert_close(eager, want[-1], **tol)
