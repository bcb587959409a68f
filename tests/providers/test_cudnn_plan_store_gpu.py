"""The cuDNN plan store on a GPU: a norm plan built (compiled) in one process is loaded by the
next process with the same cache folder, runs the same kernel (bit-identical outputs, and
within tolerance of ``dnntune.reference``), and is not stored or loaded with
``DNNTUNE_DISABLE_CACHE``. Skipped without CUDA or without nvidia-cudnn-frontend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dnntune.errors import NotSupportedError

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]
GRAPH = REPO / "examples" / "graphs" / "llama_rmsnorm.json"

#: one process: build the example rmsnorm's cuDNN plan for engine config ``argv[2]``, run it on
#: seeded inputs, check it against the reference, and print what it did
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import dnntune as dt
    from dnntune.providers.cudnn import CudnnEngine
    from dnntune.reference import compare, make_inputs, run, tolerance_for

    g = dt.Graph.load(sys.argv[1])
    g.validate()
    handle = dt.create_handle("cuda")
    start = time.perf_counter()
    plan = CudnnEngine().compile(g, [dt.KnobSetting("cudnn.engine_config", int(sys.argv[2]))],
                                 handle)
    build_s = time.perf_counter() - start
    torch.manual_seed(0)
    pack = make_inputs(g, "cuda")
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    plan.execute(pack, ws)
    torch.cuda.synchronize()
    expected = run(g, pack)
    outputs = [t for t in g.io_tensors() if t.is_output]
    outs = {t.uid: pack[t.uid] for t in outputs}
    for t in outputs:
        result = compare(outs[t.uid], expected[t.uid], tolerance_for(g, t))
        assert result.ok, result
    if len(sys.argv) > 3 and sys.argv[3] == "capture":
        # the plan recorded in a CUDA graph (on PyTorch's capture stream: another cuDNN handle
        # than the one it was loaded with), replayed on new input values in the same buffers
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            plan.execute(pack, ws)  # warm on the capture's stream
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            plan.execute(pack, ws)
        fresh = make_inputs(g, "cuda", seed=1)
        for t in g.io_tensors():
            if not t.is_output:
                pack[t.uid].copy_(fresh[t.uid])
        graph.replay()
        torch.cuda.synchronize()
        expected = run(g, pack)
        for t in outputs:
            result = compare(outs[t.uid], expected[t.uid], tolerance_for(g, t))
            assert result.ok, result
    bound = {}
    if len(sys.argv) > 3 and sys.argv[3] == "bound":
        # the plan's bound call (a direct cuDNN call where the compiled caller is built): the
        # same outputs as the frontend's execute, bit for bit
        expected_raw = {u: t.clone() for u, t in outs.items()}
        uids = [t.uid for t in g.io_tensors()]
        call = plan.bind(uids)
        for t in outs.values():
            t.fill_(float("nan"))
        call([pack[u] for u in uids], ws)
        torch.cuda.synchronize()
        bound = {"name": call.__name__,
                 "equal": all(torch.equal(outs[u], expected_raw[u]) for u in outs)}
    digest = {str(u): float(t.double().sum()) for u, t in outs.items()}
    raw = {str(u): t.view(torch.uint8).cpu().tolist()[:4096] for u, t in outs.items()}
    print(json.dumps({"loaded": plan.metadata["cudnn_plan_loaded"],
                      "name": plan.metadata["cudnn_plan_name"],
                      "build_s": build_s, "digest": digest, "raw": raw, "bound": bound}))
    """
)


@pytest.fixture(autouse=True)
def _needs_frontend() -> None:
    from dnntune.providers.cudnn import CudnnEngine

    try:
        CudnnEngine().check_available()
    except NotSupportedError as exc:
        pytest.skip(str(exc))


