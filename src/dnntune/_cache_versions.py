"""The cache folders of other dnntune versions: removed once no process has used them for 30 days.

Three caches keep a folder per dnntune version under ``$DNNTUNE_CACHE_DIR``
(``autotune-rankings/<version>``, ``cudnn-find-db/<version>``, ``cudnn-plans/<version>``): a
version reads only its own, so after an upgrade the old one is never read again by the new
version, and each upgrade left one more for good. The first write of a process to one of those
caches (:func:`sweep_once`) removes the folders of other versions that are unused:

- only under those three names in the cache folder, and only a folder named like a version
  (``0.1.0``, ``1.2rc1``, ``0.3.0.dev4+g12ab``) that is not this version's, a real folder (not
  a link) of this user's;
- only a folder that holds nothing but that cache's own files (records, their ``.lock`` files,
  temporary files, corrupt copies moved aside): a folder with anything else in it (a file of the
  user's, a subfolder, a link, a ``.unsaved-`` copy, the only one of what a failed write held)
  is left as it is;
- only when neither it nor any file in it was changed or read (modification and access time)
  for :data:`UNUSED_VERSION_AGE_S`: a process of that version still running in another
  environment that shares the cache folder keeps it (a plan load marks its file; where the file
  system keeps access times, so does a ranking read);
- only while none of its lock files is held: each is taken without waiting (``filelock``, the
  lock that version's writers take) and the folder is checked again under them; a held one
  keeps the folder for a later process.

The folder is first renamed into a hidden folder beside it named after this process
(:func:`dnntune._temp_files.make_temp_dir`), then deleted: a process of that version that
opens it afterwards finds no folder (a miss) instead of half of one, and a removal killed
midway leaves a name the next sweep removes (:func:`dnntune._temp_files.remove_stale`). Each
removal is logged at INFO level (``dnntune -v``); nothing is said otherwise. Every failure is
silent and leaves the folder for a later process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

from dnntune import settings
from dnntune._temp_files import make_temp_dir, remove_stale
from dnntune._version import __version__

__all__ = [
    "BESIDE",
    "KINDS",
    "UNUSED_VERSION_AGE_S",
    "VERSION_NAME",
    "remove_unused_versions",
    "sweep_once",
]

_log = logging.getLogger(__name__)

#: a folder of another version that no process has used for this long is removed
UNUSED_VERSION_AGE_S = 30 * 24 * 3600.0

#: a version as dnntune's are written (PEP 440: release, pre, post, dev, local)
_VERSION = r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?" + (
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?"
)
VERSION_NAME = re.compile(_VERSION, re.IGNORECASE)
#: what an atomic write, an append or a writability check adds beside a cache file (a
#: temporary file or probe, named after its writer or not), its lock, or a corrupt copy
BESIDE = r"(?:\.lock|\..*\.(?:tmp|probe)|\.corrupt-[0-9]+(?:-[0-9]+)?)?"
#: the files each versioned cache keeps in its version's folder
KINDS: dict[str, re.Pattern[str]] = {
    "autotune-rankings": re.compile(rf"\.?[^/]+\.jsonl{BESIDE}"),
    "cudnn-find-db": re.compile(rf"\.?[^/]+\.jsonl{BESIDE}"),
    # a plan's file (the key's digest), and the ``.plan-<random>`` of earlier versions' stores
    "cudnn-plans": re.compile(rf"\.?[0-9a-f]{{40}}\.plan{BESIDE}|\.plan-[a-z0-9_]{{8}}"),
}
#: a removal's hidden folder (:func:`make_temp_dir` beside the version's folder)
_REMOVING = re.compile(rf"\.(?P<version>{_VERSION})\..+\.tmpdir", re.IGNORECASE)

_lock = threading.Lock()
_swept: set[str] = set()


def sweep_once() -> list[Path]:
    """:func:`remove_unused_versions` of this process's cache folder, the first time it is
    called for that folder (a write to a versioned cache calls it); the folders removed."""
    if settings.cache_disabled():
        return []
    root = settings.cache_dir()
    with _lock:
        if str(root) in _swept:
            return []
        _swept.add(str(root))
    return remove_unused_versions(root)


def remove_unused_versions(
    root: Path, *, current: str = __version__, age_s: float = UNUSED_VERSION_AGE_S
) -> list[Path]:
    """Remove the folders of versions other than ``current`` under ``root`` that no process has
    used for ``age_s`` (the rules are in this module's docstring); the ones removed. Never
    raises."""
    removed: list[Path] = []
    now = time.time()
    for kind, files in KINDS.items():
        parent = root / kind
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            leftover = _REMOVING.fullmatch(entry.name)
            if leftover is not None:  # a removal killed midway: its writer's rules apply
                remove_stale(parent / leftover.group("version"))
                continue
            if entry.name == current or not VERSION_NAME.fullmatch(entry.name):
                continue
            folder = Path(entry.path)
            try:
                if _remove(folder, files, now, age_s):
                    removed.append(folder)
                    _log.info(
                        "dnntune: removed %s, the cache of dnntune %s, unused for %.0f days",
                        folder,
                        entry.name,
                        age_s / 86400,
                    )
            except OSError as exc:  # not ours to remove, or gone already
                _log.debug("dnntune: %s kept: %s", folder, exc)
    return removed


def _unused(folder: Path, files: re.Pattern[str], now: float, age_s: float) -> list[str] | None:
    """The names in ``folder`` if it is a real folder of this user's holding only ``files`` and
    none of it was used for ``age_s``; else None."""
    st = folder.stat(follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():  # a link is not a folder
        return None
    newest = st.st_mtime
    names: list[str] = []
    with os.scandir(folder) as listing:
        entries = list(listing)
    for entry in entries:
        if not files.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
            _log.debug("dnntune: %s kept: %s is not its cache's", folder, entry.name)
            return None
        est = entry.stat(follow_symlinks=False)
        newest = max(newest, est.st_mtime, est.st_atime)
        names.append(entry.name)
    return names if now - newest > age_s else None


def _remove(folder: Path, files: re.Pattern[str], now: float, age_s: float) -> bool:
    from filelock import FileLock, Timeout

    names = _unused(folder, files, now, age_s)
    if names is None:
        return False
    with contextlib.ExitStack() as held:
        for name in names:
            if name.endswith(".lock"):
                try:
                    held.enter_context(FileLock(str(folder / name), timeout=0))
                except Timeout:
                    _log.debug("dnntune: %s kept: %s is held", folder, name)
                    return False
        # a writer may have finished while the locks were taken
        if _unused(folder, files, now, age_s) is None:
            return False
        trash = Path(make_temp_dir(folder))
        try:
            os.rename(folder, trash / folder.name)
        except OSError:
            os.rmdir(trash)
            raise
    shutil.rmtree(trash, ignore_errors=True)
    return True
