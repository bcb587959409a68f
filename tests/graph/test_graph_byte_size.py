"""A tensor whose bytes overflow an int64 is refused by validation, naming the tensor, the
field and what overflowed (new-user audit: dims [2**40, 2**30] of float validated "ok", and
``reference.make_inputs`` then raised torch's "Storage size calculation overflowed")."""

from __future__ import annotations

import json

import pytest

import dnntune as dt
from dnntune import reference
from dnntune.graph.ir import TensorError

F = dt.DataType.FLOAT
H = dt.DataType.HALF


def _relu(dims: list[int], strides: list[int] | None, dtype: dt.DataType = F) -> dt.Graph:
    g = dt.Graph(name="relu", io_data_type=dtype, compute_data_type=F)
    x = g.tensor("X", dims=dims, strides=strides, data_type=dtype)
    g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD, name="relu").set_output(True)
    return g


@pytest.mark.parametrize(
    ("dims", "strides", "field", "match"),
    [
        # 2**70 elements: the element count overflows before the bytes do
        ([2**40, 2**30], None, "dims", r"dims \[1099511627776, 1073741824\] hold "
         r"1180591620717411303424 elements of 4 bytes, .* \(about 2\*\*72\.0\): more than an "
         r"int64 counts"),
        # 2**62 elements of 4 bytes: the element count fits, its bytes do not
        ([2**31, 2**31], None, "dims", r"elements of 4 bytes, 18446744073709551616 bytes"),
        # four elements, the last at offset 2**62 + 1: the strided buffer overflows
        ([2, 2], [2**62, 1], "strides", r"strides \[4611686018427387904, 1\] put the last "
         r"element of dims \[2, 2\] at offset 4611686018427387905: a buffer of "
         r"4611686018427387906 elements of 4 bytes"),
    ],
)  # fmt: skip
def test_a_tensor_whose_bytes_overflow_int64_is_refused_by_validate(
    dims: list[int], strides: list[int] | None, field: str, match: str
) -> None:
    g = _relu(dims, strides)
    with pytest.raises(TensorError, match=match) as caught:
        g.validate()
    assert str(caught.value).startswith(f"tensor 'X' (uid 0): {field} ")
    assert caught.value.field == field
    assert "check the dims and strides" in str(caught.value)
    assert not g.is_validated
    # make_inputs validates first: the same message, not torch's RuntimeError
    with pytest.raises(TensorError, match=match):
        reference.make_inputs(g)


def test_the_element_size_counts() -> None:
    """2**62 halves are 2**63 bytes, one past the int64 range; 2**62 - 1 of them fit."""
    with pytest.raises(TensorError, match=r"elements of 2 bytes, 9223372036854775808 bytes"):
        _relu([2**31, 2**31], None, H).validate()
    _relu([2**62 - 1], None, H).validate()  # 2**63 - 2 bytes: large, but countable
    _relu([2, 2], [2**61, 1], H).validate()  # last offset 2**61 + 1, 2**62 + 4 bytes


def test_a_loaded_graph_names_the_json_path() -> None:
    doc = _relu([2, 3], None).to_dict()
    (x,) = [t for t in doc["tensors"] if t["name"] == "X"]
    x["dims"], x["strides"] = [2, 3], [2**62, 1]
    with pytest.raises(dt.GraphFormatError, match=r"tensors\[\d\]\.strides: .*more than an int64"):
        dt.Graph.from_json(json.dumps(doc))
