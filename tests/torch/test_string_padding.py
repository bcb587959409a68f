"""Convolutions with a string padding (``"same"``, ``"valid"``) run on dnntune, as PyTorch
pads them: ``"same"`` with an even kernel pads one more after (right, bottom). Each result is
checked against PyTorch's own op (the reference) with explicit tolerances; through
``optimize`` the conv layers run on dnntune and fold their batch norm (they fell back to
PyTorch's op with a DnnTuneFallbackWarning before)."""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch import runtime

TOL = {"atol": 1e-4, "rtol": 1e-4}
GRAD_TOL = {"atol": 1e-3, "rtol": 1e-3}
HALF_TOL = {"atol": 2e-2, "rtol": 2e-2}


@contextmanager
def _pytorch_reference() -> Iterator[None]:
    """PyTorch's own op, whose ``padding="same"`` with an even kernel warns that it copies
    the input (a UserWarning of PyTorch's, not dnntune's: the reference's own)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Using padding='same'", UserWarning)
        yield


def _conv_plans() -> list[tuple[object, ...]]:
    """The keys of the conv2d plans built: a call that fell back built none."""
    return [key[0] for key in runtime.cache()._items if key[0][0] == "conv2d"]


CASES = [
    # (kernel, dilation, padding): odd and even kernels, rectangular, dilated
    pytest.param(3, 1, "same", id="same-k3"),
    pytest.param(4, 1, "same", id="same-k4-even"),
    pytest.param((2, 5), 1, "same", id="same-k2x5"),
    pytest.param((1, 4), 1, "same", id="same-k1x4"),
    pytest.param(3, 2, "same", id="same-k3-dil2"),
    pytest.param(2, 3, "same", id="same-k2-dil3-odd-total"),
    pytest.param(4, 2, "same", id="same-k4-dil2-even-total"),
    pytest.param(3, 1, "valid", id="valid-k3"),
    pytest.param((2, 3), (2, 1), "valid", id="valid-k2x3-dil"),
]


@pytest.mark.parametrize(("kernel", "dilation", "padding"), CASES)
def test_functional_conv2d_with_string_padding_matches_pytorch(
    kernel: int | tuple[int, int], dilation: int | tuple[int, int], padding: str
) -> None:
    g = torch.Generator().manual_seed(0)
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    x = torch.randn(2, 6, 11, 10, generator=g)
    w = torch.randn(8, 3, *k, generator=g)  # groups=2
    b = torch.randn(8, generator=g)
    with _pytorch_reference():
        ref = F.conv2d(x, w, b, 1, padding, dilation, 2)
    y = dtt.conv2d(x, w, b, 1, padding, dilation, 2)  # no fallback warning: an error here
    torch.testing.assert_close(y, ref, **TOL)
    if padding == "same":
        assert y.shape[2:] == x.shape[2:]
    r = torch.randn(ref.shape, generator=g)
    fused = dtt.conv2d(x, w, b, 1, padding, dilation, 2, activation="relu", residual=r)
    torch.testing.assert_close(fused, torch.relu(ref + r), **TOL)
    assert len(_conv_plans()) == 2  # both ran dnntune's graphs


def test_same_with_an_even_kernel_pads_one_more_after() -> None:
    """A ones filter over a ones image counts the real pixels under it: the extra padding is
    after (right, bottom), so the first row and column see more of the image than the last."""
    x = torch.ones(1, 1, 6, 6)
    w = torch.ones(1, 1, 4, 4)
    y = dtt.conv2d(x, w, padding="same")
    with _pytorch_reference():
        torch.testing.assert_close(y, F.conv2d(x, w, padding="same"), **TOL)
    assert y[0, 0, 0, 0] == 9  # rows and columns 0..2 of the image (1 before, 2 after)
    assert y[0, 0, -1, -1] == 4  # rows and columns 4..5 (1 before, 2 after: off the image)
    (plan,) = _conv_plans()
    assert (1, 1) in plan and (2, 2) in plan  # built with (pre, post) padding, not symmetric


@pytest.mark.parametrize("kernel", [3, 4])
@pytest.mark.parametrize("create_graph", [False, True])
def test_training_through_same_padding_matches_pytorchs_gradients(
    kernel: int, create_graph: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gradients on dnntune's dgrad and wgrad graphs, and (``create_graph``: a double backward
    follows) on PyTorch's differentiable ops with the asymmetric padding applied to the input.
    The forward's kernel is dnntune's graph, not PyTorch's op (``Kernel.native``), whatever
    this machine's heuristic picks: the training path under test is dnntune's own."""
    monkeypatch.setattr(runtime.Kernel, "native", property(lambda self: False))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 7, 9, generator=g, requires_grad=True)
    w = torch.randn(5, 4, kernel, kernel, generator=g, requires_grad=True)
    b = torch.randn(5, generator=g, requires_grad=True)
    y = dtt.conv2d(x, w, b, padding="same", activation="relu")
    dy = torch.randn(y.shape, generator=g)
    ours = torch.autograd.grad(y, (x, w, b), dy, create_graph=create_graph)
    with _pytorch_reference():
        ref = torch.relu(F.conv2d(x, w, b, padding="same"))
    theirs = torch.autograd.grad(ref, (x, w, b), dy)
    torch.testing.assert_close(y, ref, **TOL)
    for a, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, e, **GRAD_TOL)
    ops = {key[0][0] for key in runtime.cache()._items}
    graphs = {"conv2d_dgrad", "conv2d_wgrad"}
    assert "conv2d" in ops and (ops & graphs == (set() if create_graph else graphs)), ops


