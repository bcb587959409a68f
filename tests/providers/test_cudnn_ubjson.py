"""The strict UBJSON reader of cuDNN frontend serializations (providers/cudnn/ubjson.py): known
byte vectors, round trips against an independent encoder written here (end markers, ``#``
counts, ``$type#count`` typed containers), a document shaped like the frontend's
``serialize()``, and corrupt input refused with ValueError (never another exception)."""

from __future__ import annotations

import contextlib
import struct
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnntune.providers.cudnn import ubjson

Form = Literal["plain", "counted", "typed"]
FORMS: tuple[Form, ...] = ("plain", "counted", "typed")

_INTS = (
    (b"i", ">b", -(2**7), 2**7 - 1),
    (b"U", ">B", 0, 2**8 - 1),
    (b"I", ">h", -(2**15), 2**15 - 1),
    (b"l", ">i", -(2**31), 2**31 - 1),
    (b"L", ">q", -(2**63), 2**63 - 1),
)


def encode_int(n: int) -> bytes:
    """The narrowest UBJSON integer holding ``n``."""
    for marker, fmt, lo, hi in _INTS:
        if lo <= n <= hi:
            return marker + struct.pack(fmt, n)
    raise OverflowError(n)


def _text(text: str) -> bytes:
    raw = text.encode("utf-8")
    return encode_int(len(raw)) + raw


def _container(open_: bytes, close: bytes, parts: list[bytes], form: Form) -> bytes:
    """``parts``: each value's bytes (an object's: its key's bytes, then its value's)."""
    if form == "plain":
        return open_ + b"".join(parts) + close
    count = b"#" + encode_int(len(parts))
    return open_ + count + b"".join(parts)


def encode(value: Any, form: Form = "plain") -> bytes:
    """UBJSON of ``value``. ``form``: containers closed by their end marker (plain), with a
    ``#`` count (counted), or with ``$type#count`` where every value has the same marker, which
    is then written once (typed; counted otherwise)."""
    if value is None:
        return b"Z"
    if value is True:
        return b"T"
    if value is False:
        return b"F"
    if isinstance(value, int):
        return encode_int(value)
    if isinstance(value, float):
        return b"D" + struct.pack(">d", value)
    if isinstance(value, str):
        return b"S" + _text(value)
    if isinstance(value, (list, dict)):
        pairs = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
        keys = [b"" if k is None else _text(k) for k, _ in pairs]
        values = [encode(v, form) for _, v in pairs]
        open_, close = (b"{", b"}") if isinstance(value, dict) else (b"[", b"]")
        markers = {v[:1] for v in values}
        if form == "typed" and len(markers) == 1:
            (marker,) = markers
            head = open_ + b"$" + marker + b"#" + encode_int(len(values))
            return head + b"".join(k + v[1:] for k, v in zip(keys, values, strict=True))
        parts = [k + v for k, v in zip(keys, values, strict=True)]
        return _container(open_, close, parts, form)
    raise TypeError(f"no UBJSON for {type(value).__name__}")


