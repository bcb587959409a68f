"""The end-to-end check of ``optimize``: the model's forward before and after, side by side.

Per-layer winners are chosen on per-layer clocks; what the user gets is the whole forward,
where host work and kernels of neighbouring layers overlap (or do not). So with example inputs,
``optimize`` times the eager forward before it changes anything and the optimized forward at
the end, the same way (wall time of back-to-back calls, synchronized once per round: what a
serving loop sees), reports both and warns when the optimized model is slower. The host clock,
the sampling and the median are :mod:`dnntune.measure`'s.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dnntune.measure import host_ms, median, repeats_for, steady_samples
from dnntune.torch._example import Example, as_example

__all__ = [
    "DnnTuneSlowerWarning",
    "forward_ms",
    "interleaved_forward_ms",
    "side_by_side_ms",
    "warn_if_slower",
]

#: rounds of back-to-back forwards; the median round is the result
ROUNDS = 3
#: forwards per round: enough for a round to take about ROUND_MS, within these bounds
ROUND_MS = 20.0
MIN_CALLS, MAX_CALLS = 1, 50
#: slower than eager by more than this (timing noise) is reported
TOLERANCE = 0.02
#: rounds of the side-by-side re-time (each times both forwards, in alternating order)
PAIRED_ROUNDS = 5


class DnnTuneSlowerWarning(UserWarning):
    """The optimized model's forward measured slower than PyTorch's own."""


def _synchronizer(example: Example) -> Callable[[], None]:
    """What ends a timed call: a synchronize of the device of the example's first CUDA tensor
    (found once, not by walking the example on every call inside the clock), else nothing."""
    device = next((t.device for t in example.tensors() if t.is_cuda), None)
    if device is None:
        return lambda: None
    return functools.partial(torch.cuda.synchronize, device)


def forward_ms(module: nn.Module, inputs: Example | Sequence[Any]) -> float:
    """Median per-forward milliseconds of ``module(*inputs)`` (or of an :class:`Example`'s
    call, keyword arguments included) under ``no_grad``."""
    example = as_example(inputs)
    synchronize = _synchronizer(example)

    def one_call() -> None:
        example(module)
        synchronize()

    with torch.no_grad():
        one_call()  # warm: lazy builds, allocator, CUDA-graph capture
        calls = repeats_for(host_ms(one_call), ROUND_MS, lo=MIN_CALLS, hi=MAX_CALLS)

        def calls_then_sync() -> None:
            for _ in range(calls):
                example(module)
            synchronize()

        rounds = steady_samples(lambda: host_ms(calls_then_sync) / calls, ROUNDS)
    return median(rounds.samples_ms)


def interleaved_forward_ms(
    module: nn.Module,
    inputs: Example | Sequence[Any],
    to_eager: Callable[[], None],
    to_optimized: Callable[[], None],
    rounds: int = PAIRED_ROUNDS,
) -> tuple[float, float]:
    """Per-forward milliseconds of ``module``'s eager and optimized forwards, timed side by
    side: ``rounds`` rounds, each one of back-to-back calls of either (in alternating order,
    ``to_eager`` and ``to_optimized`` switching the module between them outside the clock).

    Timed before and after ``optimize`` changed the model, the two figures are minutes apart:
    for a forward bound by its host work the process's state in between (allocator, caches,
    the tuner's own objects) moved them by 20-40% on the H200 (session 9), in both directions,
    and "auto" and ``revert_if_slower`` decided on that noise. Side by side, both read the same
    conditions. The module is left optimized. Medians over the rounds: (eager, optimized).
    """
    eager_ms, optimized_ms = side_by_side_ms(
        module, inputs, (to_eager, to_optimized), to_optimized, rounds
    )
    return eager_ms, optimized_ms


def side_by_side_ms(
    module: nn.Module,
    inputs: Example | Sequence[Any],
    switches: Sequence[Callable[[], None]],
    end: Callable[[], None],
    rounds: int = PAIRED_ROUNDS,
) -> list[float]:
    """Per-forward milliseconds of each form of ``module`` that ``switches`` puts it in, timed
    side by side: ``rounds`` rounds, each one burst of back-to-back calls of every form (the
    order alternating, and rotating when there are more than two), switched between bursts,
    outside the clock. ``end`` runs last, also when a forward raises. Medians over the rounds,
    in the order of ``switches``."""
    runs: list[tuple[Callable[[], None], list[float]]] = [(switch, []) for switch in switches]
    example = as_example(inputs)
    synchronize = _synchronizer(example)

    def one_call() -> None:
        example(module)
        synchronize()

    with torch.no_grad():
        try:
            per_call: list[float] = []
            for switch, _ in runs:
                switch()
                one_call()  # warm: lazy builds, allocator
                per_call.append(host_ms(one_call))
            calls = repeats_for(min(per_call), ROUND_MS, lo=MIN_CALLS, hi=MAX_CALLS)

            def calls_then_sync() -> None:
                for _ in range(calls):
                    example(module)
                synchronize()

            for r in range(rounds):
                order = runs if r % 2 else runs[::-1]
                if len(order) > 2:
                    shift = (r // 2) % len(order)
                    order = order[shift:] + order[:shift]
                for switch, samples in order:
                    switch()
                    samples.append(host_ms(calls_then_sync) / calls)
        finally:
            end()
    return [median(samples) for _, samples in runs]


def is_slower(eager_ms: float, optimized_ms: float) -> bool:
    """The optimized forward is slower than eager beyond timing noise (TOLERANCE)."""
    return optimized_ms > eager_ms * (1.0 + TOLERANCE)


def warn_if_slower(
    eager_ms: float,
    optimized_ms: float,
    cuda_graph: bool,
    reverted: bool = False,
    on_cuda: bool = True,
) -> None:
    """Warn when the optimized forward is slower than eager beyond timing noise (and say so
    when ``optimize`` reverted the model to PyTorch's own forward because of it). ``on_cuda``:
    the model runs on a GPU, where a CUDA-graph replay is the way out of host-bound layers
    (there is none on the CPU: the advice there is the defaults that keep PyTorch's ops)."""
    if not is_slower(eager_ms, optimized_ms):
        return
    if cuda_graph:
        advice = "compare the per-layer plans in the report with PyTorch's"
    elif on_cuda:
        advice = (
            "the per-layer host work dominates at this size; optimize(..., cuda_graph=True) "
            "replays the forward without it"
        )
    else:
        advice = (
            "optimize's defaults (refine=True, revert_if_slower=True) keep PyTorch's own ops "
            "where they are faster"
        )
    if reverted:
        advice = f"so the model was reverted and runs PyTorch's own forward ({advice})"
    warnings.warn(
        f"dnntune.torch.optimize: the optimized forward took {optimized_ms:.3f} ms against "
        f"PyTorch's {eager_ms:.3f} ms ({eager_ms / optimized_ms:.2f}x) on the example inputs; "
        f"{advice}",
        DnnTuneSlowerWarning,
        stacklevel=3,
    )
