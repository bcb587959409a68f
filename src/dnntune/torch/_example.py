"""What ``optimize`` says about its example inputs and the model they run through: the example
call itself (positional and keyword arguments), where it lives, a note on an exception of the
example forward naming it, and whether the model is ``torch.compile``'s wrapper."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from dnntune.errors import InvalidValueError

__all__ = [
    "Example",
    "as_example",
    "compiled_by_torch",
    "describe_inputs",
    "example_of",
    "named_example",
    "on_cuda_of",
]


@dataclass(frozen=True)
class Example:
    """One example call of a model's forward: ``module(*args, **kwargs)``."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, module: nn.Module) -> Any:
        """Run ``module`` on the example: ``module(*args, **kwargs)``."""
        return module(*self.args, **self.kwargs)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the example, positional and keyword, nested ones included."""
        return [t for t in tree_flatten((self.args, self.kwargs))[0] if isinstance(t, torch.Tensor)]

    @property
    def is_cuda(self) -> bool:
        """Any of the example's tensors on CUDA."""
        return any(t.is_cuda for t in self.tensors())

    def describe(self) -> str:
        """The example in a line, for messages: ``example_inputs (...)`` and/or
        ``example_kwargs (name=...)``."""
        parts = []
        if self.args or not self.kwargs:
            parts.append(f"example_inputs ({describe_inputs(self.args)})")
        if self.kwargs:
            named = [f"{k}={describe_inputs([v])}" for k, v in self.kwargs.items()]
            parts.append(f"example_kwargs ({_shown(named)})")
        return " and ".join(parts)


def as_example(inputs: Example | Sequence[Any]) -> Example:
    """``inputs`` as an :class:`Example`: a sequence is the positional arguments."""
    return inputs if isinstance(inputs, Example) else Example(tuple(inputs))


def example_of(example_inputs: object, example_kwargs: object) -> Example | None:
    """``optimize``'s ``example_inputs`` and ``example_kwargs`` checked, as one :class:`Example`
    (None when neither is given); InvalidValueError saying what to pass otherwise."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)  # one input given bare, as torch.jit.trace takes it
    elif example_inputs is not None and not isinstance(example_inputs, tuple | list):
        raise InvalidValueError(
            "example_inputs must be a tuple (or list) of the forward's arguments, or one "
            f"tensor, got {type(example_inputs).__name__}"
        )
    if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
        raise InvalidValueError(
            "optimize(example_kwargs=...) must be a mapping (a dict) of the forward's keyword "
            f"arguments by name, got {type(example_kwargs).__name__}; positional arguments go "
            "in example_inputs, e.g. optimize(model, (x,), example_kwargs={'mask': mask})"
        )
    if example_kwargs is not None:
        for key in example_kwargs:
            if not isinstance(key, str):
                raise InvalidValueError(
                    "optimize(example_kwargs=...): every key must be the name (a str) of one "
                    f"of the forward's keyword arguments, got {key!r} "
                    f"({type(key).__name__}); pass positional arguments in example_inputs"
                )
    if example_inputs is None and example_kwargs is None:
        return None
    return Example(tuple(example_inputs or ()), dict(example_kwargs or {}))


def compiled_by_torch(module: nn.Module) -> bool:
    """``module`` is what ``torch.compile(model)`` returns (``OptimizedModule``, holding the
    model as ``_orig_mod``), told without importing Dynamo."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def on_cuda_of(module: nn.Module, inputs: Sequence[torch.Tensor]) -> bool:
    """Any of ``module``'s parameters or buffers, or of ``inputs`` (the example inputs'
    tensors, positional and keyword), on CUDA."""
    return any(t.is_cuda for t in (*module.parameters(), *module.buffers(), *inputs))


@contextlib.contextmanager
def named_example(example: Example | Sequence[Any]) -> Iterator[None]:
    """An exception of the model's forward on ``example`` (a wrong shape, a missing
    argument) gets a note naming where it came from and what the inputs were: PyTorch's message
    alone ("mat1 and mat2 shapes cannot be multiplied") did not say that ``optimize``'s example
    forward raised it, nor that the model was left as it was (new-user audit)."""
    example = as_example(example)
    try:
        yield
    except Exception as exc:
        exc.add_note(
            f"dnntune.torch.optimize: raised in the model's forward on {example.describe()}; "
            "the model is left as it was before optimize (example_inputs are the positional "
            "arguments of one forward call and example_kwargs its keyword arguments: "
            "model(*example_inputs, **example_kwargs))"
        )
        raise


def describe_inputs(values: Sequence[Any], shown: int = 6) -> str:
    """The first ``shown`` of ``values`` in a line: a tensor's dims, dtype and device, else its
    type."""

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            dims = ", ".join(str(d) for d in value.shape)
            return f"Tensor[{dims}] {str(value.dtype).removeprefix('torch.')} {value.device}"
        return type(value).__name__

    return _shown([one(v) for v in values], shown)


def _shown(items: Sequence[str], shown: int = 6) -> str:
    more = f", ... ({len(items) - shown} more)" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more
