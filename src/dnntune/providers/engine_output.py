"""What the engines dnntune drives print while they compile or search, kept out of the way.

torch.compile's max-autotune writes its ``AUTOTUNE ...`` tables to ``sys.stderr``, Inductor and
Dynamo log through handlers of their own, Triton and ``warnings.warn`` write to ``sys.stderr``.
Inside :func:`captured_engine_output`, what the current thread writes to ``sys.stdout`` or
``sys.stderr``, and the records of the engine libraries' loggers (``torch``, ``triton``,
``cudnn``) emitted from that thread, are collected instead of shown. When the block ends they
are logged as DEBUG records of the ``dnntune.engine_output`` logger: the library never prints,
and the CLI shows them with ``-vv``. Other threads (a progress display) write as before.

Output that native code writes straight to file descriptors 1 and 2 (cuDNN frontend's C++
logging when ``CUDNN_FRONTEND_LOG_FILE`` is set) is not captured: the user asked for it.

A log handler that writes to ``sys.stderr`` at emit time (the CLI's) wraps its emit in
:func:`passthrough` so that dnntune's own records, logged while an engine compiles, still show.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["ENGINE_LOGGERS", "OUTPUT_LOGGER", "captured_engine_output", "passthrough"]

#: the logger captured output is re-emitted on (DEBUG)
OUTPUT_LOGGER = "dnntune.engine_output"
#: loggers (and their children) of the libraries the engines drive
ENGINE_LOGGERS = ("torch", "triton", "cudnn")
#: engine loggers left alone: torch's structured trace (always at DEBUG; its handler writes a
#: file only when TORCH_TRACE is set, never to the terminal)
_NOT_CAPTURED = ("torch.__trace",)

_log = logging.getLogger(OUTPUT_LOGGER)
_LOCK = threading.RLock()


class _Local(threading.local):
    passthrough: int = 0


_local = _Local()


@dataclass
class _Capture:
    engine: str
    text: dict[str, list[str]] = field(default_factory=lambda: {"stdout": [], "stderr": []})
    records: list[logging.LogRecord] = field(default_factory=list)


#: thread id -> the innermost capture of that thread
_CAPTURES: dict[int, _Capture] = {}


def _capture_of(thread_id: int | None) -> _Capture | None:
    if thread_id is None or _local.passthrough:
        return None
    return _CAPTURES.get(thread_id)


class _Router(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr: writes of a capturing thread are kept, the rest
    go to the stream it replaced."""

    def __init__(self, name: str, stream: TextIO) -> None:
        super().__init__()
        self.name_ = name
        self.stream = stream

    def write(self, s: str) -> int:
        capture = _capture_of(threading.get_ident())
        if capture is None:
            return self.stream.write(s)
        capture.text[self.name_].append(s)
        return len(s)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class _Divert(logging.Filter):
    """On a handler of an engine library's logger: keeps the records of capturing threads."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_engine_logger(record.name):
            return True
        capture = _capture_of(record.thread)
        if capture is None:
            return True
        if not getattr(record, "_dnntune_captured", False):  # once, whatever handlers see it
            record._dnntune_captured = True  # noqa: SLF001 - our marker on a stdlib LogRecord
            capture.records.append(record)
        return False


class _LastResort(logging.Handler):
    """Stands in for ``logging.lastResort`` (what logs a WARNING when no handler is set up):
    engine records of capturing threads are kept, every other record is shown as before,
    dnntune's own included."""

    def __init__(self, original: logging.Handler | None) -> None:
        super().__init__(original.level if original is not None else logging.WARNING)
        self.original = original
        self.addFilter(_DIVERT)

    def emit(self, record: logging.LogRecord) -> None:
        if self.original is not None:
            with passthrough():
                self.original.handle(record)


_DIVERT = _Divert()


@dataclass
class _Installed:
    """What :func:`captured_engine_output` put in place while any thread captures."""

    depth: int = 0
    routers: tuple[_Router, _Router] | None = None
    handlers: list[logging.Handler] = field(default_factory=list)
    last_resort: _LastResort | None = None


_state = _Installed()


def _under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def _is_engine_logger(name: str) -> bool:
    return _under(name, ENGINE_LOGGERS) and not _under(name, _NOT_CAPTURED)


def _engine_handlers() -> list[logging.Handler]:
    """The handlers engine records can reach: their loggers' own and the root's."""
    handlers: list[logging.Handler] = list(logging.getLogger().handlers)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and _is_engine_logger(name):
            handlers.extend(logger.handlers)
    return handlers


def _install() -> None:
    stdout = _Router("stdout", sys.stdout)
    stderr = _Router("stderr", sys.stderr)
    sys.stdout, sys.stderr = stdout, stderr
    _state.routers = (stdout, stderr)
    handlers = [h for h in _engine_handlers() if _DIVERT not in h.filters]
    for handler in handlers:
        handler.addFilter(_DIVERT)
    _state.handlers = handlers
    _state.last_resort = _LastResort(logging.lastResort)
    logging.lastResort = _state.last_resort


def _uninstall() -> None:
    if _state.routers is not None:
        stdout, stderr = _state.routers
        # restore only what is still ours (whoever replaced a router restores their own)
        if sys.stdout is stdout:
            sys.stdout = stdout.stream
        if sys.stderr is stderr:
            sys.stderr = stderr.stream
    for handler in _state.handlers:
        handler.removeFilter(_DIVERT)
    if _state.last_resort is not None and logging.lastResort is _state.last_resort:
        logging.lastResort = _state.last_resort.original
    _state.routers, _state.handlers, _state.last_resort = None, [], None


@contextlib.contextmanager
def captured_engine_output(engine: str) -> Iterator[None]:
    """Collect what an engine prints or logs in this block; log it at DEBUG when it ends."""
    thread = threading.get_ident()
    capture = _Capture(engine)
    with _LOCK:
        if _state.depth == 0:
            _install()
        _state.depth += 1
        outer = _CAPTURES.get(thread)
        _CAPTURES[thread] = capture
    try:
        yield
    finally:
        with _LOCK:
            if outer is None:
                del _CAPTURES[thread]
            else:
                _CAPTURES[thread] = outer
            _state.depth -= 1
            if _state.depth == 0:
                _uninstall()
        _report(capture)


def _report(capture: _Capture) -> None:
    for stream, parts in capture.text.items():
        text = "".join(parts).rstrip()
        if text:
            _log.debug("%s (%s):\n%s", capture.engine, stream, text)
    for record in capture.records:
        _log.debug(
            "%s (%s, %s): %s",
            capture.engine,
            record.name,
            record.levelname,
            record.getMessage(),
        )


@contextlib.contextmanager
def passthrough() -> Iterator[None]:
    """Writes of this thread go to the real streams in this block, even inside a capture."""
    _local.passthrough += 1
    try:
        yield
    finally:
        _local.passthrough -= 1
