"""The one tree of dnntune exceptions.

Each error carries a :class:`Status` (the hipDNN/cuDNN status code it stands for) and, where it
refines a built-in, also derives from that built-in so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

__all__ = [
    "AutotuneError",
    "BadStateError",
    "ConfigFileError",
    "DnnTuneError",
    "ExecutionError",
    "GraphFormatError",
    "InvalidTypeError",
    "InvalidValueError",
    "NotSupportedError",
    "Status",
]


class Status(enum.Enum):
    """Status codes, named after hipDNN's ``hipdnnStatus_t``."""

    SUCCESS = 0
    BAD_PARAM = 1
    INVALID_VALUE = 2
    NOT_SUPPORTED = 3
    BAD_STATE = 4
    EXECUTION_FAILED = 5
    INTERNAL_ERROR = 6
    GRAPH_NOT_SUPPORTED = 7


class DnnTuneError(Exception):
    """Base of every dnntune error; ``status`` says which status code it stands for."""

    status: Status = Status.INTERNAL_ERROR

    def __init__(self, message: str, *args: Any) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidValueError(DnnTuneError, ValueError):
    """A value given by the caller is wrong: a shape, a knob, a uid, an index."""

    status = Status.INVALID_VALUE


class InvalidTypeError(InvalidValueError, TypeError):
    """A value given by the caller has the wrong type, such as a string where a flag takes a
    bool; a TypeError as well, as Python's own calls raise for a wrong type."""


class GraphFormatError(InvalidValueError):
    """A graph JSON document is malformed; ``json_path`` names the bad field."""

    def __init__(self, json_path: str, problem: str) -> None:
        super().__init__(f"{json_path}: {problem}" if json_path else problem)
        self.json_path = json_path
        self.problem = problem


class NotSupportedError(DnnTuneError):
    """An engine (or every engine) cannot run this graph; the message says why."""

    status = Status.NOT_SUPPORTED


class BadStateError(DnnTuneError, RuntimeError):
    """A call came in the wrong order or mixes paths that exclude each other."""

    status = Status.BAD_STATE


class ExecutionError(DnnTuneError, RuntimeError):
    """Running a plan failed."""

    status = Status.EXECUTION_FAILED


class ConfigFileError(DnnTuneError):
    """An engine-override config file or cache file cannot be read or written."""

    status = Status.INVALID_VALUE


class AutotuneError(DnnTuneError):
    """autotune() failed; ``results`` holds one entry per candidate, as the RFC requires."""

    def __init__(
        self,
        message: str,
        results: Sequence[Any] = (),
        status: Status = Status.EXECUTION_FAILED,
    ) -> None:
        super().__init__(message)
        # AutotuneResult objects; typed loosely because errors sits below every other module
        self.results: list[Any] = list(results)
        self.status = status
