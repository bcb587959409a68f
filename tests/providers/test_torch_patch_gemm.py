"""TORCH_ENGINE's ``torch.conv_as_gemm``: a convolution over non-overlapping patches (a ViT's or
a Swin's patch embedding) as one GEMM over the gathered patches, the bias in its epilogue."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import dnntune as dt
from dnntune import testing
from dnntune.errors import InvalidValueError
from dnntune.graph import OpKind
from dnntune.graph.node import Node
from dnntune.providers._torch.conv import is_patch_conv, patch_conv
from dnntune.providers._torch.lowering import lower
from dnntune.providers._torch.program import LoweringOptions
from dnntune.providers.torch_eager import (
    CONV_AS_GEMM,
    INTERMEDIATE_TYPE,
    SUGGESTED_PATCH,
    TorchEngine,
)

F32, F16, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
P = dt.PointwiseMode


def _patch_graph(
    dtype: dt.DataType = F32,
    x_dims: tuple[int, ...] = (2, 3, 34, 33),
    kernel: tuple[int, ...] = (8, 8),
    stride: tuple[int, ...] | None = None,
    padding: int = 0,
    bias: bool = True,
    act: dt.PointwiseMode | None = None,
    residual: bool = False,
    channels_last: bool = False,
    mode: dt.ConvMode | None = None,
) -> dt.Graph:
    g = dt.Graph("patch", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    _, c, *spatial = x_dims
    strides = None
    if channels_last:
        height, width = spatial
        strides = [c * height * width, 1, width * c, c]
    x = g.tensor("X", list(x_dims), strides=strides)
    w = g.tensor("W", [5, c, *kernel])
    rank = len(kernel)
    y = g.conv_fprop(
        x,
        w,
        pre_padding=[padding] * rank,
        post_padding=[padding] * rank,
        stride=list(stride or kernel),
        dilation=[1] * rank,
        conv_mode=mode or dt.ConvMode.CROSS_CORRELATION,
    )
    if bias:
        y = g.pointwise(y, g.tensor("B", [1, 5] + [1] * rank), mode=P.ADD)
    if residual:
        y = g.pointwise(y, g.tensor("R", list(y.dims)), mode=P.ADD)
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    return g


def _conv_node(g: dt.Graph) -> Node:
    return next(n for n in g.nodes if n.kind is OpKind.CONV_FPROP)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("x_shape", "kernel"),
    [
        ((2, 3, 32, 32), (16, 16)),  # whole patches
        ((2, 3, 35, 33), (16, 16)),  # a remainder the convolution drops
        ((1, 4, 9, 10), (4, 2)),  # not square
        ((2, 3, 8, 9, 10), (2, 3, 3)),  # 3-D (a video's tubelets)
    ],
    ids=["whole", "remainder", "rectangular", "3d"],
)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_patch_conv_matches_the_convolution(
    dtype: torch.dtype, x_shape: tuple[int, ...], kernel: tuple[int, ...], with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=gen).to(dtype)
    w = torch.randn(6, x_shape[1], *kernel, generator=gen).to(dtype)
    b = torch.randn(6, generator=gen).to(dtype) if with_bias else None
    conv = F.conv2d if len(kernel) == 2 else F.conv3d
    want = conv(x.double(), w.double(), None if b is None else b.double(), kernel)
    rank = len(kernel)
    got = patch_conv(x, w, b, list(kernel), [0] * rank, [1] * rank, 1)
    assert got.shape == want.shape and got.dtype == dtype
    # float32: rounding of a K = C * prod(kernel) sum; bf16: of its 8-bit result
    rel = 1e-5 if dtype is torch.float32 else 1e-2
    scale = want.abs().max().item()
    assert (got.double() - want).abs().max().item() <= rel * scale


@pytest.mark.parametrize(
    ("kwargs", "is_patch"),
    [
        ({}, True),
        ({"x_dims": (2, 3, 8, 9, 10), "kernel": (4, 4, 4)}, True),
        ({"stride": (4, 4)}, False),  # overlapping windows
        ({"padding": 1}, False),
        ({"mode": dt.ConvMode.CONVOLUTION}, False),  # a flipped filter
    ],
    ids=["patch", "patch-3d", "overlapping", "padded", "flipped"],
)
def test_which_convolutions_are_patches(kwargs: dict[str, object], is_patch: bool) -> None:
    g = _patch_graph(**kwargs)  # type: ignore[arg-type]
    assert is_patch_conv(_conv_node(g)) is is_patch
    knobs = {k.knob_id for k in TorchEngine().knobs(g)}
    assert (CONV_AS_GEMM in knobs) is is_patch
    suggested = TorchEngine().suggested_variants(g)
    assert any(CONV_AS_GEMM in v for v in suggested) is is_patch


def test_the_knob_on_another_convolution_is_refused(cpu_handle: dt.Handle) -> None:
    g = _patch_graph(stride=(4, 4))
    with pytest.raises(InvalidValueError, match="does not apply to this graph"):
        TorchEngine().validate_knobs([dt.KnobSetting(CONV_AS_GEMM, 1)], g)


def test_the_gemm_is_a_variant_of_its_own_in_the_tune() -> None:
    g = _patch_graph(BF16, act=P.GELU_FWD)  # float32 intermediates: the io variant too
    suggested = TorchEngine().suggested_variants(g)
    assert {CONV_AS_GEMM: 1} in suggested
    assert {CONV_AS_GEMM: 1, INTERMEDIATE_TYPE: "io"} in suggested


@pytest.mark.parametrize(
    ("kernel", "suggested"), [((8, 8), True), ((4, 4), False), ((7, 9), False)]
)
def test_only_large_patches_are_suggested(kernel: tuple[int, int], suggested: bool) -> None:
    # a 4x4 stem (Swin-T, ConvNeXt-T) ran faster on cuDNN's best plan (H100): the knob is there
    # for a sweep or a user, the tune does not try it unasked
    g = _patch_graph(BF16, x_dims=(2, 3, 32, 36), kernel=kernel)
    assert CONV_AS_GEMM in {k.knob_id for k in TorchEngine().knobs(g)}
    got = any(CONV_AS_GEMM in v for v in TorchEngine().suggested_variants(g))
    assert got is suggested
    assert (math.prod(kernel) >= SUGGESTED_PATCH) is suggested


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(
    "shape",
    [
        {},
        {"act": P.GELU_FWD},
        {"residual": True},
        {"residual": True, "act": P.RELU_FWD},
        {"bias": False},
        {"channels_last": True},
        {"x_dims": (2, 3, 8, 9, 10), "kernel": (2, 3, 3)},
    ],
    ids=["bias", "gelu", "residual", "residual-relu", "nobias", "channels-last", "3d"],
)
def test_the_knob_matches_the_reference(
    dtype: dt.DataType,
    shape: dict[str, object],
    cpu_handle: dt.Handle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = _patch_graph(dtype, **shape)  # type: ignore[arg-type]
    calls: list[int] = []
    import dnntune.providers._torch.conv as conv_module

    real = conv_module.patch_conv

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(conv_module, "patch_conv", counted)
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", {CONV_AS_GEMM: 1}, seed=5)
    assert calls  # the GEMM ran, not the convolution
    calls.clear()
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=5)
    assert not calls  # off by default


def test_the_plan_is_not_pytorchs_own_op(cpu_handle: dt.Handle) -> None:
    g = _patch_graph()
    plan = TorchEngine().compile(g, [dt.KnobSetting(CONV_AS_GEMM, 1)], cpu_handle)
    assert not plan.runs_eager_ops and plan.metadata["conv_as_gemm"] is True
    plain = TorchEngine().compile(g, [], cpu_handle)
    assert plain.runs_eager_ops and plain.metadata["conv_as_gemm"] is False


def test_lowering_keeps_the_fusions() -> None:
    g = _patch_graph(F32, act=P.RELU_FWD)
    program = lower(g, torch.device("cpu"), LoweringOptions(patch_gemm=True))
    assert list(program.kinds) == [OpKind.CONV_FPROP, OpKind.POINTWISE]
    assert len(program.steps) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
def test_the_knob_matches_the_reference_on_cuda(dtype: dt.DataType, cuda_handle: dt.Handle) -> None:
    for shape in ({}, {"act": P.GELU_FWD}, {"residual": True}, {"channels_last": True}):
        g = _patch_graph(dtype, x_dims=(4, 3, 64, 64), kernel=(16, 16), **shape)
        testing.check_plan(g, cuda_handle, "TORCH_ENGINE", {CONV_AS_GEMM: 1}, seed=7)
