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


def _tune_into(path: Path, replace: bool = False) -> tuple[Exception | None, int]:
    """Autotune a small graph with ``path`` as the config file: (what it raised, executes)."""
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]) as fakes:
        handle = dt.create_handle("cpu")
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        storage = dt.AutotuneStorageConfig(
            file_path=str(path), delete_all_existing_file_content=replace
        )
        pack, ws = testing.make_pack(g), torch.empty(WS, dtype=torch.uint8)
        try:
            g.autotune(handle, pack, ws, WS, dt.AutotuneConfig(), storage)
        except (ConfigFileError, InvalidValueError) as exc:
            return exc, sum(fakes.counters.executes.values())
        return None, sum(fakes.counters.executes.values())


def test_a_malformed_file_is_refused_before_any_candidate_runs(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 2, "engine_overrides": [{"op": "matmul"}]}))
    before = path.read_text()
    raised, executes = _tune_into(path)
    assert isinstance(raised, InvalidValueError)
    assert "engine_overrides[0]" in str(raised)
    assert executes == 0
    assert path.read_text() == before
    # replacing the file is still allowed, and tunes
    raised, executes = _tune_into(path, replace=True)
    assert raised is None and executes > 0
    assert json.loads(path.read_text())["engine_overrides"][0]["op"] != "matmul"


def test_a_directory_is_refused_before_any_candidate_runs(tmp_path: Path) -> None:
    raised, executes = _tune_into(tmp_path)
    assert isinstance(raised, ConfigFileError)
    assert executes == 0


@pytest.mark.parametrize("replace", [False, True])
def test_a_writable_new_file_is_written(tmp_path: Path, replace: bool) -> None:
    path = tmp_path / "sub" / "new.json"
    raised, executes = _tune_into(path, replace=replace)
    assert raised is None and executes > 0
    assert json.loads(path.read_text())["engine_overrides"]
