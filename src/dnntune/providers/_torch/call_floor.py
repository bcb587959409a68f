"""The least wall time any call of a ``torch.compile``'d function takes here (its floor).

Every call of a compiled function runs Dynamo's guards and its transformed frame before the
compiled code, whatever that code does. :func:`dynamo_floor_ms` measures that part alone: a
one-tensor function compiled with a backend whose compiled code returns its first output
(no kernel, no Inductor), timed by the wall clock. A TORCH_COMPILE_ENGINE plan pays more (its
guards cover every input and the interpreter's closure, then Inductor's wrapper and kernels
run), so its call takes at least this long: a lower bound measured, not a guess.

Measured once per process and device, in about 0.1-0.5 s (the first Dynamo trace of a process
is the dear part; an Inductor compile of one layer took 1-2.5 s on the CPU, and the first one
of a process 10-19 s with cold caches, session 62). On this 2-core CPU it read 28-72 us while
the TORCH_ENGINE plans of tiny_cnn's and tiny_mlp's linear layers took 11-22 us and their
TORCH_COMPILE_ENGINE plans 91-140 us.
"""

from __future__ import annotations

import functools
import logging
import time
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["dynamo_floor_ms"]

_log = logging.getLogger(__name__)

#: calls per timed repeat, and repeats (the floor is the fastest repeat's mean call)
_CALLS = 100
_REPEATS = 5
_WARMUP = 10


def _probe(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _returns_first_output(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """A Dynamo backend whose compiled code does no work: what is timed is Dynamo's part."""
    out = gm(*example_inputs)
    return lambda *args: out


@functools.cache
def dynamo_floor_ms(device: str) -> float | None:
    """The fastest mean wall time (ms) of a call of a compiled one-tensor function on
    ``device`` whose compiled code does nothing; None where it cannot be measured (no Dynamo,
    a trace that fails). Host time only: on CUDA it bounds a call's latency, not the device
    clock's time (the engine asks on the CPU alone, see ``TorchCompileEngine.call_floor_ms``)."""
    # a code object of its own: no other compiled function shares (or evicts) its cache entry
    code = _probe.__code__.replace(co_name="dnntune_floor_probe")
    probe = types.FunctionType(code, _probe.__globals__, "dnntune_floor_probe")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            x = torch.zeros(1, device=device)
            start = time.perf_counter()
            compiled = torch.compile(
                probe, backend=_returns_first_output, fullgraph=True, dynamic=False
            )
            for _ in range(_WARMUP):
                compiled(x)
            traced_s = time.perf_counter() - start
            best = float("inf")
            for _ in range(_REPEATS):
                start = time.perf_counter()
                for _ in range(_CALLS):
                    compiled(x)
                best = min(best, (time.perf_counter() - start) / _CALLS)
    except Exception as exc:  # the floor is an optimization: without it, nothing is skipped
        _log.debug("torch.compile call floor on %s not measured: %s", device, exc)
        return None
    _log.info(
        "torch.compile call floor on %s: %.1f us a call (measured in %.2f s)",
        device,
        best * 1e6,
        traced_s,
    )
    return best * 1e3
