"""What dnntune keeps in its cache folder, and clearing it (``dnntune cache show | clear``).

Only dnntune's own folders under ``$DNNTUNE_CACHE_DIR`` (:data:`PARTS`) are looked at, and in
them only the files dnntune writes: anything else there (a file of the user's, a link, an
``.unsaved-`` copy that is the only one of what a failed write held) is listed and kept. A clear
removes the data files (records, plans, kernels, helpers, corrupt copies moved aside) and the
temporary files and build folders of writers that are no longer running; it keeps:

- the files another process is writing: a file whose lock (``.<file>.lock`` or
  ``<file>.lock``, the ``filelock`` its writers take) is held is left, and said; a clear
  takes each lock without waiting and removes the file under it;
- the lock files themselves (deleting one while a process waits on it would let two writers
  in; they are empty), and so the folders that hold them;
- a running writer's temporary files.

Every file is its own step: one that cannot be removed (a read-only folder) is reported with the
reason and the rest go on; nothing is moved or rewritten, so a failed clear loses nothing but
what it removed, which is cache.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from dnntune._cache_versions import BESIDE, KINDS, VERSION_NAME
from dnntune._temp_files import remove_aged, remove_stale
from dnntune._version import __version__

__all__ = ["PARTS", "Cleared", "Part", "check_root", "clear", "parts"]

#: dnntune's folders in the cache folder: the files each writes (its temporary files, locks and
#: corrupt copies included), and whether it keeps a folder per dnntune version
PARTS: dict[str, tuple[re.Pattern[str], bool]] = {
    **{name: (files, True) for name, files in KINDS.items()},
    "triton-perf-db": (re.compile(rf"\.?[^/]+\.jsonl{BESIDE}"), False),
    "triton-kernels": (re.compile(r"\.?[A-Za-z0-9_]+\.py(?:\..*\.tmp|[a-z0-9_]{8}\.tmp)?"), False),
    # a helper (``<name><extension suffix>``), its build folders (named after their writer, or
    # ``tmp<random>`` of earlier versions)
    "native": (
        re.compile(r"\.?[A-Za-z0-9_]+(?:\.[A-Za-z0-9_-]+)*\.so(?:\..*\.tmpdir)?|tmp[a-z0-9_]{8}"),
        False,
    ),
}
#: a temporary file or build folder (of a writer named in it, or of earlier versions): removed by
#: the rules of :mod:`dnntune._temp_files` only, never by a clear as such
_TEMP = re.compile(r"\..*\.(?:tmp|probe|tmpdir)|\.plan-[a-z0-9_]{8}|.*\.py[a-z0-9_]{8}\.tmp")
_LEGACY_BUILD = re.compile(r"tmp[a-z0-9_]{8}")
#: the file a temporary file named after its writer stands in for
_TARGET = re.compile(r"\.(?P<target>.+?\.(?:jsonl|plan|py|so))\..+\.(?:tmp|probe|tmpdir)")


@dataclass
class Part:
    """One of dnntune's folders as it is now."""

    name: str
    path: Path
    versions: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    #: what is in it that dnntune did not write (kept by a clear)
    foreign: list[Path] = field(default_factory=list)


@dataclass
class Cleared:
    """What a clear did."""

    removed: list[Path] = field(default_factory=list)
    freed: int = 0
    #: files another process holds the lock of: kept
    in_use: list[Path] = field(default_factory=list)
    #: files that could not be removed, and why
    failed: list[tuple[Path, OSError]] = field(default_factory=list)
    #: what dnntune did not write: kept
    foreign: list[Path] = field(default_factory=list)


