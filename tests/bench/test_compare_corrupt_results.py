"""``dnntune bench compare`` on results files edited or damaged by hand: a wrong type where an
object or a time belongs is exit 2 naming the problem, or a row with no time to compare, never
an internal error (AttributeError, OverflowError)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dnntune.cli.app import app


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


def _doc(median_ms: Any = 1.0, iqr_ms: Any = 0.1) -> dict[str, Any]:
    row = {
        "provider": "dnntune",
        "engine": {"id": "0x1", "name": "E"},
        "status": "success",
        "verdict": "unchecked",
        "kernel": {"median_ms": median_ms, "iqr_ms": iqr_ms, "n": 20},
    }
    return {
        "schema_version": 1,
        "run": {"complete": True, "config": {"cache_mode": "warm"}},
        "environment": {},
        "graphs": [{"graph_id": "g1", "graph_name": "g", "status": "ok", "results": [row]}],
    }


def _write(path: Path, doc: dict[str, Any], *edits: tuple[str, str]) -> Path:
    text = json.dumps(doc)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return path


@pytest.mark.parametrize("config", ["[]", "3", "null", '"warm"'])
def test_a_run_config_that_is_not_an_object_is_bad_input(tmp_path: Path, config: str) -> None:
    good = _write(tmp_path / "a.json", _doc())
    bad = _write(
        tmp_path / "b.json", _doc(), ('"config": {"cache_mode": "warm"}', f'"config": {config}')
    )
    for args in ([str(good), str(bad)], [str(bad), str(good)]):
        result = _invoke(["bench", "compare", *args])
        assert result.exit_code == 2, result.output
        assert "run.config is not an object" in result.output


def test_a_median_too_large_for_a_float_is_no_time(tmp_path: Path) -> None:
    good = _write(tmp_path / "a.json", _doc())
    bad = _write(
        tmp_path / "b.json", _doc(median_ms=7), ('"median_ms": 7', '"median_ms": 1' + "0" * 400)
    )
    result = _invoke(["bench", "compare", str(good), str(bad), "--json"])
    assert result.exit_code == 1, result.output  # A's row has no time in B: a regression
    (row,) = json.loads(result.output)
    assert row["verdict"] == "failed in B"


def test_an_iqr_too_wide_for_a_noise_factor_is_within_noise(tmp_path: Path) -> None:
    """ln(1 + 1e308) twice over is past the largest float factor: math.expm1 raised
    OverflowError; the noise is now infinite, so no change stands out."""
    good = _write(tmp_path / "a.json", _doc())
    wide = _write(tmp_path / "b.json", _doc(median_ms=3.0, iqr_ms=1e308))
    result = _invoke(["bench", "compare", str(good), str(wide)])
    assert result.exit_code == 0, result.output
    assert "within noise" in result.output


def test_an_iqr_too_large_for_a_float_is_no_iqr(tmp_path: Path) -> None:
    """As an IQR of another type: the row is judged on the threshold alone (it raised
    OverflowError)."""
    good = _write(tmp_path / "a.json", _doc())
    bad = _write(
        tmp_path / "b.json",
        _doc(median_ms=3.0, iqr_ms=7),
        ('"iqr_ms": 7', '"iqr_ms": 1' + "0" * 400),
    )
    result = _invoke(["bench", "compare", str(good), str(bad), "--json"])
    assert result.exit_code == 1, result.output
    (row,) = json.loads(result.output)
    assert row["verdict"] == "slower"


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        # a hand edit left the old time on a second line: json kept the last, 1 ms, "faster"
        ('"median_ms": 1.0', '"median_ms": 9.0, "median_ms": 1.0', "median_ms"),
        ('"schema_version": 1', '"schema_version": 1, "schema_version": 1', "schema_version"),
    ],
    ids=["median_ms", "schema_version"],
)
def test_a_key_named_twice_is_bad_input_naming_it(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    """Exit 2 naming the key and its line, in either position; compare read the last value."""
    good = _write(tmp_path / "a.json", _doc(median_ms=9.0))
    bad = _write(tmp_path / "b.json", _doc(), (old, new))
    for args in ([str(good), str(bad)], [str(bad), str(good)]):
        result = _invoke(["bench", "compare", *args])
        assert result.exit_code == 2, result.output
        assert f'the key "{key}" appears twice' in result.output
        assert "b.json" in result.output
