"""Checks of one tensor's values and layout that :class:`~dnntune.graph.ir.OpGraph`'s
validation makes: whether its bytes can be counted in an int64 (:func:`byte_size_problem`),
whether an output layout makes two elements share an address (:func:`overlap`), and whether
a pass-by-value scalar holds a number its data type holds (:func:`scalar_value_problem`,
:func:`out_of_range`).
"""

from __future__ import annotations

import math

from dnntune.graph.json_numbers import finite_float, short_repr
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import INT64_RANGE, DataType

__all__ = [
    "EXACT_OVERLAP_LIMIT",
    "byte_size_problem",
    "out_of_range",
    "overlap",
    "scalar_value_problem",
]

#: the integer scalar types: a scalar of one holds an int (the JSON loader takes no float)
_INT_TYPES = frozenset({DataType.INT32, DataType.INT64})

#: the most elements whose addresses an irregular output layout has counted one by one
EXACT_OVERLAP_LIMIT = 1 << 22


def _bytes(n: int) -> str:
    return f"{n} bytes (about 2**{math.log2(n):.1f})"


def byte_size_problem(t: TensorAttributes) -> tuple[str, str] | None:
    """What overflows when ``t``'s bytes are counted in an int64, with the field to blame
    ("dims" or "strides"), or None. Torch, cuDNN and hipDNN count a buffer's bytes in an int64:
    its elements times the element size (a dense copy of its values), and its last element's
    offset plus one times the element size (the strided buffer). Past 2**63-1 bytes neither
    can be allocated or indexed: such a tensor passed validation and ``make_inputs`` raised
    torch's "Storage size calculation overflowed" (new-user audit). Call with checked dims
    (each >= 1) and strides (each >= 0, one per dim); an unset data type counts as 1 byte."""
    itemsize = t.data_type.itemsize if t.data_type is not None else 1
    limit = INT64_RANGE[1]
    numel = math.prod(t.dims)
    hint = (
        "no buffer of that size can be allocated or indexed (torch and cuDNN count bytes in an "
        "int64); check the dims and strides for a wrong value, or split the tensor"
    )
    if numel * itemsize > limit:
        return "dims", (
            f"dims {t.dims} hold {numel} elements of {itemsize} bytes, "
            f"{_bytes(numel * itemsize)}: more than an int64 counts (2**63-1); {hint}"
        )
    span = t.storage_size()  # the last element's offset + 1
    if span * itemsize > limit:
        return "strides", (
            f"strides {t.strides} put the last element of dims {t.dims} at offset {span - 1}: "
            f"a buffer of {span} elements of {itemsize} bytes, {_bytes(span * itemsize)}: "
            f"more than an int64 counts (2**63-1); {hint}"
        )
    return None


def overlap(dims: list[int], strides: list[int]) -> tuple[str, str] | None:
    """Whether two different indices of the layout share an address: None where they cannot,
    else the words around "make elements ... overlap" that say how sure that is. Strides that
    nest (each dim's stride at least the extent of the smaller ones: every dense and permuted
    layout) cannot; others are checked exactly up to
    :data:`EXACT_OVERLAP_LIMIT` elements (dims [3, 2] with strides [2, 3] hit addresses 0-7
    once each, and were refused; new-user audit, session 56), and beyond it are refused as not
    provably distinct."""
    pairs = sorted((s, d) for d, s in zip(dims, strides, strict=True) if d > 1)
    extent = 1  # elements spanned by the smaller-stride dims so far
    for stride, dim in pairs:
        if stride < extent:
            break
        extent = stride * (dim - 1) + extent
    else:
        return None
    if any(s == 0 for s, _ in pairs):
        return ("", "")  # a broadcast dim: every index along it, one address
    count = math.prod(d for _, d in pairs)
    if count > EXACT_OVERLAP_LIMIT:
        return (
            "may ",
            f" (a layout whose strides do not nest is checked exactly up to "
            f"{EXACT_OVERLAP_LIMIT} elements)",
        )
    import torch  # the graph layer is torch-free until a layout needs counting

    addresses = torch.zeros((), dtype=torch.int64)
    for stride, dim in pairs:
        addresses = (addresses.unsqueeze(-1) + torch.arange(dim) * stride).flatten()
    return None if addresses.unique().numel() == count else ("", "")


#: the values each integer data type holds (a scalar of another type is checked as a float)
_INT_RANGES = {
    DataType.INT8: (-(2**7), 2**7 - 1),
    DataType.UINT8: (0, 2**8 - 1),
    DataType.INT32: (-(2**31), 2**31 - 1),
    DataType.INT64: INT64_RANGE,
}


#: the smallest magnitude each float type rounds to infinity (round to nearest even): a
#: finite scalar this large is no value of its type (a half of 1e6; new-user audit, session 58)
_FLOAT_OVERFLOW = {
    DataType.HALF: 65520.0,
    DataType.BFLOAT16: (2 - 2**-8) * 2.0**127,
    DataType.FLOAT: (2 - 2**-24) * 2.0**127,
}


def out_of_range(t: TensorAttributes) -> bool:
    """Whether the pass-by-value scalar ``t`` holds a number its data type cannot: an integer
    out of an integer type's range, a finite number a float type rounds to infinity, or an
    integer too large for a float (an OverflowError when the graph ran; a JSON
    integer of 400 digits validated "ok"; new-user audit, session 56)."""
    value = t.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    limit = _FLOAT_OVERFLOW.get(t.data_type) if t.data_type is not None else None
    if isinstance(value, float):
        return limit is not None and math.isfinite(value) and abs(value) >= limit
    bounds = _INT_RANGES.get(t.data_type) if t.data_type is not None else None
    if bounds is not None:
        return not bounds[0] <= value <= bounds[1]
    return finite_float(value) is None or (limit is not None and abs(value) >= limit)


def scalar_value_problem(t: TensorAttributes) -> str | None:
    """What is wrong with the pass-by-value scalar ``t``'s value, or None: not a Python int or
    float (the JSON loader takes a number only: ``g.scalar("2")`` computed ``float("2")`` and
    its saved file did not load back; new-user audit, session 58), a float for an integer type
    (``g.scalar(2.7, data_type=INT32)`` multiplied by 2.7), NaN, or a number its data type
    cannot hold (:func:`out_of_range`)."""
    value = t.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (
            "a pass-by-value scalar's value must be a Python int or float, got "
            f"{short_repr(value)} ({type(value).__name__})"
        )
    if isinstance(value, float) and t.data_type in _INT_TYPES:
        assert t.data_type is not None
        return (
            f"an {t.data_type.json_name} scalar takes an integer, got {short_repr(value)}; "
            "give int(value), or a float data type"
        )
    if isinstance(value, float) and math.isnan(value):
        return "a pass-by-value scalar is NaN; give it a number"
    if out_of_range(t):
        return (
            f"a pass-by-value scalar of {short_repr(value)} does not fit its data type "
            f"{t.data_type.json_name if t.data_type else 'unset'}"
        )
    return None
