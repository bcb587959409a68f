"""Pooling on a GPU: TRITON_ENGINE's NHWC pooling kernel and TORCH_ENGINE's pooling path against
``dnntune.reference`` with explicit tolerances, on the three pooling graphs of the benchmark
suite (and their bf16/fp32 twins) and small odd shapes. Skipped without CUDA; the Triton tests
also without triton."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pool_cases import (
    BF,
    ODD,
    SUITE,
    F,
    H,
    M,
    odd_graph,
    odd_id,
    pool_graph,
    pool_tolerance,
    suite_graph,
)

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.reference import compare, make_inputs, run

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _twin(name: str, dtype: dt.DataType) -> dt.Graph:
    """The suite graph ``name`` with its io tensors in ``dtype``."""
    g = suite_graph(name)
    if dtype is H:
        return g
    for t in g.tensors:
        t.set_data_type(dtype)
    g.validate()
    return g


def check(
    graph: dt.Graph,
    handle: dt.Handle,
    engine_name: str,
    settings: Sequence[KnobSetting] = (),
    nan_at: tuple[int, ...] | None = None,
) -> Any:
    """Build ``engine_name``'s plan, run it on reference inputs, compare with the explicit
    tolerance (``nan_at``: put a NaN in the input there first); returns the plan."""
    engine = get_registry().get(engine_name)
    assert get_registry().why_not(engine, graph, handle) is None
    plan = engine.compile(graph, list(settings), handle)
    pack = make_inputs(graph, handle.device, seed=3)
    (x,) = [t for t in graph.tensors if not t.is_output]
    (y,) = graph.output_tensors()
    assert x.uid is not None and y.uid is not None
    if nan_at is not None:
        pack[x.uid][nan_at] = float("nan")
    pack[y.uid].fill_(12345.0)  # every element must be written
    plan.execute(pack, None)
    torch.cuda.synchronize()
    expected = run(graph, pack)
    result = compare(pack[y.uid], expected[y.uid], pool_tolerance(graph))
    assert result.ok, f"{engine_name} {graph.name} {plan.metadata.get('config')}: {result.message}"
    return plan


# ---- TRITON_ENGINE --------------------------------------------------------------------------
@pytest.fixture
def triton_available() -> None:
    pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("name", SUITE)
def test_triton_suite_graphs(
    cuda_handle: dt.Handle, triton_available: None, name: str, dtype: dt.DataType
) -> None:
    plan = check(_twin(name, dtype), cuda_handle, "TRITON_ENGINE")
    assert plan.metadata["kernel"] == "pool"


@pytest.mark.parametrize("name", SUITE)
def test_triton_suite_graphs_every_candidate(
    cuda_handle: dt.Handle, triton_available: None, name: str
) -> None:
    """Each config of the search list computes the right answer (not only the fastest)."""
    from dnntune.providers.triton.patterns import match_graph
    from dnntune.providers.triton.solvers import device_limits, solver_for

    g = suite_graph(name)
    match = match_graph(g)
    candidates = solver_for(match).candidates(match, device_limits(), {})
    for config in candidates:
        pins = [KnobSetting(f"triton.{k}", v) for k, v in config.items()]
        plan = check(g, cuda_handle, "TRITON_ENGINE", pins)
        assert plan.metadata["config"] == config


@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("index", range(len(ODD)), ids=odd_id)
def test_triton_odd_shapes(
    cuda_handle: dt.Handle, triton_available: None, index: int, dtype: dt.DataType
) -> None:
    check(odd_graph(index, dtype), cuda_handle, "TRITON_ENGINE")


def test_triton_wider_output_type(cuda_handle: dt.Handle, triton_available: None) -> None:
    for mode in M:
        g = pool_graph([2, 24, 9, 9], mode, [3, 3], [2, 2], [1, 1], [1, 1], H, y_dtype=F)
        check(g, cuda_handle, "TRITON_ENGINE")


@pytest.mark.parametrize("window", [[3, 3], [6, 6]], ids=["window", "global"])
def test_triton_max_pool_propagates_nan(
    cuda_handle: dt.Handle, triton_available: None, window: list[int]
) -> None:
    pad = [1, 1] if window == [3, 3] else [0, 0]
    g = pool_graph([2, 16, 6, 6], M.MAXPOOL, window, [1, 1], pad, pad, F)
    check(g, cuda_handle, "TRITON_ENGINE", nan_at=(1, 5, 2, 3))


@pytest.mark.parametrize("name", SUITE)
def test_triton_search_picks_a_verified_config(
    cuda_handle: dt.Handle, triton_available: None, name: str
) -> None:
    plan = check(
        suite_graph(name), cuda_handle, "TRITON_ENGINE", [KnobSetting("triton.tuning_policy", 4)]
    )
    assert plan.metadata["config_source"] == "search"
    assert plan.metadata["timed_candidates"] >= 2


def test_triton_declines_nchw_on_the_gpu(cuda_handle: dt.Handle, triton_available: None) -> None:
    engine = get_registry().get("TRITON_ENGINE")
    g = pool_graph([2, 8, 6, 6], M.MAXPOOL, [2, 2], layout="nchw")
    reason = get_registry().why_not(engine, g, cuda_handle)
    assert reason is not None and "channels-last" in reason


# ---- TORCH_ENGINE ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("name", SUITE)
def test_torch_suite_graphs(cuda_handle: dt.Handle, name: str, dtype: dt.DataType) -> None:
    check(_twin(name, dtype), cuda_handle, "TORCH_ENGINE")


@pytest.mark.parametrize("name", SUITE)
def test_torch_suite_graphs_in_a_cuda_graph(cuda_handle: dt.Handle, name: str) -> None:
    check(suite_graph(name), cuda_handle, "TORCH_ENGINE", [KnobSetting("torch.cuda_graph", 1)])


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("index", range(len(ODD)), ids=odd_id)
def test_torch_odd_shapes(
    cuda_handle: dt.Handle, index: int, dtype: dt.DataType, layout: str
) -> None:
    check(odd_graph(index, dtype, layout), cuda_handle, "TORCH_ENGINE")


@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("mode", list(M), ids=lambda m: m.json_name)
def test_torch_3d_pooling(
    cuda_handle: dt.Handle, mode: dt.ResampleMode, dtype: dt.DataType
) -> None:
    dims = [2, 5, 7, 6, 5]
    for layout in ("nhwc", "nchw"):
        for g in (
            pool_graph(dims, mode, [3, 3, 3], [2, 2, 2], [1, 0, 1], [0, 1, 1], dtype, layout),
            pool_graph(dims, mode, [3, 3, 3], [2, 1, 2], [1, 1, 1], [1, 1, 1], dtype, layout),
            pool_graph(dims, mode, dims[2:], dtype=dtype, layout=layout),
        ):
            check(g, cuda_handle, "TORCH_ENGINE")


def test_torch_layout_change_and_wider_output_type(cuda_handle: dt.Handle) -> None:
    for mode in M:
        g = pool_graph([2, 6, 7, 7], mode, [3, 3], [2, 2], [1, 1], [1, 1], H, "nchw", "nhwc", F)
        check(g, cuda_handle, "TORCH_ENGINE")


def test_torch_max_pool_propagates_nan(cuda_handle: dt.Handle) -> None:
    g = pool_graph([2, 16, 6, 6], M.MAXPOOL, [3, 3], [1, 1], [1, 1], [1, 1], F)
    check(g, cuda_handle, "TORCH_ENGINE", nan_at=(1, 5, 2, 3))


@pytest.mark.parametrize("name", SUITE)
def test_torch_suite_graphs_make_no_copy(
    cuda_handle: dt.Handle, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pooling kernel writing the caller's buffer, as eager code does: no ``copy_``."""
    copies: list[tuple[int, ...]] = []
    real = torch.Tensor.copy_

    def copy_(self: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
        copies.append(tuple(self.shape))
        return real(self, src, *args, **kwargs)

    g = suite_graph(name)
    engine = get_registry().get("TORCH_ENGINE")
    plan = engine.compile(g, [], cuda_handle)
    pack = make_inputs(g, "cuda", seed=1)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    plan.execute(pack, None)
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert copies == []
