"""Which of dnntune's epilogue activations a module computes (:func:`activation_name`):
exactly one of PyTorch's activation classes, transformers' ``ACT2FN`` modules
(:mod:`dnntune.torch._transformers`), or a module whose forward writes one out
(:mod:`dnntune.torch._written_activations`). A fusion asks it where it fuses, and each fused
call asks it again, so a module changed since runs as it is."""

from __future__ import annotations

from torch import nn

from dnntune.torch._transformers import activation_of
from dnntune.torch._written_activations import written_activation

__all__ = ["activation_name"]

_ACT_MODULES: dict[type[nn.Module], str] = {
    nn.ReLU: "relu",
    nn.GELU: "gelu",
    nn.SiLU: "silu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
}


def activation_name(module: nn.Module) -> str | None:
    """The dnntune activation a module computes, or None (also for a module given a forward
    of its own, ``module.forward = ...``: it computes what that forward does; new-user audit,
    session 55: a fused call ran the class's activation, an error of 2.4)."""
    if "forward" in module.__dict__:
        return None
    name = _ACT_MODULES.get(type(module))  # the exact class: a subclass may compute otherwise
    if name is None:
        # transformers' ACT2FN modules, else one whose forward writes an activation out
        return activation_of(module) or written_activation(module)
    if name == "gelu" and getattr(module, "approximate", "none") == "tanh":
        return "gelu_tanh"
    return name
