"""Regression tests for what the H200 conformance sweep of 2026-12-01 (session 7) found: each
failing case, regenerated from its seed and index (``benchmarks/conformance.py`` seed 0, full
size), on the engine and knobs that failed. See benchmarks/results/h200_2026-12-01_s7/."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch_cases import run_and_compare

import dnntune as dt
from dnntune import reference
from dnntune.errors import NotSupportedError
from dnntune.testing.conformance import generate_case

pytestmark = pytest.mark.gpu


def _case(index: int) -> dt.Graph:
    return generate_case(0, index, "full").graph()


def test_torch_batchnorm_training_fp16_strided_mean(cuda_handle: dt.Handle) -> None:
    """c01034: x[3, 13, 7, 9] fp16 with padded rows; ATen's CUDA kernel gave a MEAN rounded
    to fp16 (2.3e-5 off 0.065); TORCH_ENGINE now reads such an x as float32."""
    run_and_compare(_case(1034), cuda_handle, "TORCH_ENGINE")


def test_torch_compile_broadcast_input(cuda_handle: dt.Handle) -> None:
    """c00831: an input with stride 0 over a dimension of more than one element; the compile's
    trial arguments were filled through the view and the build raised."""
    run_and_compare(_case(831), cuda_handle, "TORCH_COMPILE_ENGINE")


@pytest.mark.parametrize("index", [1298, 1337])
def test_cudnn_declines_non_packed_reductions(index: int, cuda_handle: dt.Handle) -> None:
    """c01298 (x[65536, 1], strides [1, 65536]: cudaErrorInvalidAddressSpace, which poisons the
    process) and c01337 (column-major 8192x4096 amax: wrote past its output)."""
    g = _case(index)
    g.build_operation_graph(cuda_handle)
    g.create_execution_plan_ext("CUDNN_ENGINE", {})
    with pytest.raises(NotSupportedError, match="packed row-major"):
        g.check_support()
        g.build_plans()


def test_cudnn_tf32_dgrad_is_checked_at_tf32_tolerance(cuda_handle: dt.Handle) -> None:
    """c00079: a float32 dgrad of K=14 with cudnn.allow_tf32=1 is 3.4e-4 off (TF32 rounding):
    outside float32's tolerance, inside TF32's; the default plan (TF32 deselected) passes
    float32's."""
    run_and_compare(_case(79), cuda_handle, "CUDNN_ENGINE")
    g = _case(79)
    g.build_operation_graph(cuda_handle)
    g.create_execution_plan_ext("CUDNN_ENGINE", {"cudnn.allow_tf32": 1, "cudnn.engine_config": 2})
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    pack = reference.make_inputs(g, cuda_handle.device, seed=0)
    g.execute(cuda_handle, pack, dt.allocate_workspace(g.get_workspace_size(), cuda_handle.device))
    expected = reference.run(g, pack)
    check = reference.check_outputs(g, pack, expected, tf32=True)
    assert check.ok, [o.comparison.message for o in check.failed]


def _built_configs(index: int, handle: dt.Handle) -> Iterator[tuple[int, dt.Graph]]:
    """Case ``index`` built on every cuDNN engine config that builds (refusals skipped), each
    on a fresh graph: (config, graph)."""
    probe = _case(index)
    probe.build_operation_graph(handle)
    count = dt.get_registry().get("CUDNN_ENGINE").plan_count(probe, handle)  # type: ignore[attr-defined]
    for config in range(count):
        g = _case(index)
        g.build_operation_graph(handle)
        g.create_execution_plan_ext("CUDNN_ENGINE", {"cudnn.engine_config": config})
        try:
            g.check_support()
            g.build_plans(dt.BuildPlanPolicy.ALL)
        except NotSupportedError:
            continue
        yield config, g


def _run(g: dt.Graph, handle: dt.Handle) -> dict[int, Any]:
    """The graph run once on reference inputs (seed 0): the pack after the run."""
    pack = reference.make_inputs(g, handle.device, seed=0)
    g.execute(handle, pack, dt.allocate_workspace(g.get_workspace_size(), handle.device))
    return pack


@pytest.mark.parametrize("index", [83, 174])
def test_no_cudnn_layernorm_training_plan_writes_into_x(index: int, cuda_handle: dt.Handle) -> None:
    """Session 8: c00083 (x[1, 65536] fp32) and c00174 (x[8192, 4096] fp16), layernorm training
    forward: cuDNN engine 4 (engine_config 14 and 26) wrote into x. Every engine config must now
    be refused or leave x alone and match the reference."""
    ran = 0
    for config, g in _built_configs(index, cuda_handle):
        x_uid = next(t.uid for t in g.tensors if t.name == "X")
        assert x_uid is not None
        x_before = reference.make_inputs(g, cuda_handle.device, seed=0)[x_uid]
        pack = _run(g, cuda_handle)
        assert torch.equal(pack[x_uid], x_before), f"engine_config {config} wrote into x"
        check = reference.check_outputs(g, pack, reference.run(g, pack))
        assert check.ok, (config, [o.comparison.message for o in check.failed])
        ran += 1
    assert ran > 0


def test_no_cudnn_wgrad_plan_is_wrong_on_padded_rows(cuda_handle: dt.Handle) -> None:
    """Session 9: c00561, a conv_wgrad fp16 of x and dy [32, 64, 56, 56] whose rows are padded
    to a pitch of 59: cuDNN's engine_config 43 (engine 70; global.benchmarking=1 picked it) gave
    a DW with 33,613 of 36,864 values wrong. Every engine config must now be refused or match
    the reference."""
    from dnntune.providers.cudnn.support import padded_inputs

    assert any(padded_inputs(n) for n in _case(561).nodes)
    ran = 0
    for config, g in _built_configs(561, cuda_handle):
        pack = _run(g, cuda_handle)
        check = reference.check_outputs(g, pack, reference.run(g, pack))
        assert check.ok, (config, [o.comparison.message for o in check.failed])
        ran += 1
    assert ran > 0
