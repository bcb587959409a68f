"""CUDNN_ENGINE's suggested variants: the next plans of cuDNN's heuristic list, timed in every
tune beside its first choice (``SUGGESTED_PLANS``; session 24's H200 study)."""

from __future__ import annotations

from typing import Any

import pytest

import dnntune as dt
from dnntune.errors import NotSupportedError
from dnntune.providers.cudnn import engine as cudnn_engine
from dnntune.providers.cudnn.engine import ENGINE_CONFIG, SUGGESTED_PLANS, CudnnEngine

H, F = dt.DataType.HALF, dt.DataType.FLOAT


def _conv(n: int = 4, c: int = 32, hw: int = 14, k: int = 64) -> dt.Graph:
    g = dt.Graph(name="conv_bias_relu", io_data_type=H, compute_data_type=F)
    x = g.tensor(name="X", dims=[n, c, hw, hw], strides=[c * hw * hw, 1, hw * c, c])
    w = g.tensor(name="W", dims=[k, c, 3, 3], strides=[c * 9, 1, 3 * c, c])
    y = g.conv_fprop(x, w, padding=1, stride=1)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


@pytest.mark.parametrize(
    ("count", "want"),
    [
        (None, []),  # the list is not known: no GPU, or not supported
        (1, []),  # one plan: the default is it
        (3, [1, 2]),
        (40, list(range(1, SUGGESTED_PLANS))),
    ],
)
def test_suggested_plans_are_the_next_of_the_list(
    monkeypatch: pytest.MonkeyPatch, count: int | None, want: list[int]
) -> None:
    monkeypatch.setattr(cudnn_engine, "_distinct_plan_count", lambda graph: count)
    got = CudnnEngine().suggested_variants(_conv())
    assert got == [{ENGINE_CONFIG: i} for i in want]


def test_no_suggestion_without_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert CudnnEngine().suggested_variants(_conv()) == []


@pytest.mark.gpu
def test_a_tune_times_and_verifies_the_suggested_plans(cuda_handle: dt.Handle) -> None:
    try:
        CudnnEngine().check_available()
    except NotSupportedError as exc:
        pytest.skip(str(exc))
    from dnntune import allocate_workspace
    from dnntune.autotune import add_suggested_variants
    from dnntune.reference import make_inputs

    g = _conv()
    g.build_operation_graph(cuda_handle)
    g.add_engine("CUDNN_ENGINE")
    count = CudnnEngine().plan_count(g, cuda_handle)
    assert add_suggested_variants(g) == min(count, SUGGESTED_PLANS) - 1 >= 1
    ws = g.get_estimated_max_workspace_size()
    pack = make_inputs(g, cuda_handle.device, seed=0)
    results = g.autotune(cuda_handle, pack, allocate_workspace(ws, cuda_handle.device), ws)
    configs: dict[Any, dt.AutotuneResult] = {
        next((s.value for s in r.knob_settings if s.knob_id == ENGINE_CONFIG), -1): r
        for r in results
    }
    # the default (-1, the first plan that fits) and plans 1..5 (H200, session 24: the first
    # version of this line wanted plan 0 too, which is not suggested)
    assert sorted(configs) == [-1, *range(1, min(count, SUGGESTED_PLANS))]
    for r in configs.values():  # each built, timed and checked against the reference
        assert r.succeeded and r.verified, (r.plan_name, r.error_message)


@pytest.mark.gpu
def test_under_estimates_without_builds_the_suggested_plans_are_built_in_the_search(
    cuda_handle: dt.Handle,
) -> None:
    """A budgeted tune (``backend.estimates``): adding the suggested variants builds none of
    their plans (each took 0.2-0.5 s to build on the H100, session 44); the plans the search
    reaches are built, timed and verified there."""
    try:
        CudnnEngine().check_available()
    except NotSupportedError as exc:
        pytest.skip(str(exc))
    from dnntune import allocate_workspace
    from dnntune.autotune import add_suggested_variants
    from dnntune.backend.estimates import estimates_without_builds
    from dnntune.providers.cudnn.problem import clear_problem_cache, get_problem
    from dnntune.reference import make_inputs

    clear_problem_cache()
    g = _conv(n=3)  # a shape no other test builds
    g.build_operation_graph(cuda_handle)
    g.add_engine("CUDNN_ENGINE")
    with estimates_without_builds():
        added = add_suggested_variants(g)
    assert added >= 1
    problem = get_problem(g, cuda_handle.device.index or 0, "a")
    suggested = [problem.candidates[i] for i in range(1, added + 1)]
    assert all(problem.built_workspace(i) is None for i in suggested)  # nothing built
    ws = max(g.get_estimated_max_workspace_size(), 64 << 20)
    pack = make_inputs(g, cuda_handle.device, seed=0)
    config = dt.AutotuneConfig(time_budget_s=30.0)
    results = g.autotune(cuda_handle, pack, allocate_workspace(ws, cuda_handle.device), ws, config)
    timed = [r for r in results if r.succeeded]
    assert len(timed) == added + 1  # 30 s is room for all of them: built in their turn
    assert all(r.verified for r in timed)
    assert all(problem.built_workspace(i) is not None for i in suggested)
