"""Each uncaptured forward of an optimized model runs on the faster route for its inputs:
dnntune's, or PyTorch's own forward, chosen by timing both.

``optimize`` decides on its example inputs. A model is called afterwards with others, and
what was faster there need not be faster here. A generation loop's decode steps are the case
in point: one token in, transformers' ``DynamicCache`` passed along (no replay takes it), each
step bound by the host, where dnntune's route costs more Python than PyTorch's. On an H100
(session 48) an 8-layer LLaMA-style decoder after ``optimize`` generated at 0.93x eager after a
128-token prompt, though its device time per token was 838 against eager's 1109 µs.

So the first forwards given each set of input shapes (each tensor's shape and type, plain
values as they are, other objects by type: :func:`_shapes`) alternate between the two routes,
each timed (on CUDA between device synchronizations), :data:`SAMPLES` a side, and dnntune's
route runs the later forwards given those shapes only where its median beats PyTorch's by more
than the speed check's noise tolerance (:data:`dnntune.torch.speed.TOLERANCE`, as ``"auto"``
keeps dnntune's forward: within noise the doubt goes to PyTorch's forward, whose host work is
eager's; session 54, H100: on ``generate()``'s decode steps dnntune's route ran 0.88x eager a
token and PyTorch's 0.97x); after :data:`RACE_AGAIN_AFTER` of
them the routes race again (kernels dnntune built or tuned while racing are hits by then). A
choice of dnntune's route made so is provisional: the routes race again after
:data:`RECHECK_AFTER` forwards, in use, and that race's choice holds (session 53, H100: the race
of ``generate()``'s decode steps with a ``DynamicCache`` read dnntune's route at 7.06 against
PyTorch's 7.88 ms a forward on its first forwards, and the optimized model then ran 0.86x
eager per token; what moved between the race and the use is not found yet).
Where the input shapes keep changing (:data:`CHANGING_AFTER` forwards in a row, each given
other shapes than the one before: a mask one token longer each step, batch sizes in turn) no
set of shapes comes back to be raced, so those forwards race as one, until
:data:`SETTLED_AFTER` forwards in a row are given the shapes of the one before. PyTorch's route
runs the forward of every class dnntune put in place as the class it stands in for
(:data:`._support.pytorch_route`), so its outputs are eager's. ``optimize``'s example inputs
keep ``optimize``'s choice (it timed both routes on them, ``check_speed``, and chose dnntune's):
for good where they replay, which PyTorch's route would not, and where they run uncaptured
until :data:`RECHECK_AFTER` forwards, when they race as other shapes do. ``optimize`` timed
them while it tuned, and a host-bound forward's reading moves with the process's state
(session 50, H100: ConvNeXt-T's check read dnntune's uncaptured forward ahead, and it then ran
0.87x eager; two more runs read 0.93x and 0.98x and reverted). A model
optimized without that check (``check_speed=False``, no example inputs, training mode) runs
every forward on dnntune's route, unraced.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

# forwards in a row given other input shapes than the one before, after which they race as
# one; and given the shapes of the one before, after which that race ends: the counts after
# which an optimized model's new signatures stop and start being tuned again
from dnntune.torch._changing_shapes import CHANGING_AFTER, SETTLED_AFTER
from dnntune.torch.speed import TOLERANCE

__all__ = [
    "CHANGING_AFTER",
    "RACE_AGAIN_AFTER",
    "RECHECK_AFTER",
    "SAMPLES",
    "SETTLED_AFTER",
    "Race",
    "Routes",
]

_log = logging.getLogger("dnntune.torch")

#: forwards timed on each route before the choice
SAMPLES = 4
#: forwards on the chosen route after which the routes race again
RACE_AGAIN_AFTER = 1024
#: forwards given optimize's example shapes, uncaptured, before their first race; and forwards
#: on dnntune's route after a race chose it on its first forwards, before it is timed again
RECHECK_AFTER = 64
#: sets of input shapes whose race a model keeps (all are forgotten when there are more)
KEPT = 256
#: where an optimized model keeps its :class:`Routes` (dnntune's state: never saved); ``optimize``
#: puts them there where it timed both routes on the example inputs (``check_speed``)
ROUTES = "_dnntune_routes"


class Race:
    """One race between a model's two routes, and then its choice."""

    __slots__ = ("confirms", "device", "name", "pytorch_chosen", "since", "times", "what")

    def __init__(self, module: nn.Module, what: str, confirms: bool = False) -> None:
        self.name = type(module).__name__
        #: which forwards race (for the log)
        self.what = what
        #: whether this race confirms an earlier one's choice of dnntune's route (its own
        #: choice then holds for :data:`RACE_AGAIN_AFTER` forwards)
        self.confirms = confirms
        #: the CUDA device whose work a timed forward waits for (None: the host's clock alone)
        self.device = _cuda_device(module)
        #: seconds per timed forward: dnntune's route [0], PyTorch's [1]
        self.times: tuple[list[float], list[float]] = ([], [])
        #: None while racing, then whether PyTorch's route won
        self.pytorch_chosen: bool | None = None
        #: forwards since the choice
        self.since = 0

    @property
    def over(self) -> bool:
        """Whether the choice has run :data:`RACE_AGAIN_AFTER` forwards (race again)."""
        return self.since >= RACE_AGAIN_AFTER

    @property
    def provisional(self) -> bool:
        """Whether this race chose dnntune's route on its first forwards, a choice the next
        race (after :data:`RECHECK_AFTER` forwards) confirms or undoes."""
        return self.pytorch_chosen is False and not self.confirms

    def next_is_pytorch(self) -> bool:
        """Which route the next forward takes: the routes alternate while racing (dnntune's
        first), then the winner's."""
        chosen = self.pytorch_chosen
        if chosen is None:
            return len(self.times[1]) < len(self.times[0])
        self.since += 1
        return chosen

    def run(self, pytorch: bool, forward: Callable[..., Any], *args: Any) -> Any:
        """``forward(*args)`` on the route ``pytorch`` names, timed while racing."""
        if self.pytorch_chosen is not None:
            return forward(*args)
        self._sync()
        start = time.perf_counter()
        out = forward(*args)
        self._sync()
        self.times[pytorch].append(time.perf_counter() - start)
        if min(len(t) for t in self.times) >= SAMPLES and self.pytorch_chosen is None:
            self._choose()
        return out

    def _sync(self) -> None:
        if self.device is not None:
            torch.cuda.synchronize(self.device)

    def _choose(self) -> None:
        dnntune, pytorch = (statistics.median(t) for t in self.times)
        # dnntune's route only where it is faster beyond noise: a tie goes to PyTorch's
        self.pytorch_chosen = pytorch <= dnntune * (1.0 + TOLERANCE)
        if self.provisional:  # timed again in use, RECHECK_AFTER forwards on
            self.since = RACE_AGAIN_AFTER - RECHECK_AFTER
        _log.info(
            "dnntune.torch: %s's forwards given %s run %s (median of %d forwards each: "
            "PyTorch's %.3f ms, dnntune's %.3f ms)",
            self.name,
            self.what,
            "PyTorch's forward" if self.pytorch_chosen else "on dnntune",
            SAMPLES,
            pytorch * 1e3,
            dnntune * 1e3,
        )


