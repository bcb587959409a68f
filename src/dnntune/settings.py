"""Every environment variable dnntune reads, read here and nowhere else.

Values are read on each call (not cached at import) so that a program, or a test, can change
them between calls, as hipDNN re-reads ``HIPDNN_HEUR_CONFIG_PATH`` on every heuristic query.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = [
    "TRUTHY",
    "FALSY",
    "cache_dir",
    "cudnn_build_processes",
    "cache_disabled",
    "exact_engine_cache_disabled",
    "force_benchmarking",
    "heur_config_path",
    "heur_model_path",
    "heur_policy_order",
    "log_level",
    "selection_environment",
    "static_cache_move_in",
    "static_cache_replay",
]

_log = logging.getLogger(__name__)

TRUTHY = frozenset({"1", "true", "on", "yes", "enable", "enabled"})
FALSY = frozenset({"0", "false", "off", "no", "disable", "disabled"})

ENV_VARS = (
    "DNNTUNE_HEUR_CONFIG_PATH",
    "DNNTUNE_HEUR_MODEL_PATH",
    "DNNTUNE_HEUR_POLICY_ORDER",
    "DNNTUNE_DISABLE_EXACT_ENGINE_CACHE",
    "DNNTUNE_FORCE_BENCHMARKING",
    "DNNTUNE_CACHE_DIR",
    "DNNTUNE_DISABLE_CACHE",
    "DNNTUNE_DISABLE_NATIVE",
    "DNNTUNE_LOG_LEVEL",
    "DNNTUNE_CUDNN_BUILD_PROCESSES",
    "DNNTUNE_STATIC_CACHE_REPLAY",
    "DNNTUNE_STATIC_CACHE_MOVE_IN",
)


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


#: (variable, value) pairs already warned about: each is warned once per process, then logged
#: at DEBUG (these are read on every query; a sweep would repeat the warning hundreds of times)
_REPORTED: set[tuple[str, str]] = set()


def _warn_once(name: str, value: str, message: str) -> None:
    key = (name, value)
    level = logging.DEBUG if key in _REPORTED else logging.WARNING
    _REPORTED.add(key)
    _log.log(level, "%s", message)


def _on_off(name: str, unrecognised: str) -> bool | None:
    """A yes/no variable: True, False, or None when unset (or empty, which reads as unset).

    A value that is neither on nor off is warned about (once per value), naming the variable,
    the value, the accepted words and ``unrecognised``: what dnntune does instead.
    """
    value = _get(name)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in TRUTHY:
        return True
    if lowered in FALSY:
        return False
    _warn_once(
        name,
        value,
        f"{name}={value!r} is neither on ({', '.join(sorted(TRUTHY))}) nor off "
        f"({', '.join(sorted(FALSY))}), any case; {unrecognised}. Set it to 1 or 0",
    )
    return None


def _truthy(name: str, what_stays: str) -> bool:
    return _on_off(name, f"read as off: {what_stays}") is True


def heur_config_path() -> Path | None:
    """``DNNTUNE_HEUR_CONFIG_PATH``: the engine-override file the Config policy reads (``~``
    expanded, as ``DNNTUNE_HEUR_MODEL_PATH`` and ``DNNTUNE_CACHE_DIR`` are)."""
    value = _get("DNNTUNE_HEUR_CONFIG_PATH")
    return Path(value).expanduser() if value else None


def heur_model_path() -> Path | None:
    """``DNNTUNE_HEUR_MODEL_PATH``: the learned ranking model HeuristicMode.B reads (unset: the
    model shipped with dnntune)."""
    value = _get("DNNTUNE_HEUR_MODEL_PATH")
    return Path(value).expanduser() if value else None


def heur_policy_order() -> list[str] | None:
    """``DNNTUNE_HEUR_POLICY_ORDER``: comma list of policy names or ids, or None for the default.

    The tokens are returned as written; :mod:`dnntune.backend.heuristics` resolves them (full
    names, short names such as ``Config`` in any case, decimal ids) and warns, once per name,
    about one that names no policy.
    """
    value = _get("DNNTUNE_HEUR_POLICY_ORDER")
    if not value:
        return None
    tokens = [token.strip() for token in value.split(",") if token.strip()]
    if not tokens:
        _warn_once(
            "DNNTUNE_HEUR_POLICY_ORDER",
            value,
            f"DNNTUNE_HEUR_POLICY_ORDER={value!r} names no policy; the default order is used. "
            "Give a comma list such as Config,Learned,StaticOrdering, or unset it",
        )
        return None
    return tokens


def exact_engine_cache_disabled() -> bool:
    """``DNNTUNE_DISABLE_EXACT_ENGINE_CACHE``: only 1/true/on/yes/enable/enabled disable it.

    Any other value, "0" included, leaves the exact-match ranking cache on; one that is neither
    on nor off is warned about.
    """
    return _truthy("DNNTUNE_DISABLE_EXACT_ENGINE_CACHE", "the exact-match ranking cache stays on")


def cache_disabled() -> bool:
    """``DNNTUNE_DISABLE_CACHE``: truthy turns off every on-disk cache (find/perf db too)."""
    return _truthy("DNNTUNE_DISABLE_CACHE", "the on-disk caches stay on")


def native_disabled() -> bool:
    """``DNNTUNE_DISABLE_NATIVE``: truthy builds and loads no compiled helper
    (``dnntune.backend.native``); the checks it speeds up run in Python."""
    return _truthy("DNNTUNE_DISABLE_NATIVE", "the compiled helpers are used")


def cudnn_direct_disabled() -> bool:
    """``DNNTUNE_DISABLE_CUDNN_DIRECT``: truthy runs bound cuDNN calls through the frontend's
    execute instead of the compiled caller of cuDNN's backend API
    (``dnntune.providers.cudnn.direct``); ``DNNTUNE_DISABLE_NATIVE`` turns it off too."""
    return _truthy("DNNTUNE_DISABLE_CUDNN_DIRECT", "bound cuDNN calls run directly")


def static_cache_replay() -> bool:
    """``DNNTUNE_STATIC_CACHE_REPLAY``: on unless set to an off word. dnntune's CUDA-graph
    recordings take transformers' ``StaticCache`` as it is (``dnntune.torch._static_caches``),
    so that the decode steps of ``generate(cache_implementation="static")`` replay; off, a
    static cache is an object argument as any other, never recorded."""
    return _on_off("DNNTUNE_STATIC_CACHE_REPLAY", "read as on: static caches replay") is not False


def static_cache_move_in() -> bool:
    """``DNNTUNE_STATIC_CACHE_MOVE_IN``: on unless set to an off word. A later static cache
    moves into the memory of the cache a CUDA graph was recorded on and replays that graph
    (``dnntune.torch._static_caches.Held``) instead of recording its own; off, each new
    cache's memory records its own graph (on by default since session 53, after its GPU
    tests and timing on an H100)."""
    return _on_off("DNNTUNE_STATIC_CACHE_MOVE_IN", "read as on: later caches move in") is not False


def cudnn_build_processes() -> int | None:
    """``DNNTUNE_CUDNN_BUILD_PROCESSES``: how many processes build a tune's cuDNN plans (0:
    none); None when unset, or not a whole number (warned about once per value)."""
    value = _get("DNNTUNE_CUDNN_BUILD_PROCESSES")
    if value is None:
        return None
    try:
        return max(0, int(value))
    except ValueError:
        _warn_once(
            "DNNTUNE_CUDNN_BUILD_PROCESSES",
            value,
            f"DNNTUNE_CUDNN_BUILD_PROCESSES={value!r} is not a whole number; the default is used",
        )
        return None


def cache_dir() -> Path:
    """``DNNTUNE_CACHE_DIR``, default ``~/.cache/dnntune``."""
    value = _get("DNNTUNE_CACHE_DIR")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "dnntune"


def force_benchmarking() -> bool | None:
    """``DNNTUNE_FORCE_BENCHMARKING``: True/False to force ``global.benchmarking``; None if unset.

    An unrecognised value is ignored with a warning (once per value: this is read on every
    build), as hipDNN does.
    """
    return _on_off("DNNTUNE_FORCE_BENCHMARKING", "ignored: the global.benchmarking knob decides")


#: ``DNNTUNE_LOG_LEVEL``'s values (any case)
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "off": logging.CRITICAL + 10,
}


def log_level() -> int | None:
    """``DNNTUNE_LOG_LEVEL`` as a logging level (one of ``LOG_LEVELS``), or None if unset.

    An unrecognised value is ignored with a warning naming the allowed ones, as
    ``DNNTUNE_FORCE_BENCHMARKING``'s is.
    """
    value = _get("DNNTUNE_LOG_LEVEL")
    if value is None:
        return None
    level = LOG_LEVELS.get(value.lower())
    if level is None:
        _log.warning("DNNTUNE_LOG_LEVEL=%r is not one of %s; ignored", value, ", ".join(LOG_LEVELS))
    return level


def selection_environment() -> dict[str, str | None]:
    """The engine-selection variables as set now, for run metadata (never changed by dnntune)."""
    return {name: os.environ.get(name) for name in ENV_VARS}


def unsafe_code_dir(directory: Path) -> str | None:
    """Why ``directory`` must not hold code this process imports or loads (generated Triton
    kernels, the compiled replay-check helper), or None when it may (or does not exist yet).

    Safe means: a real directory (a symbolic link could be re-pointed), owned by the current
    user, and writable by neither group nor others (anyone who can write there could swap a
    file between its write and its import).
    """
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory (a symbolic link or a file)"
    uid = os.getuid()
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by the current user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def claim_code_dir(directory: Path) -> str | None:
    """Make ``directory`` (mode 0700, its parents as needed) to hold code this process loads,
    and say why it must not (None: it may): :func:`unsafe_code_dir`, checked again after the
    folder is made, since another user may have made it first."""
    reason = unsafe_code_dir(directory)
    if reason is None:
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            directory.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            return f"it cannot be created: {exc}"
        reason = unsafe_code_dir(directory)
    return reason
