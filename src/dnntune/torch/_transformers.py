"""Module classes of Hugging Face transformers that compute exactly what a dnntune op computes,
recognised without importing transformers: its activation modules (``ACT2FN["gelu"]``,
``["silu"]``, ``["gelu_pytorch_tanh"]``), which an ``act(linear(x))`` fusion takes as the
linear's epilogue as it takes ``nn.GELU``, and the RMSNorm its decoder models write out
(LlamaRMSNorm and the many classes copied from it), which ``optimize`` runs as one
``rms_norm`` instead of its six to seven passes over the hidden states, and GPT-2's ``Conv1D``,
a linear layer with its weight stored transposed, whose following activation a fused call runs
as the GEMM's epilogue.

A class is recognised by what it is, not by its name: its module and name for the
activations (whose forwards call the one PyTorch function kept on the instance), and the code
of its forward for an RMSNorm (a forward that computes anything else, Gemma's ``1 + weight``
say, has other names or constants and is left alone). A forward replaced on the class or on
the instance (transformers' kernel hub) is never taken for the class's own.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.nn.functional as F
from torch import nn

__all__ = ["activation_of", "conv1d_like", "rms_norm_like"]

_ACTIVATIONS = "transformers.activations"


def activation_of(module: nn.Module) -> str | None:
    """The dnntune activation a transformers activation module computes, or None."""
    cls = type(module)
    if cls.__module__ != _ACTIVATIONS or not _own_forward(module):
        return None
    name = cls.__qualname__
    if name == "SiLUActivation":  # forward: F.silu(input)
        return "silu"
    act = module.__dict__.get("act")  # forward: self.act(input)
    if name == "GELUActivation" and act is F.gelu:  # not its erf written in Python
        return "gelu"
    if (
        name == "GELUTanh"
        and isinstance(act, functools.partial)
        and act.func is F.gelu
        and not act.args
        and act.keywords == {"approximate": "tanh"}
    ):
        return "gelu_tanh"
    return None


def _own_forward(module: nn.Module) -> bool:
    """Whether ``module`` runs its class's own ``forward`` (not one set on the instance, nor one
    put on the class by a library that swaps forwards)."""
    cls = type(module)
    forward = getattr(cls.forward, "__qualname__", None)
    return "forward" not in module.__dict__ and forward == f"{cls.__qualname__}.forward"


#: what an RMSNorm's forward computes in transformers' LlamaRMSNorm form: the hidden states in
#: float32, their mean square over the last dimension (``pow(2).mean(-1, keepdim=True)``), times
#: the reciprocal square root of it plus ``variance_epsilon``, cast back to the input's type, then
#: times ``weight``. Its code names these and only these (a forward that names others, or other
#: numbers, computes something else)
_RMS_NAMES = (
    "dtype",
    "to",
    "torch",
    "float32",
    "pow",
    "mean",
    "rsqrt",
    "variance_epsilon",
    "weight",
)
_RMS_LOCALS = ("self", "hidden_states", "input_dtype", "variance")
_RMS_CONSTANTS = frozenset({("int", 2), ("int", -1), ("bool", True), ("tuple", ("keepdim",))})


def _rms_norm_class(cls: type) -> bool:
    found = _RMS_CLASSES.get(cls)
    if found is None:
        found = _RMS_CLASSES[cls] = _rms_norm_code(cls)
    return found


#: each class's answer (a class's forward is not expected to change once it is used)
_RMS_CLASSES: dict[type, bool] = {}


def _rms_norm_code(cls: type) -> bool:
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    if code is None or code.co_argcount != 2 or code.co_kwonlyargcount:
        return False
    if code.co_names != _RMS_NAMES or code.co_varnames != _RMS_LOCALS:
        return False
    constants = {(type(c).__name__, c) for c in code.co_consts if c is not None}
    return constants == _RMS_CONSTANTS


def rms_norm_like(module: nn.Module) -> bool:
    """Whether ``module`` is an RMSNorm in transformers' LlamaRMSNorm form: that forward, a
    one-dimensional ``weight`` parameter, a float ``variance_epsilon``, and nothing else."""
    cls = type(module)
    if not _rms_norm_class(cls) or not _own_forward(module):
        return False
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    eps: Any = module.__dict__.get("variance_epsilon")
    return (
        weight is not None
        and weight.dim() == 1
        and len(params) == 1
        and next(module.buffers(recurse=False), None) is None
        and next(module.children(), None) is None
        and isinstance(eps, float)
    )


def conv1d_like(module: nn.Module) -> bool:
    """Whether ``module`` is exactly transformers' ``Conv1D`` (GPT-2's linear layer: ``addmm(bias,
    x, weight)`` with ``weight`` of shape [in, out]) running its own forward, with its two
    parameters of matching shapes and nothing else."""
    cls = type(module)
    if (
        cls.__module__ != "transformers.pytorch_utils"
        or cls.__qualname__ != "Conv1D"
        or not _own_forward(module)
    ):
        return False
    state = module.__dict__
    params, nf = state["_parameters"], state.get("nf")
    weight, bias = params.get("weight"), params.get("bias")
    return (
        len(params) == 2
        and weight is not None
        and bias is not None
        and not state["_buffers"]
        and not state["_modules"]
        and weight.dim() == 2
        and bias.dim() == 1
        and weight.shape[1] == bias.shape[0] == nf
    )
