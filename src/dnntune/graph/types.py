"""Enumerations of the graph IR: data types and the modes of pointwise, reduction, resample, norm.

Every mode enum has a stable integer value (written as the override file's ``criteria``) and a
lowercase JSON name (written in graph files).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Self

from dnntune.errors import InvalidTypeError, InvalidValueError

if TYPE_CHECKING:
    import torch

#: the values an int64 holds: hipDNN's uids, dims and strides, and an Int64Value scalar
INT64_RANGE = (-(2**63), 2**63 - 1)

__all__ = [
    "INT64_RANGE",
    "DataType",
    "check_bool",
    "check_data_type",
    "NormFwdPhase",
    "PointwiseMode",
    "ReductionMode",
    "ResampleMode",
]


class _JsonEnum(enum.Enum):
    """An enum whose JSON spelling is its lowercase name.

    ``_json_aliases`` maps other spellings found in hipDNN files (upper or lower case) to the
    member name, e.g. hipDNN writes pointwise ``max_op`` because ``MAX`` is a reserved word.
    """

    @property
    def json_name(self) -> str:
        return self.name.lower()

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {}

    @classmethod
    def from_json_name(cls, text: str) -> Self:
        """Parse the lowercase (or upper) name; raises ValueError listing the valid names."""
        key = text.upper()
        key = cls._aliases().get(key, key)
        try:
            return cls[key]
        except KeyError:
            valid = ", ".join(m.json_name for m in cls)
            raise ValueError(f"unknown {cls.__name__} {text!r}; expected one of: {valid}") from None


class DataType(enum.Enum):
    """Tensor element types; the value is the hipDNN JSON spelling."""

    FLOAT = "float"
    HALF = "half"
    BFLOAT16 = "bfloat16"
    DOUBLE = "double"
    INT8 = "int8"
    UINT8 = "uint8"
    INT32 = "int32"
    INT64 = "int64"
    BOOLEAN = "boolean"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    FP8_E8M0 = "fp8_e8m0"

    @property
    def json_name(self) -> str:
        return self.value

    @classmethod
    def from_json_name(cls, text: str) -> DataType:
        try:
            return cls(text.lower())
        except ValueError:
            valid = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown data type {text!r}; expected one of: {valid}") from None

    @property
    def is_floating(self) -> bool:
        return self in _FLOATING

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    def to_torch(self) -> torch.dtype:
        """The torch dtype of this data type."""
        import torch

        mapping = {
            DataType.FLOAT: torch.float32,
            DataType.HALF: torch.float16,
            DataType.BFLOAT16: torch.bfloat16,
            DataType.DOUBLE: torch.float64,
            DataType.INT8: torch.int8,
            DataType.UINT8: torch.uint8,
            DataType.INT32: torch.int32,
            DataType.INT64: torch.int64,
            DataType.BOOLEAN: torch.bool,
            DataType.FP8_E4M3: torch.float8_e4m3fn,
            DataType.FP8_E5M2: torch.float8_e5m2,
            DataType.FP8_E8M0: torch.float8_e8m0fnu,
        }
        return mapping[self]

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> DataType:
        """The data type of a torch dtype; raises ValueError for dtypes dnntune does not model."""
        for member in cls:
            if member.to_torch() == dtype:
                return member
        raise ValueError(f"torch dtype {dtype} has no dnntune DataType")


_FLOATING = frozenset(
    {
        DataType.FLOAT,
        DataType.HALF,
        DataType.BFLOAT16,
        DataType.DOUBLE,
        DataType.FP8_E4M3,
        DataType.FP8_E5M2,
        DataType.FP8_E8M0,
    }
)
_ITEMSIZE = {
    DataType.FLOAT: 4,
    DataType.HALF: 2,
    DataType.BFLOAT16: 2,
    DataType.DOUBLE: 8,
    DataType.INT8: 1,
    DataType.UINT8: 1,
    DataType.INT32: 4,
    DataType.INT64: 8,
    DataType.BOOLEAN: 1,
    DataType.FP8_E4M3: 1,
    DataType.FP8_E5M2: 1,
    DataType.FP8_E8M0: 1,
}


class PointwiseMode(_JsonEnum):
    """Pointwise operations; arity is given by :attr:`arity`."""

    ADD = 1
    SUB = 2
    MUL = 3
    DIV = 4
    MAX = 5
    MIN = 6
    POW = 7
    RELU_FWD = 20
    GELU_FWD = 21
    GELU_APPROX_TANH_FWD = 22
    TANH_FWD = 23
    SIGMOID_FWD = 24
    SWISH_FWD = 25
    ELU_FWD = 26
    SOFTPLUS_FWD = 27
    EXP = 40
    LOG = 41
    NEG = 42
    ABS = 43
    SQRT = 44
    RSQRT = 45
    IDENTITY = 46
    RECIPROCAL = 47
    SIN = 48
    COS = 49
    CEIL = 50
    FLOOR = 51
    ERF = 52
    CMP_EQ = 60
    CMP_NEQ = 61
    CMP_GT = 62
    CMP_GE = 63
    CMP_LT = 64
    CMP_LE = 65
    BINARY_SELECT = 70

    @property
    def json_name(self) -> str:
        # hipDNN spells these max_op/min_op (MAX and MIN are reserved in its schema).
        if self in (PointwiseMode.MAX, PointwiseMode.MIN):
            return f"{self.name.lower()}_op"
        return self.name.lower()

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {"MAX_OP": "MAX", "MIN_OP": "MIN"}

    @property
    def arity(self) -> int:
        if self is PointwiseMode.BINARY_SELECT:
            return 3
        if self.value < 20 or 60 <= self.value < 70:
            return 2
        return 1

    @property
    def is_comparison(self) -> bool:
        return 60 <= self.value < 70


class ReductionMode(_JsonEnum):
    """Reduction operations (hipDNN spells them in lower case, older files in upper case)."""

    ADD = 1
    MUL = 2
    MAX = 3
    MIN = 4
    AVG = 5
    NORM1 = 6
    NORM2 = 7
    AMAX = 8


class ResampleMode(_JsonEnum):
    """Resampling (pooling) modes."""

    MAXPOOL = 1
    AVGPOOL_INCLUDE_PADDING = 2
    AVGPOOL_EXCLUDE_PADDING = 3


class NormFwdPhase(_JsonEnum):
    """Forward normalisation phase: inference (y only) or training (y plus saved statistics)."""

    INFERENCE = 1
    TRAINING = 2


def check_data_type(value: object, what: str) -> DataType | None:
    """``value`` if it is a :class:`DataType` or None; else InvalidValueError naming ``what``
    and the member to give (a string or a torch dtype was kept as given, and validation or
    execute later failed on it with an AttributeError; new-user audit, session 58)."""
    if value is None or isinstance(value, DataType):
        return value
    hint = "a DataType member, e.g. DataType.HALF"
    if isinstance(value, str):
        member = next((m for m in DataType if m.value == value.lower()), None)
        if member is not None:
            hint = f"DataType.{member.name}"
    elif type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        hint = f"DataType.from_torch({value})"
    raise InvalidValueError(f"{what}: expected a DataType, got {value!r}; give {hint}")


def check_bool(value: object, what: str) -> bool:
    """``value`` if it is a bool (a NumPy bool as the Python bool it holds); else
    InvalidTypeError (a TypeError too) naming ``what`` and the value, and saying that a flag
    takes a bool only. ``set_output("False")`` made the tensor an output, since a non-empty
    string is true (new-user audit). cuDNN frontend's Python API (pybind11) refuses a string
    with a TypeError as well; it takes 0, 1 and None, which dnntune refuses too: a flag
    spelled as a number is more often a mistake (a count, a uid) than a choice."""
    if isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):
        return bool(value)  # the value it holds (JSON and engines read a Python bool)
    hint = "True or False"
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        hint = str(value.strip().lower() == "true")
    elif isinstance(value, int) and value in (0, 1):
        hint = str(bool(value))
    raise InvalidTypeError(
        f"{what}: expected a bool, got {value!r} ({kind.__name__}); a flag takes a bool "
        f'only, True or False, not a string or a number ("False" is a true string): '
        f"give {hint}"
    )
