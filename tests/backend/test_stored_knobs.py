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


def test_valid_knobs_that_cannot_build_here_fall_back_to_the_engines_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``torch.cuda_graph=1`` validates anywhere but builds only on CUDA: on the CPU the
    entry's engine runs with its default knobs (before session 22: the next engine in the
    heuristic order), with one warning naming the plan, the reason and the file."""
    path = tmp_path / "gpu_tuned.json"
    handle = dt.create_handle("cpu")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    knob = {"knob_id": "torch.cuda_graph", "type": "int", "value": 1}
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        for _ in range(3):
            g = _matmul_file(path, [knob])
            g.build(handle, [dt.HeuristicMode.A])
            assert g.get_plan_name() == "TORCH_ENGINE"
            entry = g._plan_set.plans.entries[0]
            assert entry.stored_failure is not None
            assert entry.stored_failure[0] == "TORCH_ENGINE[torch.cuda_graph=1]"
            assert "needs a CUDA device" in entry.stored_failure[1]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "dnntune.backend.plans"
    ]
    assert len(warnings) == 1, warnings
    assert f"override file {path}: engine_overrides[0]" in warnings[0]
    assert "TORCH_ENGINE[torch.cuda_graph=1] cannot be built here" in warnings[0]
    assert "TORCH_ENGINE runs with its default knobs" in warnings[0]


def test_an_engine_that_cannot_build_still_gives_way_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only stored knobs fall back to defaults: a plan whose default knobs fail too is not
    retried, and the collection moves on as before."""
    from dnntune.backend.plans import PlanCollection, PlanEntry

    path = tmp_path / "gpu_tuned.json"
    handle = dt.create_handle("cpu")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    g = _matmul_file(path, [{"knob_id": "torch.cuda_graph", "type": "int", "value": 1}])
    g.build_operation_graph(handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    plans = g._plan_set.plans
    assert isinstance(plans, PlanCollection)
    first: PlanEntry = plans.entries[0]
    calls: list[object] = []

    def refuse(graph: object, knob_settings: object, handle: object) -> object:
        calls.append(knob_settings)
        raise dt.NotSupportedError("not on this machine")

    monkeypatch.setattr(first.engine, "compile", refuse)
    assert not plans._compile(first)
    assert len(calls) == 2 and calls[1] == ()  # the stored knobs, then the defaults, once
    assert first.build_error == "not on this machine"
