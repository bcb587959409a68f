"""A residual add handed to a Linear inside a child's call (:mod:`._output_tails`).

For the length of one call of a child module (an attention), :data:`ARMED` holds the Linear
that ends the child's forward and the residual its parent adds to the child's output; the
Linear's forward takes it as its GEMM's epilogue (:func:`take_armed`) and says so by keeping
its output here. A context variable: each thread and task sees only its own call's.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ARMED", "Armed", "compiling", "take_armed"]

#: Dynamo reads it as a constant True, so ``not compiling() and ARMED.get()`` never reaches the
#: context variable, which Dynamo cannot trace, in a compiled or exported forward
compiling = torch.compiler.is_compiling


@dataclass(slots=True)
class Armed:
    """The Linear that takes ``residual``, and its output once it has."""

    layer: nn.Module
    residual: torch.Tensor
    output: torch.Tensor | None = None


ARMED: contextvars.ContextVar[Armed | None] = contextvars.ContextVar(
    "dnntune_armed_residual", default=None
)


def take_armed(
    layer: nn.Module,
    x: torch.Tensor,
    fused_tail: Callable[[torch.Tensor, torch.Tensor, str | None], torch.Tensor | None],
) -> torch.Tensor | None:
    """``layer``'s output with the armed residual added in its epilogue, if a residual is
    armed for ``layer`` and not taken yet and ``fused_tail`` takes it (a residual of the
    output's shape and type, eval mode); else None (the layer runs as usual)."""
    state = ARMED.get()
    if state is None or state.layer is not layer or state.output is not None:
        return None
    out = fused_tail(x, state.residual, None)
    if out is not None:
        state.output = out
    return out
