"""TensorAttributes: one tensor of a graph (a real buffer, a virtual intermediate or a scalar)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dnntune.errors import InvalidValueError
from dnntune.graph.types import DataType

if TYPE_CHECKING:
    import torch

__all__ = ["TensorAttributes", "contiguous_strides", "channels_last_strides"]


def _ints(values: Sequence[Any], what: str, name: str) -> list[int]:
    """``values`` as a list of ints; a float (8.9, or 8.0), a bool or a non-number is refused
    (``int()`` truncated 8.9 to 8, where the JSON loader refuses it)."""
    out = []
    for v in values:
        if isinstance(v, bool):
            v = None  # refused below: True is not a size
        try:
            out.append(operator.index(v))
        except TypeError:
            raise InvalidValueError(
                f"tensor {name!r}: {what} must be integers, got {list(values)!r} "
                f"({v!r} is a {type(v).__name__})"
            ) from None
    return out


def contiguous_strides(dims: Sequence[int]) -> list[int]:
    """Row-major (NCHW-style) strides in elements for logical ``dims``."""
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(int(dims[i + 1]), 1)
    return strides


def channels_last_strides(dims: Sequence[int]) -> list[int]:
    """NHWC / NDHWC strides for logical NC[D]HW ``dims`` (rank >= 3)."""
    if len(dims) < 3:
        return contiguous_strides(dims)
    n, c, *spatial = (int(d) for d in dims)
    strides = [0] * len(dims)
    strides[1] = 1
    running = max(c, 1)
    for i in range(len(dims) - 1, 1, -1):
        strides[i] = running
        running *= max(spatial[i - 2], 1)
    strides[0] = running
    del n
    return strides


class TensorAttributes:
    """A tensor of a graph: uid, name, logical dims, strides (the layout), data type.

    ``is_virtual`` tensors are intermediates with no buffer; ``is_output`` marks graph outputs
    that the caller provides a buffer for. A pass-by-value scalar carries ``value``.
    Tensors compare by identity: two tensors with equal attributes are still different tensors.
    """

    __slots__ = (
        "_auto_data_type",
        "_graphs",
        "_json_source",
        "_json_unset",
        "_spec_data_type",
        "data_type",
        "dims",
        "is_output",
        "is_virtual",
        "name",
        "strides",
        "uid",
        "value",
    )

    def __init__(
        self,
        *,
        name: str = "",
        dims: Sequence[int] = (),
        strides: Sequence[int] | None = None,
        data_type: DataType | None = None,
        uid: int | None = None,
        is_virtual: bool = False,
        is_output: bool = False,
        value: float | int | bool | None = None,
    ) -> None:
        self.uid = uid
        self.name = name
        self.dims = _ints(dims, "dims", name)
        self.strides = (
            _ints(strides, "strides", name) if strides is not None else contiguous_strides(dims)
        )
        self.data_type = data_type
        self.is_virtual = is_virtual
        self.is_output = is_output
        self.value = value
        self._auto_data_type = False  # data_type was filled in from the graph's types
        self._spec_data_type = False  # data_type was chosen by the op (float32 statistics)
        self._json_unset = False  # loaded as "unset": written back as "unset"
        self._json_source: dict[str, Any] | None = None  # the JSON object it was loaded from
        #: the graphs holding this tensor: a setter tells them (their plans are then stale)
        self._graphs: list[Any] = []

    def _edited(self) -> None:
        for graph in self._graphs:
            graph.note_edit()

    # cuDNN-frontend style setters (chainable)
    def set_output(self, is_output: bool = True) -> TensorAttributes:
        """Mark (or unmark) this tensor as a graph output: it becomes non-virtual."""
        self.is_output = is_output
        self.is_virtual = not is_output
        self._edited()
        return self

    def set_name(self, name: str) -> TensorAttributes:
        self.name = name
        return self

    def set_uid(self, uid: int) -> TensorAttributes:
        self.uid = int(uid)
        self._edited()
        return self

    def set_dims(self, dims: Sequence[int]) -> TensorAttributes:
        self.dims = _ints(dims, "dims", self.name)
        self._edited()
        return self

    def set_strides(self, strides: Sequence[int]) -> TensorAttributes:
        self.strides = _ints(strides, "strides", self.name)
        self._edited()
        return self

    def set_data_type(self, data_type: DataType) -> TensorAttributes:
        self.data_type = data_type
        self._auto_data_type = False
        self._spec_data_type = False
        self._json_unset = False
        self._edited()
        return self

    def set_is_virtual(self, is_virtual: bool) -> TensorAttributes:
        self.is_virtual = is_virtual
        self._edited()
        return self

    @property
    def is_scalar(self) -> bool:
        """True for pass-by-value scalars (epsilon, momentum, a constant operand)."""
        return self.value is not None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    def storage_size(self) -> int:
        """Elements a buffer needs to hold this tensor's layout (max offset + 1)."""
        if any(d == 0 for d in self.dims):
            return 0
        return 1 + sum((d - 1) * s for d, s in zip(self.dims, self.strides, strict=False))

    def has_layout(self, strides: Sequence[int]) -> bool:
        """True if this tensor's strides are ``strides`` on every dim of size > 1 (such as
        ``contiguous_strides(t.dims)``: row-major whatever its size-1 dims' strides)."""
        return _strides_equivalent(self.dims, self.strides, strides)

    def matches_tensor(self, tensor: torch.Tensor) -> str | None:
        """None if ``tensor`` has this tensor's dims, strides and dtype, else what differs."""
        problems = []
        if list(tensor.shape) != self.dims:
            problems.append(f"dims {list(tensor.shape)} != expected {self.dims}")
        elif tensor.numel() > 1 and not _strides_equivalent(
            self.dims, self.strides, list(tensor.stride())
        ):
            problems.append(f"strides {list(tensor.stride())} != expected {self.strides}")
        if self.data_type is not None and tensor.dtype != self.data_type.to_torch():
            problems.append(f"dtype {tensor.dtype} != expected {self.data_type.to_torch()}")
        return "; ".join(problems) or None

    def describe(self) -> str:
        dtype = self.data_type.json_name if self.data_type else "unset"
        return f"tensor {self.name or '?'} (uid {self.uid}, dims {self.dims}, {dtype})"

    def __repr__(self) -> str:
        extra = " virtual" if self.is_virtual else ""
        extra += " output" if self.is_output else ""
        extra += f" value={self.value}" if self.value is not None else ""
        dtype = self.data_type.json_name if self.data_type else "unset"
        return (
            f"TensorAttributes(uid={self.uid}, name={self.name!r}, dims={self.dims}, "
            f"strides={self.strides}, {dtype}{extra})"
        )


def _strides_equivalent(dims: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Strides agree on every dim whose size is > 1 (size-1 dims may have any stride)."""
    if len(a) != len(b):
        return False
    return all(d <= 1 or sa == sb for d, sa, sb in zip(dims, a, b, strict=True))
