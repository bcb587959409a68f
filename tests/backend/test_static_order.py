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


def test_cuda_mode_a_prefers_cudnn_for_conv_matmul_and_norms() -> None:
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
