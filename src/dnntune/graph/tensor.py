"""TensorAttributes: one tensor of a graph (a real buffer, a virtual intermediate or a scalar)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Self, SupportsIndex

from dnntune.errors import InvalidValueError
from dnntune.graph.types import INT64_RANGE, DataType, check_bool, check_data_type

if TYPE_CHECKING:
    import torch

__all__ = ["TensorAttributes", "TrackedInts", "contiguous_strides", "channels_last_strides"]


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


def _uid(value: Any, name: str) -> int:
    """``value`` as an int uid: a str ("3"), a float or a bool was kept as given, written to
    JSON as it was, and the file did not load back (nor did a uid beyond int64); a pack keyed
    by the int missed it (new-user audit, session 58)."""
    try:
        uid = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        uid = None
    if uid is None or not INT64_RANGE[0] <= uid <= INT64_RANGE[1]:
        raise InvalidValueError(
            f"tensor {name!r}: uid must be an integer between -2**63 and 2**63-1, got {value!r}"
        )
    return uid


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


#: attributes whose change is an edit of the graphs holding the tensor: plans built before it
#: do not run them (``Graph.execute`` raises BadStateError). Watched in ``__setattr__``, not
#: by properties: reads stay plain slot reads (a property costs 30 ns more per read, one
#: returning a copy of ``dims`` 65 ns; measured on CPython 3.11), writes are rare.
_TRACKED = frozenset({"uid", "dims", "strides", "data_type", "value", "is_virtual", "is_output"})


class TrackedInts(list[int]):
    """A tensor's ``dims`` or ``strides``: a list whose changes in place (``t.dims[1] = 32``,
    ``append``, ``del``, ...) are edits of the tensor, as ``set_dims`` is.

    It compares, prints and serializes as the plain list it is. A copy (``list(t.dims)``,
    ``t.dims[:]``, ``copy.copy``, a pickle) is a plain list, independent of the tensor; a list
    replaced by a later assignment no longer edits the tensor.
    """

    __slots__ = ("_owner",)

    def __init__(self, owner: TensorAttributes, values: Sequence[int]) -> None:
        super().__init__(values)
        self._owner = owner

    def _field(self) -> str:
        return "strides" if self._owner.strides is self else "dims"

    def _checked(self, values: Sequence[Any]) -> list[int]:
        return _ints(values, self._field(), self._owner.name)

    def _edit(self, change: Callable[[], Any]) -> Any:
        """Run ``change`` (a list method on self) and tell the tensor, as its setters do."""
        result = change()
        owner = self._owner
        if owner.strides is self:
            owner._auto_strides = None  # the caller's strides from now on
            owner._edited()
        elif owner.dims is self:
            owner._restride()
            owner._edited()
        return result

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            value = self._checked(value)
        else:
            (value,) = self._checked([value])
        self._edit(lambda: super(TrackedInts, self).__setitem__(index, value))

    def __delitem__(self, index: Any) -> None:
        self._edit(lambda: super(TrackedInts, self).__delitem__(index))

    def __iadd__(self, values: Iterable[Any]) -> Self:  # type: ignore[override,misc]  # as list's
        checked = self._checked(list(values))
        self._edit(lambda: super(TrackedInts, self).__iadd__(checked))
        return self

    def __imul__(self, n: SupportsIndex) -> Self:
        self._edit(lambda: super(TrackedInts, self).__imul__(n))
        return self

    def append(self, value: Any) -> None:
        (checked,) = self._checked([value])
        self._edit(lambda: super(TrackedInts, self).append(checked))

    def extend(self, values: Iterable[Any]) -> None:
        checked = self._checked(list(values))
        self._edit(lambda: super(TrackedInts, self).extend(checked))

    def insert(self, index: SupportsIndex, value: Any) -> None:
        (checked,) = self._checked([value])
        self._edit(lambda: super(TrackedInts, self).insert(index, checked))

    def pop(self, index: SupportsIndex = -1) -> int:
        value: int = self._edit(lambda: super(TrackedInts, self).pop(index))
        return value

    def remove(self, value: Any) -> None:
        self._edit(lambda: super(TrackedInts, self).remove(value))

    def clear(self) -> None:
        self._edit(super().clear)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._edit(lambda: super(TrackedInts, self).sort(*args, **kwargs))

    def reverse(self) -> None:
        self._edit(super().reverse)


class TensorAttributes:
    """A tensor of a graph: uid, name, logical dims, strides (the layout), data type.

    ``is_virtual`` tensors are intermediates with no buffer; ``is_output`` marks graph outputs
    that the caller provides a buffer for. A pass-by-value scalar carries ``value``.
    Tensors compare by identity: two tensors with equal attributes are still different tensors.

    Changing ``uid``, ``dims``, ``strides``, ``data_type``, ``value``, ``is_virtual`` or
    ``is_output`` (by a ``set_*`` method, by assignment, or ``dims``/``strides`` in place, such
    as ``t.dims[1] = 32``) is an edit of every graph holding the tensor: the graph is validated
    again, and a plan built before the edit is refused by ``execute`` (BadStateError) until
    plans are built again. Setting the value it already has is an edit too, as it is for the
    setters (the plans were not built after it); validation filling in a data type is not.
    """

    __slots__ = (
        "_auto_data_type",
        "_auto_strides",
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
        #: the layout the strides were derived in ("row_major", "channels_last": defaulted
        #: here or inferred by an op), re-derived when the dims change; None: the caller's
        self._auto_strides: str | None = None if strides is not None else "row_major"
        # __setattr__ makes dims and strides TrackedInts, checking they are integers
        self.dims = list(dims)
        self.strides = list(strides) if strides is not None else contiguous_strides(self.dims)
        self.data_type = data_type
        self.is_virtual = is_virtual
        self.is_output = is_output
        self.value = value
        self._auto_data_type = False  # data_type was filled in from the graph's types
        self._spec_data_type = False  # data_type was chosen by the op (float32 statistics)
        self._json_unset = False  # loaded as "unset": written back as "unset"
        self._json_source: dict[str, Any] | None = None  # the JSON object it was loaded from
        #: the graphs holding this tensor: an edit tells them (their plans are then stale)
        self._graphs: list[Any] = []

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _TRACKED:
            if name == "name" and not isinstance(value, str):
                # JSON names are strings: a graph saved with name=7 did not load back
                raise InvalidValueError(f"tensor name must be a string, got {value!r}")
            object.__setattr__(self, name, value)
            return
        if name == "uid" and value is not None:
            value = _uid(value, getattr(self, "name", ""))
        if name == "dims" or name == "strides":
            value = TrackedInts(self, _ints(value, name, getattr(self, "name", "")))
        elif name == "data_type" and value is not None and not isinstance(value, DataType):
            check_data_type(value, f"tensor {getattr(self, 'name', '')!r}: data_type")
        elif name == "is_virtual" or name == "is_output":
            # a flag: "False" is a true string (set_output("False") made an output)
            value = check_bool(value, f"tensor {getattr(self, 'name', '')!r}: {name}")
        initialized = hasattr(self, name)
        object.__setattr__(self, name, value)
        if not initialized:  # set in __init__ (or by copy or pickle): no edit
            return
        if name == "strides":
            self._auto_strides = None  # the caller's strides from now on
        elif name == "dims":
            self._restride()
        if name == "data_type":
            # a data type the caller chose: no longer the graph's default (the setter's rule)
            self._auto_data_type = self._spec_data_type = self._json_unset = False
        self._edited()

    def __copy__(self) -> TensorAttributes:
        """A tensor with the same attributes (its own dims and strides lists), held by no graph:
        editing it edits no graph, and it keys no graph's variant pack until added to one."""
        twin = TensorAttributes.__new__(TensorAttributes)
        for name in self.__slots__:
            if name != "_graphs" and hasattr(self, name):
                setattr(twin, name, getattr(self, name))
        twin._graphs = []
        return twin

    def _infer_data_type(self, data_type: DataType | None, *, by_op: bool = False) -> None:
        """Fill in a data type the caller left unset: from the graph's types, or (``by_op``)
        the one the op prescribes. Unlike an assignment it keeps the tensor marked as inferred
        (filled in again on the next validation; written back to JSON as it was read)."""
        old = self.data_type
        object.__setattr__(self, "data_type", data_type)
        self._auto_data_type = not by_op
        self._spec_data_type = by_op
        if old != data_type:
            self._edited()

    def _edited(self) -> None:
        for graph in getattr(self, "_graphs", ()):
            graph.note_edit()

    def _restride(self) -> None:
        """New dims: strides that were defaulted or inferred (never the caller's) follow them,
        in the same layout. They kept the old dims' values: ``dx.set_dims(...)`` on a conv_dgrad
        output, as cuDNN frontend code sets its dims, was refused as overlapping."""
        layout = getattr(self, "_auto_strides", None)
        if layout is None or not hasattr(self, "strides"):
            return
        dims = list(self.dims)
        derive = channels_last_strides if layout == "channels_last" else contiguous_strides
        object.__setattr__(self, "strides", TrackedInts(self, derive(dims)))

    # cuDNN-frontend style setters (chainable)
    def set_output(self, is_output: bool = True) -> TensorAttributes:
        """Mark (or unmark) this tensor as a graph output: it becomes non-virtual.

        Raises:
            InvalidTypeError: ``is_output`` is not a bool (``"False"`` was taken as true).
        """
        self.is_output = is_output  # checked: a bool (or a NumPy bool, stored as bool)
        self.is_virtual = not self.is_output
        return self

    def set_name(self, name: str) -> TensorAttributes:
        self.name = name
        return self

    def set_uid(self, uid: int) -> TensorAttributes:
        self.uid = uid  # int(uid) truncated 3.7 to 3 and took True and "3"
        return self

    def set_dims(self, dims: Sequence[int]) -> TensorAttributes:
        """Set the logical dims. Strides that were defaulted (row-major) or inferred by the op
        that made the tensor follow the new dims in the same layout; strides the caller set
        stay as set."""
        self.dims = list(dims)
        return self

    def set_strides(self, strides: Sequence[int]) -> TensorAttributes:
        self.strides = list(strides)
        return self

    def set_data_type(self, data_type: DataType) -> TensorAttributes:
        self.data_type = data_type
        return self

    def set_is_virtual(self, is_virtual: bool) -> TensorAttributes:
        self.is_virtual = is_virtual
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
        layout = str(tensor.layout)  # graph/ does not import torch
        if layout != "torch.strided":
            # a sparse (or MKL-DNN) tensor has no strided buffer an engine could read; its
            # stride() reads [0, 0, ...], which named a layout problem that was not the one
            return (
                f"a {layout.removeprefix('torch.')} tensor; variant pack buffers are dense "
                "(strided) tensors: give tensor.to_dense()"
            )
        if list(tensor.shape) != self.dims:
            problems.append(f"dims {list(tensor.shape)} != expected {self.dims}")
        elif tensor.numel() > 1 and not _strides_equivalent(
            self.dims, self.strides, list(tensor.stride())
        ):
            problems.append(f"strides {list(tensor.stride())} != expected {self.strides}")
        if self.data_type is not None and tensor.dtype != self.data_type.to_torch():
            problems.append(f"dtype {tensor.dtype} != expected {self.data_type.to_torch()}")
        if tensor.is_neg() or tensor.is_conj():
            # its memory holds the values before the negation (or conjugation), which an
            # engine reading the buffer would take (torch.compile's plans did)
            problems.append(
                "a lazy negative or conjugate view (z.conj().imag, torch._neg_view); give "
                "tensor.resolve_neg() / resolve_conj()"
            )
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
