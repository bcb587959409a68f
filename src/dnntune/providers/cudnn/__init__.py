"""CUDNN_ENGINE: dnntune graphs lowered to NVIDIA's cuDNN frontend (``nvidia-cudnn-frontend``).

Modules, in the order a build uses them: ``_runtime`` (the lazily imported ``cudnn`` module,
versions, cuDNN handles per stream), ``support`` (what can be lowered, decided without cuDNN),
``lowering`` (OpGraph -> ``cudnn.pygraph``), ``problem`` (cuDNN's plan list per graph, lazy
plan builds), ``selection`` (which plan: explicit index, search, find-db record, heuristic),
``search`` (timing cuDNN's plans), ``find_db`` (the on-disk record of search winners) and
``engine`` (the Engine and Plan).

Importing this package does not import ``cudnn``; without it the engine reports
"install dnntune[cudnn] (nvidia-cudnn-frontend)".
"""

from __future__ import annotations

from dnntune.backend.engine import Engine
from dnntune.providers.cudnn.engine import CudnnEngine, CudnnPlan

__all__ = ["CudnnEngine", "CudnnPlan", "engines"]


def engines() -> list[Engine]:
    """The engines of the cudnn provider (the registry calls this)."""
    return [CudnnEngine()]
