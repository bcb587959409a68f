"""The override file format: knob (de)serialization per type, parsing rules, v1/v2, errors."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest

from dnntune.backend.knobs import KnobSetting
from dnntune.errors import ConfigFileError
from dnntune.overrides.format import (
    CURRENT_VERSION,
    OverrideEntry,
    TensorPattern,
    canonical_tensor_id,
    dumps,
    knob_from_json,
    knob_to_json,
    load_file,
    parse_document,
    parse_text,
)

# ---- knobs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(16777216, "int"), (-3, "int"), (0.5, "double"), (2.0, "double"), ("winograd", "string")],
)
def test_knob_serialization_per_type_round_trips(value: int | float | str, type_name: str) -> None:
    obj = knob_to_json(KnobSetting("k.v", value))
    assert obj == {"knob_id": "k.v", "type": type_name, "value": value}
    back = knob_from_json(json.loads(json.dumps(obj)))
    assert back == KnobSetting("k.v", value)
    assert type(back.value) is type(value)


def test_bool_knob_is_written_as_int() -> None:
    assert knob_to_json(KnobSetting("global.benchmarking", True)) == {
        "knob_id": "global.benchmarking",
        "type": "int",
        "value": 1,
    }


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_non_finite_double_is_written_as_string_and_read_back(value: float) -> None:
    obj = knob_to_json(KnobSetting("k", value))
    assert obj["type"] == "double" and isinstance(obj["value"], str)
    assert knob_from_json(json.loads(json.dumps(obj))).value == value


@pytest.mark.parametrize(
    ("type_name", "raw", "expected"),
    [
        ("int", 7, 7),
        ("int64", 7, 7),
        ("INTEGER", 7, 7),
        ("long", 7, 7),
        ("int", 7.0, 7),  # JSON cannot tell 7 from 7.0: an integral double is an int
        ("int", "0x10", 16),
        ("double", 2, 2.0),  # a double written without a fraction stays a double
        ("float", 0.25, 0.25),
        ("float64", 1, 1.0),
        ("double", "1.5", 1.5),
        ("string", "fft", "fft"),
        ("str", "fft", "fft"),
    ],
)
def test_knob_type_aliases(type_name: str, raw: object, expected: object) -> None:
    setting = knob_from_json({"knob_id": "k", "type": type_name, "value": raw})
    assert setting.value == expected
    assert type(setting.value) is type(expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(3, 3), (2.5, 2.5), ("s", "s"), (True, 1)],
)
def test_knob_without_type_takes_the_json_type(raw: object, expected: object) -> None:
    assert knob_from_json({"knob_id": "k", "value": raw}).value == expected


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ({"knob_id": "k", "type": "int", "value": 1.5}, "type is int"),
        ({"knob_id": "k", "type": "string", "value": 3}, "type is string"),
        ({"knob_id": "k", "type": "double", "value": "abc"}, "type is double"),
        # an integer literal no double holds: OverflowError escaped every reader (audit)
        ({"knob_id": "k", "type": "double", "value": 10**400}, "too large"),
        ({"knob_id": "k", "type": "complex", "value": 1}, "unknown knob type"),
        ({"type": "int", "value": 1}, "knob_id"),
        ({"knob_id": "k", "type": "int"}, "value: missing"),
        ({"knob_id": "k", "value": [1]}, "number or a string"),
        ([1, 2], "expected an object"),
    ],
)
def test_bad_knobs_raise_naming_the_field(obj: object, fragment: str) -> None:
    with pytest.raises(ConfigFileError, match=fragment):
        knob_from_json(obj, "autotune_metadata.knobs[0]")


# ---- documents ------------------------------------------------------------------------------


def _entry(**overrides: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "op": "conv_fprop",
        "engine_name": "FAKE_A",
        "tensors": [
            {"tensor_id": "x_tensor_uid", "dim": [1, 2, 3, 3], "stride": [18, 9, 3, 1]},
            {"tensor_id": "w_tensor_uid", "dim": [4, 2, 3, 3]},
        ],
    }
    entry.update(overrides)
    return entry


def test_missing_version_is_legacy_v1_positional() -> None:
    config = parse_document({"engine_overrides": [_entry()]})
    assert config.version == 1 and not config.has_version
    assert not config.named_tensor_ids


def test_version_2_uses_named_ids() -> None:
    config = parse_document({"version": 2, "engine_overrides": [_entry()]})
    assert config.named_tensor_ids
    assert config.entries[0].tensors[1] == TensorPattern("w_tensor_uid", (4, 2, 3, 3), ())


def test_explicit_version_1_is_positional() -> None:
    assert not parse_document({"version": 1, "engine_overrides": []}).named_tensor_ids


def test_unknown_fields_are_ignored_and_kept_raw() -> None:
    doc = {
        "version": 2,
        "producer": "someone else",
        "engine_overrides": [_entry(comment="hand written", autotune_metadata={"x": 1})],
    }
    entry = parse_document(doc).entries[0]
    assert entry.raw["comment"] == "hand written"
    assert entry.metadata == {"x": 1}
    assert entry.knobs is None


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([], "top level"),
        ({"version": "2", "engine_overrides": []}, "version: expected an integer"),
        ({"version": 3, "engine_overrides": []}, "not supported"),
        ({"version": 0}, "not supported"),
        ({"version": 2, "engine_overrides": {}}, "engine_overrides: expected a list"),
        ({"version": 2, "engine_overrides": [5]}, r"engine_overrides\[0\]: expected an object"),
        ({"version": 2, "engine_overrides": [_entry(op="")]}, r"engine_overrides\[0\]\.op"),
        ({"version": 2, "engine_overrides": [_entry(engine_name=None)]}, "engine_name"),
        ({"version": 2, "engine_overrides": [_entry(tensors={})]}, "tensors: expected a list"),
        (
            {"version": 2, "engine_overrides": [_entry(tensors=[{"tensor_id": "x"}])]},
            r"tensors\[0\]\.dim: missing",
        ),
        (
            {"version": 2, "engine_overrides": [_entry(tensors=[{"dim": [1, "2"]}])]},
            r"tensors\[0\]\.dim: expected a list of integers",
        ),
        (
            {"version": 2, "engine_overrides": [_entry(tensors=[{"dim": [1], "stride": 1}])]},
            r"tensors\[0\]\.stride",
        ),
        (
            {"version": 2, "engine_overrides": [_entry(criteria={"pointwise_mode": "relu"})]},
            r"criteria\.pointwise_mode: expected an integer",
        ),
        (
            {"version": 2, "engine_overrides": [_entry(criteria=[1])]},
            r"criteria: expected an object",
        ),
    ],
)
def test_malformed_documents_name_the_json_path(doc: object, fragment: str) -> None:
    with pytest.raises(ConfigFileError, match=fragment):
        parse_document(doc, "f.json")


@pytest.mark.parametrize(
    ("text", "json_path"),
    [
        (
            '{"version": 2, "engine_overrides": [{"op": "matmul", "engine_name": "E", '
            '"tensors": [], "autotune_metadata": {"min_time_ms": NaN}}]}',
            "engine_overrides[0].autotune_metadata.min_time_ms",
        ),
        (
            '{"version": 2, "engine_overrides": [{"op": "matmul", "engine_name": "E", '
            '"tensors": [], "autotune_metadata": {"knobs": [{"knob_id": "k", "type": "double", '
            '"value": -Infinity}]}}]}',
            "engine_overrides[0].autotune_metadata.knobs[0].value",
        ),
        ('{"version": 2, "engine_overrides": [], "note": [1, Infinity]}', "note[1]"),
        ('{"version": 2, "engine_overrides": [], "big": 1e999}', "big"),
    ],
)
def test_non_finite_numbers_are_rejected_naming_the_json_path(text: str, json_path: str) -> None:
    """NaN, Infinity and overflowing literals are not JSON: the file is refused, not half-read."""
    with pytest.raises(ConfigFileError, match=re.escape(f"f.json: {json_path}: not a finite")):
        parse_text(text, "f.json")


def test_a_knob_written_as_the_string_nan_is_still_accepted() -> None:
    """The writer's own spelling of a non-finite double knob is a string, which is valid JSON."""
    doc = _entry(autotune_metadata={"knobs": [{"knob_id": "k", "type": "double", "value": "nan"}]})
    (entry,) = parse_document({"version": 2, "engine_overrides": [doc]}).entries
    assert entry.knobs is not None and math.isnan(float(entry.knobs[0].value))


