"""Shared builders of the learned-ranking tests: small graphs, records, named engines."""

from __future__ import annotations

from collections.abc import Mapping

import dnntune as dt
from dnntune.backend.engine import engine_id
from dnntune.backend.learned import device_class, problem_of
from dnntune.graph import channels_last_strides
from dnntune.learning import Record

F, H, BF = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
H200 = device_class("NVIDIA H200")


def matmul(m: int, k: int, n: int, dtype: dt.DataType = H, bias: bool = False) -> dt.Graph:
    g = dt.Graph(name=f"mm_{m}_{k}_{n}", io_data_type=dtype, compute_data_type=F)
    a = g.tensor(name="A", dims=[m, k], data_type=dtype)
    b = g.tensor(name="B", dims=[k, n], strides=[1, k], data_type=dtype)
    c = g.matmul(a, b)
    if bias:
        c = g.pointwise(
            c, g.tensor(name="bias", dims=[1, n], data_type=dtype), mode=dt.PointwiseMode.ADD
        )
    c.set_output(True)
    g.validate()
    return g


def layernorm(rows: int, cols: int, dtype: dt.DataType = BF) -> dt.Graph:
    g = dt.Graph(name=f"ln_{rows}_{cols}", io_data_type=dtype, compute_data_type=F)
    x = g.tensor(name="X", dims=[rows, cols], data_type=dtype)
    s = g.tensor(name="S", dims=[1, cols], data_type=dtype)
    b = g.tensor(name="B", dims=[1, cols], data_type=dtype)
    (y,) = g.layernorm(x, s, b, 1e-5)
    y.set_output(True)
    g.validate()
    return g


def rmsnorm(rows: int, cols: int, dtype: dt.DataType = BF) -> dt.Graph:
    g = dt.Graph(name=f"rms_{rows}_{cols}", io_data_type=dtype, compute_data_type=F)
    x = g.tensor(name="X", dims=[rows, cols], data_type=dtype)
    s = g.tensor(name="S", dims=[1, cols], data_type=dtype)
    (y,) = g.rmsnorm(x, s, 1e-6)
    y.set_output(True)
    g.validate()
    return g


def conv_nhwc(n: int, c: int, hw: int, k: int, r: int, dtype: dt.DataType = H) -> dt.Graph:
    g = dt.Graph(name=f"conv_{c}_{hw}_{k}_{r}", io_data_type=dtype, compute_data_type=F)
    x = g.tensor(
        name="X",
        dims=[n, c, hw, hw],
        strides=channels_last_strides([n, c, hw, hw]),
        data_type=dtype,
    )
    w = g.tensor(
        name="W", dims=[k, c, r, r], strides=channels_last_strides([k, c, r, r]), data_type=dtype
    )
    y = g.conv_fprop(x, w, padding=r // 2)
    y.set_output(True)
    g.validate()
    return g


def rec(
    graph: dt.Graph, times: Mapping[str, float], device: str = H200, source: str = "test"
) -> Record:
    return Record(problem_of(graph), device, dict(times), source=source)


def family_records(device: str = H200) -> list[Record]:
    """Matmuls where TORCH wins small M and CUDNN large M; norms where CUDNN wins; convs
    where CUDNN wins: 12 problems, 12 shapes."""
    out = []
    for m in (1, 2, 4, 8):
        out.append(rec(matmul(m, 4096, 4096), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.3}, device))
    for m in (2048, 4096, 8192):
        out.append(rec(matmul(m, 4096, 4096), {"TORCH_ENGINE": 1.4, "CUDNN_ENGINE": 1.0}, device))
    for rows in (4096, 8192, 16384):
        out.append(rec(layernorm(rows, 1024), {"CUDNN_ENGINE": 1.0, "TRITON_ENGINE": 1.5}, device))
    for c in (64, 128):
        out.append(
            rec(conv_nhwc(8, c, 28, 64, 3), {"CUDNN_ENGINE": 1.0, "TORCH_ENGINE": 3.0}, device)
        )
    return out


class Named:
    """An engine as the heuristics chain sees it: a name and an id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.id = engine_id(name)

    def __repr__(self) -> str:
        return self.name


def named(*names: str) -> list[Named]:
    return [Named(n) for n in names]
