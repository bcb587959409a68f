"""A tuned entry's knobs are applied when a later run builds from the override file."""

from __future__ import annotations

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
