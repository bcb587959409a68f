"""BuilderBase: tensors, scalars and the one way a builder method adds a checked node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune.errors import InvalidValueError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops import spec_for
from dnntune.graph.ops.shapes import is_channels_last
from dnntune.graph.tensor import TensorAttributes, channels_last_strides, contiguous_strides
from dnntune.graph.types import DataType, check_bool, check_data_type

if TYPE_CHECKING:
    import torch

__all__ = ["BuilderBase", "Operand", "pair"]

Operand = TensorAttributes | float | int


def pair(value: int | Sequence[int] | None, n: int, name: str) -> list[int] | None:
    """``n`` integers from one integer or a sequence (None stays None: the op's default)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidValueError(f"{name}: expected an integer or {n} integers, got {value!r}")
    if isinstance(value, int):
        return [value] * n
    try:
        values = [int(v) for v in value]
    except (TypeError, ValueError):
        raise InvalidValueError(f"{name}: expected {n} integers, got {value!r}") from None
    if len(values) != n:
        raise InvalidValueError(f"{name}: expected {n} values, got {values}")
    return values


def _scalar(value: float | int, name: str, data_type: DataType) -> TensorAttributes:
    return TensorAttributes(name=name, dims=[1], strides=[1], data_type=data_type, value=value)


class BuilderBase(OpGraph):
    """Tensor creation and node insertion shared by every builder method."""

    # ---- tensors ------------------------------------------------------------------------
    def tensor(
        self,
        name: str = "",
        dims: Sequence[int] = (),
        strides: Sequence[int] | None = None,
        data_type: DataType | None = None,
        *,
        uid: int | None = None,
        is_virtual: bool = False,
        value: float | int | None = None,
    ) -> TensorAttributes:
        """Add a graph tensor (strides default to row-major; layout lives in the strides).

        Defaulted strides follow the dims if ``set_dims`` changes them later; given ones stay.

        Dims are logical (N, C, [D,] H, W for convolutions); pass NHWC strides for a
        channels-last buffer. Bad values surface in :meth:`validate`, naming the tensor.
        """
        if not isinstance(name, str):
            raise InvalidValueError(f"tensor name must be a string, got {name!r}")
        # checked before the tensor is made: its errors below are reported as dims errors
        is_virtual = check_bool(is_virtual, f"tensor {name!r}: is_virtual")
        if value is not None and not dims:
            dims = [1]
        if data_type is not None and not isinstance(data_type, DataType):
            raise InvalidValueError(
                f"tensor {name!r}: data_type must be a DataType, got {data_type!r}"
            )
        try:
            t = TensorAttributes(
                name=name,
                dims=dims,
                strides=strides,
                data_type=data_type,
                is_virtual=is_virtual,
                value=value,
            )
        except (TypeError, ValueError):
            raise InvalidValueError(
                f"tensor {name!r}: dims and strides must be sequences of integers, got "
                f"dims={dims!r}, strides={strides!r}"
            ) from None
        if uid is not None:
            t.uid = uid  # refused with its own message (a str, a float, beyond int64)
        return self.add_tensor(t)

    def tensor_like(self, like: torch.Tensor, name: str = "") -> TensorAttributes:
        """Add a tensor with the dims, strides and dtype of a torch tensor."""
        import torch

        if not isinstance(like, torch.Tensor):
            module = type(like).__module__
            kind = (
                type(like).__qualname__
                if module == "builtins"
                else f"{module}.{type(like).__qualname__}"
            )
            if kind.startswith("numpy."):
                how = "torch.from_numpy(array) (zero copy)"
            elif hasattr(like, "__dlpack__"):
                how = "torch.from_dlpack(value) (zero copy)"
            else:
                how = "torch.as_tensor(value)"
            raise InvalidValueError(
                f"tensor_like({name!r}): expected a torch.Tensor, got {kind}; convert it with "
                f"{how}, or give dims, strides and data_type to tensor()"
            )
        try:
            dtype = DataType.from_torch(like.dtype)
        except ValueError as exc:
            raise InvalidValueError(f"tensor_like({name!r}): {exc}") from None
        return self.tensor(
            name=name, dims=list(like.shape), strides=list(like.stride()), data_type=dtype
        )

    def scalar(
        self, value: float | int, name: str = "", data_type: DataType = DataType.FLOAT
    ) -> TensorAttributes:
        """Add a pass-by-value scalar (epsilon, momentum, a constant operand)."""
        return self.add_tensor(_scalar(value, name or f"scalar_{len(self.tensors)}", data_type))

    # ---- internals ----------------------------------------------------------------------
    def _operand(self, value: Operand, name: str) -> TensorAttributes:
        # Not registered yet: the node registers it if (and only if) it is accepted.
        if isinstance(value, TensorAttributes):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            node, _, field = name.partition("::")  # scalar names are "<node>::<FIELD>"
            raise InvalidValueError(
                f"node {node!r}: {field.lower()}_tensor_uid: expected a tensor or a number, "
                f"got {value!r}"
            )
        return _scalar(value, name, DataType.FLOAT)

    def _new_output(self, node_name: str, suffix: str) -> TensorAttributes:
        t = TensorAttributes(name=f"{node_name}::{suffix}", dims=(), strides=[], is_virtual=True)
        t._auto_data_type = True
        return t

    def _add(
        self,
        kind: OpKind,
        name: str | None,
        inputs: Mapping[str, TensorAttributes | None],
        output_fields: Sequence[str],
        params: dict[str, Any],
        compute_data_type: DataType | None,
        out_dims: dict[str, Sequence[int]] | None = None,
        like: TensorAttributes | None = None,
    ) -> list[TensorAttributes]:
        """Create a node, check it (inferring output dims), and only then add it."""
        spec = spec_for(kind)
        if name is not None and not isinstance(name, str):
            raise InvalidValueError(f"{spec.builder_name}: name must be a string, got {name!r}")
        node_name = name or f"{spec.builder_name}_{len(self.nodes)}"
        check_data_type(compute_data_type, f"{spec.builder_name}({node_name!r}): compute_data_type")
        outputs: dict[str, TensorAttributes | None] = {}
        for f in output_fields:
            out = self._new_output(node_name, f.removesuffix("_tensor_uid").upper())
            if out_dims is not None and f in out_dims:
                out.dims = [int(d) for d in out_dims[f]]
                layout = like is not None and is_channels_last(like)
                out.strides = (channels_last_strides if layout else contiguous_strides)(out.dims)
                out._auto_strides = "channels_last" if layout else "row_major"
            outputs[f] = out
        parsed = spec.defaults()
        for key, value in params.items():
            if not spec.has_param(key):
                known = ", ".join(p.name for p in spec.params) or "none"
                raise InvalidValueError(
                    f"{spec.builder_name}({node_name!r}): unknown parameter {key!r} "
                    f"(parameters: {known})"
                )
            try:
                parsed[key] = spec.param(key).parse(value, key)
            except ValueError as exc:
                raise InvalidValueError(
                    f"node {node_name!r} ({kind.value}): {key}: {exc}"
                ) from None
        for f, t in inputs.items():
            if t is not None and not isinstance(t, TensorAttributes):
                raise InvalidValueError(
                    f"node {node_name!r} ({kind.value}): {f}: expected a tensor, got {t!r}"
                )
        node = Node(
            name=node_name,
            kind=kind,
            inputs={k: v for k, v in inputs.items() if v is not None},
            outputs=outputs,
            params=parsed,
            compute_data_type=compute_data_type,
        )
        # Infer output shapes now so that callers can read y.dims right away; a node that
        # fails its checks is not added, so the graph stays usable after the error.
        self.check_node(node)
        self.add_node(node)
        return [t for t in outputs.values() if t is not None]
