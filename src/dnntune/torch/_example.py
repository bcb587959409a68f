"""What ``optimize`` says about its example inputs and the model they run through: where they
live, a note on an exception of the example forward naming them, and whether the model is
``torch.compile``'s wrapper."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["compiled_by_torch", "describe_inputs", "named_example", "on_cuda_of"]


def compiled_by_torch(module: nn.Module) -> bool:
    """``module`` is what ``torch.compile(model)`` returns (``OptimizedModule``, holding the
    model as ``_orig_mod``), told without importing Dynamo."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def on_cuda_of(module: nn.Module, inputs: Sequence[torch.Tensor]) -> bool:
    """Any of ``module``'s parameters or buffers, or of ``inputs`` (the example inputs'
    tensors), on CUDA."""
    return any(t.is_cuda for t in (*module.parameters(), *module.buffers(), *inputs))


@contextlib.contextmanager
def named_example(example_inputs: Sequence[Any]) -> Iterator[None]:
    """An exception of the model's forward on ``example_inputs`` (a wrong shape, a missing
    argument) gets a note naming where it came from and what the inputs were: PyTorch's message
    alone ("mat1 and mat2 shapes cannot be multiplied") did not say that ``optimize``'s example
    forward raised it, nor that the model was left as it was (new-user audit)."""
    try:
        yield
    except Exception as exc:
        exc.add_note(
            "dnntune.torch.optimize: raised in the model's forward on example_inputs "
            f"({describe_inputs(example_inputs)}); the model is left as it was before optimize "
            "(example_inputs are the positional arguments of one forward call: "
            "model(*example_inputs))"
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

    more = f", ... ({len(values) - shown} more)" if len(values) > shown else ""
    return ", ".join(one(v) for v in list(values)[:shown]) + more
