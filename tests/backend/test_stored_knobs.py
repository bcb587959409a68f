"""A tuned entry's knobs are applied when a later run builds from the override file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import dnntune as dt
from dnntune import testing


def test_override_file_knobs_are_applied_on_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ov.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        handle = dt.create_handle("cpu")
        g = testing.small_matmul_graph()
        g.build_operation_graph(handle)
        # FAKE_ENGINE_A variant 1 (0.7 ms) beats C (2.0 ms) and A's default (1.0 ms)
        g.add_engine_sweep(
            [
                dt.EngineSweepSpec(
                    dt.engine_id(testing.FAKE_ENGINE_A),
                    [dt.KnobSweepAxis("fake.variant", [0, 1, 2])],
                )
            ]
        )
        g.add_engine(testing.FAKE_ENGINE_C)
        ws = g.get_estimated_max_workspace_size()
        workspace = torch.empty(ws, dtype=torch.uint8)
        g.autotune(
            handle,
            testing.make_pack(g),
            workspace,
            ws,
            dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE),
            dt.AutotuneStorageConfig(file_path=str(path)),
        )
        assert g.get_plan_name() == "FAKE_ENGINE_A[fake.variant=1]"

        monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
        again = testing.small_matmul_graph()
        again.build(handle, [dt.HeuristicMode.A])
        assert again.get_plan_name() == "FAKE_ENGINE_A[fake.variant=1]"


def _matmul_file(path: Path, knobs: list[dict[str, object]]) -> dt.Graph:
    """A hand-edited override entry for a float matmul with ``knobs``; the graph it matches."""
    g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    a = g.tensor(name="A", dims=[1, 64, 128])
    b = g.tensor(name="B", dims=[1, 128, 32])
    g.matmul(a, b).set_output(True)
    entry = {
        "op": "matmul",
        "engine_name": "TORCH_ENGINE",
        "tensors": [
            {"tensor_id": "a_tensor_uid", "dim": [1, 64, 128], "stride": [8192, 128, 1]},
            {"tensor_id": "b_tensor_uid", "dim": [1, 128, 32], "stride": [4096, 32, 1]},
        ],
        "autotune_metadata": {"knobs": knobs},
    }
    path.write_text(json.dumps({"version": 2, "engine_overrides": [entry]}))
    return g


@pytest.mark.parametrize(
    ("knob", "problem"),
    [
        ({"knob_id": "torch.allow_tf32", "type": "int", "value": 7}, "allowed range: 0..1"),
        ({"knob_id": "torch.alow_tf32", "type": "int", "value": 1}, "unknown knob"),
    ],
)
def test_invalid_hand_edited_knobs_warn_once_per_entry(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    knob: dict[str, object],
    problem: str,
) -> None:
    """An out-of-range value or a misspelled knob id drops the entry's knobs (the engine runs
    with its defaults), with a warning that says so, once (the file is re-read per query)."""
    path = tmp_path / "hand.json"
    handle = dt.create_handle("cpu")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        for _ in range(3):
            g = _matmul_file(path, [knob])
            g.build(handle, [dt.HeuristicMode.A])
            assert g.get_plan_name() == "TORCH_ENGINE"  # the entry's engine, default knobs
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "dnntune.backend.plans"
    ]
    assert len(warnings) == 1, warnings
    (message,) = warnings
    assert f"override file {path}: engine_overrides[0]" in message
    assert str(knob["knob_id"]) in message and problem in message
    assert "TORCH_ENGINE runs with its default knobs" in message
    assert "autotune_metadata.knobs" in message
