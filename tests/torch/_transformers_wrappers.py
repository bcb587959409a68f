"""Wrappers that behave as transformers 5.2x's two around a decoder layer's forward (written
here, so the test runs where transformers is not installed): a keyword-renaming decorator
whose wrapper is ``wrapped_func``, and a layer base class whose ``__init_subclass__`` wraps
``forward`` in ``forward_with_checkpointing``. The tests register this module under
transformers' two module names, which is where ``dnntune.torch._known_wrappers`` looks."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def deprecate_kwarg(
    old_name: str, version: str, new_name: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrapper(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapped_func(*args: Any, **kwargs: Any) -> Any:
            if old_name in kwargs:
                warnings.warn(f"{old_name} is deprecated ({version})", FutureWarning, stacklevel=2)
                if new_name is not None:
                    kwargs[new_name] = kwargs.pop(old_name)
            return func(*args, **kwargs)

        return wrapped_func

    return wrapper


class CheckpointingLayer(nn.Module):
    gradient_checkpointing = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.forward

        @functools.wraps(forward)
        def forward_with_checkpointing(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                self.checkpointed = True
                step = functools.partial(forward, self, **kwargs)
                return checkpoint(step, *args, use_reentrant=False)
            return forward(self, *args, **kwargs)

        cls.forward = forward_with_checkpointing  # type: ignore[method-assign]
