"""A tensor edited after its graph's plan was built, by a setter, an assignment or in place,
is an edit of the graph: execute refuses the old plan (BadStateError) instead of running it on
the old constant, or on buffers of the new shape."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import dnntune as dt
from dnntune.graph.tensor import TrackedInts

F = dt.DataType.FLOAT


def _scaled(handle: dt.Handle) -> tuple[dt.Graph, dt.TensorAttributes, dt.TensorAttributes]:
    g = dt.Graph(name="scal", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="x", dims=[4, 8], data_type=F)
    s = g.scalar(2.0, name="s")
    y = g.pointwise(x, s, mode=dt.PointwiseMode.MUL)
    y.set_output(True)
    g.build(handle)
    return g, x, s


def _matmul(handle: dt.Handle) -> tuple[dt.Graph, dt.TensorAttributes, dt.TensorAttributes]:
    g = dt.Graph(name="mm", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    a = g.tensor(name="A", dims=[1, 64, 128], data_type=F)
    b = g.tensor(name="B", dims=[1, 128, 32], data_type=F)
    y = g.matmul(a, b)
    y.set_output(True)
    g.build(handle)
    return g, a, y


def test_a_scalar_constant_assigned_after_build_is_not_ignored() -> None:
    handle = dt.create_handle("cpu")
    g, x, s = _scaled(handle)
    y = g.output_tensors()[0]
    xv, out = torch.randn(4, 8), torch.empty(4, 8)
    g.execute(handle, {x: xv, y: out})
    torch.testing.assert_close(out, 2 * xv)
    key = g.key()
    s.value = 3.0
    assert g.key() != key
    with pytest.raises(dt.BadStateError, match="changed"):
        g.execute(handle, {x: xv, y: out})
    g.build(handle)  # plans built again: the new constant is used
    g.execute(handle, {x: xv, y: out})
    torch.testing.assert_close(out, 3 * xv)


def test_dims_edited_in_place_after_build_are_an_edit() -> None:
    handle = dt.create_handle("cpu")
    g, a, y = _matmul(handle)
    b = g.tensors[1]
    bv, out = torch.randn(1, 128, 32), torch.empty(1, 64, 32)
    g.execute(handle, {a: torch.randn(1, 64, 128), b: bv, y: out})
    a.dims[1] = 32
    assert a.dims == [1, 32, 128]
    with pytest.raises(dt.BadStateError, match="changed"):
        g.execute(handle, {a: torch.randn(1, 32, 128), b: bv, y: out})
    assert tuple(out.shape) == (1, 64, 32)  # the caller's buffer is left alone


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.dims.__setitem__(0, 2),
        lambda t: t.strides.__setitem__(0, 2 * t.strides[0]),
        lambda t: t.dims.append(1),
        lambda t: t.dims.extend([1]),
        lambda t: t.dims.insert(0, 1),
        lambda t: t.dims.pop(),
        lambda t: t.dims.__delitem__(0),
        lambda t: t.dims.reverse(),
        lambda t: t.dims.clear(),
        lambda t: t.dims.__iadd__([1]),
        lambda t: t.dims.__imul__(2),
        lambda t: t.dims.remove(128),
        lambda t: t.dims.sort(reverse=True),
        lambda t: setattr(t, "dims", [1, 64, 64]),
        lambda t: setattr(t, "strides", [1, 1, 64]),
        lambda t: setattr(t, "uid", 77),
        lambda t: setattr(t, "data_type", dt.DataType.HALF),
        lambda t: setattr(t, "is_virtual", True),
        lambda t: setattr(t, "is_output", True),
        lambda t: t.set_dims([2, 64, 128]),
    ],
)
def test_every_way_to_change_a_tensor_is_an_edit(edit: object) -> None:
    handle = dt.create_handle("cpu")
    g, a, _ = _matmul(handle)
    revision = g.revision
    edit(a)  # type: ignore[operator]
    assert g.revision > revision
    assert not g.is_validated
    with pytest.raises(dt.BadStateError, match="changed"):
        g.execute(handle, {})


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.dims.__setitem__(1, 64),
        lambda t: setattr(t, "dims", [1, 64, 128]),
        lambda t: setattr(t, "uid", t.uid),
        lambda t: setattr(t, "value", None),
        lambda t: t.set_dims([1, 64, 128]),
    ],
)
def test_setting_what_a_tensor_already_has_is_an_edit_too(edit: object) -> None:
    """As for the setters: the plans were not built after it (tests/test_plan_path.py)."""
    handle = dt.create_handle("cpu")
    g, a, y = _matmul(handle)
    pack = {a: torch.randn(1, 64, 128), 1: torch.randn(1, 128, 32), y: torch.empty(1, 64, 32)}
    g.execute(handle, pack)
    edit(a)  # type: ignore[operator]
    with pytest.raises(dt.BadStateError, match="changed"):
        g.execute(handle, pack)
    g.build(handle)
    g.execute(handle, pack)


def test_dims_stay_lists_of_ints_and_copies_are_plain_lists() -> None:
    t = dt.TensorAttributes(name="T", dims=(2, 3), data_type=F)
    assert isinstance(t.dims, TrackedInts) and isinstance(t.dims, list)
    assert t.dims == [2, 3] and repr(t.dims) == "[2, 3]" and t.strides == [3, 1]
    for copied in (
        list(t.dims),
        t.dims[:],
        t.dims.copy(),
        copy.copy(t.dims),
        copy.deepcopy(t.dims),
    ):
        assert type(copied) is list and copied == [2, 3]
    assert type(pickle.loads(pickle.dumps(t.dims))) is list
    with pytest.raises(dt.InvalidValueError, match="dims must be integers"):
        t.dims[0] = 2.5
    with pytest.raises(dt.InvalidValueError, match="strides must be integers"):
        t.strides.append(True)
    with pytest.raises(dt.InvalidValueError, match="dims must be integers"):
        t.dims = [1.5]  # type: ignore[list-item]
    assert t.dims == [2, 3]


def test_a_copy_of_a_tensor_is_independent_and_keeps_its_flags() -> None:
    handle = dt.create_handle("cpu")
    g, a, _ = _matmul(handle)
    y = g.output_tensors()[0]
    assert y._auto_data_type  # its type was filled in from the graph's
    assert copy.copy(y)._auto_data_type and copy.copy(y).data_type is F
    twin = copy.copy(a)
    assert twin.dims == a.dims and twin.dims is not a.dims and twin.uid == a.uid
    assert not g.holds(twin)  # held by no graph: it keys no pack of g
    revision = g.revision
    twin.dims[0] = 5
    twin.value = 1.0
    assert a.dims[0] == 1 and a.value is None and g.revision == revision
    with pytest.raises(dt.InvalidValueError, match="not a tensor of graph"):
        g.execute(handle, {twin: torch.empty(5, 64, 128)})


def test_a_replaced_dims_list_no_longer_edits_the_tensor() -> None:
    handle = dt.create_handle("cpu")
    g, a, _ = _matmul(handle)
    old = a.dims
    a.set_dims([1, 64, 128])
    revision = g.revision
    old[0] = 9
    assert g.revision == revision and a.dims == [1, 64, 128]


def test_an_assigned_data_type_is_the_callers_choice() -> None:
    """Assignment is set_data_type: a type filled in from the graph's types is replaced for
    good, not filled in again by the next validation."""
    handle = dt.create_handle("cpu")
    g = dt.Graph(name="t", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    x = g.tensor(name="x", dims=[4])
    y = g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    g.build(handle)
    assert x.data_type is F and x._auto_data_type
    x.data_type = dt.DataType.HALF
    y.data_type = dt.DataType.HALF
    g.validate()
    assert x.data_type is dt.DataType.HALF and y.data_type is dt.DataType.HALF


def test_validation_filling_in_types_again_is_no_edit() -> None:
    handle = dt.create_handle("cpu")
    g, _, _ = _scaled(handle)
    revision = g.revision
    g.validate()
    g.build(handle)
    assert g.revision == revision


def test_a_loaded_graphs_tensors_report_their_edits() -> None:
    handle = dt.create_handle("cpu")
    g, _, _ = _matmul(handle)
    loaded = dt.Graph.from_json(g.to_json())
    loaded.build(handle)
    a = loaded.tensors[0]
    assert loaded.holds(a) and not g.holds(a)
    a.dims[1] = 32
    with pytest.raises(dt.BadStateError, match="changed"):
        loaded.execute(handle, {})


def test_plan_choice_refuses_a_graph_edited_since() -> None:
    handle = dt.create_handle("cpu")
    g, a, y = _matmul(handle)
    choice = dt.choose_plan(g, handle)
    pack = {
        a: torch.randn(1, 64, 128),
        g.tensors[1]: torch.randn(1, 128, 32),
        y: torch.empty(1, 64, 32),
    }
    choice.execute(handle, pack)
    choice.execute(handle, pack)  # bound
    a.dims[1] = 32
    with pytest.raises(dt.BadStateError, match="changed"):
        choice.execute(handle, pack)


def _dgrad(dy_layout: torch.memory_format) -> tuple[dt.Graph, torch.Tensor, torch.Tensor]:
    dy = torch.randn(2, 4, 7, 7).to(memory_format=dy_layout)
    w = torch.randn(4, 3, 3, 3)
    g = dt.Graph(name="dgrad", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    g.conv_dgrad(g.tensor_like(dy, name="dy"), g.tensor_like(w, name="w"), padding=1, stride=2)
    return g, dy, w


@pytest.mark.parametrize(
    ("layout", "strides"),
    [
        (torch.contiguous_format, [588, 196, 14, 1]),
        (torch.channels_last, [588, 1, 42, 3]),
    ],
)
def test_set_dims_on_an_inferred_output_rederives_its_strides(
    layout: torch.memory_format, strides: list[int]
) -> None:
    """cuDNN frontend code sets a conv_dgrad output's dims after the builder call
    (``dx.set_dims(...)``); with stride 2 the builder had inferred 13x13, and the strides kept
    for those dims were refused as overlapping the new 14x14 dims. Strides the op inferred
    follow the new dims, in the layout it chose."""
    handle = dt.create_handle("cpu")
    g, dy, w = _dgrad(layout)
    dx = g.tensors[-1]
    assert dx.dims == [2, 3, 13, 13]
    dx.set_output(True).set_dims([2, 3, 14, 14])
    assert dx.strides == strides
    g.build(handle, [dt.HeuristicMode.A])
    out = torch.empty_strided([2, 3, 14, 14], strides)
    g.execute(handle, {g.tensors[0]: dy, g.tensors[1]: w, dx: out})
    x = torch.zeros(2, 3, 14, 14, requires_grad=True)
    torch.nn.functional.conv2d(x, w, padding=1, stride=2).backward(dy)
    torch.testing.assert_close(out, x.grad)


def test_set_dims_keeps_strides_the_caller_gave() -> None:
    g = dt.Graph(name="t", io_data_type=F)
    given = g.tensor(name="given", dims=[2, 3], strides=[1, 2])
    default = g.tensor(name="default", dims=[2, 3])
    given.set_dims([4, 5])
    default.set_dims([4, 5])
    assert given.strides == [1, 2]  # the caller's: checked by validate(), never replaced
    assert default.strides == [5, 1]  # defaulted row-major: follows the dims
    default.set_strides([1, 4]).set_dims([4, 6])
    assert default.strides == [1, 4]  # set by the caller since
    default.dims[1] = 5
    assert default.strides == [1, 4]


def test_an_input_resized_after_its_output_was_inferred_says_what_to_set() -> None:
    """Porting a graph to another batch size with ``set_dims`` on the inputs: the outputs'
    dims, inferred when their nodes were added, stay as they were, and validate() said only
    that they 'do not match the inferred dims', naming dims the caller never set (new-user
    audit). The message says why and what to set."""
    handle = dt.create_handle("cpu")
    g, a, y = _matmul(handle)
    b = next(t for t in g.tensors if t.name == "B")
    a.set_dims([4, 64, 128])
    b.set_dims([4, 128, 32])
    with pytest.raises(dt.InvalidValueError, match=r"inferred when its node is added") as info:
        g.validate()
    assert "set them to [4, 64, 32] (set_dims)" in str(info.value)
    y.set_dims([4, 64, 32])  # what the message says to do validates and runs
    g.build_operation_graph(handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    g.build_plans()
    at, bt = torch.randn(4, 64, 128), torch.randn(4, 128, 32)
    out = torch.empty(4, 64, 32)
    g.execute(handle, {a: at, b: bt, y: out})
    torch.testing.assert_close(out, at @ bt)
