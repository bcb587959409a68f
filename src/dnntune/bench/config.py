"""``dnntune bench`` options, and the TOML recipe (``--config``) they can come from.

Precedence: defaults < TOML recipe < explicit command-line flags. The recipe must say
``version = 1``; an unknown key or a wrong type is a usage error (exit 2), as in ROCm's
dnn-benchmarking tool.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

from dnntune.errors import InvalidValueError
from dnntune.rfc import TuneMode

__all__ = ["BenchConfig", "BenchConfigError", "load_toml"]


class BenchConfigError(InvalidValueError):
    """A bad bench option or recipe (the CLI exits with 2)."""


@dataclass(frozen=True)
class BenchConfig:
    graphs: tuple[str, ...] = ()
    warmup: int = 10
    iters: int = 100
    min_time_ms: float = 0.0
    cache_mode: str = "warm"
    seed: int = 0
    engines: tuple[str, ...] = ()
    backend: str = "dnntune"
    validate: str = "none"
    rtol: float | None = None
    atol: float | None = None
    oracle: bool = False
    output: str | None = None
    verbose: bool = False
    quiet: bool = False
    device: str | None = None
    plot: str | None = None
    #: refuse a graph whose input and output buffers need more GiB than this (0: no limit)
    max_input_gb: float = 8.0
    #: hard cap on samples when --min-time-ms keeps sampling
    max_iters: int = field(default=10000)
    #: --oracle: wall-time budget in seconds of each graph's tuning, shared equally by its
    #: engine rows (``AutotuneConfig.time_budget_s``); None: no budget
    budget_s: float | None = None
    #: --oracle's tune mode: ``standard`` (each engine's plans and knob variants) or
    #: ``exhaustive`` (also the engines' own searches, such as cuDNN's benchmarking and
    #: torch.compile's max-autotune: tens of seconds per graph on a GPU)
    oracle_mode: str = "standard"

    def check(self) -> BenchConfig:
        """Raise BenchConfigError for out-of-range values; return self."""
        if self.warmup < 0:
            raise BenchConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.iters < 1:
            raise BenchConfigError(f"--iters must be >= 1, got {self.iters}")
        if self.min_time_ms < 0:
            raise BenchConfigError(f"--min-time-ms must be >= 0, got {self.min_time_ms}")
        if self.cache_mode not in ("warm", "cold"):
            raise BenchConfigError(f"--cache-mode must be warm or cold, got {self.cache_mode!r}")
        if self.backend not in ("dnntune", "pytorch"):
            raise BenchConfigError(f"--backend must be dnntune or pytorch, got {self.backend!r}")
        if self.validate not in ("none", "reference"):
            raise BenchConfigError(f"--validate must be none or reference, got {self.validate!r}")
        if self.oracle and self.backend == "pytorch":
            raise BenchConfigError(
                "--oracle tunes dnntune engines; it cannot be used with --backend pytorch"
            )
        if self.verbose and self.quiet:
            raise BenchConfigError("--verbose and --quiet exclude each other")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise BenchConfigError(f"--{name} must be >= 0, got {value}")
        if self.max_input_gb < 0:
            raise BenchConfigError(f"--max-input-gb must be >= 0, got {self.max_input_gb}")
        if self.budget_s is not None:
            if not (0.0 < self.budget_s < 1e12):
                raise BenchConfigError(
                    f"--budget-s must be a finite number of seconds > 0, got {self.budget_s}"
                )
            if not self.oracle:
                raise BenchConfigError("--budget-s limits --oracle's tuning; add --oracle")
        if self.oracle_mode not in {m.value for m in TuneMode}:
            raise BenchConfigError(
                f"--oracle-mode must be standard or exhaustive, got {self.oracle_mode!r}"
            )
        if self.oracle_mode != "standard" and not self.oracle:
            raise BenchConfigError("--oracle-mode sets how --oracle tunes; add --oracle")
        if self.output and not self.output.endswith((".json", ".csv")):
            raise BenchConfigError(f"--output must end in .json or .csv, got {self.output!r}")
        return self

    @property
    def max_input_bytes(self) -> int | None:
        """``max_input_gb`` in bytes; None when 0 (no limit)."""
        return int(self.max_input_gb * (1 << 30)) if self.max_input_gb > 0 else None

    def merged(self, overrides: dict[str, Any]) -> BenchConfig:
        """A copy with ``overrides`` (explicit CLI flags) applied."""
        return replace(self, **overrides)


_TYPES: dict[str, tuple[type, ...]] = {
    "graphs": (list,),
    "warmup": (int,),
    "iters": (int,),
    "min_time_ms": (int, float),
    "cache_mode": (str,),
    "seed": (int,),
    "engines": (list,),
    "backend": (str,),
    "validate": (str,),
    "rtol": (int, float),
    "atol": (int, float),
    "oracle": (bool,),
    "output": (str,),
    "verbose": (bool,),
    "quiet": (bool,),
    "device": (str,),
    "plot": (str,),
    "max_input_gb": (int, float),
    "budget_s": (int, float),
    "oracle_mode": (str,),
}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a recipe into a dict of BenchConfig fields (paths resolved against the file).

    Raises:
        BenchConfigError: unreadable file, bad TOML, missing/wrong version, unknown key, bad type.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise BenchConfigError(f"--config {p}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BenchConfigError(f"--config {p}: invalid TOML: {exc}") from None
    version = data.pop("version", None)
    if version != 1 or isinstance(version, bool):
        raise BenchConfigError(f"--config {p}: 'version = 1' is required, got {version!r}")
    known = {f.name for f in fields(BenchConfig)}
    out: dict[str, Any] = {}
    value: Any
    for key, value in data.items():
        if key not in known or key not in _TYPES:
            raise BenchConfigError(
                f"--config {p}: unknown key {key!r}; known keys: {', '.join(sorted(_TYPES))}"
            )
        types = _TYPES[key]
        if isinstance(value, bool) and bool not in types:
            raise BenchConfigError(
                f"--config {p}: {key} must be {types[0].__name__}, got {value!r}"
            )
        if not isinstance(value, types):
            raise BenchConfigError(
                f"--config {p}: {key} must be {types[0].__name__}, got {value!r}"
            )
        value = cast(Any, value)  # checked against _TYPES above
        if key in ("graphs", "engines"):
            if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
                raise BenchConfigError(f"--config {p}: {key} must be a list of strings")
            value = tuple(
                str((p.parent / v).resolve())
                if key == "graphs" and not Path(str(v)).is_absolute()
                else str(v)
                for v in value
            )
        elif key in ("output", "plot") and not Path(value).is_absolute():
            value = str(p.parent / value)
        elif key in ("min_time_ms", "rtol", "atol", "max_input_gb"):
            value = float(value)
        out[key] = value
    return out
