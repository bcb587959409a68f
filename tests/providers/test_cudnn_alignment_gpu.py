"""cuDNN plans on tensors 2, 4 or 8 bytes into their buffers (providers/cudnn/alignment.py).

Before the fix, on an H100 with cuDNN 9.19 (session 59's probe): ``dnntune.torch.conv2d`` on a
view one half-precision element into its buffer raised
``CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER``, and ``dnntune.torch.linear`` returned wrong
numbers (max error 6.8) with no error. Each case here runs a cuDNN plan on misaligned views,
through every call path (the frontend's execute, the bound call with and without the direct
caller, ``Graph.execute``, a CUDA-graph capture), against the reference (``dnntune.torch``'s
layers: tests/torch/test_misaligned_views.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from cudnn_graphs import built_cudnn_plan, conv_bias_relu, layernorm

import dnntune as dt
from dnntune import reference
from dnntune.backend.plans import allocate_workspace

pytestmark = pytest.mark.gpu


def _matmul_bias() -> dt.Graph:
    g = dt.Graph("align_mm", dt.DataType.HALF, dt.DataType.FLOAT, dt.DataType.FLOAT)
    a = g.tensor("A", [1, 256, 512])
    b = g.tensor("B", [1, 512, 384])
    bias = g.tensor("bias", [1, 1, 384])
    c = g.matmul(a, b)
    g.pointwise(c, bias, mode=dt.PointwiseMode.ADD).set_output(True).set_name("C")
    return g


CASES: dict[str, Callable[[], dt.Graph]] = {
    "conv_bias_relu": lambda: conv_bias_relu("align_conv", 4, 32, 16),
    "layernorm": lambda: layernorm("align_ln", 128, 768),
    "matmul_bias": _matmul_bias,
}


def _offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """``t``'s values, in a new buffer, ``elements`` elements further into it than ``t`` is
    into its own (same dims and strides)."""
    size = t.untyped_storage().nbytes() // t.element_size()
    buffer = torch.full((size + elements,), float("nan"), dtype=t.dtype, device=t.device)
    view = buffer.as_strided(t.shape, t.stride(), t.storage_offset() + elements)
    view.copy_(t)
    return view


def _check(g: dt.Graph, pack: dict[int, torch.Tensor], out: int) -> None:
    inputs = {u: t for u, t in pack.items() if u != out}
    expected = reference.run(g, inputs)[out]
    tol = reference.default_tolerance(dt.DataType.HALF, g.nodes[0].kind)
    result = reference.compare(pack[out], expected, tol)
    assert result.ok, result.message


@pytest.mark.parametrize("elements", [1, 2, 4])
@pytest.mark.parametrize("which", ["inputs", "output", "all"])
@pytest.mark.parametrize("path", ["execute", "bind", "frontend_bind", "graph_execute"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cudnn_plan_on_misaligned_tensors_matches_the_reference(
    cuda_handle: dt.Handle,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    path: str,
    which: str,
    elements: int,
) -> None:
    if path == "frontend_bind":
        monkeypatch.setenv("DNNTUNE_DISABLE_CUDNN_DIRECT", "1")
    g = CASES[case]()
    plan = built_cudnn_plan(cuda_handle, g)
    (out,) = [t.uid for t in g.output_tensors()]
    pack = reference.make_inputs(g, "cuda", seed=3)
    for uid in list(pack):
        if (which == "output") == (uid == out) or which == "all":
            pack[uid] = _offset(pack[uid], elements)
    pack[out].fill_(float("nan"))
    ws = allocate_workspace(plan.workspace_size, cuda_handle.device)
    uids = [t.uid for t in g.io_tensors()]
    if path == "execute":
        plan.execute(pack, ws)
    elif path == "graph_execute":
        g.execute(cuda_handle, pack, ws)
    else:
        plan.bind(uids)([pack[u] for u in uids], ws)
    torch.cuda.synchronize()
    _check(g, pack, out)


def test_a_misaligned_call_is_recorded_by_a_cuda_graph_with_its_copies(
    cuda_handle: dt.Handle,
) -> None:
    g = _matmul_bias()
    plan = built_cudnn_plan(cuda_handle, g)
    (out,) = [t.uid for t in g.output_tensors()]
    pack = {u: _offset(t, 1) for u, t in reference.make_inputs(g, "cuda", seed=4).items()}
    uids = [t.uid for t in g.io_tensors()]
    ws = allocate_workspace(plan.workspace_size, cuda_handle.device)
    call = plan.bind(uids)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call([pack[u] for u in uids], ws)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call([pack[u] for u in uids], ws)
    for seed in (5, 6):
        for u, t in reference.make_inputs(g, "cuda", seed=seed).items():
            if u != out:
                pack[u].copy_(t)
        pack[out].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(g, pack, out)