class Routes:
    """One optimized model's races: one per set of input shapes, and one for forwards whose
    input shapes keep changing."""

    __slots__ = ("by_shapes", "changed", "changing", "last", "same")

    def __init__(self) -> None:
        self.by_shapes: dict[tuple[Any, ...], Race | None] = {}
        self.last: tuple[Any, ...] | None = None
        #: forwards in a row given other input shapes than the one before, and the same
        self.changed = 0
        self.same = 0
        #: the race of forwards whose input shapes keep changing, while they do
        self.changing: Race | None = None

    def race_for(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Race | None:
        """The race this forward of ``module`` takes part in, or None (dnntune's route)."""
        shapes = _shapes(args, kwargs)
        if shapes == self.last:
            self.same += 1
            self.changed = 0
        else:
            self.changed += 1
            self.same = 0
            self.last = shapes
        race = self.by_shapes.get(shapes, _NEW)
        if race is None:  # optimize's example inputs
            return None
        if race is not _NEW and not race.over:
            # shapes met before keep their own race, also amid shapes that keep changing
            # (each generate() call's prompt, between the decode steps of two calls)
            return race
        changing = self.changing
        if changing is not None and self.same >= SETTLED_AFTER:
            changing = self.changing = None
            _log.info("dnntune.torch: %s's input shapes have settled", type(module).__name__)
        if changing is not None or self.changed >= CHANGING_AFTER:
            if changing is None or changing.over:
                confirms = changing is not None and changing.provisional
                what = "input shapes that keep changing"
                changing = self.changing = Race(module, what, confirms)
            return changing
        # not met before, or their choice has run long enough: race them
        if len(self.by_shapes) >= KEPT:  # forget the races, keep optimize's choices
            self.by_shapes = {k: v for k, v in self.by_shapes.items() if v is None}
        confirms = race is not _NEW and race.provisional
        race = self.by_shapes[shapes] = Race(module, "these input shapes", confirms)
        return race

    def decided(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        recheck: bool = False,
    ) -> None:
        """Forwards given these inputs' shapes (``optimize``'s example: it timed both routes
        and chose dnntune's) run on dnntune's route: for good where they replay (``optimize``
        chose a replay, which PyTorch's route does not run), or, ``recheck``, until they
        race after :data:`RECHECK_AFTER` forwards: an uncaptured choice timed while
        ``optimize`` tuned is then timed again in the model's use, and again every
        :data:`RACE_AGAIN_AFTER` forwards."""
        shapes = _shapes(args, kwargs)
        if not recheck:
            self.by_shapes[shapes] = None
            return
        race = self.by_shapes[shapes] = Race(module, "optimize's example shapes")
        race.pytorch_chosen = False
        race.since = RACE_AGAIN_AFTER - RECHECK_AFTER


#: a set of input shapes not met before
_NEW: Any = object()


def _shapes(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a call's arguments tells its shapes: each tensor's shape and type, each plain
    value itself, the type of anything else (a cache object)."""
    return (
        tuple(_part(a) for a in args),
        tuple((k, _part(v)) for k, v in kwargs.items()),
    )


def _part(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        try:
            return (value.shape, value.dtype)
        except RuntimeError:  # a nested tensor has no one shape
            return (type(value), value.dtype, value.layout)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return (type(value), tuple(_part(v) for v in value[:8]), len(value))
    return type(value)


def _cuda_device(module: nn.Module) -> torch.device | None:
    """The CUDA device of ``module``'s first parameter or buffer, if it has one there."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device if tensor.is_cuda else None
    return None
