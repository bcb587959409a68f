"""Numbers a graph cannot run on are refused by validation, naming the field (new-user audit,
session 56): a NaN parameter (the outputs were NaN, which the reference check matched with NaN
and passed), an infinite attention scale, and JSON integers too large for their field's type
(an OverflowError came out as "internal error", or validated "ok" and failed when run)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import dnntune as dt

F = dt.DataType.FLOAT
EXAMPLES = Path(__file__).parents[2] / "examples" / "graphs"
HUGE = 10**400


def _swish(beta: float) -> dict[str, Any]:
    g = dt.Graph(name="swish", io_data_type=F, compute_data_type=F)
    y = g.pointwise(g.tensor("X", [2, 4]), mode=dt.PointwiseMode.SWISH_FWD, swish_beta=beta)
    y.set_output(True)
    return g.to_dict()


def _loaded(doc: dict[str, Any]) -> dt.Graph:
    return dt.Graph.from_json(json.dumps(doc))


def test_a_nan_parameter_is_refused_by_validation_naming_it() -> None:
    _loaded(_swish(1.0))
    with pytest.raises(dt.InvalidValueError, match="swish_beta: is NaN; give it a number"):
        _loaded(_swish(math.nan))


def test_an_infinite_attention_scale_is_refused() -> None:
    doc = json.loads((EXAMPLES / "llama3_gqa_sdpa_causal.json").read_text())
    (node,) = [n for n in doc["nodes"] if "attn_scale_value" in json.dumps(n)]
    _set_deep(node, "attn_scale_value", "inf")
    with pytest.raises(dt.InvalidValueError, match="attn_scale_value: must be a finite number > 0"):
        _loaded(doc)


def test_an_integer_too_large_for_a_float_parameter_is_a_field_error() -> None:
    doc = _swish(1.0)
    _set_deep(doc["nodes"][0], "swish_beta", HUGE)
    with pytest.raises(dt.InvalidValueError, match=r"swish_beta.*a float can hold, got an integer"):
        _loaded(doc)


@pytest.mark.parametrize(
    ("value_type", "value", "fits"),
    [("Float32Value", HUGE, False), ("Int32Value", 2**31, False), ("Int32Value", 2**31 - 1, True),
     ("Int64Value", 10**30, False), ("Float32Value", 3, True)],
)  # fmt: skip
def test_a_scalar_that_does_not_fit_its_type_is_refused(
    value_type: str, value: int, fits: bool
) -> None:
    g = dt.Graph(name="add", io_data_type=F, compute_data_type=F)
    g.pointwise(g.tensor("X", [2, 4]), 2.0, mode=dt.PointwiseMode.ADD).set_output(True)
    doc = g.to_dict()
    (scalar,) = [t for t in doc["tensors"] if "value" in t]
    scalar["value"], scalar["value_type"] = value, value_type
    scalar["data_type"] = (
        "int32" if value_type == "Int32Value" else "int64" if "64" in value_type else "float"
    )
    if fits:
        _loaded(doc)
        return
    with pytest.raises(
        dt.InvalidValueError,
        match=r"value: tensor .*: a pass-by-value scalar of .* does not fit its data type",
    ):
        _loaded(doc)


def test_an_epsilon_too_large_for_a_float_names_the_field() -> None:
    doc = json.loads((EXAMPLES / "llama_rmsnorm.json").read_text())
    (eps,) = [t for t in doc["tensors"] if "value" in t]
    eps["value"] = HUGE
    with pytest.raises(dt.InvalidValueError, match=r"epsilon 1000.*\.\.\. must be a finite number"):
        _loaded(doc)


def _set_deep(obj: Any, key: str, value: Any) -> None:
    """Set ``key`` wherever it sits in ``obj`` (a node keeps parameters at its top level or under
    ``parameters``, by format version)."""
    if isinstance(obj, dict):
        if key in obj:
            obj[key] = value
        for v in obj.values():
            _set_deep(v, key, value)
    elif isinstance(obj, list):
        for v in obj:
            _set_deep(v, key, value)


def test_a_graph_file_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    """An editor's UTF-8 BOM made the file unreadable ("decode using utf-8-sig"); override files
    skip it already (new-user audit, session 56)."""
    text = (EXAMPLES / "llama_rmsnorm.json").read_text()
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert dt.Graph.load(path).to_json() == dt.Graph.load(EXAMPLES / "llama_rmsnorm.json").to_json()


def test_graph_save_replaces_the_file_atomically(tmp_path: Path, monkeypatch: Any) -> None:
    """``Graph.save`` truncated the file, then wrote it: a reader alongside read an empty file,
    and a failed write left one (new-user audit, session 56). A failed save keeps the old file."""
    g = dt.Graph.load(EXAMPLES / "llama_rmsnorm.json")
    path = tmp_path / "g.json"
    g.save(path)
    before = path.read_text()
    import dnntune.overrides.store as store

    def broken(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", broken)
    with pytest.raises(dt.DnnTuneError):
        g.save(path)
    monkeypatch.undo()
    assert path.read_text() == before and dt.Graph.load(path).name == g.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]  # no temporary file left