def frontend_document(**changes: Any) -> dict[str, Any]:
    """A document shaped like the cuDNN frontend's ``serialize()`` (nlohmann's ``to_ubjson``):
    the plan's backend JSON (tens of KB) as one string, and what the frontend adds at execute
    time, empty."""
    knobs = ", ".join(f'{{"type": "KNOB_{i}", "value": {i % 7}}}' for i in range(1500))
    document: dict[str, Any] = {
        "cudnn_backend_data": f'{{"engineId": 6, "knobs": [{knobs}], "version": "9.10.0"}}',
        "variant_pack_uids": [4, 3, 0, 1, 2],
        "pass_by_values": {},
        "workspace_modifications": {},
        "variant_pack_replacements": {},
        "fe_workspace_size": 0,
        "behavior_notes": [[]],
    }
    document.update(changes)
    return document


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b"i\x80", -128),
        (b"i\x7f", 127),
        (b"U\xff", 255),
        (b"I\x80\x00", -32768),
        (b"I\x01\x00", 256),
        (b"l\x80\x00\x00\x00", -(2**31)),
        (b"l\x00\x01\x00\x00", 65536),
        (b"L\x7f\xff\xff\xff\xff\xff\xff\xff", 2**63 - 1),
        (b"L\xff\xff\xff\xff\xff\xff\xff\xfe", -2),
        (b"D\x3f\xf8\x00\x00\x00\x00\x00\x00", 1.5),
        (b"d\xc0\x20\x00\x00", -2.5),
        (b"T", True),
        (b"F", False),
        (b"Z", None),
        (b"S\x69\x02\xc3\xbc", "ü"),
        (b"SU\x00", ""),
        (b"Cx", "x"),
        (b"HU\x041.25", 1.25),
        (b"[]", []),
        (b"{}", {}),
        (b"{i\x01aZ}", {"a": None}),
        (b"[#U\x00", []),
        (b"[$U#i\x03\x01\x02\xff", [1, 2, 255]),
        (b"[$Z#i\x02", [None, None]),
        (b"{$i#i\x01i\x01k\xfb", {"k": -5}),
        (b"NNi\x05", 5),
        (b"[Ni\x01]", [1]),
    ],
    ids=lambda v: repr(v)[:24] if isinstance(v, bytes) else None,
)
def test_a_known_byte_vector_reads_as_its_value(data: bytes, value: Any) -> None:
    got = ubjson.loads(data)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize("n", [0, -1, 127, -128, 128, 255, 256, -129, 2**15, 2**31, -(2**63)])
def test_an_integer_of_each_width_round_trips(n: int) -> None:
    assert ubjson.loads(encode_int(n)) == n


def test_the_encoder_uses_every_integer_width() -> None:
    widths = {encode_int(n)[:1] for n in (-1, 200, -30000, 70000, 2**40)}
    assert widths == {b"i", b"U", b"I", b"l", b"L"}


NESTED = {
    "ints": [0, -1, 200, -30000, 70000, -(2**40)],
    "floats": [1.5, -0.25, 1e300],
    "text": ["", "plain", "ü ∑ 漢字"],
    "flags": [True, False, None],
    "deep": {"a": [1, [2, [3, {"b": [[], {}]}]]], "same": [[1, 2], [3, 4]]},
    "empty": {},
    "nulls": [None, None, None],
}


@pytest.mark.parametrize("form", FORMS)
def test_nested_objects_and_arrays_round_trip(form: Form) -> None:
    assert ubjson.loads(encode(NESTED, form)) == NESTED


@pytest.mark.parametrize("form", FORMS)
def test_a_plan_sized_string_round_trips(form: Form) -> None:
    document = frontend_document()
    text = document["cudnn_backend_data"]
    assert 50_000 < len(text) < 70_000
    data = encode(document, form)
    assert b"SI" in data or b"Sl" in data  # a length wider than one byte
    assert ubjson.loads(data) == document


def test_typed_containers_are_written_by_the_encoder() -> None:
    assert encode([1, 2, 3], "typed") == b"[$i#i\x03\x01\x02\x03"
    assert encode({"a": "x", "b": "y"}, "typed") == b"{$S#i\x02i\x01ai\x01xi\x01bi\x01y"
    assert encode([1, "x"], "typed") == b"[#i\x02i\x01Si\x01x"  # mixed: counted, not typed
    assert encode([[1], [2]], "typed")[:4] == b"[$[#"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@settings(deadline=None)  # no timing in a unit test: a busy CI host must not fail it
@given(value=JSON, form=st.sampled_from(FORMS))
def test_any_json_value_round_trips(value: Any, form: Form) -> None:
    assert ubjson.loads(encode(value, form)) == value


def test_a_frontend_serialization_reads_whole() -> None:
    document = frontend_document()
    got = ubjson.loads(encode(document))
    assert got == document
    assert list(got) == list(document)  # keys in the order written
    assert got["variant_pack_uids"] == [4, 3, 0, 1, 2]
    assert got["behavior_notes"] == [[]]
    assert got["fe_workspace_size"] == 0
    assert got["cudnn_backend_data"].startswith('{"engineId": 6, "knobs": [')


SMALL = {"a": [1, 2.5, "text", {"b": None}], "c": 70000, "d": [True, False], "e": "ü"}


@pytest.mark.parametrize("form", FORMS)
def test_every_truncation_of_a_document_is_refused_with_value_error(form: Form) -> None:
    data = encode(SMALL, form)
    assert ubjson.loads(data) == SMALL
    for end in range(len(data)):
        with pytest.raises(ValueError, match="UBJSON"):
            ubjson.loads(data[:end])


