"""Which class ``optimize`` swaps a module's class for: dnntune's module class for PyTorch's
own (:data:`dnntune.torch.modules.SWAPS`), and a stand-in made at run time for an RMSNorm
written as transformers writes it (:func:`dnntune.torch._transformers.rms_norm_like`), whose
forward runs one ``rms_norm``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dnntune.torch import functional as dtf
from dnntune.torch._calls import PYTORCH_FLAG
from dnntune.torch._subclass import shared_stand_in
from dnntune.torch._support import tracing
from dnntune.torch._transformers import rms_norm_like
from dnntune.torch.modules import ATTRIBUTED, SWAPS, _attributed, _grad_wanted

__all__ = ["swap_class", "swapped_class"]

_is_grad_enabled = torch.is_grad_enabled

#: the class attribute that marks a stand-in running a transformers RMSNorm on dnntune
_RMS_STAND_IN = "_dnntune_rms_norm"


def swap_class(module: nn.Module) -> type[nn.Module] | None:
    """The dnntune class ``module``'s class is swapped for, or None: dnntune's module class for
    PyTorch's own (:data:`SWAPS`), and a stand-in that runs ``rms_norm`` for an RMSNorm written
    as transformers writes it (:func:`_transformers.rms_norm_like`)."""
    target = SWAPS.get(type(module))
    if target is None and rms_norm_like(module):
        cls = type(module)
        target = shared_stand_in(
            cls, _RMS_STAND_IN, {"forward": _rms_norm_forward(cls.forward), _RMS_STAND_IN: True}
        )
    return target


def swapped_class(module: nn.Module) -> type[nn.Module] | None:
    """The dnntune class ``module`` already runs as (an earlier ``optimize`` swapped it), or
    None."""
    if getattr(type(module), _RMS_STAND_IN, False):  # (under a stand-in made on top of it)
        return next(c for c in type(module).__mro__ if c.__dict__.get(_RMS_STAND_IN))
    return next((t for t in SWAPS.values() if isinstance(module, t)), None)


def _rms_norm_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The forward of a transformers RMSNorm on dnntune: ``rms_norm`` over the last dimension
    with the module's ``weight`` and ``variance_epsilon``, where the weight has the input's
    type (its forward then gives that type; another weight type gives the promoted one, and the
    module's own forward runs), and PyTorch's arithmetic as the module writes it where refine
    flagged it, gradients are wanted or the input is not contiguous (that arithmetic lays its
    output out as its input, ``rms_norm`` contiguous: a transposed batch into LLaMA, Mistral,
    Qwen and Phi-3 came out in another layout than eager's, the first real-model sweep)."""

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self._parameters.get("weight")
        if (
            self.__dict__.get(PYTORCH_FLAG)
            or tracing()  # a recorded program records the module's own arithmetic
            or weight is None
            or not isinstance(hidden_states, torch.Tensor)
            or weight.dtype != hidden_states.dtype
            or not hidden_states.dim()
            or not hidden_states.is_contiguous()
            or hidden_states.shape[-1] != weight.shape[0]  # (a weight of one broadcasts)
            or (_is_grad_enabled() and _grad_wanted(hidden_states, self, "weight"))
        ):
            return original(self, hidden_states)
        shape = (weight.shape[0],)
        eps = float(self.__dict__["variance_epsilon"])
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(self, lambda: dtf.rms_norm(hidden_states, shape, weight, eps))
        return dtf.rms_norm(hidden_states, shape, weight, eps)

    return forward
