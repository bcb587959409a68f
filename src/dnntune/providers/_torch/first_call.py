"""Which of a plan's arguments will require grad on its first real call, for the trial run.

``torch.compile`` guards every argument's ``requires_grad``, also under ``no_grad``. Its plans
are compiled by a trial run on dummy tensors (:func:`~.program.dummy_args`), none of which
required grad; a layer's first real call then passed its ``nn.Parameter`` (``requires_grad``
True), failed the guard and compiled the plan again: two Inductor compiles per weighted layer in
``optimize``'s tunes (seconds each on a fresh cache, on the CPU most of a small model's tuning),
the first one's code never run again. A caller that holds the call's tensors while plans are
built for them (``dnntune.torch``'s runtime) says which uids require grad
(:func:`arguments_requiring_grad`), and the dummies copy it (:func:`like_first_call`).
Without it the dummies are as before. Only the flag is copied; values stay the dummies'.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["arguments_requiring_grad", "like_first_call"]

_requiring_grad: ContextVar[frozenset[int]] = ContextVar(
    "dnntune_first_call_requiring_grad", default=frozenset()
)


@contextmanager
def arguments_requiring_grad(uids: Iterable[int]) -> Iterator[None]:
    """While the ``with`` block builds plans for one graph's call, the tensors of ``uids``
    require grad on that call."""
    token = _requiring_grad.set(frozenset(uids))
    try:
        yield
    finally:
        _requiring_grad.reset(token)


def like_first_call(uids: Sequence[int], args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``args`` (dummies for ``uids``, in order) with ``requires_grad`` set where the first
    real call's tensor requires grad (floating tensors only: others cannot)."""
    flagged = _requiring_grad.get()
    return [
        t.requires_grad_(True) if uid in flagged and t.is_floating_point() else t
        for uid, t in zip(uids, args, strict=True)
    ]
