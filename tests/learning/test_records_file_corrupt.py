"""The heuristics records file (``dnntune-heuristics-records``) given damaged or hand-edited
text: every reader refuses it naming the file and the field, never keeps a wrong value, and
``heuristics train`` skips it with a note (round trip: test_learning_sources.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from learning_helpers import matmul, rec

from dnntune.errors import ConfigFileError
from dnntune.learning import collect, read_records_file, write_records_file


@pytest.fixture
def good(tmp_path: Path) -> Path:
    records = [
        rec(matmul(8, 64, 64), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 2.0}),
        rec(matmul(16, 64, 64), {"TORCH_ENGINE": 2.0, "CUDNN_ENGINE": 1.0}),
    ]
    return write_records_file(records, tmp_path / "r.json")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        # a second times_ms line above the first: json kept the last, another engine won
        ('"times_ms": {', '"times_ms": {"TORCH_ENGINE": 9.0},\n   "times_ms": {', "times_ms"),
        ('"format_version": 1', '"format_version": 1, "format_version": 1', "format_version"),
        ('"op": "matmul"', '"op": "matmul", "op": "conv"', "op"),
    ],
    ids=["times_ms", "format_version", "op"],
)
def test_a_key_named_twice_is_refused(good: Path, old: str, new: str, where: str) -> None:
    _edit(good, old, new)
    with pytest.raises(ConfigFileError, match=rf'r\.json: .*the key "{where}" appears twice'):
        read_records_file(good)
    found = collect([good])
    assert found.records == []
    assert any("appears twice" in n and n.endswith("skipped") for n in found.notes), found.notes


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # bool("false") is True: the measured record read as order-only, dropped beside others
        ("order_only", "false", r"records\[0\]\.order_only: expected true or false"),
        ("order_only", 0, r"records\[0\]\.order_only: expected true or false"),
        ("source", 5, r"records\[0\]\.source: expected a string"),
        ("source", None, r"records\[0\]\.source: expected a string"),
        ("times_ms", [1.0], r"records\[0\]\.times_ms: expected an object"),
        ("device_class", "", r"records\[0\]\.device_class: expected a name"),
        # an engine's config that is no object was dropped without a word
        (
            "configs",
            {"TORCH_ENGINE": 5},
            r"records\[0\]\.configs\.TORCH_ENGINE: expected an object",
        ),
    ],
    ids=[
        "order_only-string",
        "order_only-int",
        "source-int",
        "source-null",
        "times-list",
        "device-empty",
        "config-number",
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_it(
    good: Path, field: str, value: object, message: str
) -> None:
    doc = json.loads(good.read_text())
    doc["records"][0][field] = value
    good.write_text(json.dumps(doc))
    with pytest.raises(ConfigFileError, match=message):
        read_records_file(good)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "cannot read the records file"),
        (b"\x00\xff\xfe\x89PNG\r\n", "cannot read the records file"),
        (b"[" * 100_000, "nested too deeply"),
        # named as every other reader names another dnntune file
        (b'{"version": 2, "engine_overrides": []}', "an engine-override file .*, not a dnntune-h"),
        (b'{"format": "dnntune-heuristics-records", "format_version": 2, "records": []}', "2 is"),
        (b'{"format": "dnntune-heuristics-records", "format_version": 1}', "expected a list"),
    ],
    ids=["empty", "binary", "nested", "override-file", "future-version", "no-records"],
)
def test_garbage_empty_other_and_future_files_are_refused(
    tmp_path: Path, data: bytes, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(data)
    with pytest.raises(ConfigFileError, match=message):
        read_records_file(path)


def test_a_file_cut_anywhere_is_refused_never_read_short(good: Path) -> None:
    """A copy cut short (a full disk, a transfer stopped) at any byte is an error, not fewer
    records: no prefix of the text is itself a whole records file."""
    text = good.read_bytes()
    for end in range(0, len(text) - 1, 7):
        good.write_bytes(text[:end])
        with pytest.raises(ConfigFileError):
            read_records_file(good)
