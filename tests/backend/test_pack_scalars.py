"""A pass-by-value scalar given in the variant pack, as cuDNN frontend code passes its
attention scale or epsilon: dnntune fixes its value when the graph is built, so an equal value
is accepted and ignored, and another one refused. Before, any value was ignored: a ported graph
that changed its scale at run time computed with the old one (new-user audit, session 58)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import dnntune as dt

F = dt.DataType.FLOAT


def _built(value: float = 3.0, data_type: dt.DataType = F) -> tuple[dt.Graph, Any, Any, Any]:
    handle = dt.create_handle("cpu")
    g = dt.Graph("scaled", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[4], data_type=F)
    s = g.scalar(value, name="scale", data_type=data_type)
    y = g.pointwise(x, s, mode=dt.PointwiseMode.MUL)
    y.set_output(True)
    g.validate()
    g.build_operation_graph(handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    return g, x, s, y


@pytest.mark.parametrize(
    "given", [3.0, 3, torch.tensor(3.0), torch.tensor([3.0]), np.float32(3.0)], ids=repr
)
def test_an_equal_scalar_in_the_pack_is_accepted(given: Any) -> None:
    g, x, s, y = _built()
    xs, out = torch.arange(4.0), torch.empty(4)
    g.execute(dt.create_handle("cpu"), {x: xs, s: given, y: out})
    torch.testing.assert_close(out, 3.0 * xs)


def test_a_scalar_equal_in_its_data_type_is_accepted() -> None:
    g, x, s, y = _built(1.0 / 3.0, dt.DataType.HALF)
    out = torch.empty(4)
    g.execute(dt.create_handle("cpu"), {x: torch.ones(4), s.uid: 0.3333, y: out})


@pytest.mark.parametrize("given", [2.0, torch.tensor(2.5)], ids=repr)
def test_another_scalar_value_in_the_pack_is_refused(given: Any) -> None:
    g, x, s, y = _built()
    with pytest.raises(
        dt.InvalidValueError,
        match=r"tensor scale \(uid 1, .*pass-by-value scalar whose value is fixed when the graph "
        r"is built \(3.0\); the pack gives 2.*build its plans again",
    ):
        g.execute(dt.create_handle("cpu"), {x: torch.ones(4), s: given, y: torch.empty(4)})


@pytest.mark.parametrize("given", ["3", torch.ones(2), None], ids=repr)
def test_a_scalar_that_is_no_number_is_refused(given: Any) -> None:
    g, x, s, y = _built()
    with pytest.raises(dt.InvalidValueError, match="is a pass-by-value scalar; the pack gives"):
        g.execute(dt.create_handle("cpu"), {x: torch.ones(4), s: given, y: torch.empty(4)})
