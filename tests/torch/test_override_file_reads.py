"""What reading the override file costs a call of a new shape (new-user audit)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import dnntune.torch as dtt
from dnntune.errors import ConfigFileError
from dnntune.overrides import format as override_format
from dnntune.overrides import policy as override_policy


def _entry(k: int) -> dict[str, Any]:
    return {
        "op": "matmul",
        "engine_name": "TORCH_ENGINE",
        "tensors": [
            {"tensor_id": "a_tensor_uid", "dim": [8, k], "stride": [k, 1]},
            {"tensor_id": "b_tensor_uid", "dim": [k, 40], "stride": [1, k]},
        ],
        "autotune_metadata": {"rank": 0, "min_time_ms": 0.02, "median_time_ms": 0.03},
    }


def test_a_new_shape_reads_the_override_file_without_walking_its_json_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Config policy reads the file again for every graph it is asked about, and the
    check for NaN built a JSON path string for every value of the document: most of the parse
    (4 of 6 ms for a 91-entry file), paid by each layer's first call of a shape (a GPT block's
    step at a new sequence length took 60 ms, 23 ms without the file). The paths are built
    only for a document that holds a NaN, whose error still names it."""
    path = tmp_path / "overrides.json"
    doc = {"version": 2, "engine_overrides": [_entry(k) for k in range(1, 60)]}
    path.write_text(json.dumps(doc))
    reads: list[Path] = []
    walks: list[object] = []
    load_file = override_format.load_file
    walk = override_format.non_finite_path

    def counted_load(p: Any) -> Any:
        reads.append(Path(p))
        return load_file(p)

    def counted_walk(d: Any) -> str | None:
        walks.append(d)
        return walk(d)

    monkeypatch.setattr(override_format, "load_file", counted_load)
    monkeypatch.setattr(override_format, "non_finite_path", counted_walk)
    dtt.configure(policy="heuristic", overrides=path)
    w = torch.randn(16, 24)
    for rows in (3, 5):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(dtt.linear(x, w), torch.nn.functional.linear(x, w))
    assert path in reads
    assert walks == []
    doc["engine_overrides"][7]["autotune_metadata"]["min_time_ms"] = float("nan")
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigFileError, match=r"engine_overrides\[7\]\.autotune_metadata"):
        override_format.load_file(path)
    assert len(walks) == 1


def test_first_calls_of_several_new_shapes_parse_the_override_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new shape's first call asks the override file about its graph; the file was read
    and parsed again for each (new-user audit: 44 ms per new shape with a 91-entry file on a
    busy CPU). It is parsed once per state of the file now, and an edit is still seen."""
    path = tmp_path / "overrides.json"
    doc = {"version": 2, "engine_overrides": [_entry(k) for k in range(1, 92)]}
    path.write_text(json.dumps(doc))
    old_ns = time.time_ns() - 3600 * 1_000_000_000  # outside the cache's racy window
    os.utime(path, ns=(old_ns, old_ns))
    asks: list[Path] = []
    parses: list[str] = []
    ask = override_policy.load_file_cached
    parse_text = override_format.parse_text

    def counted_ask(p: Any) -> Any:
        asks.append(Path(p))
        return ask(p)

    def counted_parse(text: str, source: str = "") -> Any:
        parses.append(source)
        return parse_text(text, source)

    monkeypatch.setattr(override_policy, "load_file_cached", counted_ask)
    monkeypatch.setattr(override_format, "parse_text", counted_parse)
    dtt.configure(policy="heuristic", overrides=path)
    w = torch.randn(16, 24)
    for rows in (3, 5, 7, 9):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(dtt.linear(x, w), torch.nn.functional.linear(x, w))
    assert asks.count(path) >= 4  # every new shape asked the file
    assert parses == [str(path)]  # and it was parsed once
    path.write_text(json.dumps(doc).replace('"rank": 0', '"rank": 1', 1))
    os.utime(path, ns=(old_ns + 1, old_ns + 1))
    x = torch.randn(11, 24)
    torch.testing.assert_close(dtt.linear(x, w), torch.nn.functional.linear(x, w))
    assert parses == [str(path)] * 2
