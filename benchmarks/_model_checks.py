"""How ``model_conformance.py`` judges a value: against the exact answer, beside eager PyTorch's
own error (in either memory layout, and over draws in reduced precision), with eager's shape,
dtype and strides."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
from torch import nn

__all__ = ["compare", "compare_draws", "first_wrong_block"]

#: the error every dtype may have, relative to the output's largest magnitude above 1
_FLOOR = {torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}
#: how many times eager PyTorch's own error against the exact answer dnntune's may have
_EAGER_FACTOR = 4.0


def _strides(t: torch.Tensor) -> tuple[int | None, ...]:
    """The strides of the dims with more than one element (the others' are arbitrary)."""
    return tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride(), strict=True))


def compare(
    ours: Any, eager: Any, exact: Any, what: str, also: torch.Tensor | None = None
) -> str | None:
    """Why ``ours`` fails against the exact answer, beside eager's (None: it passes). ``also``:
    eager's answer on the same values in the other memory layout (see :func:`compare_draws`)."""
    return compare_draws([ours], [eager], [exact], what, None if also is None else [also])


def compare_draws(
    ours: list[Any],
    eager: list[Any],
    exact: list[Any],
    what: str,
    also: list[torch.Tensor] | None = None,
) -> str | None:
    """Why ``ours`` fails over draws of one check (None: it passes). Per draw, the largest
    error against the exact answer, and eager's: with ``also`` (eager on the same values in
    the other layout) the larger of eager's two, since PyTorch's own error depends on the
    layout (its CPU float16 matmul was 5x more accurate on a transposed input than on its
    contiguous copy, whose answer dnntune's equalled bit for bit: seeds 9049 and 9132).

    The check passes when the median or the mean over the draws of those errors is at most 4
    times eager's (the same statistic), or within the dtype's floor. One draw is the plain
    rule. Several make a reduced-precision gradient through ReLU gates a fair check
    (``_model_steps.Models.input_grad``): a flipped gate is an error of the gradient's
    own size, in a few draws (the median passes it) or, in a deep network, in about half of
    them for eager and dnntune alike (the mean passes it), while a wrong kernel is wrong on
    every draw and fails both."""
    errors: list[float] = []
    eager_errors: list[float] = []
    floor = 0.0
    for i, (o, e, x) in enumerate(zip(ours, eager, exact, strict=True)):
        if not isinstance(o, torch.Tensor) or not isinstance(e, torch.Tensor):
            return f"{what}: {type(o).__name__} where eager gives {type(e).__name__}"
        if o.shape != e.shape or o.dtype != e.dtype:
            return f"{what}: {tuple(o.shape)} {o.dtype}, eager {tuple(e.shape)} {e.dtype}"
        if o.numel() > 1 and _strides(o) != _strides(e):
            return f"{what}: strides {tuple(o.stride())}, eager's {tuple(e.stride())}"
        if o.numel() == 0:
            continue
        exact64 = x.double()
        errors.append(_error(o, exact64))
        eager_errors.append(_error(e, exact64))
        if also is not None:
            eager_errors[-1] = max(eager_errors[-1], _error(also[i], exact64))
        floor = max(floor, _FLOOR[o.dtype] * max(1.0, exact64.abs().max().item()))
    if not errors:
        return None
    if any(
        stat(errors) <= max(_EAGER_FACTOR * stat(eager_errors), floor) for stat in (_median, _mean)
    ):
        return None  # NaN fails
    err, eager_err = _median(errors), _median(eager_errors)
    allowed = max(_EAGER_FACTOR * eager_err, floor)
    over = ""
    if len(errors) > 1:
        over = (
            f", the median of {len(errors)} draws (mean {_mean(errors):.3g}, eager's "
            f"{_mean(eager_errors):.3g})"
        )
    return (
        f"{what}: error {err:.3g} against the exact answer{over}, {allowed:.3g} allowed "
        f"(eager's {eager_err:.3g}, largest magnitude {floor / _FLOOR[ours[0].dtype]:.3g})"
    )


def _error(t: torch.Tensor, exact64: torch.Tensor) -> float:
    return (t.double() - exact64).abs().max().item()


def _median(values: list[float]) -> float:
    """The median; NaN when any value is NaN (so that a NaN fails the check)."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return statistics.median(values)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def first_wrong_block(
    ours: nn.Module, eager: nn.Module, exact: nn.Module, x: torch.Tensor, depth: int = 2
) -> str | None:
    """The first block, in the order the forward runs them, whose output fails
    :func:`compare` for input ``x``, or None. Blocks are the modules named down to ``depth``
    levels ("features", "features.1"): their outputs are what the optimized model must give
    whatever it fused inside them (a convolution that took its batch norm gives another value
    than the eager convolution, its block the same). Each module's first call counts. Seeds
    21 and 1 of session 36 were taken apart this way by hand."""
    names = [n for n, _ in exact.named_modules() if n and n.count(".") < depth]
    seen: dict[str, dict[str, Any]] = {"ours": {}, "eager": {}, "exact": {}}
    handles = []
    for key, model in (("ours", ours), ("eager", eager), ("exact", exact)):
        modules = dict(model.named_modules())
        for name in names:
            if name in modules:

                def keep(m: nn.Module, i: Any, out: Any, key: str = key, name: str = name) -> None:
                    if isinstance(out, torch.Tensor):
                        seen[key].setdefault(name, out.detach().clone())

                handles.append(modules[name].register_forward_hook(keep))
    try:
        with torch.no_grad():
            exact(x.double().contiguous())
            eager(x)
            ours(x)
    finally:
        for h in handles:
            h.remove()
    for name in seen["exact"]:  # in the order the exact forward ran them
        got, want = seen["ours"].get(name), seen["eager"].get(name)
        if got is None or want is None or got.shape != want.shape:
            continue
        why = compare(got, want, seen["exact"][name], f"block {name}")
        if why is not None:
            return why
    return None
