"""Small graphs and variant packs for tests (fast on CPU, exercised by every fake engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dnntune.frontend import Graph
from dnntune.graph.types import DataType, PointwiseMode
from dnntune.reference import make_inputs

if TYPE_CHECKING:
    import torch


__all__ = ["make_pack", "small_conv_graph", "small_matmul_graph", "small_pointwise_graph"]


def small_pointwise_graph(
    dims: tuple[int, ...] = (2, 3, 4, 4), data_type: DataType = DataType.FLOAT
) -> Graph:
    """``y = relu(x + b)``: two inputs, one output, one pointwise chain."""

    g = Graph(
        name="test_add_relu",
        io_data_type=data_type,
        compute_data_type=DataType.FLOAT,
        intermediate_data_type=DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=list(dims), data_type=data_type)
    b = g.tensor(name="B", dims=list(dims), data_type=data_type)
    t = g.pointwise(x, b, mode=PointwiseMode.ADD)
    y = g.pointwise(t, mode=PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


def small_matmul_graph(
    m: int = 8, n: int = 8, k: int = 16, data_type: DataType = DataType.FLOAT
) -> Graph:
    """``c = a @ b`` with one batch."""

    g = Graph(name="test_matmul", io_data_type=data_type, compute_data_type=DataType.FLOAT)
    a = g.tensor(name="A", dims=[1, m, k], data_type=data_type)
    b = g.tensor(name="B", dims=[1, k, n], data_type=data_type)
    c = g.matmul(a, b)
    c.set_output(True).set_name("C")
    g.validate()
    return g


def small_conv_graph(data_type: DataType = DataType.FLOAT) -> Graph:
    """A 3x3 convolution (padding 1) with a bias add and a ReLU: the RFC's example shape, tiny."""

    g = Graph(
        name="test_conv_bias_relu",
        io_data_type=data_type,
        compute_data_type=DataType.FLOAT,
        intermediate_data_type=DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[2, 4, 6, 6], data_type=data_type)
    w = g.tensor(name="W", dims=[8, 4, 3, 3], data_type=data_type)
    bias = g.tensor(name="BIAS", dims=[1, 8, 1, 1], data_type=data_type)
    y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y = g.pointwise(y, bias, mode=PointwiseMode.ADD)
    y = g.pointwise(y, mode=PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


def make_pack(
    graph: Graph, device: str | torch.device = "cpu", seed: int = 0
) -> dict[int, torch.Tensor]:
    """Random inputs and zeroed output buffers for ``graph`` (see ``dnntune.reference``)."""

    return make_inputs(graph, device, seed=seed)
