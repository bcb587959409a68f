"""Shared builders for the override tests: small graphs, fake engines, fake autotune results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dnntune as dt
from dnntune.backend.engine import Engine, Plan, engine_id
from dnntune.backend.knobs import IntConstraint, Knob, KnobSetting, KnobValueType, StringConstraint
from dnntune.errors import NotSupportedError
from dnntune.overrides.writer import write_autotune_winner
from dnntune.rfc import AutotuneResult, AutotuneStorageConfig, AutotuneStrategy, TuneMode

F = dt.DataType.FLOAT


def conv_graph(
    n: int = 2, c: int = 8, hw: int = 8, k: int = 16, channels_last: bool = False
) -> dt.Graph:
    g = dt.Graph(name="conv", io_data_type=F, compute_data_type=F)
    if channels_last:
        from dnntune.graph import channels_last_strides

        xs = channels_last_strides([n, c, hw, hw])
    else:
        xs = None
    x = g.tensor(name="X", dims=[n, c, hw, hw], strides=xs)
    w = g.tensor(name="W", dims=[k, c, 3, 3])
    y = g.conv_fprop(x, w, padding=1)
    y.set_output(True)
    g.validate()
    return g


def conv_bias_relu_graph(n: int = 2) -> dt.Graph:
    g = dt.Graph(name="conv_bias_relu", io_data_type=F, compute_data_type=F)
    x = g.tensor(name="X", dims=[n, 8, 8, 8])
    w = g.tensor(name="W", dims=[16, 8, 3, 3])
    b = g.tensor(name="B", dims=[1, 16, 1, 1])
    y = g.conv_fprop(x, w, padding=1)
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    g.validate()
    return g


def matmul_graph(
    m: int = 4, k: int = 8, n: int = 16, b_strides: Sequence[int] | None = None
) -> dt.Graph:
    g = dt.Graph(name="matmul", io_data_type=F, compute_data_type=F)
    a = g.tensor(name="A", dims=[m, k])
    b = g.tensor(name="B", dims=[k, n], strides=b_strides)
    c = g.matmul(a, b)
    c.set_output(True)
    g.validate()
    return g


def pointwise_graph(
    dims: Sequence[int] = (4, 8),
    strides: Sequence[int] | None = None,
    mode: dt.PointwiseMode = dt.PointwiseMode.RELU_FWD,
) -> dt.Graph:
    g = dt.Graph(name="pw", io_data_type=F, compute_data_type=F)
    x = g.tensor(name="X", dims=list(dims), strides=strides)
    if mode.arity == 2:
        y = g.pointwise(x, 2.0, mode=mode)  # a pass-by-value scalar operand
    else:
        y = g.pointwise(x, mode=mode)
    y.set_output(True)
    g.validate()
    return g


def layernorm_graph(phase: dt.NormFwdPhase = dt.NormFwdPhase.INFERENCE) -> dt.Graph:
    g = dt.Graph(name="ln", io_data_type=F, compute_data_type=F)
    x = g.tensor(name="X", dims=[4, 32])
    s = g.tensor(name="S", dims=[1, 32])
    b = g.tensor(name="B", dims=[1, 32])
    outs = g.layernorm(x, s, b, 1e-5, forward_phase=phase)
    for t in outs:
        t.set_output(True)
    g.validate()
    return g


# ---- fake engines ---------------------------------------------------------------------------
class FakePlan(Plan):
    def execute(self, variant_pack: Any, workspace: Any, stream: Any = None) -> None:
        return None


class FakeEngine(Engine):
    """Supports everything on every device; knobs ``fake.tile`` (int) and ``fake.algo`` (str)."""

    devices = ("cpu", "cuda")

    def __init__(self, name: str, workspace: int = 0) -> None:
        self.name = name
        self.provider = "fake"
        self._workspace = workspace

    def check_support(self, graph: Any, handle: Any) -> None:
        return None

    def knobs(self, graph: Any = None) -> list[Knob]:
        return [
            Knob("fake.tile", "tile size", KnobValueType.INT64, 16, IntConstraint(1, 1024)),
            Knob(
                "fake.algo",
                "algorithm",
                KnobValueType.STRING,
                "direct",
                StringConstraint(frozenset({"direct", "winograd", "fft"})),
            ),
            Knob("fake.alpha", "a double knob", KnobValueType.FLOAT64, 1.0),
        ]

    def compile(self, graph: Any, knob_settings: Sequence[KnobSetting], handle: Any) -> Plan:
        return FakePlan(self, knob_settings, self._workspace, {"compiled_for": graph.name})


class UnsupportedEngine(FakeEngine):
    def check_support(self, graph: Any, handle: Any) -> None:
        raise NotSupportedError("never supported")


def engines(*names: str) -> list[FakeEngine]:
    return [FakeEngine(n) for n in names]


# ---- results --------------------------------------------------------------------------------
def result(
    name: str,
    rank: int = 0,
    succeeded: bool = True,
    knobs: Sequence[KnobSetting] = (),
    strategy: AutotuneStrategy = AutotuneStrategy.RUN_UNTIL_STABLE,
    mode: TuneMode = TuneMode.STANDARD,
    **fields: Any,
) -> AutotuneResult:
    values: dict[str, Any] = {
        "engine_id": engine_id(name),
        "engine_name": name,
        "knob_settings": list(knobs),
        "min_time_ms": 0.041 + 0.01 * max(rank, 0),
        "avg_time_ms": 0.044 + 0.01 * max(rank, 0),
        "stddev_ms": 0.0018,
        "iterations_run": 37,
        "converged": True,
        "rank": rank if succeeded else -1,
        "succeeded": succeeded,
        "workspace_size": 1024,
        "mode_used": mode,
        "strategy_used": strategy,
    }
    values.update(fields)
    return AutotuneResult(**values)


def write_winner(
    graph: dt.Graph,
    path: Path,
    name: str = "FAKE_A",
    knobs: Sequence[KnobSetting] = (),
    delete_all: bool = False,
    **fields: Any,
) -> None:
    write_autotune_winner(
        graph,
        [result(name, 0, knobs=knobs, **fields), result("FAKE_LOSER", 1)],
        AutotuneStorageConfig(str(path), delete_all),
        dt.AutotuneConfig(),
    )
