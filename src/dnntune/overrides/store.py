"""Locked, atomic file updates for the override file and the ranking cache.

Beyond the RFC (which leaves concurrent writers unsafe): every read-modify-write holds a
cross-process lock on ``.<name>.lock`` beside the file (``filelock``), and new content goes to a
temporary file in the same folder that is flushed, fsynced and then renamed over the target
with ``os.replace``. A reader therefore sees the old file or the new one, never half of one,
and two processes appending to one file lose nothing.

The lock file is hidden (a dot name, which the project's ``.gitignore`` covers with ``.*.lock``)
and stays after the writer is done: deleting it would let a process that waits on the old
inode and a newcomer that creates a new one both hold "the" lock.

A path that is a symbolic link is written through to its target, as editors do: the lock, the
temporary file and the rename are beside the target, and the link stays a link
(:func:`write_target`).

A writer killed mid-write (``kill -9``) leaves its temporary file; the next write of the same
file removes it, never one a running writer is using (:mod:`dnntune._temp_files`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from dnntune._temp_files import make_temp, remove_stale
from dnntune.errors import ConfigFileError

__all__ = [
    "CACHE_HINT",
    "COMPACT_MIN_BYTES",
    "LOCK_TIMEOUT_S",
    "atomic_write_text",
    "check_writable",
    "compact_lines",
    "json_line_key",
    "lock_path",
    "locked",
    "move_aside",
    "read_text_if_exists",
    "warn_once",
    "warn_unreadable",
    "write_target",
]

_log = logging.getLogger(__name__)

#: how long a writer waits for another process's lock before giving up
LOCK_TIMEOUT_S = 120.0


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def lock_path(path: Path) -> Path:
    """The lock file that guards ``path``: the hidden sibling ``.<name>.lock``."""
    return path.with_name(f".{path.name}.lock")


def write_target(path: str | Path) -> Path:
    """The file a write to ``path`` lands on: a symbolic link's final target, else ``path``.

    Editors write through a link to the file it names, and so does dnntune, so that a link
    stays a link and its target is the file that changes. A dangling link's target is where
    the new file is created.

    Raises:
        ConfigFileError: for a loop of links, or a path the system cannot look up (a name
            longer than the file system allows).
    """
    p = Path(path)
    try:
        is_link = p.is_symlink()
    except OSError as exc:  # ENAMETOOLONG: is_symlink answers only "no such file" itself
        raise ConfigFileError(f"{p}: cannot write: {exc.strerror or exc}") from None
    if not is_link:
        return p
    target = Path(os.path.realpath(p))
    if target.is_symlink():  # realpath stops where a loop begins
        raise ConfigFileError(f"{p}: cannot write: {os.strerror(errno.ELOOP)}")
    return target


def check_writable(path: str | Path, example: str = "overrides.json") -> Path:
    """Check that :func:`atomic_write_text` can create or replace ``path``; the file it would write.

    ``example`` is the file name a "name a file in it" message suggests when ``path`` is a
    directory: the caller's kind of file (``run_results.json`` for run results).

    What writing needs, checked before any work is spent and without leaving anything behind:
    the path (a link's target) is not a directory or a device, an existing file is readable
    (updates read it first), and files can be created in its folder (a temporary file is made
    there and removed; a folder that does not exist yet must be creatable in its nearest
    existing parent, where the writer will create it).

    Raises:
        ConfigFileError: naming the path and the reason.
    """
    p = write_target(Path(path).expanduser())
    folder = p.parent
    existing = next((a for a in (folder, *folder.parents) if os.path.lexists(a)), Path("."))
    if not existing.is_dir():
        raise ConfigFileError(f"{p}: cannot write: {existing} is not a directory")
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigFileError(f"{p}: cannot write: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigFileError(f"{p}: is a directory; name a file in it, e.g. {p / example}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigFileError(f"{p}: is not a regular file")
    if st is not None and not os.access(p, os.R_OK):
        raise ConfigFileError(f"{p}: cannot read: {os.strerror(errno.EACCES)}")
    if existing != folder:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigFileError(
                f"{p}: cannot create directory {folder}: {os.strerror(errno.EACCES)} in {existing}"
            )
        return p
    try:
        fd, probe = make_temp(p, ".probe")
    except OSError as exc:
        raise ConfigFileError(
            f"{p}: cannot create files in directory {folder}: {exc.strerror or exc}"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.remove(probe)
    return p


@contextlib.contextmanager
def locked(path: str | Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the cross-process lock of ``path`` (creating its folder if needed).

    The lock is beside the file a write lands on (:func:`write_target`), so writers that reach
    one file through different links share one lock.

    Raises:
        ConfigFileError: when the folder cannot be created or the lock is not acquired in time.
    """
    p = write_target(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigFileError(f"{p.parent}: cannot create folder: {exc.strerror or exc}") from None
    lock = FileLock(str(lock_path(p)), timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigFileError(
            f"{p}: another process has held {lock_path(p)} for over {timeout_s:.0f} s; "
            "if no dnntune process is running, delete the lock file"
        ) from None
    except OSError as exc:
        what = (
            "a folder stands where dnntune keeps the lock it takes to write "
            f"{p.name}: remove the folder or write the file elsewhere"
            if lock_path(p).is_dir()
            else f"check that {p.parent} is writable, or write the file elsewhere"
        )
        raise ConfigFileError(
            f"{lock_path(p)}: cannot lock: {exc.strerror or exc}; {what}"
        ) from None
    try:
        yield
    finally:
        lock.release()


def read_text_if_exists(path: Path) -> str | None:
    """The file's text, or None if it does not exist (other errors raise ConfigFileError)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigFileError(f"{path}: cannot read: {reason}") from None


def append_line(path: Path, line: str, *, sync: bool = False) -> None:
    """Append ``line`` (a newline is added) to a JSON-lines file. A torn last line, left by a
    writer that died mid-append, is ended first, so it cannot swallow this one. ``sync``:
    fsync before returning. Raises OSError; the caller holds the file's lock. Stale temporary
    files of the file's atomic rewrites are removed first, as :func:`atomic_write_text` does."""
    remove_stale(path)
    with open(path, "a+b") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(line.encode("utf-8") + b"\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())


def read_lines_lenient(path: Path) -> list[str] | None:
    """A JSON-lines file's lines, None if it does not exist. Bytes that are not UTF-8 become
    U+FFFD, so such a line fails to parse and is skipped by the caller instead of making the
    whole file unreadable. Raises OSError for other read errors."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None


def read_lines_each(path: Path) -> list[str] | None:
    """A JSON-lines file's lines, None if it does not exist. Each line is decoded on its own:
    one that is not UTF-8 becomes "" (a blank line, which readers skip), so a bad byte spoils
    only its own line, never the file, and never reaches a record as U+FFFD. Raises OSError
    for other read errors."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    out = []
    for raw in data.splitlines():
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append("")
    return out


#: a JSON-lines cache smaller than this is never compacted (reading it back costs nothing)
COMPACT_MIN_BYTES = 256 << 10


def compact_lines(
    path: Path, key_of: Callable[[str], str | None], *, min_bytes: int | None = None
) -> int:
    """Rewrite a JSON-lines cache with only the last line of each key, once at least
    ``min_bytes`` (default :data:`COMPACT_MIN_BYTES`) and half of its lines are superseded
    or unreadable (``key_of`` gives None: a torn line, another writer's). The lines removed.

    The find db and the perf db append a line per search, and the last line of a key wins:
    without this a process that searches on every start (``global.benchmarking=1``) grew the
    file by a line per graph per run for good, and every lookup read it all. The caller holds
    the file's lock, so no append is lost; readers see the old file or the new one (an atomic
    rewrite). Never raises: a file that cannot be read or rewritten stays as it is (logged).
    """
    try:
        if path.stat().st_size < (COMPACT_MIN_BYTES if min_bytes is None else min_bytes):
            return 0
        lines = read_lines_lenient(path) or []  # as the readers see them
    except OSError as exc:
        _log.debug("%s not compacted: %s", path, exc)
        return 0
    last: dict[str, int] = {}
    for number, line in enumerate(lines):
        key = key_of(line) if line.strip() else None
        if key is not None:
            last[key] = number
    kept = sorted(last.values())
    if len(kept) * 2 > len(lines):
        return 0
    try:
        atomic_write_text(path, "".join(lines[n] + "\n" for n in kept))
    except ConfigFileError as exc:
        _log.debug("%s not compacted: %s", path, exc)
        return 0
    removed = len(lines) - len(kept)
    _log.debug("%s compacted: %d superseded or unreadable lines removed", path, removed)
    return removed


def json_line_key(line: str) -> str | None:
    """The ``key`` string of a JSON-lines record, None for any other line (for
    :func:`compact_lines`)."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    key = entry.get("key") if isinstance(entry, dict) else None
    return key if isinstance(key, str) else None


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (temp file + fsync + ``os.replace``).

    Keeps the permission bits of an existing file; a new file gets ``0666 & ~umask``. A
    symbolic link is written through: its target is replaced and the link is kept. The
    temporary files that writers killed mid-write left beside it are removed first
    (:func:`dnntune._temp_files.remove_stale`).

    Raises:
        ConfigFileError: when the file cannot be written.
    """
    path = write_target(path)
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = 0o666 & ~_UMASK
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)
        fd, tmp_name = make_temp(path)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot write: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    removed = False  # the old file is gone: from then on ``tmp`` holds the only copy
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        try:
            os.replace(tmp, path)
        except OSError:
            # Some filesystems refuse to rename over an existing file: remove, then rename.
            try:
                os.remove(path)
                removed = True
            except FileNotFoundError:
                pass
            os.replace(tmp, path)
    except OSError as exc:
        if removed:
            kept = _set_aside(tmp, path)
            raise ConfigFileError(
                f"{path}: cannot write: {exc.strerror or exc}; the old file was removed to be "
                f"replaced, and its new content (the old entries included) is in {kept}: "
                f"rename that to {path.name}"
            ) from None
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigFileError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:  # Ctrl-C, SystemExit: no hidden temporary file is left behind
        if not removed:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _set_aside(tmp: Path, path: Path) -> Path:
    """Where the only copy of ``path``'s content is kept once its rename failed: ``tmp``
    renamed to ``<name>.unsaved-<epoch seconds>``, a name no later write takes for a stale
    temporary file of its own; ``tmp`` itself if that rename fails too."""
    kept = path.with_name(f"{path.name}.unsaved-{int(time.time())}")
    n = 1
    while os.path.lexists(kept):
        kept = path.with_name(f"{path.name}.unsaved-{int(time.time())}-{n}")
        n += 1
    try:
        os.rename(tmp, kept)
    except OSError:
        return tmp
    return kept


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def move_aside(path: Path) -> Path | None:
    """Rename a corrupt file to ``<path>.corrupt-<epoch seconds>``; None if that fails.

    A numeric suffix is added when a file of that name exists already, so repeated recoveries
    within one second never overwrite each other.
    """
    stem = f"{path.name}.corrupt-{int(time.time())}"
    target = path.with_name(stem)
    n = 1
    while target.exists():
        target = path.with_name(f"{stem}-{n}")
        n += 1
    try:
        os.rename(path, target)
    except OSError as exc:
        _log.warning(
            "%s: cannot move the corrupt file aside to %s: %s", path, target, exc.strerror or exc
        )
        return None
    return target


#: what to do about an on-disk cache that cannot be read or written (appended to such warnings)
CACHE_HINT = (
    "; set DNNTUNE_CACHE_DIR to a writable folder with free space "
    "(DNNTUNE_DISABLE_CACHE=1 turns the on-disk caches off)"
)

#: (logger name, key) pairs already warned about (:func:`warn_once`)
_WARNED: set[tuple[str, str]] = set()


def warn_unreadable(
    log: logging.Logger, path: Path, root: Path, exc: OSError, message: str, *args: object
) -> None:
    """:func:`warn_once` for a store file at ``path`` (under ``root``) that could not be read
    (``message`` % ``args``): once per file, or once per store where a file stands where its
    folder must (``DNNTUNE_CACHE_DIR`` naming a file: every file under it fails alike), then
    with what to set."""
    if isinstance(exc, NotADirectoryError):
        warn_once(log, str(root), message + CACHE_HINT, *args)
    else:
        warn_once(log, str(path), message, *args)


def warn_once(log: logging.Logger, key: str, message: str, *args: object) -> None:
    """``message`` at WARNING the first time ``key`` (a folder, a file) is named in this
    process, at DEBUG after that: a read-only or full cache, or a file a killed writer left a
    torn line in, fails every lookup or write the same way, and one warning says it."""
    level = logging.DEBUG if (log.name, key) in _WARNED else logging.WARNING
    _WARNED.add((log.name, key))
    log.log(level, message, *args)
