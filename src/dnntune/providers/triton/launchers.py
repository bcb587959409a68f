"""Which launcher runs each kernel: one loader a kernel, keyed by the match's ``kernel`` name.

The loaders import their kernel module when a build asks for it, the one function-level import
of the package: the kernel modules import triton, an optional dependency, and the engine must
import without it (and report itself not applicable).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dnntune.providers.triton.patterns import Match
from dnntune.providers.triton.solver_base import Config

__all__ = ["Launcher", "build_launcher"]


class Launcher(Protocol):
    workspace_bytes: int

    def __call__(self, pack: Mapping[int, Any], workspace: Any, warmup: bool = False) -> None: ...


def _matmul() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.matmul import MatmulLauncher

    return MatmulLauncher


def _norm() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.norm import NormLauncher

    return NormLauncher


def _reduction() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.reduction import ReductionLauncher

    return ReductionLauncher


def _pointwise() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.pointwise import PointwiseLauncher

    return PointwiseLauncher


def _pool() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.pool import PoolLauncher

    return PoolLauncher


def _batchnorm() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.batchnorm import BatchnormLauncher

    return BatchnormLauncher


def _attention() -> Callable[[Any, Config], Launcher]:
    from dnntune.providers.triton.kernels.attention import AttentionLauncher

    return AttentionLauncher


#: a match's ``kernel`` -> its launcher class's loader (each kernel's solver has the same key)
LOADERS: dict[str, Callable[[], Callable[[Any, Config], Launcher]]] = {
    "matmul": _matmul,
    "norm": _norm,
    "reduction": _reduction,
    "pointwise": _pointwise,
    "pool": _pool,
    "batchnorm": _batchnorm,
    "attention": _attention,
}


def build_launcher(match: Match, config: Config) -> Launcher:
    """The kernel module's launcher for ``config`` (imports triton)."""
    return LOADERS[match.kernel]()(match, config)
