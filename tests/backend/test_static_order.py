"""Static ordering (HeuristicMode.A / FALLBACK) per device and op class."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import dnntune as dt
from dnntune import testing
from dnntune.backend.heuristics import HeuristicMode, static_order


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


ENGINES: list[Any] = [
    _Named(n) for n in ("TORCH_ENGINE", "TORCH_COMPILE_ENGINE", "CUDNN_ENGINE", "TRITON_ENGINE")
]


def _order(graph: dt.Graph, cuda: bool, mode: HeuristicMode = HeuristicMode.A) -> list[str]:
    handle: Any = SimpleNamespace(is_cuda=cuda)
    return [e.name for e in static_order(graph, handle, ENGINES, mode)]


def test_cuda_mode_a_prefers_cudnn_for_conv_and_matmul() -> None:
    conv = testing.small_conv_graph()
    conv.validate()
    matmul = testing.small_matmul_graph()
    matmul.validate()
    assert _order(conv, cuda=True)[0] == "CUDNN_ENGINE"
    assert _order(matmul, cuda=True)[:2] == ["CUDNN_ENGINE", "TORCH_ENGINE"]


def test_cpu_and_fallback_orders() -> None:
    matmul = testing.small_matmul_graph()
    matmul.validate()
    assert _order(matmul, cuda=False)[:2] == ["TORCH_ENGINE", "TORCH_COMPILE_ENGINE"]
    assert _order(matmul, cuda=True, mode=HeuristicMode.FALLBACK)[0] == "TORCH_ENGINE"
    unknown: Any = [_Named("X"), *ENGINES]
    handle: Any = SimpleNamespace(is_cuda=True)
    assert static_order(matmul, handle, unknown, HeuristicMode.A)[-1].name == "X"


def test_cuda_mode_a_prefers_triton_for_norms_and_pooling() -> None:
    norm = dt.Graph(name="ln", io_data_type=dt.DataType.BFLOAT16)
    x = norm.tensor(name="X", dims=[8, 64])
    (y,) = norm.layernorm(
        x, norm.tensor(name="S", dims=[1, 64]), norm.tensor(name="B", dims=[1, 64]), 1e-5
    )
    y.set_output(True)
    norm.validate()
    pool = dt.Graph(name="pool", io_data_type=dt.DataType.HALF)
    p = pool.tensor(name="X", dims=[2, 8, 6, 6], strides=[288, 1, 48, 8])
    pool.resample(p, mode=dt.ResampleMode.MAXPOOL, window=[3, 3], stride=[2, 2]).set_output(True)
    pool.validate()
    assert _order(norm, cuda=True)[:2] == ["TRITON_ENGINE", "CUDNN_ENGINE"]
    assert _order(pool, cuda=True)[:2] == ["TRITON_ENGINE", "TORCH_ENGINE"]
    assert _order(pool, cuda=False)[0] == "TORCH_ENGINE"


def _attention(keys: int, batch: int = 256) -> dt.Graph:
    g = dt.Graph(name="attn", io_data_type=dt.DataType.BFLOAT16)
    dims = [batch, 3, keys, 32]
    q, k, v = (g.tensor(name=n, dims=dims) for n in "qkv")
    (o,) = g.sdpa(q, k, v, attn_mask=g.tensor(name="m", dims=[batch, 3, keys, keys]))
    o.set_output(True)
    g.validate()
    return g


def test_cuda_mode_a_runs_a_short_window_on_triton_and_longer_attention_on_cudnn() -> None:
    # Swin's windows (49 keys, 768+ of them): Triton's small tiles were 2-4x cuDNN's plans
    # (session 48, H100)
    assert _order(_attention(49), cuda=True)[:2] == ["TRITON_ENGINE", "CUDNN_ENGINE"]
    assert _order(_attention(64), cuda=True)[0] == "TRITON_ENGINE"
    assert _order(_attention(65), cuda=True)[0] == "CUDNN_ENGINE"
    assert _order(_attention(49), cuda=False)[0] == "TORCH_ENGINE"
    assert _order(_attention(49), cuda=True, mode=HeuristicMode.FALLBACK)[0] == "TORCH_ENGINE"
    # a few sequences (the examples' BERT and LLaMA attention, batch 1): not measured, cuDNN
    assert _order(_attention(49, batch=170), cuda=True)[0] == "CUDNN_ENGINE"
    assert _order(_attention(49, batch=171), cuda=True)[0] == "TRITON_ENGINE"  # 513 problems


def test_the_learned_rankings_order_of_a_problem_is_its_graphs() -> None:
    """``train`` compares with, and ``heuristics predict`` ranks, A's order for a problem
    (``problem_preference``): the same as ``static_order`` gives the problem's graph, the
    short-attention rule included."""
    from dnntune.backend.heuristics import problem_preference
    from dnntune.backend.learned.problem import problem_of

    for graph in (_attention(49), _attention(49, batch=170), _attention(65)):
        names = _order(graph, cuda=True)
        assert list(problem_preference(problem_of(graph), True, HeuristicMode.A)) == names
    window = problem_of(_attention(49))
    assert problem_preference(window, False, HeuristicMode.A)[0] == "TORCH_ENGINE"
