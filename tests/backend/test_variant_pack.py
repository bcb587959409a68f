"""Variant-pack validation: what is missing or wrong is named; what is extra is accepted."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import dnntune as dt
from dnntune import reference
from dnntune.backend.variant_pack import normalize_variant_pack


@pytest.fixture
def graph() -> dt.Graph:
    g = dt.Graph("pack", io_data_type=dt.DataType.FLOAT, intermediate_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [2, 4, 5, 5], uid=10)
    w = g.tensor("W", [3, 4, 3, 3], uid=11)
    y = g.conv_fprop(x, w, padding=1)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y").set_uid(12)
    g.validate()
    return g


def test_uids_and_tensor_keys_give_the_same_pack(graph: dt.Graph) -> None:
    pack = reference.make_inputs(graph)
    by_uid = normalize_variant_pack(graph, pack)
    by_tensor = normalize_variant_pack(graph, {graph.tensor_by_uid(u): v for u, v in pack.items()})
    assert by_uid.keys() == by_tensor.keys() == {10, 11, 12}
    assert all(by_uid[u] is by_tensor[u] for u in by_uid)


def test_missing_uids_are_listed(graph: dt.Graph) -> None:
    pack = reference.make_inputs(graph)
    del pack[10], pack[12]
    with pytest.raises(dt.InvalidValueError, match=r"missing tensor uid\(s\): 10 \(X\), 12 \(Y\)"):
        normalize_variant_pack(graph, pack)


def test_empty_pack_is_refused(graph: dt.Graph) -> None:
    with pytest.raises(dt.InvalidValueError, match="variant pack is empty"):
        normalize_variant_pack(graph, {})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            torch.zeros(2, 4, 5, 6),
            r"tensor X \(uid 10.*dims \[2, 4, 5, 6\] != expected \[2, 4, 5, 5\]",
        ),
        (
            torch.zeros(2, 4, 5, 5, dtype=torch.float16),
            r"tensor X .*dtype torch.float16 != expected "
            r"torch.float32",
        ),
        (
            torch.zeros(2, 5, 5, 4).permute(0, 3, 1, 2),
            r"tensor X .*strides \[100, 1, 20, 4\] != "
            r"expected \[100, 25, 5, 1\]",
        ),
    ],
    ids=["shape", "dtype", "strides"],
)
def test_wrong_tensor_is_named(graph: dt.Graph, value: torch.Tensor, message: str) -> None:
    pack = reference.make_inputs(graph)
    pack[10] = value
    with pytest.raises(dt.InvalidValueError, match=message):
        normalize_variant_pack(graph, pack)


def test_size_one_dims_may_have_any_stride() -> None:
    g = dt.Graph("bias", io_data_type=dt.DataType.FLOAT)
    b = g.tensor("B", [1, 4, 1, 1], uid=1)
    x = g.tensor("X", [2, 4, 3, 3], uid=2)
    g.pointwise(x, b, mode=dt.PointwiseMode.ADD).set_output(True).set_uid(3)
    g.validate()
    pack = reference.make_inputs(g)
    pack[1] = torch.zeros(4, 1, 1, 1).permute(1, 0, 2, 3)  # strides [1, 1, 1, 1]
    assert normalize_variant_pack(g, pack)[1] is pack[1]


def test_extra_uids_are_accepted(graph: dt.Graph) -> None:
    pack = reference.make_inputs(graph)
    pack[999] = torch.zeros(1)
    assert 999 in normalize_variant_pack(graph, pack)


def test_a_none_key_is_skipped_as_cudnn_frontend_skips_it() -> None:
    """cuDNN frontend's samples key optional tensors in one dict literal (test_rmsnorm.py:
    ``bias: bias_gpu`` with ``bias = None``; test_mhas.py: ``bias``, ``seq_len_q``, ...) and
    its execute skips a None key; here the pack was refused ("keys must be TensorAttributes or
    int uids, got None"). Skipped on every path: execute (full and bound), the plan-index
    path, autotune and the reference."""
    handle = dt.create_handle("cpu")
    f = dt.DataType.FLOAT
    g = dt.Graph("rms", io_data_type=f, intermediate_data_type=f, compute_data_type=f)
    x, scale = g.tensor("X", [8, 16, 1, 1]), g.tensor("scale", [1, 16, 1, 1])
    bias = None  # has_bias=False in the sample
    (y,) = g.rmsnorm(x, scale, epsilon=1e-3, bias=bias)
    y.set_output(True)
    g.build(handle, [dt.HeuristicMode.A], dt.BuildPlanPolicy.ALL)
    xt, st = torch.randn(8, 16, 1, 1), torch.randn(1, 16, 1, 1)
    bias_gpu = None
    out = torch.empty(8, 16, 1, 1)
    pack = {x: xt, scale: st, bias: bias_gpu, y: out}
    expected = xt * torch.rsqrt(xt.square().mean(dim=(1, 2, 3), keepdim=True) + 1e-3) * st
    for _ in range(2):  # the second call goes through the bound path
        out.zero_()
        g.execute(handle, pack)
        torch.testing.assert_close(out, expected)
    out.zero_()
    g.execute_plan_at_index(handle, pack, None, 0)
    torch.testing.assert_close(out, expected)
    assert None not in normalize_variant_pack(g, pack)
    results = g.autotune(handle, pack, None, config=dt.AutotuneConfig(baseline=None))
    assert results[0].succeeded
    torch.testing.assert_close(reference.run(g, pack)[y.uid].float(), expected)


def test_numpy_values_are_converted_zero_copy(graph: dt.Graph) -> None:
    pack = {u: t.numpy() for u, t in reference.make_inputs(graph).items()}
    by_uid = normalize_variant_pack(graph, pack)
    assert all(isinstance(v, torch.Tensor) for v in by_uid.values())
    by_uid[12].fill_(3.0)
    assert np.all(pack[12] == 3.0)


def test_a_read_only_numpy_output_is_refused_and_left_unwritten(
    graph: dt.Graph, cpu_handle: dt.Handle
) -> None:
    """Converted zero-copy, a read-only array was written through: execute() filled the
    immutable bytes object under np.frombuffer. A read-only input is fine."""
    pack = {u: t.numpy() for u, t in reference.make_inputs(graph).items()}
    frozen = bytes(pack[12].nbytes)
    pack[12] = np.frombuffer(frozen, dtype=np.float32).reshape(pack[12].shape)
    pack[10].setflags(write=False)
    graph.build(cpu_handle)
    with pytest.raises(dt.InvalidValueError, match=r"tensor Y \(uid 12\) is an output.*read-only"):
        graph.execute(cpu_handle, pack)
    assert frozen == bytes(len(frozen))
    pack[12] = np.empty_like(pack[12])
    graph.execute(cpu_handle, pack)
    assert np.any(pack[12] != 0)


@pytest.mark.parametrize("dtype", [">f4", object], ids=["big_endian", "object"])
def test_a_numpy_array_torch_cannot_read_is_refused_by_name(graph: dt.Graph, dtype: Any) -> None:
    """NumPy arrays of another byte order or a dtype torch lacks raised torch's bare
    ValueError / TypeError, naming no tensor."""
    pack: dict[int, Any] = dict(reference.make_inputs(graph))
    pack[10] = pack[10].numpy().astype(dtype)
    with pytest.raises(dt.InvalidValueError, match=r"tensor X \(uid 10\): a NumPy array of dtype"):
        normalize_variant_pack(graph, pack)


def test_a_numpy_array_with_negative_strides_is_refused_not_a_crash(
    graph: dt.Graph, cpu_handle: dt.Handle
) -> None:
    """torch.from_dlpack of a reversed NumPy view aborted the interpreter (a C++ exception
    no ``except`` catches: the whole process died, new-user audit, session 55)."""
    pack: dict[int, Any] = {u: t.numpy() for u, t in reference.make_inputs(graph).items()}
    pack[10] = pack[10][::-1]
    graph.build(cpu_handle)
    with pytest.raises(dt.InvalidValueError, match=r"tensor X \(uid 10\).*negative strides"):
        graph.execute(cpu_handle, pack)
    pack[10] = np.ascontiguousarray(pack[10])  # the copy the message asks for
    graph.execute(cpu_handle, pack)


def test_bad_keys_and_values_are_refused(graph: dt.Graph) -> None:
    pack = reference.make_inputs(graph)
    with pytest.raises(dt.InvalidValueError, match="keys must be TensorAttributes or int uids"):
        normalize_variant_pack(graph, {"X": pack[10]})
    with pytest.raises(dt.InvalidValueError, match="values must be torch tensors"):
        normalize_variant_pack(graph, {**pack, 10: [1, 2, 3]})


def test_graph_changes_are_seen_after_a_cached_check(graph: dt.Graph) -> None:
    pack = reference.make_inputs(graph)
    normalize_variant_pack(graph, pack)  # caches what the graph expects
    extra = graph.tensor("EXTRA", [3], uid=20)
    graph.pointwise(extra, mode=dt.PointwiseMode.ABS).set_output(True).set_uid(21)
    with pytest.raises(dt.InvalidValueError, match=r"20 \(EXTRA\), 21"):
        normalize_variant_pack(graph, pack)
    pack[20], pack[21] = torch.zeros(3), torch.zeros(3)
    graph.tensor_by_uid(10).set_dims([2, 4, 5, 6]).set_strides([120, 30, 6, 1])
    with pytest.raises(
        dt.InvalidValueError, match=r"dims \[2, 4, 5, 5\] != expected \[2, 4, 5, 6\]"
    ):
        normalize_variant_pack(graph, pack)


def test_device_mismatch_is_named(graph: dt.Graph) -> None:
    pack = reference.make_inputs(graph)
    handle = dt.create_handle("cpu")
    assert normalize_variant_pack(graph, pack, handle).keys() == pack.keys()
    if torch.cuda.is_available():
        cuda = dt.create_handle("cuda")
        with pytest.raises(dt.InvalidValueError, match="is on cpu, the handle on cuda"):
            normalize_variant_pack(graph, pack, cuda)
