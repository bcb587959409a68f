"""Names are strings and uids int64 integers, refused where they are given otherwise. A graph,
node or tensor name of another type (Graph(name=5), tensor(name=7), pointwise(..., name=3)) and
a uid given as "3", 3.7, True or 2**70 were kept as given: to_json() wrote them, and
Graph.from_json() refused its own output ('name: expected a string, got 5'); a pack keyed by
the int 3 missed the tensor whose uid was "3" (new-user audit, session 58)."""

from __future__ import annotations

from typing import Any

import pytest

import dnntune as dt

F = dt.DataType.FLOAT


def _graph(**tensor_kwargs: Any) -> dt.Graph:
    g = dt.Graph("g", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="X", dims=[2, 3], data_type=F, **tensor_kwargs)
    g.pointwise(x, mode=dt.PointwiseMode.EXP, name="p").set_output(True)
    return g


@pytest.mark.parametrize("name", [5, None])
def test_a_graph_name_is_a_string(name: Any) -> None:
    with pytest.raises(dt.InvalidValueError, match="graph name must be a string, got "):
        dt.Graph(name)


@pytest.mark.parametrize("name", [7, None])
def test_a_tensor_name_is_a_string(name: Any) -> None:
    g = dt.Graph("g", io_data_type=F)
    with pytest.raises(dt.InvalidValueError, match="tensor name must be a string, got "):
        g.tensor(name=name, dims=[2])
    assert g.tensors == []
    x = g.tensor(name="X", dims=[2])
    with pytest.raises(dt.InvalidValueError, match="tensor name must be a string, got "):
        x.set_name(name)
    assert x.name == "X"


def test_a_node_name_is_a_string() -> None:
    g = dt.Graph("g", io_data_type=F)
    x = g.tensor(name="X", dims=[2])
    with pytest.raises(dt.InvalidValueError, match="pointwise: name must be a string, got 3"):
        g.pointwise(x, mode=dt.PointwiseMode.EXP, name=3)  # type: ignore[arg-type]
    assert g.nodes == []


def test_names_assigned_later_are_refused_by_validate() -> None:
    g = _graph()
    g.nodes[0].name = 4  # type: ignore[assignment]
    with pytest.raises(dt.InvalidValueError, match="node name must be a string, got 4"):
        g.validate()


@pytest.mark.parametrize("uid", ["3", 3.7, True, 2**70, -(2**63) - 1])
def test_a_uid_is_an_int64_integer(uid: Any) -> None:
    with pytest.raises(dt.InvalidValueError, match=r"tensor 'X': uid must be an integer"):
        _graph(uid=uid)
    g = _graph()
    with pytest.raises(dt.InvalidValueError, match=r"tensor 'X': uid must be an integer"):
        g.tensors[0].set_uid(uid)


def test_a_graph_with_string_names_and_int_uids_round_trips() -> None:
    np = pytest.importorskip("numpy")
    g = _graph(uid=np.int64(9))  # an integer type other than int is taken as its int
    assert type(g.tensors[0].uid) is int
    g.validate()
    again = dt.Graph.from_json(g.to_json())
    assert again.to_json() == g.to_json()
    assert [t.uid for t in again.tensors] == [9, 0]