def test_a_truncated_value_is_refused_with_its_position() -> None:
    with pytest.raises(ValueError, match=r"truncated at byte 3 \(wanted 5 more\)"):
        ubjson.loads(b"SU\x05abc")
    with pytest.raises(ValueError, match=r"truncated at byte 2 \(wanted 4 more\)"):
        ubjson.loads(b"[l\x00\x00]")


def test_an_unknown_marker_is_refused_with_its_position() -> None:
    with pytest.raises(ValueError, match=r"unknown marker b'X' at byte 3"):
        ubjson.loads(b"[i\x01X]")
    with pytest.raises(ValueError, match="unknown marker"):
        ubjson.loads(b"]")


def test_bytes_after_the_value_are_refused() -> None:
    with pytest.raises(ValueError, match="2 bytes after the value"):
        ubjson.loads(encode([1]) + b"ZZ")
    with pytest.raises(ValueError, match="1 bytes after the value"):
        ubjson.loads(encode(SMALL) + b"N")


def test_a_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="bad length -5"):
        ubjson.loads(b"Si\xfbabc")
    with pytest.raises(ValueError, match="bad length -1"):
        ubjson.loads(b"[#i\xff")
    with pytest.raises(ValueError, match="bad length -2"):
        ubjson.loads(b"{I\xff\xfeZ}")  # an object key's length


def test_a_length_that_is_not_an_integer_is_refused() -> None:
    with pytest.raises(ValueError, match=r"bad length 1\.0"):
        ubjson.loads(b"SD" + struct.pack(">d", 1.0) + b"x")
    with pytest.raises(ValueError, match="not a number marker"):
        ubjson.loads(b"SSx")


def test_a_typed_container_without_a_count_is_refused() -> None:
    with pytest.raises(ValueError, match="typed container without a count"):
        ubjson.loads(b"[$i\x01\x02]")
    with pytest.raises(ValueError, match="typed container without a count"):
        ubjson.loads(b"{$Zi\x01a}")


def test_nesting_to_max_depth_is_read_and_deeper_is_refused() -> None:
    depth = ubjson.MAX_DEPTH
    inner: Any = 1
    for _ in range(depth):
        inner = [inner]
    assert ubjson.loads(b"[" * depth + b"i\x01" + b"]" * depth) == inner
    deeper = b"[" * (depth + 1) + b"i\x01" + b"]" * (depth + 1)
    with pytest.raises(ValueError, match=f"nested deeper than {depth}"):
        ubjson.loads(deeper)
    objects = b"{i\x01k" * (depth + 1) + b"Z" + b"}" * (depth + 1)
    with pytest.raises(ValueError, match="nested deeper"):
        ubjson.loads(objects)


def test_far_deeper_nesting_is_a_value_error_not_a_recursion_error() -> None:
    with pytest.raises(ValueError, match="nested deeper"):
        ubjson.loads(b"[" * 200_000)
    with pytest.raises(ValueError, match="nested deeper"):
        ubjson.loads(b"[" + b"$[#i\x01" * 1000)


def test_invalid_utf8_text_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        ubjson.loads(b"Si\x02\xc3\x28")
    with pytest.raises(ValueError):
        ubjson.loads(b"{i\x01\xffZ}")


def test_a_high_precision_number_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError):
        ubjson.loads(b"Hi\x03abc")


@pytest.mark.parametrize("form", FORMS)
def test_every_single_byte_change_gives_a_value_or_a_value_error(form: Form) -> None:
    data = encode(SMALL, form)
    for i in range(len(data)):
        for byte in b"[]{}$#NZTFiUIlLdDSCH\x00\x7f\x80\xff":
            changed = data[:i] + bytes([byte]) + data[i + 1 :]
            with contextlib.suppress(ValueError):
                ubjson.loads(changed)


def test_a_count_of_zero_byte_values_past_the_data_is_refused() -> None:
    # 9 bytes asking for a million nulls (with an L count, 2**62: memory and time unbounded)
    with pytest.raises(ValueError, match="UBJSON"):
        ubjson.loads(b"[$Z#l" + struct.pack(">i", 2**20))