def _run(cache: Path, config: int, *extra: str, **env: str) -> dict[str, Any]:
    environ = dict(
        os.environ,
        DNNTUNE_CACHE_DIR=str(cache),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT, str(GRAPH), str(config), *extra],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_norm_plan_built_in_one_process_is_loaded_by_the_next(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run(cache, 0)
    assert first["loaded"] is False
    stored = list((cache / "cudnn-plans").rglob("*.plan"))
    assert len(stored) == 1, stored
    second = _run(cache, 0)
    assert second["loaded"] is True
    assert second["name"] == first["name"]
    assert second["raw"] == first["raw"] and second["digest"] == first["digest"]
    # the load skips cuDNN's compile (0.3-1 s for a norm plan on the H200)
    assert second["build_s"] < first["build_s"]
    # another engine config of the same graph is another file
    other = _run(cache, 1)
    assert other["loaded"] is False and other["name"] != first["name"]
    assert len(list((cache / "cudnn-plans").rglob("*.plan"))) == 2


def test_a_loaded_plan_runs_inside_a_cuda_graph(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _run(cache, 0)["loaded"] is False
    assert _run(cache, 0, "capture")["loaded"] is True  # checked against the reference inside


def test_a_built_and_a_loaded_plan_run_directly_through_cudnn_s_backend_api(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    built = _run(cache, 0, "bound")
    loaded = _run(cache, 0, "bound")
    assert built["loaded"] is False and loaded["loaded"] is True
    for run in (built, loaded):  # the bound call of both: the direct call, the same bits
        assert run["bound"] == {"name": "direct_call", "equal": True}
    assert loaded["raw"] == built["raw"]


def test_no_plan_is_stored_or_loaded_with_the_caches_off(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _run(cache, 0)["loaded"] is False  # stores one
    off = _run(cache, 0, DNNTUNE_DISABLE_CACHE="1")
    assert off["loaded"] is False
    assert len(list((cache / "cudnn-plans").rglob("*.plan"))) == 1


def test_a_damaged_plan_file_is_built_again_and_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run(cache, 0)
    (path,) = (cache / "cudnn-plans").rglob("*.plan")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte in the compiled plan
    path.write_bytes(bytes(data))
    again = _run(cache, 0)
    assert again["loaded"] is False and again["raw"] == first["raw"]
    assert _run(cache, 0)["loaded"] is True  # the rebuild replaced the file


#: one process: the oracle's setup for the example rmsnorm (a spec per cuDNN engine config,
#: whose workspace estimates build every plan), then each config's compile and run
PARALLEL = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import dnntune as dt
    from dnntune.autotune.plan_specs import PlanSpecCollection
    from dnntune.backend.registry import get_registry
    from dnntune.providers.cudnn import CudnnEngine
    from dnntune.providers.cudnn.problem import get_problem
    from dnntune.reference import compare, make_inputs, run, tolerance_for

    g = dt.Graph.load(sys.argv[1])
    g.validate()
    handle = dt.create_handle("cuda")
    engine = get_registry().find("CUDNN_ENGINE")
    count = len(get_problem(g, 0, "a").candidates)
    start = time.perf_counter()
    specs = PlanSpecCollection(g, handle)
    specs.add_engine_variants(
        [dt.EngineVariant(engine.id, {"cudnn.engine_config": i}) for i in range(count)]
    )
    setup_s = time.perf_counter() - start
    torch.manual_seed(0)
    pack = make_inputs(g, "cuda")
    expected = run(g, pack)
    loaded, bad = 0, []
    for i in range(count):
        try:
            plan = CudnnEngine().compile(g, [dt.KnobSetting("cudnn.engine_config", i)], handle)
        except dt.DnnTuneError:
            continue
        loaded += bool(plan.metadata["cudnn_plan_loaded"])
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        plan.execute(pack, ws)
        torch.cuda.synchronize()
        for t in g.io_tensors():
            if t.is_output and not compare(pack[t.uid], expected[t.uid], tolerance_for(g, t)).ok:
                bad.append(i)
    print(json.dumps({"count": count, "loaded": loaded, "bad": bad, "setup_s": setup_s}))
    """
)


def test_a_norms_plans_are_built_in_worker_processes_and_loaded_here(tmp_path: Path) -> None:
    environ = dict(
        os.environ,
        DNNTUNE_CACHE_DIR=str(tmp_path / "cache"),
        DNNTUNE_CUDNN_BUILD_PROCESSES="4",
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", PARALLEL, str(GRAPH)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bad"] == []
    # the first plan is built in this process to time it; the workers built the others, and
    # the oracle's compiles then loaded them (a refused or unbuildable plan is neither)
    assert result["loaded"] >= result["count"] // 2, result
