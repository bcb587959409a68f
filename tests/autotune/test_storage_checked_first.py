"""Graph.autotune refuses a config file it could not write before tuning, as the CLI does
(issue 26: the library found a malformed file or a directory only after every candidate ran)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.errors import ConfigFileError, InvalidValueError

WS = testing.ESTIMATED_WORKSPACE_BYTES


def _autotune(path: Path, replace: bool = False) -> testing.FakeEngines:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        storage = dt.AutotuneStorageConfig(
            file_path=str(path), delete_all_existing_file_content=replace
        )
        try:
            g.autotune(
                handle,
                testing.make_pack(g),
                torch.empty(WS, dtype=torch.uint8),
                WS,
                dt.AutotuneConfig(),
                storage,
            )
        finally:
            executed = sum(fakes.counters.executes.values())
        assert executed > 0
        return fakes


def test_a_malformed_file_is_refused_before_any_candidate_runs(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "engine_overrides": [{"op": "matmul"}]}))
    before = path.read_text()
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        storage = dt.AutotuneStorageConfig(file_path=str(path))
        with pytest.raises(InvalidValueError, match=r"engine_overrides\[0\]"):
            g.autotune(
                handle,
                testing.make_pack(g),
                torch.empty(WS, dtype=torch.uint8),
                WS,
                dt.AutotuneConfig(),
                storage,
            )
        assert sum(fakes.counters.executes.values()) == 0
    assert path.read_text() == before
    # replacing the file is still allowed, and tunes
    _autotune(path, replace=True)
    assert json.loads(path.read_text())["engine_overrides"][0]["op"] != "matmul"


def test_a_directory_is_refused_before_any_candidate_runs(tmp_path: Path) -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        storage = dt.AutotuneStorageConfig(file_path=str(tmp_path))
        with pytest.raises(ConfigFileError):
            g.autotune(
                handle,
                testing.make_pack(g),
                torch.empty(WS, dtype=torch.uint8),
                WS,
                dt.AutotuneConfig(),
                storage,
            )
        assert sum(fakes.counters.executes.values()) == 0
