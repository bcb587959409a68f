"""Issue 21 item 3 on a GPU: the RFC sequence (estimate, allocate, EXHAUSTIVE autotune) never
loses CUDNN_ENGINE because its search picked a plan needing more workspace than allocated.

The graph is the H200 case: a ResNet-50 1x1 conv + bias + ReLU, NHWC fp16, 256->64 channels,
56x56, batch 32, where cuDNN's search found a plan needing 272 bytes, the estimate was 0, and
the candidate failed with "Workspace size 272 exceeds limit 0"; TORCH_COMPILE_ENGINE then won
at 0.29x the heuristic plan's speed.
"""

from __future__ import annotations

import pytest

import dnntune as dt
from dnntune.autotune.verdicts import CONFIRMED, KEPT_DEFAULT, WINNER_IS_DEFAULT
from dnntune.backend.knobs import WORKSPACE_SIZE_LIMIT
from dnntune.backend.plans import allocate_workspace
from dnntune.errors import NotSupportedError
from dnntune.reference import make_inputs
from dnntune.workflows.tuning import confirm_plans, heuristic_plan

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

H, F = dt.DataType.HALF, dt.DataType.FLOAT


@pytest.fixture(autouse=True)
def _needs_cudnn() -> None:
    from dnntune.providers.cudnn import CudnnEngine

    try:
        CudnnEngine().check_available()
    except NotSupportedError as exc:
        pytest.skip(str(exc))


def _nhwc(dims: list[int]) -> list[int]:
    _, c, h, w = dims
    return [c * h * w, 1, w * c, c]


def resnet_1x1(n: int = 32, c: int = 256, k: int = 64, hw: int = 56) -> dt.Graph:
    g = dt.Graph(
        name="resnet50_1x1_256_64_nhwc_fp16",
        io_data_type=H,
        compute_data_type=F,
        intermediate_data_type=F,
    )
    x = g.tensor(name="X", dims=[n, c, hw, hw], strides=_nhwc([n, c, hw, hw]))
    w = g.tensor(name="W", dims=[k, c, 1, 1], strides=_nhwc([k, c, 1, 1]))
    b = g.tensor(name="B", dims=[1, k, 1, 1], strides=_nhwc([1, k, 1, 1]))
    y = g.conv_fprop(x, w, padding=[0, 0], stride=[1, 1], dilation=[1, 1])
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    g.validate()
    return g


def test_rfc_sequence_under_exhaustive_keeps_cudnn(cuda_handle: dt.Handle) -> None:
    g = resnet_1x1()
    g.build_operation_graph(cuda_handle)
    g.add_all_engines()
    ws = g.get_estimated_max_workspace_size()
    workspace = allocate_workspace(ws, cuda_handle.device)
    pack = make_inputs(g, cuda_handle.device, seed=0)
    config = dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE)
    results = g.autotune(cuda_handle, pack, workspace, ws, config)

    cudnn = [r for r in results if r.engine_name == "CUDNN_ENGINE"]
    assert cudnn, [r.engine_name for r in results]
    for r in cudnn:
        assert "exceeds limit" not in r.error_message, r.error_message
        assert r.succeeded, r.error_message
        assert r.workspace_size <= ws
        if r.ran_exhaustive:
            assert r.knobs.get(WORKSPACE_SIZE_LIMIT) == ws  # searched within the caller's bytes
        else:  # the primed build, searched within the caller's bytes, did not beat the
            # untuned default (74150c3): the default's result names it
            reason = r.exhaustive_not_run_reason
            assert f"kept: the primed build CUDNN_ENGINE[{WORKSPACE_SIZE_LIMIT}={ws}]" in reason, (
                reason
            )

    # never worse than the default: the session's verdict, then an independent re-timing
    w = results[0]
    assert w.confirmation in (CONFIRMED, WINNER_IS_DEFAULT, *KEPT_DEFAULT), w.confirmation
    heuristic = heuristic_plan(g, cuda_handle, dt.HeuristicMode.A)
    if heuristic.name != g.get_plan_name():
        check = confirm_plans(g, heuristic, cuda_handle, pack, dt.AutotuneConfig())
        assert check.speedup is not None and check.speedup >= 0.95, check.describe()


def test_exhaustive_winner_rebuilds_from_the_override_file(
    cuda_handle: dt.Handle, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capped search record is found again when a later process builds the stored plan."""
    path = f"{tmp_path}/overrides.json"
    g = resnet_1x1()
    g.build_operation_graph(cuda_handle)
    g.add_engines(["CUDNN_ENGINE"])
    ws = g.get_estimated_max_workspace_size()
    workspace = allocate_workspace(ws, cuda_handle.device)
    pack = make_inputs(g, cuda_handle.device, seed=0)
    g.autotune(
        cuda_handle,
        pack,
        workspace,
        ws,
        dt.AutotuneConfig(mode=dt.TuneMode.EXHAUSTIVE),
        dt.AutotuneStorageConfig(file_path=path),
    )
    tuned_plan = g.get_plan_name()

    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", path)
    again = dt.Graph.from_json(g.to_dict())
    again.build_operation_graph(cuda_handle)
    again.create_execution_plans([dt.HeuristicMode.A])
    again.check_support()
    again.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    assert again.get_plan_name() == tuned_plan
    assert again.get_workspace_size() <= ws
    again.execute(
        cuda_handle, pack, allocate_workspace(again.get_workspace_size(), cuda_handle.device)
    )
