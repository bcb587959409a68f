"""Functional-call routing for optimized models.

``optimize`` replaces a few ``torch.nn.functional`` functions (:data:`ROUTED`) with routers once
per process. A router sends a call to dnntune's op only while an optimized module's forward is
running in this thread (that forward enters and leaves :func:`install_routing`'s wrapper, which
also puts the module's own settings in force); every other caller gets PyTorch's function.
That wrapper also runs each forward on the route its race chose, where ``optimize`` installed
the races: dnntune's, or PyTorch's own forward (:mod:`._route_race`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dnntune.torch import functional as dtf
from dnntune.torch._changing_shapes import forward_begins, forward_ends
from dnntune.torch._route_race import ROUTES
from dnntune.torch._subclass import wrap_forward
from dnntune.torch._support import own_recording, pytorch_route, tracing
from dnntune.torch.config import TorchConfig, enter_scope, exit_scope
from dnntune.torch.cuda_graphs import running_uncaptured

__all__ = [
    "ROUTED",
    "install_routers",
    "install_routing",
    "originals",
    "routers",
    "routing_active",
    "unraced",
]

#: ``torch.nn.functional`` functions whose calls inside an optimized module run on dnntune
#: (by name in both namespaces; ``nn.MaxPool2d``/``nn.AvgPool2d`` call these too)
ROUTED = ("scaled_dot_product_attention", "max_pool2d", "avg_pool2d")


class _RouteState(threading.local):
    """Per thread: how deep inside optimized forwards we are (functional calls route to
    dnntune when above 0), and the settings scopes those forwards entered."""

    depth = 0

    def __init__(self) -> None:
        self.scopes: list[Any] = []


_route_state = _RouteState()
originals: dict[str, Any] = {name: getattr(F, name) for name in ROUTED}
routers: dict[str, Any] = {}
_route_lock = threading.Lock()
_capturing = torch.cuda.is_current_stream_capturing


def _router(name: str) -> Any:
    original = originals[name]

    def routed(*args: Any, **kwargs: Any) -> Any:
        depth = _route_state.depth
        if depth <= 0:
            return original(*args, **kwargs)
        # Engines (TORCH_ENGINE) and fall-backs call the F function themselves: route those
        # inner calls to PyTorch's op, not back here.
        _route_state.depth = 0
        try:
            return getattr(dtf, name)(*args, **kwargs)
        finally:
            _route_state.depth = depth

    routed.__name__ = routed.__qualname__ = name
    routed.__doc__ = original.__doc__
    return routed


def routing_active() -> bool:
    """Whether an optimized module's forward is running in this thread (its functional calls
    go to dnntune)."""
    return _route_state.depth > 0


def install_routers() -> None:
    with _route_lock:
        for name in ROUTED:
            router = routers.get(name)
            if router is None:
                router = routers[name] = _router(name)
            if getattr(F, name) is not router:
                setattr(F, name, router)


def _bound(module: nn.Module) -> TorchConfig | None:
    """The settings ``module`` was optimized with, for its forward."""
    bound = module.__dict__.get("_dnntune_config")
    if bound is not None and running_uncaptured():
        # a CUDA-graph model running uncaptured pays each layer's host cost: decide on the
        # clock that counts it (when optimize chose the clock)
        bound = module.__dict__.get("_dnntune_config_uncaptured", bound)
    return bound


def _route_enter(module: nn.Module) -> None:
    state = _route_state
    state.depth += 1
    # the settings this module was optimized with, in force for its forward (per thread: the
    # same model may run in several threads at once)
    bound = _bound(module)
    state.scopes.append(None if bound is None else enter_scope(bound))


def _route_exit() -> None:
    state = _route_state
    state.depth = max(0, state.depth - 1)
    if state.scopes:
        token = state.scopes.pop()
        if token is not None:
            exit_scope(token)


def unraced(module: nn.Module) -> bool:
    """Whether this forward of ``module`` runs on dnntune's route without a race: in training
    mode (the races time inference), or while dnntune records it as a CUDA graph (which
    records dnntune's kernels). (Nor does a forward captured into a user's own graph race: no
    capture takes a race's device synchronization.)"""
    return module.training or own_recording.get()


def install_routing(module: nn.Module) -> None:
    """Give the optimized model a forward that routes functional calls to dnntune and puts
    its settings in force while it runs (a subclass forward, see ``_subclass``)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def on_dnntune(self: nn.Module, args: Any, kwargs: Any) -> Any:
            _route_enter(self)
            forward_begins(self)
            try:
                return original(self, *args, **kwargs)
            finally:  # also when forward raises
                forward_ends()
                _route_exit()

        def on_pytorch(self: nn.Module, args: Any, kwargs: Any) -> Any:
            route = pytorch_route
            route.on = True
            # its settings in force too, though no dnntune op runs: each module of it then
            # finds it runs inside its model's forward at one read, and puts none in force
            # itself (``_subclass.call_in_model_settings``)
            bound = _bound(self)
            token = None if bound is None else enter_scope(bound)
            try:
                return original(self, *args, **kwargs)
            finally:
                route.on = False
                if token is not None:
                    exit_scope(token)

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if pytorch_route.on or tracing():  # the program PyTorch records or runs is its own
                return original(self, *args, **kwargs)
            routes = self.__dict__.get(ROUTES)  # the races of routes (._route_race)
            race = None if routes is None or unraced(self) else routes.race_for(self, args, kwargs)
            if race is None or (race.device is not None and _capturing()):  # no sync there
                return on_dnntune(self, args, kwargs)
            if race.next_is_pytorch():
                return race.run(True, on_pytorch, self, args, kwargs)
            return race.run(False, on_dnntune, self, args, kwargs)

        return forward

    wrap_forward(module, "_dnntune_routed", wrap)
