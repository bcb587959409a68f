"""The torch engines on graphs a user can build that the conformance sweep did not: outputs
laid out unlike the op's result (transposed, padded, channels-last after an NCHW op), checked
against ``dnntune.reference`` with its per-output tolerances, into output buffers whose whole
storage starts as NaN so that an element left unwritten (or a gap written) shows."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune import reference
from dnntune.graph.tensor import channels_last_strides

FLOAT, HALF, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
PW = dt.PointwiseMode
ENGINES = ["TORCH_ENGINE", pytest.param("TORCH_COMPILE_ENGINE", marks=pytest.mark.slow)]


def _graph(name: str, io: dt.DataType) -> dt.Graph:
    return dt.Graph(
        name=name,
        io_data_type=io,
        compute_data_type=FLOAT,
        intermediate_data_type=FLOAT,
    )


def _nan_outputs(graph: dt.Graph, pack: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Replace each output buffer of ``pack`` by a view of a NaN-filled storage; return the
    storages by uid."""
    storages = {}
    for t in graph.output_tensors():
        assert t.uid is not None and t.data_type is not None
        storage = torch.full([t.storage_size()], float("nan"), dtype=t.data_type.to_torch())
        pack[t.uid] = storage.as_strided(t.dims, t.strides)
        storages[t.uid] = storage
    return storages


def run_checked(
    graph: dt.Graph, handle: dt.Handle, engine: str, knobs: dict[str, int | str] | None = None
) -> None:
    """Build ``engine``'s plan, run it into NaN-filled outputs, compare with the reference and
    check that the gaps of a non-dense output stay untouched."""
    graph.build_operation_graph(handle)
    graph.create_execution_plan_ext(engine, knobs or {})
    graph.check_support()
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    pack = reference.make_inputs(graph, handle.device, seed=0)
    storages = _nan_outputs(graph, pack)
    expected = reference.run(graph, pack)
    graph.execute(handle, pack)
    result = reference.check_outputs(graph, pack, expected)
    assert result.ok, result
    for t in graph.output_tensors():
        assert t.uid is not None
        written = torch.zeros(t.storage_size(), dtype=torch.bool)
        written[torch.arange(t.storage_size()).as_strided(t.dims, t.strides).reshape(-1)] = True
        assert torch.isnan(storages[t.uid][~written]).all(), f"{t.name}: a gap was written"


# ---- GELU into an output laid out unlike its operand -----------------------------------------
# PyTorch's CPU erf-GELU with out= (float32, bfloat16; torch 2.13) writes nothing into a buffer
# whose layout differs from a contiguous operand's: TORCH_ENGINE's output kept its old values
# (NaN here, zeros or the previous call's result in a user's buffer).
@pytest.mark.parametrize("io", [FLOAT, BF16, HALF], ids=lambda d: d.json_name)
@pytest.mark.parametrize("strides", [[1, 2, 6], [12, 1, 3], [40, 10, 1]], ids=str)
@pytest.mark.parametrize("engine", ENGINES)
def test_gelu_into_a_strided_output(
    engine: str, strides: list[int], io: dt.DataType, cpu_handle: dt.Handle
) -> None:
    g = _graph("gelu_strided_out", io)
    x = g.tensor("X", [2, 3, 4], data_type=io)
    y = g.pointwise(x, mode=PW.GELU_FWD).set_output(True).set_name("Y")
    y.set_dims([2, 3, 4]).set_strides(strides)
    run_checked(g, cpu_handle, engine)


@pytest.mark.parametrize("io", [FLOAT, BF16], ids=lambda d: d.json_name)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("engine", ENGINES)
def test_conv_gelu_nchw_into_a_channels_last_output(
    engine: str, bias: bool, io: dt.DataType, cpu_handle: dt.Handle
) -> None:
    """The fused conv (+ bias) + GELU step wrote GELU with out= into the NHWC buffer."""
    g = _graph("conv_gelu_nhwc_out", io)
    x = g.tensor("X", [2, 4, 5, 5], data_type=io)
    w = g.tensor("W", [8, 4, 3, 3], data_type=io)
    y = g.conv_fprop(x, w, padding=1)
    if bias:
        y = g.pointwise(y, g.tensor("B", [1, 8, 1, 1], data_type=io), mode=PW.ADD)
    y = g.pointwise(y, mode=PW.GELU_FWD).set_output(True).set_name("Y")
    y.set_dims([2, 8, 5, 5]).set_strides(channels_last_strides([2, 8, 5, 5]))
    run_checked(g, cpu_handle, engine)
