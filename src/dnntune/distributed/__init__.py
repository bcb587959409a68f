"""Tune a library of graphs across ranks with torch.distributed (launched by torchrun)."""

from dnntune.distributed.env import DistContext, init_distributed, launched_by_torchrun
from dnntune.distributed.library import DistributedTuneError, LibraryReport, tune_library

__all__ = [
    "DistContext",
    "DistributedTuneError",
    "LibraryReport",
    "init_distributed",
    "launched_by_torchrun",
    "tune_library",
]
