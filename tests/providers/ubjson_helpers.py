"""A UBJSON encoder for tests (the format the cuDNN frontend's ``serialize()`` writes):
written independently of ``dnntune.providers.cudnn.ubjson``, which reads it."""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["encode", "key"]


def _int(n: int) -> bytes:
    for marker, fmt, lo, hi in (
        (b"i", ">b", -128, 127),
        (b"U", ">B", 0, 255),
        (b"I", ">h", -(2**15), 2**15 - 1),
        (b"l", ">i", -(2**31), 2**31 - 1),
    ):
        if lo <= n <= hi:
            return marker + struct.pack(fmt, n)
    return b"L" + struct.pack(">q", n)


def key(text: str) -> bytes:
    raw = text.encode()
    return _int(len(raw)) + raw


def encode(value: Any, counted: bool = False) -> bytes:
    """UBJSON of ``value`` (``counted``: containers with a ``#`` count, no end marker)."""
    if value is None:
        return b"Z"
    if value is True:
        return b"T"
    if value is False:
        return b"F"
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, float):
        return b"D" + struct.pack(">d", value)
    if isinstance(value, str):
        return b"S" + key(value)
    if isinstance(value, list):
        body = b"".join(encode(v, counted) for v in value)
        return b"[#" + _int(len(value)) + body if counted else b"[" + body + b"]"
    if isinstance(value, dict):
        body = b"".join(key(k) + encode(v, counted) for k, v in value.items())
        return b"{#" + _int(len(value)) + body if counted else b"{" + body + b"}"
    raise TypeError(value)
