"""The temporary files of atomic writes: named after their writer, and removed once stale.

An atomic write (:func:`dnntune.overrides.store.atomic_write_text`) puts the new content in a
hidden file beside its target, ``.<name>.<owner>-<pid>.<random>.tmp``, and renames it over the
target. A writer killed between the two (``kill -9``, the OOM killer, a power cut) leaves that
file behind, and nothing removed it: every such crash added one beside the override file or
the cache file. Each later write of the same target now removes them first (:func:`remove_stale`):

- a temporary file of a process of this machine that is no longer running: its name says
  which process (``pid``) of which machine and process namespace (``owner``, a hash of the host
  name, its boot id and the pid namespace: on a shared file system another machine's pid says
  nothing about this one's processes);
- any other (another machine's or container's, or one named before the owner was part of the
  name) once it is :data:`STALE_AGE_S` old.

A temporary file of a process that is still running is never removed, however old: it may be
mid-write (a writer suspended with Ctrl-Z, a slow network file system), and its rename would
fail. A pid that was reused since its writer died keeps that file until the new process ends:
the safe side. The probes of :func:`~dnntune.overrides.store.check_writable` are named, and
removed, the same way.

A process's private folders in the system temp dir (:func:`private_dir`: generated Triton
kernels where the cache folder is off or unsafe, a compiled helper's build there) are named
``dnntune-<kind>-<owner>-<pid>-<random>`` and removed when the process ends; one killed by
``kill -9`` left its folder for good. The next process that makes one of that kind removes those
of its kind (:func:`remove_stale_private`): a dead process of this machine's at once, any other
(another container sharing the temp dir; one named before the owner was part of the name) once
nothing in it changed for :data:`PRIVATE_STALE_AGE_S`; only real folders of this user's, never
one of a running process.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "PRIVATE_STALE_AGE_S",
    "STALE_AGE_S",
    "make_temp",
    "make_temp_dir",
    "private_dir",
    "remove_aged",
    "remove_stale",
    "remove_stale_private",
]

_log = logging.getLogger(__name__)

#: how old (by its last change) a temporary file of an unknown writer must be to be removed
STALE_AGE_S = 24 * 3600.0
#: how long nothing in a private folder of an unknown process must have changed for it to be
#: removed: such a folder lives as long as its process (kernels are added to it as they are met),
#: so longer than a write's file; systemd's cleaning of /tmp waits as long
PRIVATE_STALE_AGE_S = 10 * 24 * 3600.0

#: what follows ``.<name>.`` in a temporary file's name: ``<owner>-<pid>.`` (absent in names
#: written before it was added) and mkstemp's eight random characters, then the suffix
_REST = re.compile(
    r"(?:(?P<owner>[0-9a-f]{8})-(?P<pid>[0-9]+)\.)?[a-z0-9_]{8}\.(?:tmp|probe|(?P<dir>tmpdir))"
)


@functools.cache
def _owner() -> str:
    """This machine and process namespace, as eight hex digits."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):  # Linux: the boot (another machine, or a reboot)
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):  # Linux: the pid namespace (another container)
        parts.append(os.readlink("/proc/self/ns/pid"))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


def make_temp(path: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """Create ``.<name>.<owner>-<pid>.<random><suffix>`` beside ``path`` (``tempfile.mkstemp``:
    an open descriptor and the name). A name too long for the file system with the owner in it
    drops the owner (such a file is removed by age only).

    Raises:
        OSError: as ``tempfile.mkstemp``.
    """
    try:
        return tempfile.mkstemp(
            prefix=f".{path.name}.{_owner()}-{os.getpid()}.", suffix=suffix, dir=path.parent
        )
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)


def make_temp_dir(path: Path) -> str:
    """Create the folder ``.<name>.<owner>-<pid>.<random>.tmpdir`` beside ``path``, for a
    result that takes several files to make (a compiled helper: its source and the build),
    renamed into place from there; its name. Removed, with what is in it, under the rules of
    the temporary files.

    Raises:
        OSError: as ``tempfile.mkdtemp``.
    """
    try:
        return tempfile.mkdtemp(
            prefix=f".{path.name}.{_owner()}-{os.getpid()}.", suffix=".tmpdir", dir=path.parent
        )
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    return tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmpdir", dir=path.parent)


