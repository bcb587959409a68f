"""A reader of UBJSON (https://ubjson.org), the binary JSON the cuDNN frontend's
``pygraph.serialize()`` writes (nlohmann::json's ``to_ubjson``): enough to take a serialized
plan apart (its backend JSON, its variant pack's uids, what the frontend adds at execute time).

Strict and bounded: every length is checked against the data, and anything else (an unknown
marker, a truncated value, trailing bytes, nesting deeper than :data:`MAX_DEPTH`) raises
ValueError that says where.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["MAX_DEPTH", "loads"]

MAX_DEPTH = 64

_NUMBERS = {
    b"i": struct.Struct(">b"),
    b"U": struct.Struct(">B"),
    b"I": struct.Struct(">h"),
    b"l": struct.Struct(">i"),
    b"L": struct.Struct(">q"),
    b"d": struct.Struct(">f"),
    b"D": struct.Struct(">d"),
}
_CONSTANTS = {b"Z": None, b"T": True, b"F": False}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"UBJSON: truncated at byte {self.pos} (wanted {n} more)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def peek(self) -> bytes:
        return self.data[self.pos : self.pos + 1]

    def number(self, marker: bytes) -> int | float:
        fmt = _NUMBERS.get(marker)
        if fmt is None:
            raise ValueError(f"UBJSON: {marker!r} at byte {self.pos - 1} is not a number marker")
        value: int | float = fmt.unpack(self.take(fmt.size))[0]
        return value

    def length(self) -> int:
        n = self.number(self.take(1))
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"UBJSON: bad length {n!r} before byte {self.pos}")
        return n

    def value(self, depth: int, marker: bytes | None = None) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"UBJSON: nested deeper than {MAX_DEPTH} at byte {self.pos}")
        if marker is None:
            marker = self.take(1)
            while marker == b"N":  # no-op padding
                marker = self.take(1)
        if marker in _CONSTANTS:
            return _CONSTANTS[marker]
        if marker in _NUMBERS:
            return self.number(marker)
        if marker == b"C":
            return self.take(1).decode("latin-1")
        if marker in (b"S", b"H"):
            text = self.take(self.length()).decode("utf-8")
            return text if marker == b"S" else float(text)
        if marker in (b"[", b"{"):
            return self.container(marker, depth)
        raise ValueError(f"UBJSON: unknown marker {marker!r} at byte {self.pos - 1}")

    def container(self, marker: bytes, depth: int) -> Any:
        typed = count = None
        if self.peek() == b"$":
            self.take(1)
            typed = self.take(1)
            if self.peek() != b"#":
                raise ValueError(f"UBJSON: a typed container without a count at byte {self.pos}")
        if self.peek() == b"#":
            self.take(1)
            count = self.length()
            # a value takes a byte at least, but in a typed array of T, F or Z none: the count
            # is bounded by the data either way, so a short document asks for no huge list
            if count > len(self.data):
                raise ValueError(f"UBJSON: a count of {count} past the data at byte {self.pos}")
        close = b"]" if marker == b"[" else b"}"
        items: list[Any] = []
        keys: list[str] = []
        index = 0
        while True:
            if count is None:
                while self.peek() == b"N":  # no-op padding, also before the close
                    self.take(1)
                if self.peek() == close:
                    self.take(1)
                    break
            elif index == count:
                break
            if marker == b"{":
                keys.append(self.take(self.length()).decode("utf-8"))
            items.append(self.value(depth + 1, typed))
            index += 1
        return items if marker == b"[" else dict(zip(keys, items, strict=True))


def loads(data: bytes) -> Any:
    """The value UBJSON ``data`` holds (ValueError: not UBJSON, truncated, trailing bytes)."""
    reader = _Reader(bytes(data))
    value = reader.value(0)
    if reader.pos != len(reader.data):
        raise ValueError(f"UBJSON: {len(reader.data) - reader.pos} bytes after the value")
    return value
