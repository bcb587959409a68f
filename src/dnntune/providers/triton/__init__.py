"""TRITON_ENGINE: hand-written Triton kernels with a solver search and a perf db.

Modules, in the order a build uses them: ``patterns`` (which kernel runs the graph, and why
none does; ``expression`` holds the fused pointwise IR it builds), ``solvers`` (each kernel's
config space, constraints and default config; ``row_configs`` sizes the memory-bound row
kernels by bytes), ``policy`` (the ``triton.tuning_policy`` decision table), ``search``
(timing the candidates), ``perf_db`` (the search winners on disk), ``kernels/`` (one module
per kernel: matmul with fused epilogue, norm, reduction, pointwise, NHWC pooling, NHWC
batch-norm inference, matched in ``batchnorm_match`` and sized by ``batchnorm_configs``, and
attention over short windows, matched in ``attention_match`` and sized by
``solvers_attention``; ``codegen`` writes the fused expressions, ``launch`` launches with
little host overhead; ``launchers`` says which launcher runs each kernel) and
``engine`` (Engine and Plan).

Importing this package does not import triton; without it the engine reports
"install dnntune[triton]", and on a CPU handle "needs CUDA".
"""

from __future__ import annotations

from dnntune.backend.engine import Engine
from dnntune.providers.triton.engine import TritonEngine, TritonPlan

__all__ = ["TritonEngine", "TritonPlan", "engines"]


def engines() -> list[Engine]:
    """The engines of the triton provider (the registry calls this)."""
    return [TritonEngine()]
