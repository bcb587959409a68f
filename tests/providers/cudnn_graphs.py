"""Small cuDNN-friendly graphs the GPU tests of the bound call paths share (the fast path, the
direct cuDNN caller, misaligned tensors): an NHWC conv + bias + ReLU and a layernorm, in half
precision, and their cuDNN plan."""

from __future__ import annotations

import pytest

import dnntune as dt
from dnntune.backend.engine import Plan


def built_plan(handle: dt.Handle, g: dt.Graph, engine: str) -> Plan:
    """``g``'s plan of ``engine``, built on ``handle`` (the test skipped where the engine
    cannot run it here)."""
    g.build_operation_graph(handle)
    try:
        g.create_execution_plan_ext(engine)
        g.check_support()
        g.build_plans()
    except (dt.NotSupportedError, dt.InvalidValueError) as exc:
        pytest.skip(f"{engine} cannot run {g.name} here: {exc}")
    plan = g.active_plan
    assert plan is not None
    return plan


def built_cudnn_plan(handle: dt.Handle, g: dt.Graph) -> Plan:
    """``g``'s CUDNN_ENGINE plan (:func:`built_plan`)."""
    return built_plan(handle, g, "CUDNN_ENGINE")


def conv_bias_relu(name: str, n: int, c: int, hw: int) -> dt.Graph:
    """A 3x3 conv (padding 1) of ``c`` to ``c`` channels on an NHWC ``n x c x hw x hw`` input,
    plus a bias, then ReLU; output ``Y``."""
    g = dt.Graph(name, dt.DataType.HALF, dt.DataType.FLOAT, dt.DataType.FLOAT)
    x = g.tensor("X", [n, c, hw, hw], strides=[c * hw * hw, 1, hw * c, c])
    w = g.tensor("W", [c, c, 3, 3], strides=[9 * c, 1, 3 * c, c])
    b = g.tensor("B", [1, c, 1, 1])
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y")
    return g


def layernorm(name: str, rows: int, cols: int) -> dt.Graph:
    """A layernorm of ``rows x cols`` (eps 1e-5) with scale and bias; output ``Y``."""
    g = dt.Graph(name, dt.DataType.HALF, dt.DataType.FLOAT, dt.DataType.FLOAT)
    x = g.tensor("X", [rows, cols, 1, 1])
    scale = g.tensor("SCALE", [1, cols, 1, 1])
    bias = g.tensor("BIAS", [1, cols, 1, 1])
    g.layernorm(x, scale, bias, 1e-5)[0].set_output(True).set_name("Y")
    return g
