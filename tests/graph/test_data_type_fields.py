"""Every data-type field takes a DataType (or None) and refuses anything else where it is given,
naming the field and the member to give. A string or a torch dtype (what a port of cuDNN
frontend code or of a torch script passes) was kept as given: validate() then raised
AttributeError ('str' object has no attribute 'json_name' / 'is_floating'), and a tensor's
set_data_type("half") validated and left a str where execute reads a DataType (new-user audit,
session 58)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dnntune as dt

F = dt.DataType.FLOAT


def _relu(g: dt.Graph) -> tuple[dt.TensorAttributes, dt.TensorAttributes]:
    x = g.tensor(name="X", dims=[2, 3], data_type=F)
    y = g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    return x, y


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("half", r"got 'half'; give DataType\.HALF"),
        ("fp16", r"got 'fp16'; give a DataType member"),
        (torch.float16, r"got torch\.float16; give DataType\.from_torch\(torch\.float16\)"),
    ],
)
@pytest.mark.parametrize("field", ["io_data_type", "compute_data_type", "intermediate_data_type"])
def test_graph_types_refuse_what_is_not_a_data_type(field: str, value: Any, hint: str) -> None:
    with pytest.raises(
        dt.InvalidValueError, match=f"graph 'g': {field}: expected a DataType, {hint}"
    ):
        dt.Graph("g", **{field: value})


def test_a_graph_type_assigned_later_is_refused_by_validate() -> None:
    g = dt.Graph("g", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    _relu(g)
    g.compute_data_type = "float"  # type: ignore[assignment]
    with pytest.raises(dt.InvalidValueError, match="compute_data_type: expected a DataType"):
        g.validate()


def test_a_node_compute_type_is_refused_by_the_builder() -> None:
    g = dt.Graph("g", io_data_type=F)
    x = g.tensor(name="X", dims=[2, 3], data_type=F)
    with pytest.raises(dt.InvalidValueError, match=r"pointwise\('p'\): compute_data_type"):
        g.pointwise(x, mode=dt.PointwiseMode.EXP, compute_data_type="float", name="p")  # type: ignore[arg-type]
    assert g.nodes == []


@pytest.mark.parametrize("how", ["setter", "assignment"])
def test_a_tensor_data_type_is_refused_when_set(how: str) -> None:
    g = dt.Graph("g", io_data_type=F)
    x, _ = _relu(g)
    with pytest.raises(dt.InvalidValueError, match=r"tensor 'X': data_type: .*DataType\.HALF"):
        if how == "setter":
            x.set_data_type("half")  # type: ignore[arg-type]
        else:
            x.data_type = "half"  # type: ignore[assignment]
    assert x.data_type is F


def test_data_type_members_still_work() -> None:
    g = dt.Graph("g", io_data_type=dt.DataType.HALF, compute_data_type=F)
    x, y = _relu(g)
    x.set_data_type(dt.DataType.HALF)
    g.validate()
    assert y.data_type is dt.DataType.HALF
