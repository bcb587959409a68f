"""TORCH_ENGINE peepholes beside matmul + bias: conv + per-channel bias as one conv2d with a
bias, a following activation written with its ``out=`` form, and the run function a program
gets for its shape (issue 22: the engine's call as close to PyTorch's own as it can be)."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune import reference, testing
from dnntune.graph import OpKind
from dnntune.providers._torch.lowering import lower
from dnntune.providers._torch.program import LoweringOptions

F32, F16, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
P = dt.PointwiseMode


def _conv_graph(
    dtype: dt.DataType,
    act: dt.PointwiseMode | None = P.RELU_FWD,
    bias_dims: list[int] | None = None,
    bias_first: bool = False,
    padding: tuple[list[int], list[int]] = ([1, 1], [1, 1]),
    channels_last: bool = False,
    bias_type: dt.DataType | None = None,
) -> dt.Graph:
    g = dt.Graph("conv_bias", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    x_strides = [128, 1, 32, 2] if channels_last else None
    x = g.tensor("X", [2, 2, 4, 8], strides=x_strides)
    w = g.tensor("W", [6, 2, 3, 3])
    pre, post = padding
    c = g.conv_fprop(x, w, pre_padding=pre, post_padding=post, stride=[1, 1], dilation=[1, 1])
    bias = g.tensor("BIAS", bias_dims or [1, 6, 1, 1], data_type=bias_type)
    y = g.pointwise(bias, c, mode=P.ADD) if bias_first else g.pointwise(c, bias, mode=P.ADD)
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    return g


def _small_conv(g: dt.Graph) -> dt.TensorAttributes:
    """A 1x2x5x5 conv to 3 channels, 3x3, same padding: its output."""
    return g.conv_fprop(
        g.tensor("X", [1, 2, 5, 5]),
        g.tensor("W", [3, 2, 3, 3]),
        pre_padding=[1, 1],
        post_padding=[1, 1],
        stride=[1, 1],
        dilation=[1, 1],
    )


def _kinds(g: dt.Graph, **options: bool) -> list[OpKind]:
    return list(lower(g, torch.device("cpu"), LoweringOptions(**options)).kinds)


def _conv_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...] | None]:
    """The bias shape (None: no bias) of every torch.conv2d call the lowering makes."""
    seen: list[tuple[int, ...] | None] = []
    real = torch.conv2d

    def spy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, *args: object) -> object:
        seen.append(None if b is None else tuple(b.shape))
        return real(x, w, b, *args)  # type: ignore[arg-type]

    import dnntune.providers._torch.conv as conv_module

    monkeypatch.setitem(conv_module._CONV, 2, spy)
    return seen


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("act", [P.RELU_FWD, P.GELU_FWD, P.SWISH_FWD, P.SIGMOID_FWD, None], ids=str)
def test_conv_bias_act_is_one_step_and_matches_the_reference(
    dtype: dt.DataType,
    act: dt.PointwiseMode | None,
    cpu_handle: dt.Handle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = _conv_graph(dtype, act)
    program = lower(g, torch.device("cpu"), LoweringOptions())
    assert len(program.steps) == 1  # conv, bias and activation in one step
    want = [OpKind.CONV_FPROP] if act is None else [OpKind.CONV_FPROP, OpKind.POINTWISE]
    assert list(program.kinds) == want
    unfused = [OpKind.CONV_FPROP, OpKind.POINTWISE] + ([OpKind.POINTWISE] if act else [])
    assert _kinds(g, fuse=False) == unfused
    seen = _conv_calls(monkeypatch)
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=3)
    assert seen and all(b == (6,) for b in seen)  # the bias reached conv2d as a vector


def test_bias_first_channels_last_and_the_memory_format_knob(cpu_handle: dt.Handle) -> None:
    g = _conv_graph(F32, P.RELU_FWD, bias_first=True, channels_last=True)
    assert _kinds(g) == [OpKind.CONV_FPROP, OpKind.POINTWISE]
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=4)
    g = _conv_graph(F32, P.RELU_FWD, channels_last=True)
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", {"torch.memory_format": "channels_last"})


@pytest.mark.parametrize(
    ("bias_dims", "padding"),
    [
        ([1, 6, 4, 8], ([1, 1], [1, 1])),  # a full tensor, not a per-channel bias
        ([1, 1, 1, 1], ([1, 1], [1, 1])),  # a scalar-like bias: not one value per channel
        ([1, 6, 1, 1], ([1, 0], [1, 2])),  # asymmetric padding: conv + F.pad, then the add
    ],
    ids=["full", "broadcast-scalar", "asymmetric-padding"],
)
def test_other_adds_stay_unfused(
    bias_dims: list[int], padding: tuple[list[int], list[int]], cpu_handle: dt.Handle
) -> None:
    g = _conv_graph(F32, None, bias_dims=bias_dims, padding=padding)
    assert _kinds(g) == [OpKind.CONV_FPROP, OpKind.POINTWISE]
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=1)


def test_a_bias_of_another_type_stays_unfused(cpu_handle: dt.Handle) -> None:
    g = _conv_graph(F16, P.RELU_FWD, bias_type=F32)  # float32 bias: added in float32
    assert _kinds(g) == [OpKind.CONV_FPROP, OpKind.POINTWISE, OpKind.POINTWISE]
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=1)


def test_a_conv_result_used_twice_keeps_its_own_step(cpu_handle: dt.Handle) -> None:
    g = dt.Graph("twice", io_data_type=F32, compute_data_type=F32, intermediate_data_type=F32)
    c = _small_conv(g)
    y = g.pointwise(c, g.tensor("BIAS", [1, 3, 1, 1]), mode=P.ADD)
    z = g.pointwise(y, c, mode=P.MUL)
    z.set_output(True)
    g.validate()
    assert _kinds(g) == [OpKind.CONV_FPROP, OpKind.POINTWISE, OpKind.POINTWISE]
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=2)


def test_an_activation_that_is_no_graph_output_is_not_absorbed(cpu_handle: dt.Handle) -> None:
    g = dt.Graph("chain", io_data_type=F16, compute_data_type=F32, intermediate_data_type=F32)
    c = _small_conv(g)
    y = g.pointwise(g.pointwise(c, g.tensor("BIAS", [1, 3, 1, 1]), mode=P.ADD), mode=P.RELU_FWD)
    z = g.pointwise(y, g.tensor("R", [1, 3, 5, 5]), mode=P.ADD)  # the relu feeds another add
    z.set_output(True)
    g.validate()
    assert _kinds(g) == [OpKind.CONV_FPROP, OpKind.POINTWISE, OpKind.POINTWISE]
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=2)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_matmul_bias_activation_matches_the_reference_and_writes_in_place(
    dtype: dt.DataType, cpu_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = dt.Graph("mm", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    c = g.matmul(g.tensor("A", [16, 32]), g.tensor("B", [32, 24]))
    y = g.pointwise(g.pointwise(c, g.tensor("BIAS", [1, 24]), mode=P.ADD), mode=P.GELU_FWD)
    y.set_output(True)
    g.validate()
    assert len(lower(g, torch.device("cpu"), LoweringOptions()).steps) == 1
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=6)
    outs: list[bool] = []
    real = torch._C._nn.gelu

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        outs.append("out" in kwargs)
        return real(*args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(torch._C._nn, "gelu", spy)
    pack = reference.make_inputs(g, cpu_handle.device, seed=2)
    g.execute(cpu_handle, pack)
    assert outs == [True]  # the activation wrote the caller's buffer: no cast, no copy


def test_a_program_without_intermediates_runs_on_its_arguments(cpu_handle: dt.Handle) -> None:
    """Two outputs, no virtual tensor: the steps read and write the arguments themselves."""
    g = dt.Graph("two", io_data_type=F32, compute_data_type=F32, intermediate_data_type=F32)
    x = g.tensor("X", [4, 8])
    y1, y2 = g.pointwise(x, mode=P.RELU_FWD), g.pointwise(x, mode=P.TANH_FWD)
    y1.set_output(True)
    y2.set_output(True)
    g.validate()
    program = lower(g, torch.device("cpu"), LoweringOptions())
    assert len(program.steps) == 2
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=7)
    for _ in range(2):  # again, on new buffers: nothing of the last call is kept
        testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=8)


def test_torch_compile_traces_the_fused_steps(cpu_handle: dt.Handle) -> None:
    from dnntune.backend.registry import get_registry

    engine = get_registry().get("TORCH_COMPILE_ENGINE")
    g = _conv_graph(F32, P.RELU_FWD)
    try:
        engine.check_available()
        engine.check_support(g, cpu_handle)
    except dt.DnnTuneError as exc:
        pytest.skip(str(exc))
    testing.check_plan(g, cpu_handle, "TORCH_COMPILE_ENGINE", seed=5)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("act", [None, P.RELU_FWD], ids=["add", "add-relu"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_conv_bias_residual_is_one_step_and_matches_the_reference(
    dtype: dt.DataType, act: dt.PointwiseMode | None, channels_last: bool, cpu_handle: dt.Handle
) -> None:
    """A ResNet block's tail (conv + bias + shortcut + ReLU) is one step: the shortcut added to
    the convolution's result in the io type (``torch.add``, float32 inside, rounded once), not
    through a float32 copy of both."""
    g = dt.Graph("conv_res", io_data_type=dtype, compute_data_type=F32, intermediate_data_type=F32)
    x_strides = [128, 1, 32, 2] if channels_last else None
    c = g.conv_fprop(
        g.tensor("X", [2, 2, 4, 8], strides=x_strides),
        g.tensor("W", [6, 2, 3, 3]),
        pre_padding=[1, 1],
        post_padding=[1, 1],
        stride=[1, 1],
        dilation=[1, 1],
    )
    y = g.pointwise(c, g.tensor("BIAS", [1, 6, 1, 1]), mode=P.ADD)
    y = g.pointwise(y, g.tensor("R", [2, 6, 4, 8]), mode=P.ADD)
    if act is not None:
        y = g.pointwise(y, mode=act)
    y.set_output(True)
    g.validate()
    program = lower(g, torch.device("cpu"), LoweringOptions())
    assert len(program.steps) == 1
    testing.check_plan(g, cpu_handle, "TORCH_ENGINE", seed=6)
