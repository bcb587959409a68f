"""``tensor_like`` takes a torch tensor; anything else is named with how to convert it (an audit
found a NumPy array reported as "torch dtype float32 has no dnntune DataType")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import dnntune as dt


def test_a_numpy_array_says_to_use_torch_from_numpy() -> None:
    g = dt.Graph("g")
    with pytest.raises(
        dt.InvalidValueError,
        match=r"tensor_like\('x'\): expected a torch.Tensor, got numpy.ndarray; convert it "
        r"with torch.from_numpy\(array\)",
    ):
        g.tensor_like(np.zeros((2, 3), dtype=np.float32), name="x")  # type: ignore[arg-type]
    assert g.tensors == []


@pytest.mark.parametrize(("value", "kind"), [([1.0, 2.0], "list"), (3.0, "float")])
def test_other_values_say_what_they_are(value: Any, kind: str) -> None:
    with pytest.raises(dt.InvalidValueError, match=f"got {kind}; convert it with torch.as_tensor"):
        dt.Graph("g").tensor_like(value, name="x")


def test_the_converted_array_gives_its_dims_strides_and_dtype() -> None:
    array = np.zeros((2, 3), dtype=np.float32)
    t = dt.Graph("g").tensor_like(torch.from_numpy(array), name="x")
    assert (t.dims, t.strides, t.data_type) == ([2, 3], [3, 1], dt.DataType.FLOAT)


def test_a_torch_dtype_without_a_data_type_is_still_named() -> None:
    with pytest.raises(dt.InvalidValueError, match="has no dnntune DataType"):
        dt.Graph("g").tensor_like(torch.zeros(2, dtype=torch.complex64), name="x")