def test_arguments_pytorch_refuses_raise_its_own_errors() -> None:
    x, w = torch.randn(1, 2, 8, 8), torch.randn(3, 2, 3, 3)
    with pytest.raises(RuntimeError, match="strided"):  # "same" needs stride 1
        dtt.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(RuntimeError, match="Invalid padding string: 'full'"):
        dtt.conv2d(x, w, padding="full")
    assert _conv_plans() == []


def _sequential(second_kernel: int) -> nn.Sequential:
    """The user's model: a 'same' conv, its batch norm and ReLU, a second 'same' conv."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding="same"),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, second_kernel, padding="same", bias=False),
        nn.Conv2d(16, 4, 3, padding="valid"),
    ).eval()
    randomize_batch_norms(model)
    return model


@pytest.mark.parametrize("second_kernel", [5, 4])
def test_optimize_runs_same_padded_convs_on_dnntune_and_folds_their_batch_norm(
    second_kernel: int,
) -> None:
    model = _sequential(second_kernel)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 8, 16, 16)
    with _pytorch_reference():  # the example forward's PyTorch timing runs the original
        report = dtt.optimize(
            model, (x,), policy="heuristic", overrides=None, check_speed=False
        )  # no DnnTuneFallbackWarning: the test's warnings are errors
    text = str(report)
    assert report.fusions == ["<root>: 0 + 1 + relu"], text
    assert re.search(r"^  0: Conv2d \+ 1 \(batchnorm, folded\) \+ 2 \(relu\) -> TORCH", text, re.M)
    assert "1: BatchNorm2d -> folded into 0 (runs in its graph)" in text
    assert re.search(r"^  3: Conv2d -> TORCH_ENGINE", text, re.M), text
    assert re.search(r"^  4: Conv2d -> TORCH_ENGINE", text, re.M), text
    assert "PyTorch's own op" not in text
    with torch.no_grad(), _pytorch_reference():
        expected = ref(x)
    runtime.cache().clear()
    with torch.no_grad():
        y = model(x)
    torch.testing.assert_close(y, expected, **TOL)
    assert len(_conv_plans()) == 3  # each conv ran a dnntune graph, the first with its fold


def test_a_same_padded_conv_with_another_padding_mode_still_falls_back() -> None:
    model = nn.Sequential(
        nn.Conv2d(4, 8, 4, padding="same", padding_mode="reflect"), nn.BatchNorm2d(8)
    ).eval()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 4, 8, 8)
    with (
        _pytorch_reference(),
        pytest.warns(dtt.DnnTuneFallbackWarning, match="padding_mode='reflect' is not"),
    ):
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    assert "0: Conv2d -> PyTorch's own op" in str(report) and report.fusions == []
    with torch.no_grad(), _pytorch_reference():
        torch.testing.assert_close(model(x), ref(x), **TOL)


def test_transposed_convs_are_left_as_they_are() -> None:
    """A transposed conv takes no string padding in PyTorch, and optimize does not swap it."""
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding="same"), nn.ConvTranspose2d(8, 4, 2, stride=2)
    ).eval()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 4, 6, 6)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    assert type(model[1]) is nn.ConvTranspose2d
    assert [r.name for r in report.swapped] == ["0"]
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), **TOL)
    same = nn.ConvTranspose2d(4, 4, 3, padding="same")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="padding"):  # PyTorch's forward refuses it
        same(x)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_same_padding_on_cuda_matches_pytorch(kernel: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 14, 15, generator=g).to("cuda", dtype)
    w = (0.1 * torch.randn(32, 16, kernel, kernel, generator=g)).to("cuda", dtype)
    b = torch.randn(32, generator=g).to("cuda", dtype)
    with _pytorch_reference():  # float64 on the CPU: PyTorch's CUDA conv may use TF32
        ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), padding="same")
    ref = ref.to("cuda", torch.float32)
    tol = TOL if dtype == torch.float32 else HALF_TOL
    for policy in ("heuristic", "tune"):
        dtt.configure(policy=policy)
        runtime.cache().clear()
        y = dtt.conv2d(x, w, b, padding="same", activation="relu")
        torch.testing.assert_close(y.float(), torch.relu(ref), **tol)
        assert len(_conv_plans()) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["TORCH_ENGINE", "TORCH_COMPILE_ENGINE", "CUDNN_ENGINE"])
def test_the_asymmetric_same_graph_on_each_cuda_engine_matches_pytorch(engine: str) -> None:
    """``padding="same"`` with an even kernel, as the graph ``dtt.conv2d`` builds for it (pre
    1, post 2), on one engine: the result is PyTorch's, or the engine refuses the graph
    (NotSupportedError: the plan policy then takes another engine), never a wrong answer."""
    import dnntune as dt
    from dnntune.errors import NotSupportedError
    from dnntune.torch.graphs import conv2d_graph

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 13, 14, generator=g).to("cuda", torch.float16)
    w = (0.1 * torch.randn(32, 16, 4, 4, generator=g)).to("cuda", torch.float16)
    b = torch.randn(1, 32, 1, 1, generator=g).to("cuda", torch.float16)
    build = conv2d_graph(x, w, b, (1, 1), (1, 1), (1, 1), "relu", None, (2, 2))
    graph, handle = build.graph, dt.create_handle("cuda")
    try:
        graph.validate()
        graph.build_operation_graph(handle)
        graph.create_execution_plan_ext(engine, {})
        graph.check_support()
        graph.build_plans()
    except NotSupportedError as exc:
        pytest.skip(f"{engine} does not run this graph here: {exc}")
    y = torch.empty(2, 32, 13, 14, device="cuda", dtype=torch.float16)
    pack = dict(zip([*build.inputs, *build.outputs], (x, w, b, y), strict=True))
    size = graph.get_workspace_size()
    workspace = torch.empty(size, dtype=torch.uint8, device="cuda") if size else None
    graph.execute(handle, pack, workspace)
    torch.cuda.synchronize()
    with _pytorch_reference():  # float64 on the CPU, as above
        ref = F.conv2d(
            x.double().cpu(), w.double().cpu(), b.double().cpu().view(-1), padding="same"
        )
    torch.testing.assert_close(y.float(), torch.relu(ref).to("cuda", torch.float32), **HALF_TOL)
