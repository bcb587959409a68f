"""An optimized model whose shapes keep changing stops tuning the new ones.

With ``policy="tune"`` each new signature a layer sees is tuned on first sight, into the
model's override file. A generation loop gives the attention a key/value length one token
longer at every step: every step is a new signature, and every one was tuned (a 24-token
``generate()`` of a small LLaMA after ``optimize`` ran 31 autotune calls, 4.1 s, on a CPU; on a
GPU a tune takes 0.4-2 s), each once, for a length the next step no longer has, and each
appended to the file: the ``torch.backends.cudnn.benchmark`` trap.

So, as :data:`dnntune.torch.cuda_graphs.DYNAMIC_AFTER` does for recordings: once
:data:`CHANGING_AFTER` forwards of an optimized model in a row have each met a new signature,
its new signatures run PyTorch's own op, untuned and not written to the file (what a tuning
budget that is spent gives them), until :data:`SETTLED_AFTER` forwards in a row bring none (the
shapes have settled: a prompt length served again and again, a batch size). A static model
that meets a new batch size tunes it (one forward with new signatures, then none). Outside an
optimized model's forward (a bare ``dnntune.torch.functional`` call) every new signature is
tuned, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref

from torch import nn

__all__ = [
    "CHANGING_AFTER",
    "SETTLED_AFTER",
    "forget",
    "forward_begins",
    "forward_ends",
    "new_signature",
]

_log = logging.getLogger("dnntune.torch")

#: forwards in a row that each tuned a new signature, after which the model's new signatures
#: are not tuned
CHANGING_AFTER = 3
#: forwards in a row that met no new signature, after which shapes that kept changing have
#: settled: one is not enough, since a generation loop's prompt (a length it has met before)
#: comes between its runs of decode steps, each of which would then tune its first
#: :data:`CHANGING_AFTER` new lengths again
SETTLED_AFTER = 3


class _Watch:
    """One optimized model's count of forwards in a row that met a new signature to tune."""

    __slots__ = ("calm", "in_a_row", "name", "new_now")

    def __init__(self, name: str) -> None:
        self.in_a_row = 0
        #: forwards in a row since the last that met a new signature
        self.calm = 0
        self.new_now = False
        self.name = name


_watches: weakref.WeakKeyDictionary[nn.Module, _Watch] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Active(threading.local):
    """Per thread: the outermost optimized forward running, and how deep inside it."""

    def __init__(self) -> None:
        self.watch: _Watch | None = None
        self.depth = 0


_active = _Active()


def forward_begins(module: nn.Module) -> None:
    """An optimized module's forward begins (the outermost one counts)."""
    state = _active
    state.depth += 1
    if state.depth == 1:
        watch = _watch_of(module)
        if watch is not None:
            watch.new_now = False
        state.watch = watch


def forward_ends() -> None:
    """The forward :func:`forward_begins` began has ended (also when it raised)."""
    state = _active
    state.depth = max(0, state.depth - 1)
    if state.depth or state.watch is None:
        return
    watch, state.watch = state.watch, None
    was_changing = watch.in_a_row >= CHANGING_AFTER
    if watch.new_now:
        watch.in_a_row += 1
        watch.calm = 0
    else:
        watch.calm += 1
        if not was_changing or watch.calm >= SETTLED_AFTER:
            watch.in_a_row = 0
    if watch.new_now and watch.in_a_row == CHANGING_AFTER:
        _log.info(
            "dnntune.torch: %s's shapes keep changing (%d forwards in a row each met a new "
            "signature): its new signatures run PyTorch's op, untuned, until %d forwards in a "
            "row bring none",
            watch.name,
            CHANGING_AFTER,
            SETTLED_AFTER,
        )
    elif was_changing and watch.in_a_row == 0:
        _log.info(
            "dnntune.torch: %s's shapes have settled: new signatures are tuned again", watch.name
        )


def new_signature() -> bool:
    """A new signature that ``policy="tune"`` would tune has come in the current forward;
    whether it may be tuned (not inside the forward of an optimized model whose shapes keep
    changing). Each forward that meets one counts towards :data:`CHANGING_AFTER`,
    tuned or not, so a model stays in that state while its shapes go on changing."""
    watch = _active.watch
    if watch is None:
        return True
    watch.new_now = True
    return watch.in_a_row < CHANGING_AFTER


def forget(module: nn.Module) -> None:
    """Count ``module``'s forwards afresh (``optimize`` ends: its own forwards met the model's
    first signatures)."""
    with _lock, contextlib.suppress(TypeError):
        _watches.pop(module, None)


def _watch_of(module: nn.Module) -> _Watch | None:
    """``module``'s watch, made on its first forward; None for a module that cannot be a weak
    dictionary's key (a class that defines ``__eq__`` without ``__hash__``): its new signatures
    are tuned as before."""
    try:
        watch = _watches.get(module)  # (a replay's host path: no lock where it is known)
        if watch is None:
            with _lock:
                watch = _watches.setdefault(module, _Watch(type(module).__name__))
    except TypeError:
        return None
    return watch
