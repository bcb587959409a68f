"""TORCH_ENGINE pooling: every form against the reference with explicit tolerances, and the
lowering that writes the caller's buffer directly (``out=``) instead of computing a result and
copying it over: what made pooling plans slower than eager code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
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
from dnntune import reference
from dnntune.providers._torch import pooling
from dnntune.providers._torch.lowering import lower
from dnntune.providers._torch.program import LoweringOptions

ENGINE = "TORCH_ENGINE"


class CopySpy:
    """Records the shape of every ``Tensor.copy_`` made while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.copies: list[tuple[int, ...]] = []


def run_and_check(
    graph: dt.Graph, handle: dt.Handle, seed: int = 0, spy: CopySpy | None = None
) -> dict[int, torch.Tensor]:
    """Build TORCH_ENGINE's plan, execute it, compare with the reference (explicit tolerance);
    with ``spy``, record the copies ``execute`` makes."""
    graph.build_operation_graph(handle)
    graph.create_execution_plan_ext(ENGINE, {})
    graph.check_support()
    graph.build_plans()
    pack = reference.make_inputs(graph, handle.device, seed=seed)
    if spy is not None:
        spy.recording = True
    graph.execute(handle, pack)
    if spy is not None:
        spy.recording = False
    expected = reference.run(graph, pack)
    (y,) = graph.output_tensors()
    assert y.uid is not None
    result = reference.compare(pack[y.uid], expected[y.uid], pool_tolerance(graph))
    assert result.ok, f"{graph.name}: {result.message}"
    return pack


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[CopySpy]:
    """Spy on ``Tensor.copy_`` (a result copied into the caller's buffer is one extra pass over
    the output, which eager code does not make)."""
    spy = CopySpy()
    real = torch.Tensor.copy_

    def copy_(self: torch.Tensor, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if spy.recording:
            spy.copies.append(tuple(self.shape))
        return real(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    yield spy


@pytest.fixture
def cuda_max_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the CUDA max-pool path (``max_pool*d_with_indices(out=...)``) on the CPU."""
    monkeypatch.setattr(pooling, "max_pool_writes_indices", lambda device: True)


def _step_name(graph: dt.Graph, device: str = "cpu") -> str:
    (step,) = lower(graph, torch.device(device), LoweringOptions()).steps
    return step.__name__


# ---- against the reference ------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", [F, H], ids=lambda d: d.json_name)
@pytest.mark.parametrize("index", range(len(ODD)), ids=odd_id)
def test_odd_shapes_match_reference(
    index: int, dtype: dt.DataType, layout: str, cpu_handle: dt.Handle
) -> None:
    run_and_check(odd_graph(index, dtype, layout), cpu_handle)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("index", range(len(ODD)), ids=odd_id)
def test_cuda_max_pool_path_matches_reference_on_cpu(
    index: int, layout: str, cpu_handle: dt.Handle, cuda_max_pool: None
) -> None:
    run_and_check(odd_graph(index, H, layout), cpu_handle)


@pytest.mark.parametrize("dtype", [F, H, BF], ids=lambda d: d.json_name)
@pytest.mark.parametrize("mode", list(M), ids=lambda m: m.json_name)
@pytest.mark.parametrize("padding", ["sym", "asym", "global"])
def test_3d_pooling(mode: dt.ResampleMode, dtype: dt.DataType, padding: str) -> None:
    handle = dt.create_handle("cpu")
    if padding == "global":
        g = pool_graph([2, 3, 4, 5, 3], mode, [4, 5, 3], dtype=dtype)
    elif padding == "sym":
        g = pool_graph([2, 3, 7, 6, 5], mode, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], dtype)
    else:
        g = pool_graph([2, 3, 7, 6, 5], mode, [3, 3, 3], [2, 2, 2], [1, 0, 1], [0, 1, 1], dtype)
    run_and_check(g, handle)


def test_layout_change_and_wider_output_type(cpu_handle: dt.Handle, cuda_max_pool: None) -> None:
    for mode in M:
        g = pool_graph([2, 6, 7, 7], mode, [3, 3], [2, 2], [1, 1], [1, 1], H, "nchw", "nhwc", F)
        run_and_check(g, cpu_handle)


def test_max_pool_propagates_nan(cpu_handle: dt.Handle, cuda_max_pool: None) -> None:
    g = pool_graph([1, 4, 6, 6], M.MAXPOOL, [3, 3], [1, 1], [1, 1], [1, 1], F)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plan_ext(ENGINE, {})
    g.build_plans()
    pack = reference.make_inputs(g, "cpu", seed=1)
    (x,) = [t for t in g.tensors if not t.is_virtual and not t.is_output]
    (y,) = g.output_tensors()
    assert x.uid is not None and y.uid is not None
    pack[x.uid][0, 2, 3, 3] = float("nan")
    g.execute(cpu_handle, pack)
    assert int(pack[y.uid].isnan().sum()) == 9  # every window that holds the NaN


# ---- the caller's buffer is written directly ------------------------------------------------
SYM, ASYM = ([1, 1], [1, 1]), ([1, 0], [0, 1])
AVG_IN, AVG_EX = M.AVGPOOL_INCLUDE_PADDING, M.AVGPOOL_EXCLUDE_PADDING
#: id -> (graph, the step its lowering picks)
DIRECT: dict[str, tuple[Any, str]] = {
    "global-avg": (lambda: pool_graph([2, 8, 7, 7], AVG_IN, [7, 7], dtype=F), "global_pool_out"),
    "global-max": (lambda: pool_graph([2, 8, 7, 7], M.MAXPOOL, [7, 7]), "global_pool_out"),
    "global-3d": (lambda: pool_graph([2, 8, 4, 5, 3], AVG_EX, [4, 5, 3]), "global_pool_out"),
    "avg": (lambda: pool_graph([2, 8, 7, 7], AVG_IN, [3, 3], [1, 1], *SYM), "avgpool_out"),
    "avg-asym-include": (
        lambda: pool_graph([2, 8, 7, 7], AVG_IN, [3, 3], [2, 2], *ASYM),
        "avgpool_out",
    ),
    "avg-asym-exclude": (
        lambda: pool_graph([2, 8, 7, 7], AVG_EX, [3, 3], [2, 2], *ASYM),
        "avgpool_rescaled_out",
    ),
}


@pytest.mark.parametrize("case", sorted(DIRECT))
def test_pooling_writes_the_output_buffer_without_a_copy(
    case: str, cpu_handle: dt.Handle, copies: CopySpy
) -> None:
    build, step = DIRECT[case]
    g = build()
    assert _step_name(g) == step
    run_and_check(g, cpu_handle, spy=copies)
    assert copies.copies == []


@pytest.mark.parametrize("asymmetric", [False, True])
def test_cuda_max_pool_writes_the_output_buffer_without_a_copy(
    asymmetric: bool, cpu_handle: dt.Handle, cuda_max_pool: None, copies: CopySpy
) -> None:
    pre, post = ([1, 0], [0, 1]) if asymmetric else ([1, 1], [1, 1])
    g = pool_graph([2, 64, 12, 12], M.MAXPOOL, [3, 3], [2, 2], pre, post, H)
    assert _step_name(g) == "maxpool_out"
    run_and_check(g, cpu_handle, spy=copies)
    assert copies.copies == []


def test_which_device_takes_the_indices_path() -> None:
    assert pooling.max_pool_writes_indices(torch.device("cuda"))
    assert pooling.max_pool_writes_indices(torch.device("meta"))
    # the CPU has an index-free max pool: computing indices there would cost more than a copy
    assert not pooling.max_pool_writes_indices(torch.device("cpu"))
    g = pool_graph([2, 8, 7, 7], M.MAXPOOL, [3, 3], [2, 2], [1, 1], [1, 1])
    assert _step_name(g, "cpu") == "maxpool"
    assert _step_name(g, "meta") == "maxpool_out"


def test_copies_where_the_op_lays_out_its_result_otherwise(
    cpu_handle: dt.Handle, copies: CopySpy
) -> None:
    # the CPU's avg_pool3d gives a contiguous result for channels-last data (and would write a
    # channels-last out= buffer as if it were contiguous): pooled, then copied
    dims, window, stride = [2, 3, 7, 6, 5], [3, 3, 3], [2, 2, 2]
    g = pool_graph(dims, M.AVGPOOL_INCLUDE_PADDING, window, stride, dtype=F)
    assert _step_name(g) == "avgpool"
    run_and_check(g, cpu_handle, spy=copies)
    assert copies.copies == [(2, 3, 3, 2, 2)]
    nchw = pool_graph(dims, M.AVGPOOL_INCLUDE_PADDING, window, stride, dtype=F, layout="nchw")
    assert _step_name(nchw) == "avgpool_out"


def test_what_still_copies() -> None:
    # the CPU has no fp16 3-D average pool: it pools in float32 and casts into the buffer
    g3 = pool_graph([1, 2, 4, 4, 4], M.AVGPOOL_INCLUDE_PADDING, [2, 2, 2], dtype=H, layout="nchw")
    assert _step_name(g3, "cpu") == "avgpool"
    assert _step_name(g3, "meta") == "avgpool_out"
    # an fp16 pool into a float32 output pools in float32 (cuDNN's compute type: pooled in
    # fp16 and widened it was 2e-4 off) and so writes the float32 buffer directly
    wide = pool_graph([2, 8, 7, 7], M.AVGPOOL_INCLUDE_PADDING, [3, 3], dtype=H, y_dtype=F)
    assert _step_name(wide) == "avgpool_out"
    # an output type narrower than the op's result type goes through a cast
    narrow = pool_graph([2, 8, 7, 7], M.AVGPOOL_INCLUDE_PADDING, [3, 3], dtype=F, y_dtype=H)
    assert _step_name(narrow) == "avgpool"


@pytest.mark.parametrize(
    ("name", "step"),
    list(zip(SUITE, ("avgpool_out", "global_pool_out", "maxpool_out"), strict=True)),
)
def test_suite_graphs_write_their_output_directly_on_cuda(name: str, step: str) -> None:
    # lowered for the meta device, which takes the CUDA paths and lays results out as CUDA does
    assert _step_name(suite_graph(name), "meta") == step