def check_root(root: Path) -> bool:
    """Whether ``root`` exists (False: there is nothing to show or clear).

    Raises:
        NotADirectoryError: ``root``, or a folder above it, is a file.
        OSError: it cannot be looked at (no permission on a folder above it).
    """
    try:
        st = root.stat()
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        raise NotADirectoryError(errno.ENOTDIR, "a file stands above it", str(root)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a folder", str(root))
    return True


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _folders(root: Path, name: str, versioned: bool, foreign: list[Path]) -> list[Path]:
    """The folders of part ``name`` that hold its files: itself, or its version folders."""
    top = root / name
    if top.is_symlink() or (top.exists() and not top.is_dir()):
        foreign.append(top)
        return []
    if not top.is_dir():
        return []
    if not versioned:
        return [top]
    out = []
    for entry in _listing(top):
        if VERSION_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            out.append(Path(entry.path))
        elif not _TEMP.fullmatch(entry.name):  # a version folder's removal: its own rules
            foreign.append(Path(entry.path))
    return out


def _data(folder: Path, files: re.Pattern[str], foreign: list[Path]) -> list[os.DirEntry[str]]:
    """The data files in ``folder``; what is there that dnntune did not write goes to
    ``foreign`` (locks and temporary files go to neither)."""
    out = []
    for entry in _listing(folder):
        if not files.fullmatch(entry.name) or entry.is_symlink():
            foreign.append(Path(entry.path))
        elif entry.name.endswith(".lock") or _TEMP.fullmatch(entry.name):
            continue  # a lock stays; a temporary file goes by its writer's rules
        elif _LEGACY_BUILD.fullmatch(entry.name):  # an earlier version's build folder: by age
            continue
        elif entry.is_file(follow_symlinks=False):
            out.append(entry)
        else:
            foreign.append(Path(entry.path))  # a folder named like a data file
    return out


def parts(root: Path) -> list[Part]:
    """dnntune's folders under ``root`` that exist, with their data files' count and size.

    Raises:
        NotADirectoryError, OSError: as :func:`check_root`.
    """
    if not check_root(root):
        return []
    out = []
    for name, (files, versioned) in PARTS.items():
        part = Part(name, root / name)
        folders = _folders(root, name, versioned, part.foreign)
        if not os.path.lexists(part.path):
            continue
        for folder in folders:
            if versioned:
                part.versions.append(folder.name)
            for entry in _data(folder, files, part.foreign):
                part.files += 1
                part.bytes += entry.stat(follow_symlinks=False).st_size
        out.append(part)
    return out


def _locks(path: Path) -> list[Path]:
    return [p for p in (path.with_name(f".{path.name}.lock"), Path(f"{path}.lock")) if p.exists()]


def _remove(path: Path, size: int, done: Cleared) -> None:
    """Remove one data file under its locks, taken without waiting (a held one keeps it)."""
    from filelock import FileLock, Timeout

    try:
        with contextlib.ExitStack() as held:
            for lock in _locks(path):
                try:
                    held.enter_context(FileLock(str(lock), timeout=0))
                except Timeout:
                    done.in_use.append(path)
                    return
            path.unlink()
    except FileNotFoundError:  # removed meanwhile (by its writer, or another clear)
        return
    except OSError as exc:
        done.failed.append((path, exc))
        return
    done.removed.append(path)
    done.freed += size


def clear(root: Path, other_versions: bool = False) -> Cleared:
    """Remove dnntune's cache files under ``root`` (the rules are in this module's docstring):
    every part's, or (``other_versions``) only those in the folders of other dnntune versions.

    Raises:
        NotADirectoryError, OSError: as :func:`check_root`.
    """
    done = Cleared()
    if not check_root(root):
        return done
    for name, (files, versioned) in PARTS.items():
        if other_versions and not versioned:
            continue
        for folder in _folders(root, name, versioned, done.foreign):
            if other_versions and folder.name == __version__:
                continue
            for entry in _data(folder, files, done.foreign):
                _remove(Path(entry.path), entry.stat(follow_symlinks=False).st_size, done)
            # what writers killed mid-write left (a running writer's stays)
            for target in {
                m.group("target") for e in _listing(folder) if (m := _TARGET.fullmatch(e.name))
            }:
                remove_stale(folder / target)
            remove_aged(folder, _LEGACY_BUILD, folders=True)
            if versioned:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # emptied, with no lock file left in it
    return done