def test_engine_name_may_be_an_integer_id() -> None:
    entry = parse_document({"version": 2, "engine_overrides": [_entry(engine_name=-42)]}).entries[0]
    assert entry.engine_name == "-42"


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        {"knobs": []},
        {"rank": 0},
        {"knobs": None},
    ],
)
def test_missing_or_empty_knobs_are_tolerated(metadata: dict[str, object]) -> None:
    doc = {"version": 2, "engine_overrides": [_entry(autotune_metadata=metadata)]}
    entry = parse_document(doc).entries[0]
    assert entry.knobs in (None, [])


def test_entry_without_metadata_is_a_pre_autotune_entry() -> None:
    entry = parse_document({"engine_overrides": [_entry()]}).entries[0]
    assert entry.metadata is None and entry.knobs is None


def test_bad_metadata_knobs_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    doc = {
        "version": 2,
        "engine_overrides": [
            _entry(autotune_metadata={"knobs": [{"knob_id": "k", "type": "int", "value": "x"}]})
        ],
    }
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        entry = parse_document(doc).entries[0]
    assert entry.knobs is None
    assert "knobs[0].value" in caplog.text


def test_knobs_nested_under_metadata_are_typed() -> None:
    knobs = [
        {"knob_id": "a", "type": "int", "value": 16777216},
        {"knob_id": "b", "type": "double", "value": 3},
        {"knob_id": "c", "type": "string", "value": "fft"},
    ]
    doc = {"version": 2, "engine_overrides": [_entry(autotune_metadata={"knobs": knobs})]}
    entry = parse_document(doc).entries[0]
    assert entry.knobs == [
        KnobSetting("a", 16777216),
        KnobSetting("b", 3.0),
        KnobSetting("c", "fft"),
    ]
    assert isinstance(entry.knobs[1].value, float)


