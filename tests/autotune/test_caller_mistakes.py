"""Caller mistakes the library must name, and state a failed call must not leave behind
(a new-user audit of the RFC API, session 15: each of these failed before its fix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dnntune as dt

F = dt.DataType.FLOAT
FAST = {"strategy": dt.AutotuneStrategy.FIXED_AVERAGE, "timed_iterations": 3}


def _matmul(
    handle: dt.Handle, m: int = 8
) -> tuple[dt.Graph, dict[dt.TensorAttributes, torch.Tensor]]:
    g = dt.Graph(name=f"mm{m}", io_data_type=F, compute_data_type=F, intermediate_data_type=F)
    a = g.tensor(name="A", dims=[1, m, 16], data_type=F)
    b = g.tensor(name="B", dims=[1, 16, 4], data_type=F)
    c = g.matmul(a, b)
    c.set_output(True)
    g.build_operation_graph(handle)
    pack = {a: torch.randn(1, m, 16), b: torch.randn(1, 16, 4), c: torch.empty(1, m, 4)}
    return g, pack


@pytest.mark.parametrize("flag", ["false", 0, None])
def test_a_storage_flag_that_is_not_a_bool_is_refused_before_it_wipes_the_file(
    cpu_handle: dt.Handle, tmp_path: Path, flag: object
) -> None:
    """``delete_all_existing_file_content="false"`` read as true and dropped every other
    graph's entry from the override file."""
    path = tmp_path / "overrides.json"
    for m in (8, 16):
        g, pack = _matmul(cpu_handle, m)
        g.add_engine("TORCH_ENGINE")
        g.autotune(
            cpu_handle,
            pack,
            None,
            0,
            dt.AutotuneConfig(**FAST),
            dt.AutotuneStorageConfig(str(path)),
        )
    before = path.read_text()
    assert len(json.loads(before)["engine_overrides"]) == 2
    with pytest.raises(dt.InvalidValueError, match="delete_all_existing_file_content"):
        dt.AutotuneStorageConfig(str(path), flag)  # type: ignore[arg-type]
    storage = dt.AutotuneStorageConfig(str(path))
    storage.delete_all_existing_file_content = flag  # type: ignore[assignment]
    g, pack = _matmul(cpu_handle, 32)
    g.add_engine("TORCH_ENGINE")
    with pytest.raises(dt.InvalidValueError, match="delete_all_existing_file_content"):
        g.autotune(cpu_handle, pack, None, 0, dt.AutotuneConfig(**FAST), storage)
    assert path.read_text() == before


def test_storage_config_takes_a_path_and_refuses_what_is_not_one(
    cpu_handle: dt.Handle, tmp_path: Path
) -> None:
    assert dt.AutotuneStorageConfig(tmp_path / "o.json").file_path == str(tmp_path / "o.json")
    with pytest.raises(dt.InvalidValueError, match="file_path must be a path"):
        dt.AutotuneStorageConfig(3)  # type: ignore[arg-type]
    g, pack = _matmul(cpu_handle)
    g.add_engine("TORCH_ENGINE")
    with pytest.raises(dt.InvalidValueError, match="must be an AutotuneStorageConfig"):
        g.autotune(cpu_handle, pack, None, 0, dt.AutotuneConfig(**FAST), "o.json")  # type: ignore[arg-type]


def test_a_failed_autotune_leaves_its_own_results_and_summary(cpu_handle: dt.Handle) -> None:
    """The previous call's results and summary stayed on the graph after a call that raised."""
    g, pack = _matmul(cpu_handle)
    g.add_all_engines()
    first = g.autotune(cpu_handle, pack, None, 0, dt.AutotuneConfig(**FAST))
    summary = g.last_autotune_summary
    assert g.last_autotune_results is first and summary is not None
    with pytest.raises(dt.AutotuneError) as caught:
        g.autotune(cpu_handle, pack, None, 0, dt.AutotuneConfig(**FAST, engine_id_filter=[12345]))
    assert g.last_autotune_results == list(caught.value.results)
    assert all(not r.succeeded for r in g.last_autotune_results)
    assert g.last_autotune_summary is not None and g.last_autotune_summary is not summary
    with pytest.raises(dt.InvalidValueError):
        g.autotune(cpu_handle, {}, None, 0, dt.AutotuneConfig(**FAST))
    assert g.last_autotune_results == [] and g.last_autotune_summary is None


def test_engine_id_filter_takes_one_name_and_names_a_bad_entry(cpu_handle: dt.Handle) -> None:
    """A bare engine name was read letter by letter and filtered out every candidate."""
    g, pack = _matmul(cpu_handle)
    g.add_all_engines()
    config = dt.AutotuneConfig(**FAST, engine_id_filter="TORCH_ENGINE")  # type: ignore[arg-type]
    config.validate()
    assert config.engine_id_filter == ["TORCH_ENGINE"]
    results = g.autotune(cpu_handle, pack, None, 0, config)
    assert {r.engine_name for r in results if r.succeeded} == {"TORCH_ENGINE"}
    for bad in ([None], [1.5], [True], {"TORCH_ENGINE": 1}):
        with pytest.raises(dt.InvalidValueError, match="engine_id_filter"):
            dt.AutotuneConfig(engine_id_filter=bad).validate()  # type: ignore[arg-type]


def test_wrong_argument_kinds_are_named(cpu_handle: dt.Handle) -> None:
    g, pack = _matmul(cpu_handle)
    g.build(cpu_handle)
    pairs = list(pack.items())
    with pytest.raises(dt.InvalidValueError, match=r"list of pairs\? pass dict"):
        g.execute(cpu_handle, pairs)  # type: ignore[arg-type]
    g, _ = _matmul(cpu_handle)  # the plan-spec path
    with pytest.raises(dt.InvalidValueError, match="entry 0 must be an EngineVariant"):
        g.add_engine_variants([{"engine_id": "TORCH_ENGINE"}])  # type: ignore[list-item]
    with pytest.raises(dt.InvalidValueError, match="entry 0 must be an EngineSweepSpec"):
        g.add_engine_sweep([dt.EngineVariant("TORCH_ENGINE")])  # type: ignore[list-item]
    with pytest.raises(dt.InvalidValueError, match="data must be the JSON text"):
        g.deserialize_plan(cpu_handle, None)  # type: ignore[arg-type]
