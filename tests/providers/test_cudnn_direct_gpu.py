"""cuDNN plans executed through cuDNN's backend API by the compiled caller (issue 22): the same
outputs as the frontend's execute, bit for bit (attention's values passed by value included), on
new buffers, on another stream and inside a CUDA graph (a plan loaded from the plan store: in
test_cudnn_plan_store_gpu.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from cudnn_graphs import built_cudnn_plan, conv_bias_relu, layernorm

import dnntune as dt
from dnntune import reference
from dnntune.backend.engine import Plan
from dnntune.backend.plans import allocate_workspace
from dnntune.providers.cudnn import direct

pytestmark = pytest.mark.gpu


def _conv_bias_relu() -> dt.Graph:
    return conv_bias_relu("direct_conv", 4, 32, 16)


def _layernorm() -> dt.Graph:
    return layernorm("direct_ln", 128, 768)


def _matmul_gelu() -> dt.Graph:
    g = dt.Graph("direct_mm", dt.DataType.HALF, dt.DataType.FLOAT, dt.DataType.FLOAT)
    a = g.tensor("A", [256, 512])
    b = g.tensor("B", [512, 384])
    c = g.matmul(a, b)
    g.pointwise(c, mode=dt.PointwiseMode.GELU_FWD).set_output(True).set_name("C")
    return g


def _sdpa(causal: bool) -> Callable[[], dt.Graph]:
    """Attention: the frontend passes the scale (and, causal, the mask's -inf) by value."""

    def build() -> dt.Graph:
        g = dt.Graph("direct_sdpa", dt.DataType.BFLOAT16, dt.DataType.FLOAT, dt.DataType.FLOAT)
        q = g.tensor("Q", [2, 4, 128, 64])
        k = g.tensor("K", [2, 4, 128, 64])
        v = g.tensor("V", [2, 4, 128, 64])
        (o,) = g.sdpa(q, k, v, causal_mask=causal, attn_scale=0.1)
        o.set_output(True).set_name("O")
        return g

    return build


CASES: dict[str, Callable[[], dt.Graph]] = {
    "conv_bias_relu": _conv_bias_relu,
    "layernorm": _layernorm,
    "matmul_gelu": _matmul_gelu,
    "sdpa": _sdpa(False),
    "sdpa_causal": _sdpa(True),
}


def _cudnn_plan(handle: dt.Handle, case: str) -> tuple[dt.Graph, Plan]:
    g = CASES[case]()
    return g, built_cudnn_plan(handle, g)


def _bound(plan: Plan, uids: list[int]) -> Callable[..., None]:
    call = plan.bind(uids)
    if call.__name__ != "direct_call":
        pytest.skip("no direct cuDNN call here (no compiler, or the plan needs the frontend)")
    return call


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_direct_call_matches_the_frontend_bit_for_bit_on_new_buffers(
    cuda_handle: dt.Handle, case: str
) -> None:
    g, plan = _cudnn_plan(cuda_handle, case)
    uids = [t.uid for t in g.io_tensors()]
    call = _bound(plan, uids)
    (out,) = [t.uid for t in g.output_tensors()]
    ws = allocate_workspace(plan.workspace_size, cuda_handle.device)
    for seed in (1, 2, 3):  # new buffers each time: a variant pack per address set
        pack = reference.make_inputs(g, "cuda", seed=seed)
        pack[out].fill_(float("nan"))
        plan.execute(pack, ws)  # the frontend's execute
        torch.cuda.synchronize()
        expected = pack[out].clone()
        pack[out].fill_(float("nan"))
        call([pack[u] for u in uids], ws)
        torch.cuda.synchronize()
        assert torch.equal(pack[out], expected)
        first_input = next(t.uid for t in g.input_tensors())
        pack[first_input].mul_(-0.5)  # updated in place: same addresses, new values
        plan.execute(pack, ws)
        torch.cuda.synchronize()
        expected = pack[out].clone()
        call([pack[u] for u in uids], ws)
        torch.cuda.synchronize()
        assert torch.equal(pack[out], expected)


def test_the_direct_call_runs_on_the_caller_s_stream_and_inside_a_cuda_graph(
    cuda_handle: dt.Handle,
) -> None:
    g, plan = _cudnn_plan(cuda_handle, "layernorm")
    uids = [t.uid for t in g.io_tensors()]
    call = _bound(plan, uids)
    (out,) = [t.uid for t in g.output_tensors()]
    ws = allocate_workspace(plan.workspace_size, cuda_handle.device)
    pack = reference.make_inputs(g, "cuda", seed=5)
    tol = reference.default_tolerance(dt.DataType.HALF, g.nodes[0].kind)

    def expect() -> None:
        expected = reference.run(g, {u: t for u, t in pack.items() if u != out})[out]
        result = reference.compare(pack[out], expected, tol)
        assert result.ok, result.message

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call([pack[u] for u in uids], ws)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    expect()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call([pack[u] for u in uids], ws)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        call([pack[u] for u in uids], ws)
    for seed in (6, 7):
        fresh = reference.make_inputs(g, "cuda", seed=seed)
        for u, t in fresh.items():
            if u != out:
                pack[u].copy_(t)
        pack[out].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expect()


def test_variant_packs_are_kept_per_address_set_and_bounded(cuda_handle: dt.Handle) -> None:
    g, plan = _cudnn_plan(cuda_handle, "matmul_gelu")
    uids = [t.uid for t in g.io_tensors()]
    plan.bind(uids)  # the plan's direct call, made once per bind
    made = plan._direct_call(tuple(uids))
    if made is None:
        pytest.skip("no direct cuDNN call here")
    pack = reference.make_inputs(g, "cuda", seed=1)
    ws = allocate_workspace(plan.workspace_size, cuda_handle.device)
    handle = plan._handle(torch.cuda.current_stream().cuda_stream)
    wsp = 0 if ws is None else ws.data_ptr()
    tensors = [pack[u] for u in uids]
    for _ in range(3):
        made(tensors, wsp, handle)
    assert direct.pack_count(made) == 1
    made(tuple(t.data_ptr() for t in tensors), wsp, handle)  # the same addresses as ints
    assert direct.pack_count(made) == 1
    kept = []  # alive, so every set is at new addresses (freed blocks would come back)
    for seed in range(direct.PACK_LIMIT + 5):
        fresh = reference.make_inputs(g, "cuda", seed=100 + seed)
        kept.append(fresh)
        made([fresh[u] for u in uids], wsp, handle)
    torch.cuda.synchronize()
    assert direct.pack_count(made) == direct.PACK_LIMIT


def test_without_the_native_helpers_the_frontend_executes(
    cuda_handle: dt.Handle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    g, plan = _cudnn_plan(cuda_handle, "layernorm")
    uids = [t.uid for t in g.io_tensors()]
    call = plan.bind(uids)
    assert call.__name__ == "call"
    pack = reference.make_inputs(g, "cuda", seed=1)
    ws = allocate_workspace(plan.workspace_size, cuda_handle.device)
    call([pack[u] for u in uids], ws)
    torch.cuda.synchronize()
