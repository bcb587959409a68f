"""Override files read once per state of the file, per process.

The Config policy and ``dnntune.torch`` ask the override file about every graph they plan,
so without a cache ``dnntune.torch``'s first call of each new shape paid a full read and
parse (new-user audit: 44 ms per new shape with a 91-entry file on a busy CPU). A parsed file
is kept under its path (as given and resolved) together with the file's state when it was
read: device, inode, size, and modification and change times in nanoseconds. Each read
checks that state first (one ``stat``), so an edit, a replace-by-rename (a new inode), a
``chmod`` (a new change time) or a deletion is seen on the next read, as before the cache.

Timestamps are coarse (a clock tick on Linux, a second or two on some filesystems), so two
writes of the same size within one tick would look the same (git's "racily clean" files). A
file modified less than :data:`RACY_WINDOW_NS` before it was read is therefore not kept: it is
parsed again on each read until it is older. Nothing else is kept either: a path that cannot
be resolved or ``stat``-ed (a missing file, a permission error), a directory and any file
that fails to read or parse go to :func:`~dnntune.overrides.format.load_file` on every read,
so their errors and warnings are exactly what they were, and a file fixed later is read as
soon as it is fixed. Anything else that is not a regular file (a FIFO, a pipe, a socket, a
device) is refused without reading it: a FIFO no process writes to would block the read
forever, and a pipe holds the file once, not on every read.

The parsed :class:`~dnntune.overrides.format.OverrideFile` is shared by every reader of that
state of the file: treat it as read-only (:func:`~dnntune.overrides.policy.match_override_file`
hands its callers copies of what they may change).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path

from dnntune.errors import ConfigFileError
from dnntune.overrides import format as _format
from dnntune.overrides.format import OverrideFile

__all__ = ["RACY_WINDOW_NS", "clear", "load_file_cached"]

#: a file modified this recently (or in the future: clock skew on a network filesystem) is
#: parsed on every read; 2 s covers the coarsest common timestamps (FAT's two seconds)
RACY_WINDOW_NS = 2_000_000_000
#: files kept at once (the least recently read goes first): a process reads one or two
_MAX_FILES = 16

#: (device, inode, size, mtime_ns, ctime_ns)
_State = tuple[int, int, int, int, int]
_Key = tuple[str, str]  # (path as given, resolved path)

_lock = threading.Lock()
_files: OrderedDict[_Key, tuple[_State, OverrideFile]] = OrderedDict()


def load_file_cached(path: str | Path) -> OverrideFile:
    """:func:`~dnntune.overrides.format.load_file`, parsed once per state of the file.

    Returns a shared object: read it, do not change it.

    Raises:
        ConfigFileError: as :func:`~dnntune.overrides.format.load_file`, on every read of a
            file that cannot be read or parsed, and for a path that is neither a regular file
            nor a directory (a FIFO, a pipe, a device).
    """
    p = Path(path)
    now_ns = time.time_ns()  # before the stat: see _trusted
    try:
        key: _Key = (str(p), str(p.resolve()))
        st = os.stat(p)  # the file itself (a pipe in /dev/fd resolves to no path)
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a NUL in the name
        return _format.load_file(p)  # its error, exactly as without the cache
    if stat.S_ISDIR(st.st_mode):
        return _format.load_file(p)  # "cannot read: Is a directory"
    if not stat.S_ISREG(st.st_mode):
        # a FIFO blocked this read until some process wrote to it (forever: a hung run), and
        # a pipe (`<(cat overrides.json)`) was read whole once, then was empty
        raise ConfigFileError(
            f"{p}: not a regular file (a pipe, socket or device); an override file is read "
            "again whenever it is looked at: write it to a file and name that"
        )
    state: _State = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _lock:
        kept = _files.get(key)
        if kept is not None and kept[0] == state:
            _files.move_to_end(key)
            return kept[1]
        _files.pop(key, None)
    # parsed outside the lock (a benign race: two threads may both parse the same state).
    # The state was taken before the read, so a write in between leaves newer content under
    # an older state, which the next read's stat tells apart: never a stale file.
    config = _format.load_file(p)
    if _trusted(st.st_mtime_ns, now_ns):
        with _lock:
            _files[key] = (state, config)
            _files.move_to_end(key)
            while len(_files) > _MAX_FILES:
                _files.popitem(last=False)
    return config


def _trusted(mtime_ns: int, now_ns: int) -> bool:
    """Whether a file last modified at ``mtime_ns`` may be kept: any later write gets a
    modification time at least ``now_ns`` less one timestamp tick, which differs from
    ``mtime_ns`` only if the file was older than a tick when it was read."""
    return now_ns - mtime_ns > RACY_WINDOW_NS


def clear() -> None:
    """Forget every kept file (tests; a process never needs it)."""
    with _lock:
        _files.clear()
