"""autotune() upfront checks (RFC 6.3 "Error conditions", 10.2 variant-pack validation)."""

from __future__ import annotations

import pytest
import torch
from autotune_helpers import Pack, tune, workspace

import dnntune as dt
from dnntune.errors import BadStateError, InvalidValueError, NotSupportedError
from dnntune.testing import FAKE_ENGINE_A, FakeEngines


@pytest.fixture
def specced(graph: dt.Graph) -> dt.Graph:
    graph.add_all_engines()
    return graph


def _nothing_ran(fakes: FakeEngines) -> bool:
    return sum(fakes.counters.compiles.values()) == 0 and sum(fakes.counters.executes.values()) == 0


@pytest.mark.parametrize("bad_handle", [None, "cpu", object()])
def test_invalid_handle(
    specced: dt.Graph, pack: Pack, bad_handle: object, fakes: FakeEngines
) -> None:
    with pytest.raises(InvalidValueError, match="handle must be a Handle"):
        specced.autotune(bad_handle, pack, workspace(), 1024)  # type: ignore[arg-type]
    assert _nothing_ran(fakes)


def test_empty_variant_pack(specced: dt.Graph, handle: dt.Handle) -> None:
    with pytest.raises(InvalidValueError, match="variant pack is empty"):
        specced.autotune(handle, {}, workspace(), 1024)


def test_missing_uid_is_reported(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    x = specced.input_tensors()[0]
    del pack[x.uid]
    with pytest.raises(InvalidValueError, match=f"missing tensor uid\\(s\\): {x.uid} \\(X\\)"):
        specced.autotune(handle, pack, workspace(), 1024)
    assert _nothing_ran(fakes)


def test_extra_uids_are_accepted(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    pack[9999] = torch.zeros(3)
    tune(specced, handle, pack)


def test_tensor_attribute_keys_are_accepted(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    by_attr = {specced.tensor_by_uid(uid): t for uid, t in pack.items()}
    results = specced.autotune(handle, by_attr, workspace(), 1024)
    assert results[0].succeeded


def test_negative_workspace_size(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match="workspace_size must be >= 0"):
        specced.autotune(handle, pack, workspace(), -1)


def test_workspace_size_type(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match="must be an int"):
        specced.autotune(handle, pack, workspace(), 1024.0)  # type: ignore[arg-type]


def test_null_workspace_with_nonzero_size(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match="workspace is None but workspace_size is 1024"):
        specced.autotune(handle, pack, None, 1024)


def test_workspace_smaller_than_claimed(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match="holds 512 bytes, less than workspace_size 1024"):
        specced.autotune(handle, pack, workspace(512), 1024)


def test_no_candidates(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(BadStateError, match="no autotuning candidates"):
        graph.autotune(handle, pack, workspace(), 1024)
    with pytest.raises(BadStateError, match="no autotuning candidates"):
        graph.autotune(handle, pack, workspace())


def test_compiled_plan_form_refuses_plan_specs(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    with pytest.raises(BadStateError, match="compiled-plan form"):
        specced.autotune(handle, pack, workspace())


def test_plans_created_but_not_built(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plans()
    with pytest.raises(BadStateError, match="no compiled plans"):
        graph.autotune(handle, pack, workspace())


def test_exhaustive_on_compiled_path(graph: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    graph.create_execution_plans().build_plans(dt.BuildPlanPolicy.ALL)
    cfg = dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE)
    with pytest.raises(InvalidValueError, match="EXHAUSTIVE mode needs the plan-spec path"):
        graph.autotune(handle, pack, workspace(), config=cfg)
    with pytest.raises(InvalidValueError, match="EXHAUSTIVE"):
        graph.autotune(handle, pack, workspace(), 1024, cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        dt.AutotuneConfig(window_size=1),
        dt.AutotuneConfig(max_iterations=2),
        dt.AutotuneConfig(stability_threshold=1.5),
        dt.AutotuneConfig(stability_threshold=0.0),
        dt.AutotuneConfig(warmup_iterations=-1),
        dt.AutotuneConfig(strategy=dt.AutotuneStrategy.FIXED_AVERAGE, timed_iterations=0),
    ],
)
def test_config_validated_before_anything_runs(
    specced: dt.Graph, handle: dt.Handle, pack: Pack, cfg: dt.AutotuneConfig, fakes: FakeEngines
) -> None:
    with pytest.raises(InvalidValueError):
        specced.autotune(None, pack, workspace(), 1024, cfg)  # type: ignore[arg-type]
    assert _nothing_ran(fakes)


def test_isolate_is_refused_on_the_compiled_plan_path(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    graph.create_execution_plans([dt.HeuristicMode.FALLBACK])
    graph.check_support()
    graph.build_plans(dt.BuildPlanPolicy.ALL)
    fakes.counters.reset()
    with pytest.raises(NotSupportedError, match="isolate=True needs the plan-spec path"):
        graph.autotune(handle, pack, workspace(), None, dt.AutotuneConfig(isolate=True))
    assert sum(fakes.counters.executes.values()) == 0


def test_wrong_config_type(specced: dt.Graph, handle: dt.Handle, pack: Pack) -> None:
    with pytest.raises(InvalidValueError, match="AutotuneConfig"):
        specced.autotune(handle, pack, workspace(), 1024, {"mode": "standard"})  # type: ignore[arg-type]


def test_add_engine_after_autotune_is_additive(
    specced: dt.Graph, handle: dt.Handle, pack: Pack
) -> None:
    tune(specced, handle, pack)
    specced.add_engine(FAKE_ENGINE_A, {"fake.variant": 1})
    results = tune(specced, handle, pack)
    assert len(results) == 8
