"""The engine registry: built-in providers, entry-point providers, and test engines.

Built-in providers are named by import path and loaded on first use, so ``import dnntune``
imports neither triton nor cudnn. Third-party packages register a callable returning engines
(or an Engine subclass/instance) in the entry-point group ``dnntune.providers``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

from dnntune.backend.engine import Engine, engine_name_or_id
from dnntune.errors import InvalidValueError, NotSupportedError

if TYPE_CHECKING:
    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["EngineRegistry", "get_registry", "ENTRY_POINT_GROUP"]

_log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dnntune.providers"

#: "module:attribute" of each built-in provider's engine list (a callable returning engines)
BUILTIN_PROVIDERS: tuple[str, ...] = (
    "dnntune.providers.torch_eager:engines",
    "dnntune.providers.torch_compile:engines",
    "dnntune.providers.cudnn:engines",
    "dnntune.providers.triton:engines",
)


def _coerce_engines(obj: Any, source: str) -> list[Engine]:
    if isinstance(obj, Engine):
        return [obj]
    if isinstance(obj, type) and issubclass(obj, Engine):
        return [obj()]
    if callable(obj):
        return _coerce_engines(obj(), source)
    if isinstance(obj, Iterable):
        out: list[Engine] = []
        for item in obj:
            out.extend(_coerce_engines(item, source))
        return out
    raise TypeError(f"provider {source} gave {obj!r}, not an Engine")


class EngineRegistry:
    """Every engine dnntune knows of, in registration order (built-ins first)."""

    def __init__(self, providers: Sequence[str] = BUILTIN_PROVIDERS, entry_points: bool = True):
        self._providers = tuple(providers)
        self._use_entry_points = entry_points
        self._engines: list[Engine] | None = None
        self._extra: list[Engine] = []
        self._load_errors: dict[str, str] = {}
        self._lock = threading.RLock()

    # ---- loading ------------------------------------------------------------------------
    def _load(self) -> list[Engine]:
        with self._lock:
            if self._engines is not None:
                return self._engines
            engines: list[Engine] = []
            for path in self._providers:
                module_name, _, attr = path.partition(":")
                try:
                    module = importlib.import_module(module_name)
                    engines.extend(_coerce_engines(getattr(module, attr), path))
                except ModuleNotFoundError as exc:
                    if exc.name and module_name.startswith(exc.name):
                        continue  # provider module not written/installed: nothing to offer
                    self._load_errors[path] = f"{type(exc).__name__}: {exc}"
                    _log.warning("provider %s failed to load: %s", path, exc)
                except Exception as exc:  # a broken provider must not break the others
                    self._load_errors[path] = f"{type(exc).__name__}: {exc}"
                    _log.warning("provider %s failed to load: %s", path, exc)
            if self._use_entry_points:
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    try:
                        engines.extend(_coerce_engines(ep.load(), ep.name))
                    except Exception as exc:
                        self._load_errors[f"entry point {ep.name}"] = f"{type(exc).__name__}: {exc}"
                        _log.warning("entry-point provider %s failed to load: %s", ep.name, exc)
            seen: dict[int, Engine] = {}
            for e in engines:
                if e.id in seen:
                    _log.warning("engine %s registered twice; keeping the first", e.name)
                    continue
                seen[e.id] = e
            self._engines = list(seen.values())
            return self._engines

    @property
    def load_errors(self) -> dict[str, str]:
        self._load()
        return dict(self._load_errors)

    def reload(self) -> None:
        with self._lock:
            self._engines = None
            self._load_errors = {}

    # ---- extra engines (tests, fakes, user engines) -------------------------------------
    def register(self, engine: Engine) -> None:
        """Add an engine for this process (before the built-ins in lookups of the same id)."""
        with self._lock:
            if any(e.id == engine.id for e in self.engines()):
                raise InvalidValueError(
                    f"engine {engine.name} (id {engine.id}) is already registered"
                )
            self._extra.append(engine)

    def unregister(self, engine: Engine) -> None:
        with self._lock:
            self._extra = [e for e in self._extra if e is not engine]

    @contextlib.contextmanager
    def extra_engines(self, engines: Sequence[Engine], exclusive: bool = False) -> Iterator[None]:
        """Register ``engines`` inside the block; ``exclusive`` hides every other engine."""
        with self._lock:
            saved_extra, saved_exclusive = self._extra, getattr(self, "_exclusive", None)
            self._extra = [*self._extra, *engines]
            if exclusive:
                self._exclusive: list[Engine] | None = list(engines)
            elif saved_exclusive is not None:
                # nested inside an exclusive block: the new engines join the visible set
                self._exclusive = [*saved_exclusive, *engines]
        try:
            yield
        finally:
            with self._lock:
                self._extra = saved_extra
                self._exclusive = saved_exclusive

    # ---- lookups ------------------------------------------------------------------------
    def engines(self) -> list[Engine]:
        exclusive = getattr(self, "_exclusive", None)
        if exclusive is not None:
            return list(exclusive)
        return [*self._load(), *self._extra]

    def get(self, engine: int | str | Engine) -> Engine:
        """Look up by id, name, decimal or hex id string; raises InvalidValueError if unknown."""
        if isinstance(engine, Engine):
            return engine
        wanted = engine_name_or_id(engine)
        for e in self.engines():
            if e.id == wanted:
                return e
        known = ", ".join(e.name for e in self.engines())
        raise InvalidValueError(f"unknown engine {engine!r}; known engines: {known}")

    def find(self, engine: int | str) -> Engine | None:
        try:
            return self.get(engine)
        except InvalidValueError:
            return None

    def applicability(self, graph: OpGraph, handle: Handle) -> list[tuple[Engine, str | None]]:
        """Each engine with None if it applies to ``graph`` on ``handle``, else the reason."""
        out: list[tuple[Engine, str | None]] = []
        for e in self.engines():
            out.append((e, self.why_not(e, graph, handle)))
        return out

    def why_not(self, engine: Engine, graph: OpGraph, handle: Handle) -> str | None:
        if handle.device.type not in engine.devices:
            return f"runs on {'/'.join(engine.devices)}, not {handle.device.type}"
        try:
            engine.check_available()
            engine.check_support(graph, handle)
        except NotSupportedError as exc:
            return str(exc)
        except Exception as exc:  # an engine's bug must not hide the others
            _log.warning(
                "engine %s check_support raised %s: %s", engine.name, type(exc).__name__, exc
            )
            return f"check_support raised {type(exc).__name__}: {exc}"
        return None

    def applicable(self, graph: OpGraph, handle: Handle) -> list[Engine]:
        return [e for e, reason in self.applicability(graph, handle) if reason is None]


_REGISTRY = EngineRegistry()


def get_registry() -> EngineRegistry:
    """The process-wide engine registry."""
    return _REGISTRY
