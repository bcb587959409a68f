"""Variant-pack checks an audit found missing: an output whose memory overlaps another buffer
(RFC 6.3: separate input and output buffers), and a tensor on the wrong device type that passed
the fast check (a meta tensor on a CPU handle)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import reference, testing
from dnntune.backend.variant_pack import normalize_variant_pack

OVERLAP = "variant pack: output C \\(uid {c}\\) shares memory with input A \\(uid {a}\\)"


@pytest.fixture
def handle() -> dt.Handle:
    return dt.create_handle("cpu")


def _matmul(handle: dt.Handle, n: int = 8) -> dt.Graph:
    g = testing.small_matmul_graph(m=n, n=n, k=n)
    g.build_operation_graph(handle)
    g.build(handle)
    return g


def _pointwise(handle: dt.Handle) -> dt.Graph:
    """``Y = relu(X + B)``: pointwise ops only, one output."""
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    g.build(handle)
    return g


def _uids(g: dt.Graph) -> tuple[int, int, int]:
    (a, b), (c,) = g.input_tensors(), g.output_tensors()
    assert a.uid is not None and b.uid is not None and c.uid is not None
    return a.uid, b.uid, c.uid


def test_an_output_over_an_input_is_refused_naming_both(handle: dt.Handle) -> None:
    """``g.execute(h, {a: A, b: B, y: A})`` of a matmul gave wrong numbers."""
    g = _matmul(handle)
    a, b, c = _uids(g)
    A, B = torch.randn(1, 8, 8), torch.randn(1, 8, 8)
    before = A.clone()
    with pytest.raises(dt.InvalidValueError, match=OVERLAP.format(a=a, c=c)) as info:
        g.execute(handle, {a: A, b: B, c: A})
    assert "256 bytes in common" in str(info.value)
    assert "torch.empty_strided([1, 8, 8], [64, 8, 1], dtype=torch.float32" in str(info.value)
    assert torch.equal(A, before)  # refused before anything ran


def test_tensor_keys_name_the_tensors_too(handle: dt.Handle) -> None:
    g = _matmul(handle)
    (ta, tb), (tc,) = g.input_tensors(), g.output_tensors()
    A, B = torch.randn(1, 8, 8), torch.randn(1, 8, 8)
    with pytest.raises(dt.InvalidValueError, match="input B"):
        g.execute(handle, {ta: A, tb: B, tc: B})


def test_a_partial_overlap_through_views_is_refused(handle: dt.Handle) -> None:
    g = _matmul(handle)
    a, b, c = _uids(g)
    buf = torch.randn(96)
    A, C = buf[:64].view(1, 8, 8), buf[32:].view(1, 8, 8)
    with pytest.raises(dt.InvalidValueError, match=OVERLAP.format(a=a, c=c)) as info:
        g.execute(handle, {a: A, b: torch.randn(1, 8, 8), c: C})
    assert "128 bytes in common" in str(info.value)


def test_disjoint_views_of_one_buffer_are_fine(handle: dt.Handle) -> None:
    g = _matmul(handle)
    a, b, c = _uids(g)
    buf = torch.randn(192)
    A, B, C = (buf[i * 64 : (i + 1) * 64].view(1, 8, 8) for i in range(3))
    expected = A @ B
    g.execute(handle, {a: A, b: B, c: C})
    torch.testing.assert_close(C, expected)


def test_the_fast_path_refuses_an_overlap_too(handle: dt.Handle) -> None:
    """A pack with the keys and layouts of an earlier one goes to the bound call without the
    full check: it must still refuse buffers at new addresses that overlap."""
    g = _matmul(handle)
    a, b, c = _uids(g)
    A, B, C = torch.randn(1, 8, 8), torch.randn(1, 8, 8), torch.zeros(1, 8, 8)
    g.execute(handle, {a: A, b: B, c: C})
    g.execute(handle, {a: A, b: B, c: C})  # the bound call
    before = B.clone()
    with pytest.raises(dt.InvalidValueError, match=r"output C .* shares memory with input B"):
        g.execute(handle, {a: A, b: B, c: B})
    assert torch.equal(B, before)
    C2 = torch.zeros(1, 8, 8)
    g.execute(handle, {a: A, b: B, c: C2})  # separate buffers again: fine
    torch.testing.assert_close(C2, A @ B)


def test_the_full_path_rechecks_when_the_addresses_change(handle: dt.Handle) -> None:
    g = _matmul(handle)
    pack = reference.make_inputs(g)
    a, _, c = _uids(g)
    normalize_variant_pack(g, pack, handle)
    normalize_variant_pack(g, pack, handle)  # the same buffers: the cached verdict
    with pytest.raises(dt.InvalidValueError, match=OVERLAP.format(a=a, c=c)):
        normalize_variant_pack(g, {**pack, c: pack[a]}, handle)
    with pytest.raises(dt.InvalidValueError, match=OVERLAP.format(a=a, c=c)):
        normalize_variant_pack(g, {**pack, c: pack[a]})  # no handle: checked every time


def test_two_outputs_may_not_overlap(handle: dt.Handle) -> None:
    g = dt.Graph("two_outputs", io_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [4, 4])
    b = g.tensor("B", [4, 4])
    t = g.pointwise(x, b, mode=dt.PointwiseMode.ADD)
    t.set_output(True).set_name("T")
    g.pointwise(t, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y")
    g.validate()
    g.build_operation_graph(handle)
    g.build(handle)
    pack = reference.make_inputs(g)
    (tt, ty) = g.output_tensors()
    assert tt.uid is not None and ty.uid is not None
    pack[ty.uid] = pack[tt.uid]
    with pytest.raises(
        dt.InvalidValueError, match=r"output T \(uid \d+\) shares memory with output Y"
    ):
        g.execute(handle, pack)


def test_a_pointwise_graph_may_write_its_output_exactly_over_an_input(handle: dt.Handle) -> None:
    """The documented exception: each element is read before it is written."""
    g = _pointwise(handle)
    pack = reference.make_inputs(g)
    (tx, tb), (ty,) = g.input_tensors(), g.output_tensors()
    assert tx.uid is not None and tb.uid is not None and ty.uid is not None
    x = pack[tx.uid]
    expected = torch.relu(x + pack[tb.uid])
    pack[ty.uid] = x
    g.execute(handle, pack)
    torch.testing.assert_close(x, expected)


def test_a_pointwise_graph_may_not_write_over_an_input_shifted(handle: dt.Handle) -> None:
    g = _pointwise(handle)
    (tx, tb), (ty,) = g.input_tensors(), g.output_tensors()
    n = 2 * 3 * 4 * 4
    buf = torch.randn(n + 4)
    pack: dict[Any, torch.Tensor] = {
        tx: buf[:n].view(2, 3, 4, 4),
        tb: torch.randn(2, 3, 4, 4),
        ty: buf[4:].view(2, 3, 4, 4),
    }
    with pytest.raises(dt.InvalidValueError, match=r"output Y .* shares memory with input X"):
        g.execute(handle, pack)


def test_autotune_refuses_an_overlapping_pack_up_front(handle: dt.Handle) -> None:
    """The verifier ran each candidate into fresh buffers, so ``verified=True`` described a
    pack that never ran: autotune raises the execute error before any candidate."""
    g = testing.small_matmul_graph(m=8, n=8, k=8)
    g.build_operation_graph(handle)
    g.add_engine("TORCH_ENGINE")
    a, b, c = _uids(g)
    A = torch.randn(1, 8, 8)
    pack = {a: A, b: torch.randn(1, 8, 8), c: A}
    with pytest.raises(dt.InvalidValueError, match=OVERLAP.format(a=a, c=c)):
        g.autotune(handle, pack, None, 0, dt.AutotuneConfig())


def test_autotune_on_compiled_plans_refuses_it_too(handle: dt.Handle) -> None:
    g = testing.small_matmul_graph(m=8, n=8, k=8)
    g.build_operation_graph(handle)
    g.create_execution_plans()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    a, b, c = _uids(g)
    B = torch.randn(1, 8, 8)
    pack = {a: torch.randn(1, 8, 8), b: B, c: B}
    with pytest.raises(dt.InvalidValueError, match=r"output C .* shares memory with input B"):
        g.autotune(handle, pack, None)


@pytest.mark.parametrize("which", ["A", "C"])
def test_a_meta_tensor_on_a_cpu_handle_is_named(handle: dt.Handle, which: str) -> None:
    """The fast check compared only ``is_cuda``: a meta output passed it and failed inside the
    engine (``ExecutionError ... copy from device cpu to device meta``)."""
    g = _matmul(handle)
    pack = reference.make_inputs(g)
    t = next(t for t in g.io_tensors() if t.name == which)
    assert t.uid is not None
    pack[t.uid] = torch.empty(1, 8, 8, device="meta")
    with pytest.raises(
        dt.InvalidValueError, match=rf"tensor {which} \(uid \d+.*\) is on meta, the handle on cpu"
    ):
        g.execute(handle, pack)
    with pytest.raises(dt.InvalidValueError, match="is on meta, the handle on cpu"):
        normalize_variant_pack(g, pack, handle)


def test_a_meta_tensor_after_a_bound_call_is_named(handle: dt.Handle) -> None:
    g = _matmul(handle)
    pack = reference.make_inputs(g)
    g.execute(handle, pack)
    g.execute(handle, pack)
    _, _, c = _uids(g)
    with pytest.raises(dt.InvalidValueError, match="is on meta, the handle on cpu"):
        g.execute(handle, {**pack, c: torch.empty(1, 8, 8, device="meta")})


def test_inputs_may_share_memory(handle: dt.Handle) -> None:
    """Only outputs are written: ``A @ A`` with one buffer for both inputs is fine."""
    g = _matmul(handle)
    a, b, c = _uids(g)
    A, C = torch.randn(1, 8, 8), torch.zeros(1, 8, 8)
    g.execute(handle, {a: A, b: A, c: C})
    torch.testing.assert_close(C, A @ A)


def test_a_sparse_buffer_is_named_as_sparse(handle: dt.Handle) -> None:
    """A sparse tensor was refused as 'strides [0, 0] != expected [8, 1]' (its stride() reads
    zeros), which sent the user looking for a layout problem (new-user audit)."""
    g = _matmul(handle)
    a, _, _ = _uids(g)
    pack = reference.make_inputs(g, "cpu")
    pack[a] = pack[a].to_sparse()
    with pytest.raises(
        dt.InvalidValueError, match=r"tensor A .*: a sparse_coo tensor; .*to_dense"
    ) as info:
        g.execute(handle, pack)
    assert "strides" not in str(info.value)
