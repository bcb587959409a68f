"""The UBJSON reader of cuDNN frontend serializations (providers/cudnn/ubjson.py): round trips
against an encoder written here, and corrupt input refused with ValueError, never another
exception."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from ubjson_helpers import encode, key

from dnntune.providers.cudnn import ubjson

FRONTEND_LIKE = {
    "cudnn_backend_data": '{"engineId": 6, "knobs": [1, 2, 3]}' * 1500,  # ~60 KB, as a plan's
    "variant_pack_uids": [4, 3, 0, 1, 2],
    "pass_by_values": {},
    "workspace_modifications": {},
    "variant_pack_replacements": {},
    "fe_workspace_size": 0,
    "behavior_notes": [[]],
    "json_version": "1.0",
}

VALUES = [
    0,
    -1,
    200,
    -30000,
    70000,
    -(2**40),
    1.5,
    "",
    "ü text",
    True,
    False,
    None,
    [1, "a", [2.5, None], {"k": [True]}],
    {"nested": {"deeper": [1, 2, {"x": -7}]}, "empty": {}, "list": []},
    FRONTEND_LIKE,
]


@pytest.mark.parametrize("counted", [False, True], ids=["end_markers", "counts"])
@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_value_round_trips(value: Any, counted: bool) -> None:
    assert ubjson.loads(encode(value, counted)) == value


def test_typed_containers_and_padding_are_read() -> None:
    typed = b"[$U#i\x03\x01\x02\xff"  # three uint8 values, no markers between them
    assert ubjson.loads(typed) == [1, 2, 255]
    typed_object = b"{$i#i\x02" + key("a") + b"\x05" + key("b") + b"\xfb"
    assert ubjson.loads(typed_object) == {"a": 5, "b": -5}
    assert ubjson.loads(b"NN" + encode([1])) == [1]  # no-op markers before a value
    assert ubjson.loads(b"C" + b"x") == "x"
    assert ubjson.loads(b"H" + key("1.25")) == 1.25
    assert ubjson.loads(b"d" + struct.pack(">f", 0.5)) == 0.5


def test_every_truncation_of_a_document_is_refused_with_value_error() -> None:
    data = encode({"a": [1, 2.5, "text", {"b": None}], "c": 70000}, counted=False)
    for end in range(len(data)):
        with pytest.raises(ValueError, match="UBJSON"):
            ubjson.loads(data[:end])


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"X", "unknown marker"),
        (encode([1]) + b"Z", "bytes after the value"),
        (b"S" + b"i\xfb" + b"abc", "bad length"),  # a negative length
        (b"[$i\x01\x02]", "typed container without a count"),
        (b"[" * (ubjson.MAX_DEPTH + 2) + b"]" * (ubjson.MAX_DEPTH + 2), "nested deeper"),
        (b"S" + b"S" + b"x", "not a number marker"),  # a length that is not a number
    ],
    ids=["marker", "trailing", "negative_length", "typed_without_count", "depth", "length"],
)
def test_corrupt_input_is_refused_and_says_what(data: bytes, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        ubjson.loads(data)


def test_a_frontend_like_serialization_is_read_whole() -> None:
    got = ubjson.loads(encode(FRONTEND_LIKE, counted=True))
    assert got["variant_pack_uids"] == [4, 3, 0, 1, 2]
    assert got["cudnn_backend_data"].startswith('{"engineId": 6')
    assert got["fe_workspace_size"] == 0 and got["pass_by_values"] == {}
