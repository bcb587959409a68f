"""The fast execute path (issue 22): Graph.execute's pack binding, Plan.bind, and the cuDNN
plan's pointer packs, which must never run on a stale binding.

cuDNN itself needs a GPU; its plan's bind is checked here on a fake frontend graph that resolves
the addresses it is given back to the CPU tensors living there, as cuDNN would read them.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
import torch
from fake_cudnn import FakeFrontendGraph, make_cudnn_plan

import dnntune as dt
from dnntune import reference
from dnntune.backend.variant_pack import PointerPacks


def _conv_graph() -> tuple[dt.Graph, dt.Handle]:
    handle = dt.create_handle("cpu")
    g = dt.Graph("fast", io_data_type=dt.DataType.FLOAT, intermediate_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [2, 4, 5, 5], uid=10)
    w = g.tensor("W", [3, 4, 3, 3], uid=11)
    y = g.conv_fprop(x, w, padding=1)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y").set_uid(12)
    g.build(handle)
    return g, handle


def _expected(g: dt.Graph, pack: dict[int, torch.Tensor]) -> torch.Tensor:
    return reference.run(g, {u: t for u, t in pack.items() if u != 12})[12].float()


def test_graph_execute_binds_once_and_new_buffers_give_correct_results() -> None:
    g, handle = _conv_graph()
    first = reference.make_inputs(g, seed=1)
    g.execute(handle, first)
    binding = g._binding
    assert binding is not None
    torch.testing.assert_close(first[12], _expected(g, first))
    for seed in (2, 3):  # new buffers (new addresses), same keys: the binding is reused
        pack = reference.make_inputs(g, seed=seed)
        g.execute(handle, pack)
        assert g._binding is binding
        torch.testing.assert_close(pack[12], _expected(g, pack))
    pack[11].mul_(-2.0)  # an input updated in place is read again
    g.execute(handle, pack)
    torch.testing.assert_close(pack[12], _expected(g, pack))


def test_graph_execute_fast_path_still_refuses_a_wrong_pack() -> None:
    g, handle = _conv_graph()
    pack = reference.make_inputs(g)
    g.execute(handle, pack)
    bad = dict(pack)
    bad[10] = torch.zeros(2, 4, 5, 6)
    with pytest.raises(dt.InvalidValueError, match="uid 10"):
        g.execute(handle, bad)
    wrong_type = dict(pack)
    wrong_type[11] = pack[11].double()
    with pytest.raises(dt.InvalidValueError):
        g.execute(handle, wrong_type)
    missing = {10: pack[10], 12: pack[12]}
    with pytest.raises(dt.InvalidValueError, match="missing"):
        g.execute(handle, missing)
    g.execute(handle, pack)  # the good pack still runs


def test_graph_execute_other_keys_and_values_take_the_full_path() -> None:
    g, handle = _conv_graph()
    pack = reference.make_inputs(g, seed=4)
    by_tensor = {g.tensor_by_uid(u): t for u, t in pack.items()}
    g.execute(handle, by_tensor)  # TensorAttributes keys bind too
    torch.testing.assert_close(pack[12], _expected(g, pack))
    pack[12].zero_()
    g.execute(handle, by_tensor)
    torch.testing.assert_close(pack[12], _expected(g, pack))
    as_numpy = {10: pack[10].numpy(), 11: pack[11].numpy(), 12: pack[12]}
    pack[12].zero_()
    g.execute(handle, as_numpy)  # converted by the full path
    torch.testing.assert_close(pack[12], _expected(g, pack))
    assert isinstance(as_numpy[10], np.ndarray)


def test_a_new_plan_gets_a_new_binding() -> None:
    g, handle = _conv_graph()
    pack = reference.make_inputs(g)
    g.execute(handle, pack)
    old = g._binding
    assert old is not None and old.plan is g.active_plan
    g.create_execution_plan_ext("TORCH_ENGINE", {"torch.memory_format": "channels_last"})
    g.build_plans()
    assert g._binding is None
    pack[12].zero_()
    g.execute(handle, pack)
    assert g._binding is not None and g._binding.plan is g.active_plan is not old.plan
    torch.testing.assert_close(pack[12], _expected(g, pack))


def test_plan_bind_in_any_uid_order_matches_execute() -> None:
    g, _ = _conv_graph()
    plan = g.active_plan
    assert plan is not None
    pack = reference.make_inputs(g, seed=5)
    plan.execute(pack, None)
    expected = pack[12].clone()
    for uids in ((10, 11, 12), (12, 10, 11)):
        pack[12].zero_()
        plan.bind(uids)(tuple(pack[u] for u in uids), None)
        torch.testing.assert_close(pack[12], expected)
    with pytest.raises(ValueError, match="11"):
        plan.bind((10, 12))


# ---- pointer packs -------------------------------------------------------------------------------
def test_pointer_packs_are_built_once_per_address_set_and_bounded() -> None:
    packs = PointerPacks((1, 2), {9: 1234})
    a = packs.get((100, 200))
    assert a == {9: 1234, 1: 100, 2: 200}
    assert packs.get((100, 200)) is a
    b = packs.get((100, 300))
    assert b == {9: 1234, 1: 100, 2: 300} and b is not a
    for i in range(PointerPacks.LIMIT + 5):
        packs.get((i, i))
    assert len(packs) <= PointerPacks.LIMIT
    assert packs.get((100, 200)) == a  # rebuilt after the purge: the same content


@pytest.fixture
def cudnn_plan(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FakeFrontendGraph]:
    return make_cudnn_plan(monkeypatch)


def test_cudnn_bind_reads_the_addresses_of_every_call(
    cudnn_plan: tuple[Any, FakeFrontendGraph],
) -> None:
    plan, frontend = cudnn_plan
    assert plan.takes_pointers
    call = plan.bind((3, 1, 2))  # outputs first: any order
    storage = torch.zeros(64)
    x, w, y = torch.randn(8), torch.randn(8), storage[:8]
    frontend.register(x, w, y)
    call((y, x, w), None)
    torch.testing.assert_close(y, x + w)
    # new input buffers at new addresses: a new pack
    x2 = torch.randn(8)
    frontend.register(x2)
    call((y, x2, w), None)
    torch.testing.assert_close(y, x2 + w)
    # the weight updated in place: same address, same pack, new values read
    w.mul_(3.0)
    call((y, x2, w), None)
    torch.testing.assert_close(y, x2 + w)
    # a buffer freed and another tensor living at its address (a reused block): the pack of
    # that address is right for the new tensor, never a binding of the old tensor object
    del y
    y_new = storage[:8]
    y_new.fill_(-1.0)
    frontend.register(y_new)
    call((y_new, x, w), None)
    torch.testing.assert_close(y_new, x + w)
    for pack in frontend.packs:
        assert pack[7] == 4242  # the scalars ride along
    seen = [(p[1], p[2], p[3]) for p in frontend.packs]
    assert seen == [
        (x.data_ptr(), w.data_ptr(), storage.data_ptr()),
        (x2.data_ptr(), w.data_ptr(), storage.data_ptr()),
        (x2.data_ptr(), w.data_ptr(), storage.data_ptr()),
        (x.data_ptr(), w.data_ptr(), storage.data_ptr()),
    ]
    assert frontend.packs[1] is frontend.packs[2]  # one pack per address set


def test_cudnn_execute_shares_the_pointer_packs(cudnn_plan: tuple[Any, FakeFrontendGraph]) -> None:
    plan, frontend = cudnn_plan
    x, w, y = torch.randn(4), torch.randn(4), torch.empty(4)
    frontend.register(x, w, y)
    plan.execute({1: x, 2: w, 3: y}, None)
    plan.execute({1: x, 2: w, 3: y}, None)
    assert frontend.packs[0] is frontend.packs[1]
    bound = plan.bind((1, 2, 3))
    bound((x, w, y), None)
    bound((x, w, y), None)
    torch.testing.assert_close(y, x + w)
    assert frontend.packs[2] is frontend.packs[3] == frontend.packs[0]
    # another order of the same uids, and the addresses handed over (as a tuple, or as the
    # native reader's bytes): the same pack, built in the caller's order
    y.zero_()
    plan.bind((3, 1, 2))((y, x, w), None)
    torch.testing.assert_close(y, x + w)
    pointers = plan.bind_pointers((2, 3, 1))
    pointers((w.data_ptr(), y.data_ptr(), x.data_ptr()), None)
    pointers(struct.pack("3Q", w.data_ptr(), y.data_ptr(), x.data_ptr()), None)
    assert frontend.packs[-1] == frontend.packs[-2] == frontend.packs[0]
    with pytest.raises(dt.InvalidValueError, match="missing tensor uid 2"):
        plan.execute({1: x, 3: y}, None)
    with pytest.raises(dt.InvalidValueError, match="bind"):
        plan.bind((1, 3))


def _mm_graph() -> tuple[dt.Graph, dt.Handle, Any, Any, Any]:
    handle = dt.create_handle("cpu")
    g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    a = g.tensor(name="A", dims=[1, 8, 16], data_type=dt.DataType.FLOAT)
    b = g.tensor(name="B", dims=[1, 16, 4], data_type=dt.DataType.FLOAT)
    y = g.matmul(a, b)
    y.set_output(True)
    g.build(handle, [dt.HeuristicMode.A])
    return g, handle, a, b, y


@pytest.mark.parametrize("warm", [False, True])
def test_the_bound_path_answers_as_the_full_path_does(warm: bool) -> None:
    """What the full path refuses, a bound graph refused too (audit, session 18): a plan the
    deselect criteria bar after it was bound, a workspace that is no tensor, a key equal to a
    uid without being an int (True, 1.0, numpy's int64), and an IntEnum key beside the
    tensor's own with another buffer."""
    import enum

    g, handle, a, b, y = _mm_graph()
    pack = reference.make_inputs(g)
    if warm:
        g.execute(handle, pack)  # binds
    with pytest.raises(dt.InvalidValueError, match="workspace"):
        g.execute(handle, pack, "not a workspace")  # type: ignore[arg-type]
    # == b.uid (1), hashed alike: refused by the full path whatever else the pack holds (it
    # ran them without another key, refused them with one); a bound pack's keys are found by
    # equality, as dict lookups are, so there such a key reads as the uid it equals
    for key in () if warm else (True, 1.0, np.int64(1)):
        assert key == b.uid
        odd = {a.uid: pack[a.uid], key: pack[b.uid], y.uid: pack[y.uid]}
        with pytest.raises(dt.InvalidValueError, match="keys must be TensorAttributes or int"):
            g.execute(handle, odd)
    enum_a = enum.IntEnum("U", {"A": a.uid}).A
    twice = {
        a: torch.randn(1, 8, 16),
        enum_a: torch.randn(1, 8, 16),
        b: pack[b.uid],
        y: pack[y.uid],
    }
    if warm:
        same = torch.randn(1, 8, 16)
        g.execute(handle, {a: same, enum_a: same, b: pack[b.uid], y: pack[y.uid]})
    with pytest.raises(dt.InvalidValueError, match="given twice"):
        g.execute(handle, twice)
    g.execute(handle, pack)
    g.deselect_engines([g.get_plan_name()])
    with pytest.raises(dt.InvalidValueError, match="barred"):
        g.build_plan_at_index(0)
    with pytest.raises(dt.InvalidValueError, match="barred"):
        g.execute(handle, pack)


def test_a_lazy_negative_view_is_refused_by_name() -> None:
    """Its memory holds the values before the negation: TORCH_COMPILE_ENGINE's plan read them
    and answered wrong (audit, session 18)."""
    g, handle, a, _, _ = _mm_graph()
    pack = reference.make_inputs(g)
    g.execute(handle, pack)  # bound: the lazy view must not pass the bound check either
    lazy = torch._neg_view(torch.randn(1, 8, 16))
    assert lazy.is_neg()
    with pytest.raises(dt.InvalidValueError, match="lazy negative or conjugate view"):
        g.execute(handle, {**pack, a.uid: lazy})
    g.execute(handle, {**pack, a.uid: lazy.resolve_neg()})


@pytest.mark.parametrize("workspace_size", [0, 64])
@pytest.mark.parametrize("on_pointers", [False, True])
def test_cudnn_bound_calls_pass_the_workspace_and_refuse_a_small_one(
    monkeypatch: pytest.MonkeyPatch, workspace_size: int, on_pointers: bool
) -> None:
    """Each form of the bound call (reading the addresses, or given them; with and without a
    workspace) hands cuDNN the right pack and workspace address, and names a workspace that is
    missing or too small instead of letting cuDNN write past it."""
    plan, frontend = make_cudnn_plan(monkeypatch, workspace_size)
    uids = (1, 2, 3)
    call = plan.bind_pointers(uids) if on_pointers else plan.bind(uids)
    x, w, y = torch.randn(8), torch.randn(8), torch.zeros(8)
    frontend.register(x, w, y)
    items = tuple(t.data_ptr() for t in (x, w, y)) if on_pointers else (x, w, y)
    workspace = torch.empty(workspace_size, dtype=torch.uint8)
    call(items, workspace if workspace_size else None)
    torch.testing.assert_close(y, x + w)
    assert frontend.packs[-1] == {7: 4242, 1: x.data_ptr(), 2: w.data_ptr(), 3: y.data_ptr()}
    assert frontend.workspaces[-1] == (workspace.data_ptr() if workspace_size else 0)
    if workspace_size:
        for bad in (None, torch.empty(workspace_size - 1, dtype=torch.uint8)):
            with pytest.raises(dt.InvalidValueError, match=f"workspace of {workspace_size}"):
                call(items, bad)
    # a frontend error is the plan's ExecutionError, named
    monkeypatch.setattr(frontend, "live", {})
    with pytest.raises(dt.ExecutionError, match="cuDNN execute failed"):
        call(items, workspace if workspace_size else None)
