"""``dnntune bench`` options, and the TOML recipe (``--config``) they can come from.

Precedence: defaults < TOML recipe < explicit command-line flags. The recipe must say
``version = 1``; an unknown key or a wrong type is a usage error (exit 2), as in ROCm's
dnn-benchmarking tool.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

from dnntune._rfc_values import budget_error
from dnntune.errors import InvalidValueError
from dnntune.rfc import TuneMode

__all__ = ["BenchConfig", "BenchConfigError", "load_toml", "split_engines"]


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
        for name in ("rtol", "atol", "max_input_gb", "min_time_ms"):
            value = getattr(self, name)
            if value is not None and not (0.0 <= value < math.inf):  # NaN fails both
                flag = "--" + name.replace("_", "-")
                raise BenchConfigError(f"{flag} must be a finite number >= 0, got {value}")
        if self.budget_s is not None:
            bad_budget = budget_error("--budget-s", self.budget_s)
            if bad_budget is not None:
                raise BenchConfigError(bad_budget)
            if not self.oracle:
                raise BenchConfigError("--budget-s limits --oracle's tuning; add --oracle")
        if self.oracle_mode not in {m.value for m in TuneMode}:
            raise BenchConfigError(
                f"--oracle-mode must be standard or exhaustive, got {self.oracle_mode!r}"
            )
        if self.oracle_mode != "standard" and not self.oracle:
            raise BenchConfigError("--oracle-mode sets how --oracle tunes; add --oracle")
        if self.output and not self.output.lower().endswith((".json", ".csv")):
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


#: how a type check names what a key takes
_WANTS = {
    (list,): "a list of strings",
    (int,): "an integer",
    (int, float): "a number",
    (str,): "a string",
    (bool,): "true or false",
}

#: a key may also be spelled like its long option (``min-time-ms``, ``graph``, ``engine``)
_ALIASES = {"graph": "graphs", "engine": "engines"}


def _field_name(key: str) -> str:
    name = key.replace("-", "_")
    return _ALIASES.get(name, name)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a recipe into a dict of BenchConfig fields (paths resolved against the file).

    Raises:
        BenchConfigError: unreadable file, bad TOML, missing/wrong version, unknown key, bad type.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise BenchConfigError(f"--config {p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BenchConfigError(
            f"--config {p}: not UTF-8 text (byte {exc.start}); save the recipe as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise BenchConfigError(f"--config {p}: invalid TOML: {exc}") from None
    version = data.pop("version", None)
    if version != 1 or isinstance(version, bool):
        raise BenchConfigError(f"--config {p}: 'version = 1' is required, got {version!r}")
    known = {f.name for f in fields(BenchConfig)}
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    value: Any
    for key, value in data.items():
        name = _field_name(key)
        if name not in known or name not in _TYPES:
            options = ", ".join(sorted(k.replace("_", "-") for k in _TYPES))
            raise BenchConfigError(
                f"--config {p}: unknown key {key!r}; keys are the long options: {options}"
            )
        if name in spelled:
            raise BenchConfigError(
                f"--config {p}: {spelled[name]!r} and {key!r} set the same option; keep one"
            )
        spelled[name] = key
        types = _TYPES[name]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise BenchConfigError(f"--config {p}: {key} must be {_WANTS[types]}, got {value!r}")
        value = cast(Any, value)  # checked against _TYPES above
        if name == "graphs":
            if not all(isinstance(v, str) for v in value):
                raise BenchConfigError(
                    f"--config {p}: {key} must be a list of strings (graph files, folders or "
                    f"globs), got {value!r}"
                )
            value = tuple(
                str(v if Path(v).is_absolute() else (p.parent / v).resolve()) for v in value
            )
        elif name == "engines":
            if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
                raise BenchConfigError(
                    f"--config {p}: {key} must be a list of engine names or ids, got {value!r}"
                )
            # "A,B" splits as on the command line
            listed = value
            value = split_engines(str(v) for v in value)
            if not value:
                # it read as no list at all: every engine, where the writer meant none or
                # forgot to fill it in; `--engine ""` is refused for the same reason
                raise BenchConfigError(
                    f"--config {p}: {key} = {json.dumps(listed)} names no engine; list the "
                    f'engines to run ({key} = ["CUDNN_ENGINE", "TORCH_ENGINE"]; `dnntune '
                    f"engines` lists them), or delete the {key} line to run every applicable "
                    "engine"
                )
        elif name in ("output", "plot") and not Path(value).is_absolute():
            value = str(p.parent / value)
        elif name in ("min_time_ms", "rtol", "atol", "max_input_gb", "budget_s"):
            value = float(value)
        out[name] = value
    return out


def split_engines(items: Any) -> tuple[str, ...]:
    """Engine names or ids from ``--engine`` values or a recipe's list; commas separate."""
    return tuple(token.strip() for item in items for token in str(item).split(",") if token.strip())
