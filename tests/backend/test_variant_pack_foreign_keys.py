"""A variant pack keyed by another graph's tensors, or giving one tensor twice, is refused:
matched by uid, a foreign tensor picked whichever tensor has its number here (wrong numbers,
silently). The fast path (the bound pack) never lets such a key through either."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune.backend.variant_pack import normalize_variant_pack

F = dt.DataType.FLOAT


def _sub_graph(
    handle: dt.Handle, swap: bool
) -> tuple[dt.Graph, dt.TensorAttributes, dt.TensorAttributes, dt.TensorAttributes]:
    """y = A - B; with ``swap`` the tensors are created in the other order (uids swapped)."""
    g = dt.Graph(name="sub", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    if swap:
        b = g.tensor(name="B", dims=[4, 4], data_type=F, uid=0)
        a = g.tensor(name="A", dims=[4, 4], data_type=F, uid=1)
    else:
        a = g.tensor(name="A", dims=[4, 4], data_type=F, uid=0)
        b = g.tensor(name="B", dims=[4, 4], data_type=F, uid=1)
    y = g.pointwise(a, b, mode=dt.PointwiseMode.SUB)
    y.set_output(True)
    g.build(handle)
    return g, a, b, y


def _full(value: float) -> torch.Tensor:
    return torch.full((4, 4), value)


def test_tensors_of_another_graph_are_refused_naming_both() -> None:
    handle = dt.create_handle("cpu")
    _, a1, b1, y1 = _sub_graph(handle, swap=False)
    g2, _, _, _ = _sub_graph(handle, swap=True)
    out = torch.empty(4, 4)
    with pytest.raises(
        dt.InvalidValueError, match=r"tensor A \(uid 0.*not a tensor of graph 'sub'"
    ):
        g2.execute(handle, {a1: _full(5.0), b1: _full(2.0), y1: out})
    with pytest.raises(dt.InvalidValueError, match="uid 0 here is tensor B"):
        normalize_variant_pack(g2, {a1: _full(5.0), b1: _full(2.0), y1: out})


def test_own_tensors_and_uids_still_give_the_right_numbers() -> None:
    handle = dt.create_handle("cpu")
    g2, a2, b2, y2 = _sub_graph(handle, swap=True)
    out = torch.empty(4, 4)
    g2.execute(handle, {a2: _full(5.0), b2: _full(2.0), y2: out})
    assert out[0, 0].item() == 3.0
    g2.execute(handle, {a2.uid: _full(7.0), b2.uid: _full(2.0), y2.uid: out})
    assert out[0, 0].item() == 5.0


def test_a_tensor_shared_by_two_graphs_keys_both() -> None:
    handle = dt.create_handle("cpu")
    x = dt.TensorAttributes(name="X", dims=[4, 4], data_type=F)
    graphs = []
    for mode in (dt.PointwiseMode.RELU_FWD, dt.PointwiseMode.NEG):
        g = dt.Graph(name=mode.name, io_data_type=F, compute_data_type=F)
        g.pointwise(x, mode=mode).set_output(True).set_name("Y")
        g.build(handle)
        graphs.append(g)
    for g in graphs:
        y = next(t for t in g.tensors if t.name == "Y")
        out = torch.empty(4, 4)
        g.execute(handle, {x: _full(-1.0), y: out})
        assert out[0, 0].item() == (0.0 if g.name == "RELU_FWD" else 1.0)


def test_a_tensor_given_twice_with_different_buffers_is_refused() -> None:
    handle = dt.create_handle("cpu")
    g1, a1, b1, y1 = _sub_graph(handle, swap=False)
    out = torch.empty(4, 4)
    assert a1.uid is not None
    with pytest.raises(dt.InvalidValueError, match=r"tensor A \(uid 0\) is given twice"):
        g1.execute(handle, {a1: _full(0.0), a1.uid: _full(5.0), b1: _full(2.0), y1: out})
    # the same buffer twice is one tensor given twice: accepted
    five = _full(5.0)
    g1.execute(handle, {a1: five, a1.uid: five, b1: _full(2.0), y1: out})
    assert out[0, 0].item() == 3.0


def test_the_bound_fast_path_takes_no_foreign_or_duplicate_key() -> None:
    handle = dt.create_handle("cpu")
    _, a1, _, y1 = _sub_graph(handle, swap=False)
    g2, a2, b2, y2 = _sub_graph(handle, swap=True)
    out = torch.empty(4, 4)
    pack = {a2: _full(5.0), b2: _full(2.0), y2: out}
    g2.execute(handle, pack)
    assert g2._binding is not None  # the pack is bound: later packs with its keys go fast
    with pytest.raises(dt.InvalidValueError, match="not a tensor of graph"):
        g2.execute(handle, {**pack, a1: _full(9.0)})  # the bound keys, and a foreign one
    assert b2.uid is not None
    with pytest.raises(dt.InvalidValueError, match="given twice"):
        g2.execute(handle, {**pack, b2.uid: _full(9.0)})  # the bound keys, and B again by uid
    g2.execute(handle, pack)  # the bound pack still runs
    assert out[0, 0].item() == 3.0
    # a uid-keyed pack binds too, and takes no extra tensor key on the fast path
    by_uid = {a2.uid: _full(5.0), b2.uid: _full(2.0), y2.uid: out}
    g2.execute(handle, by_uid)
    with pytest.raises(dt.InvalidValueError, match="not a tensor of graph"):
        g2.execute(handle, {**by_uid, y1: torch.empty(4, 4)})


def test_a_bound_pack_with_extra_keys_needs_exactly_those_keys() -> None:
    handle = dt.create_handle("cpu")
    _, a1, _, _ = _sub_graph(handle, swap=False)
    g2, a2, b2, y2 = _sub_graph(handle, swap=True)
    out = torch.empty(4, 4)
    pack = {a2: _full(5.0), b2: _full(2.0), y2: out, 99: _full(0.0)}  # an extra uid: ignored
    g2.execute(handle, pack)
    binding = g2._binding
    assert binding is not None
    g2.execute(handle, pack)
    assert g2._binding is binding and out[0, 0].item() == 3.0
    swapped = {a2: _full(5.0), b2: _full(2.0), y2: out, a1: _full(0.0)}  # same length
    with pytest.raises(dt.InvalidValueError, match="not a tensor of graph"):
        g2.execute(handle, swapped)


def test_plan_choice_refuses_foreign_keys_on_its_fast_path_too() -> None:
    handle = dt.create_handle("cpu")
    _, a1, _, _ = _sub_graph(handle, swap=False)
    g2, a2, b2, y2 = _sub_graph(handle, swap=True)
    choice = dt.choose_plan(g2, handle)
    out = torch.empty(4, 4)
    pack = {a2: _full(5.0), b2: _full(2.0), y2: out}
    choice.execute(handle, pack)
    choice.execute(handle, pack)
    assert out[0, 0].item() == 3.0
    with pytest.raises(dt.InvalidValueError, match="not a tensor of graph"):
        choice.execute(handle, {**pack, a1: _full(9.0)})


def test_an_int_keyed_pack_with_a_foreign_tensor_key_takes_the_full_check() -> None:
    handle = dt.create_handle("cpu")
    _, a1, _, _ = _sub_graph(handle, swap=False)
    g2, a2, b2, y2 = _sub_graph(handle, swap=True)
    assert a2.uid is not None and b2.uid is not None and y2.uid is not None
    pack = {a2.uid: _full(5.0), b2.uid: _full(2.0), y2.uid: torch.empty(4, 4)}
    assert normalize_variant_pack(g2, pack, handle) is pack  # exactly the uids: as is
    with pytest.raises(dt.InvalidValueError, match="not a tensor of graph"):
        normalize_variant_pack(g2, {**pack, a1: _full(1.0)}, handle)
