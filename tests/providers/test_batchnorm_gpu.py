"""Batch-norm inference on a GPU: TRITON_ENGINE's NHWC batch-norm kernel against
``dnntune.reference`` with explicit tolerances, on the two batch-norm graphs of the benchmark
suite (and their bf16/fp32 twins), every config of their search lists, small odd shapes, fused
epilogues and CUDA-graph replay. Skipped without CUDA or triton."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from batchnorm_cases import BF, ODD, SUITE, F, H, bn_graph, bn_tolerance, odd_id, suite_graph

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.reference import compare, make_inputs, run

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture
def triton_available() -> None:
    pytest.importorskip("triton")


def _plan(graph: dt.Graph, handle: dt.Handle, settings: Sequence[KnobSetting] = ()) -> Any:
    engine = get_registry().get("TRITON_ENGINE")
    assert get_registry().why_not(engine, graph, handle) is None
    plan = engine.compile(graph, list(settings), handle)
    assert plan.metadata["kernel"] == "batchnorm"
    return plan


def _compare(graph: dt.Graph, pack: dict[int, Any], what: str) -> None:
    expected = run(graph, pack)
    for t in graph.output_tensors():
        assert t.uid is not None
        result = compare(pack[t.uid], expected[t.uid], bn_tolerance(t))
        assert result.ok, f"{what} {graph.name} {t.name}: {result.message}"


def check(graph: dt.Graph, handle: dt.Handle, settings: Sequence[KnobSetting] = ()) -> Any:
    """Build TRITON_ENGINE's plan, run it on reference inputs (outputs pre-filled with garbage:
    every element must be written) and compare each output; returns the plan."""
    plan = _plan(graph, handle, settings)
    pack = make_inputs(graph, handle.device, seed=3)
    for t in graph.output_tensors():
        assert t.uid is not None
        pack[t.uid].fill_(12345.0)
    plan.execute(pack, None)
    torch.cuda.synchronize()
    _compare(graph, pack, str(plan.metadata.get("config")))
    return plan


@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("name", SUITE)
def test_suite_graphs(
    cuda_handle: dt.Handle, triton_available: None, name: str, dtype: dt.DataType
) -> None:
    plan = check(suite_graph(name, dtype), cuda_handle)
    assert plan.metadata["config_source"] == "default"


@pytest.mark.parametrize("name", SUITE)
def test_suite_graphs_every_candidate(
    cuda_handle: dt.Handle, triton_available: None, name: str
) -> None:
    """Each config of the search list computes the right answer (not only the fastest)."""
    from dnntune.providers.triton.patterns import match_graph
    from dnntune.providers.triton.solvers import device_limits, solver_for

    g = suite_graph(name)
    match = match_graph(g)
    candidates = solver_for(match).candidates(match, device_limits(), {})
    assert 2 <= len(candidates) <= 12
    for config in candidates:
        pins = [KnobSetting(f"triton.{k}", v) for k, v in config.items()]
        plan = check(g, cuda_handle, pins)
        assert plan.metadata["config"] == config


@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
@pytest.mark.parametrize("dims", ODD, ids=odd_id)
def test_odd_shapes(
    cuda_handle: dt.Handle, triton_available: None, dims: list[int], dtype: dt.DataType
) -> None:
    check(bn_graph(dims, dtype), cuda_handle)


@pytest.mark.parametrize("dims", [[2, 37, 4, 3], [2, 300, 3, 3]], ids=odd_id)
def test_odd_shapes_every_candidate(
    cuda_handle: dt.Handle, triton_available: None, dims: list[int]
) -> None:
    from dnntune.providers.triton.patterns import match_graph
    from dnntune.providers.triton.solvers import device_limits, solver_for

    g = bn_graph(dims, H)
    match = match_graph(g)
    for config in solver_for(match).candidates(match, device_limits(), {}):
        check(g, cuda_handle, [KnobSetting(f"triton.{k}", v) for k, v in config.items()])


@pytest.mark.parametrize(
    ("epilogue", "keep_y"),
    [
        (("relu",), False),
        (("res", "relu"), False),
        (("chan", "scale"), False),
        (("pix", "one"), False),
        (("relu",), True),
    ],
    ids=["relu", "res-relu", "chan-scale", "pix-one", "y-and-relu"],
)
@pytest.mark.parametrize("dtype", [H, BF, F], ids=lambda d: d.json_name)
def test_fused_epilogues(
    cuda_handle: dt.Handle,
    triton_available: None,
    epilogue: tuple[str, ...],
    keep_y: bool,
    dtype: dt.DataType,
) -> None:
    check(bn_graph([2, 24, 5, 7], dtype, epilogue, keep_y=keep_y), cuda_handle)
    check(bn_graph([4, 64, 6, 6], dtype, epilogue, keep_y=keep_y), cuda_handle)


def test_mixed_types(cuda_handle: dt.Handle, triton_available: None) -> None:
    check(bn_graph([2, 16, 4, 4], H, y_dtype=F), cuda_handle)
    check(bn_graph([2, 40, 3, 5], BF, stat_dtype=BF), cuda_handle)


@pytest.mark.parametrize("name", SUITE)
def test_search_picks_a_verified_config(
    cuda_handle: dt.Handle, triton_available: None, name: str
) -> None:
    plan = check(suite_graph(name), cuda_handle, [KnobSetting("triton.tuning_policy", 4)])
    assert plan.metadata["config_source"] == "search"
    assert plan.metadata["timed_candidates"] >= 2


@pytest.mark.parametrize("name", SUITE)
def test_cuda_graph_replay(cuda_handle: dt.Handle, triton_available: None, name: str) -> None:
    """The plan's launch can be captured in a CUDA graph and replayed on new input values."""
    g = suite_graph(name)
    plan = _plan(g, cuda_handle)
    pack = make_inputs(g, "cuda", seed=5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        plan.execute(pack, None)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.execute(pack, None)
    fresh = make_inputs(g, "cuda", seed=6)
    for t in g.tensors:
        assert t.uid is not None
        if t.is_output:
            pack[t.uid].fill_(12345.0)
        else:
            pack[t.uid].copy_(fresh[t.uid])
    graph.replay()
    torch.cuda.synchronize()
    _compare(g, pack, "replay")


def test_declines_nchw_on_the_gpu(cuda_handle: dt.Handle, triton_available: None) -> None:
    engine = get_registry().get("TRITON_ENGINE")
    reason = get_registry().why_not(engine, bn_graph([2, 8, 6, 6], layout="nchw"), cuda_handle)
    assert reason is not None and "channels-last" in reason