def _remove(entry: os.DirEntry[str], folder_too: bool) -> bool:
    """Remove a file, or (``folder_too``) a real folder with its contents; whether it was one
    of those (a symbolic link is neither)."""
    if entry.is_file(follow_symlinks=False):
        os.unlink(entry.path)
        return True
    if folder_too and entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path)
        return True
    return False


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts, and so does any doubt)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's (EPERM), or unknown: keep its file
        return True
    return True


def _stale(rest: re.Match[str], mtime: float, now: float) -> bool:
    owner, pid = rest.group("owner"), rest.group("pid")
    if owner == _owner() and pid is not None:
        return not _running(int(pid))
    return now - mtime > STALE_AGE_S


def remove_stale(path: Path) -> list[Path]:
    """Remove the temporary files beside ``path`` that writers killed mid-write left (the
    rules are in this module's docstring); the ones removed. Never raises: what cannot be
    listed or removed stays, for a later write."""
    head = f".{path.name}."
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(head):
            continue
        rest = _REST.fullmatch(entry.name, len(head))
        if rest is None:
            continue
        try:
            if not _stale(rest, entry.stat(follow_symlinks=False).st_mtime, now):
                continue
            if not _remove(entry, folder_too=rest.group("dir") is not None):
                continue
        except OSError:  # gone already (another writer removed it), or not ours to remove
            continue
        removed.append(Path(entry.path))
        _log.debug("removed %s, left by a writer that stopped mid-write", entry.path)
    return removed


def remove_aged(
    folder: Path,
    pattern: re.Pattern[str],
    *,
    folders: bool = False,
    age_s: float = STALE_AGE_S,
) -> list[Path]:
    """Remove the files (``folders``: and folders, with their contents) in ``folder`` whose
    whole name matches ``pattern`` and that are ``age_s`` old (by their last change): the
    temporary files of writers that did not name themselves (those of earlier versions), which
    no one can tell apart from a running writer's but by age, or cache files no one has used for
    that long. The ones removed; never raises."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime <= age_s:
                continue
            if not _remove(entry, folders):
                continue
        except OSError:
            continue
        removed.append(Path(entry.path))
        _log.debug("removed %s, %.0f days old", entry.path, age_s / 86400)
    return removed


@contextlib.contextmanager
def private_dir(kind: str) -> Iterator[Path]:
    """A new folder of this process's, ``dnntune-<kind>-<owner>-<pid>-<random>`` in the system
    temp dir (``tempfile.mkdtemp``: mode 0700), removed with its contents when the block ends;
    the stale ones of ``kind`` that killed processes left are removed first
    (:func:`remove_stale_private`)."""
    path = make_private_dir(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_private_dir(kind: str) -> Path:
    """:func:`private_dir`'s folder, for a caller that removes it itself (at exit)."""
    remove_stale_private(kind)
    return Path(tempfile.mkdtemp(prefix=f"dnntune-{kind}-{_owner()}-{os.getpid()}-"))


def _newest_change(path: str, st: os.stat_result) -> float:
    newest = st.st_mtime
    with contextlib.suppress(OSError), os.scandir(path) as listing:
        for entry in listing:
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def remove_stale_private(kind: str, age_s: float = PRIVATE_STALE_AGE_S) -> list[Path]:
    """Remove the private folders of ``kind`` in the system temp dir that processes killed
    before their end left (the rules are in this module's docstring); the ones removed. Never
    raises."""
    pattern = re.compile(
        rf"dnntune-{re.escape(kind)}-(?:(?P<owner>[0-9a-f]{{8}})-(?P<pid>[0-9]+)-)?[a-z0-9_]{{8}}"
    )
    folder = tempfile.gettempdir()
    removed: list[Path] = []
    now = time.time()
    try:
        with os.scandir(folder) as listing:
            entries = [e for e in listing if pattern.fullmatch(e.name)]
    except OSError:
        return removed
    for entry in entries:
        name = pattern.fullmatch(entry.name)
        assert name is not None
        owner, pid = name.group("owner"), name.group("pid")
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():  # a link, another's
                continue
            if owner == _owner() and pid is not None:
                if _running(int(pid)):
                    continue
            elif now - _newest_change(entry.path, st) <= age_s:
                continue
            shutil.rmtree(entry.path)
        except OSError:  # gone already (its process ended meanwhile), or not ours to remove
            continue
        removed.append(Path(entry.path))
        _log.debug("removed %s, left by a process that was killed", entry.path)
    return removed