def test_parse_text_rejects_invalid_json_naming_the_source() -> None:
    with pytest.raises(ConfigFileError, match=r"f\.json: invalid JSON"):
        parse_text("{not json", "f.json")


def test_load_file_reports_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_file(tmp_path / "missing.json")
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_file(tmp_path)


def test_canonical_tensor_id_accepts_short_and_upper_names() -> None:
    assert canonical_tensor_id("X") == "x_tensor_uid"
    assert canonical_tensor_id(" w ") == "w_tensor_uid"
    assert canonical_tensor_id("in_0_tensor_uid") == "in_0_tensor_uid"


def test_tensor_pattern_omits_empty_stride_and_entry_omits_empty_criteria() -> None:
    assert TensorPattern("x_tensor_uid", (2, 3)).to_json() == {
        "tensor_id": "x_tensor_uid",
        "dim": [2, 3],
    }
    entry = OverrideEntry("matmul", "E", {}, [TensorPattern("a_tensor_uid", (1,), (1,))])
    assert "criteria" not in entry.to_json()
    assert "autotune_metadata" not in entry.to_json()


def test_dumps_is_valid_json_with_inline_scalar_lists() -> None:
    doc = {"version": CURRENT_VERSION, "engine_overrides": [_entry(criteria={"b": 2, "a": 1})]}
    text = dumps(doc)
    assert json.loads(text) == doc
    assert '"dim": [1, 2, 3, 3]' in text
    assert text.endswith("\n")
    with pytest.raises(ValueError):
        dumps({"x": float("nan")})


def test_a_bad_entry_is_warned_about_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    # issue 26 item 13: the file is read for every graph; its problems are said once
    doc = {"version": 2, "engine_overrides": [_entry(autotune_metadata={"knobs": "fast"})]}
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        for _ in range(3):
            parse_document(doc)
    hits = [r for r in caplog.records if "knobs ignored" in r.getMessage()]
    assert [r.levelno for r in hits] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_a_double_knob_too_large_for_a_double_drops_the_knobs_not_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``"value": 1000...0`` (400 digits) with type double raised a bare OverflowError through
    load_file, the Config policy's match, ``overrides show`` and ``overrides merge`` (audit,
    session 20); it is a bad metadata knob like any other: dropped with a warning."""
    path = tmp_path / "o.json"
    knob = '{"knob_id": "k", "type": "double", "value": 1' + "0" * 400 + "}"
    entry = json.dumps(_entry(autotune_metadata={"knobs": []})).replace(
        '"knobs": []', f'"knobs": [{knob}]'
    )
    path.write_text('{"version": 2, "engine_overrides": [' + entry + "]}")
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        config = load_file(path)
    assert config.entries[0].knobs is None
    assert "knobs[0].value: type is double but the value 1000" in caplog.text
    assert "too large" in caplog.text
