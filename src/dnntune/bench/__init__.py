"""``dnntune bench``: OOTB rows per graph and engine, the ``--oracle`` comparison, results."""

from dnntune.bench.config import BenchConfig, BenchConfigError, load_toml
from dnntune.bench.results import SCHEMA_VERSION, SuiteResult
from dnntune.bench.runner import BenchRunner

__all__ = [
    "SCHEMA_VERSION",
    "BenchConfig",
    "BenchConfigError",
    "BenchRunner",
    "SuiteResult",
    "load_toml",
]
