"""Random models for ``model_conformance.py``: the patterns ``dnntune.torch.optimize`` rewrites
and routes, written the ways model code writes them, drawn from one seed.

A CNN chains conv + batch norm + activation blocks (a Sequential or a forward, every activation
spelling, depthwise, dilated, ``padding="same"``), residual blocks (the shortcut added in each
spelling: ``+=``, ``+``, ``torch.add``, ``.add_``, into the shortcut's own copy; a branch output
used twice), squeeze-excitation, pooling, an in-place residual (``h += f(x)``), a DenseNet
concatenation, a conv + batch norm called twice and an MBConv block (nested Sequentials,
dropout before the residual add), then a head.
A transformer chains pre- or post-norm blocks (LayerNorm, RMSNorm, no affine) of attention
(fused QKV or three projections, causal, boolean or additive masks, a scale) and an MLP (GELU,
tanh GELU, SiLU, gated, a ReLU module, a Sequential ending in a dropout), some with a dropout
between the MLP and its residual add; or PyTorch's own layers: ``nn.TransformerEncoderLayer``
and ``nn.MultiheadAttention`` with causal or key-padding masks. Some models get a forward hook
that changes a layer's output, or a frozen backbone (only the last layer trains). Everything is
deterministic from the seed.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _random_cnn import CNN
from _random_transformer import Transformer
from torch import nn

__all__ = ["Case", "make_case"]


@dataclass
class Case:
    """One drawn model and how to draw its inputs (``make_input(batch)``, from ``generator``)."""

    seed: int
    model: nn.Module
    make_input: Callable[[int], torch.Tensor]
    batch: int
    channels_last_model: bool
    channels_last_input: bool
    desc: str
    #: new weights and statistics for the ``new_weights`` check; None: :func:`random_state`
    new_state: Callable[[nn.Module, torch.Generator], dict[str, torch.Tensor]] | None = None
    #: an edit of every parameter (``weight_edit``) scaled to the parameter's own magnitude
    #: (a real network's weights, where a unit-scale step would overflow it)
    relative_edits: bool = False
    #: gradient checks over several draws in float32 too (:class:`_model_steps.Models`): a deep
    #: real network flips a ReLU gate on rounding there, where the random models are shallow
    float32_draws: bool = False


def make_case(seed: int, device: str, dtype: torch.dtype) -> Case:
    """The model of ``seed``, in eval mode, with random weights and batch-norm statistics."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    cnn = rng.random() < 0.55
    model: nn.Module
    make: Callable[[int], torch.Tensor]
    if cnn:
        cin, hw = rng.choice([1, 3, 4]), rng.choice([7, 8, 12, 15])
        model = CNN(rng, cin, hw)
        make = lambda b: torch.randn(b, cin, hw, hw, generator=g)  # noqa: E731
    else:
        d_in, s = rng.choice([8, 12]), rng.choice([1, 5, 8])
        model = Transformer(rng, d_in)
        make = lambda b: torch.randn(b, s, d_in, generator=g)  # noqa: E731
    model.load_state_dict(random_state(model, g))
    extras = _decorate(model, rng)
    cl_model = cnn and rng.random() < 0.3
    cl_input = cnn and rng.random() < 0.3
    model = model.to(device=device, dtype=dtype)
    if cl_model:
        model = model.to(memory_format=torch.channels_last)

    def make_input(batch: int) -> torch.Tensor:
        x = make(batch).to(device=device, dtype=dtype)
        return x.to(memory_format=torch.channels_last) if cl_input else x

    desc = (
        f"{'CNN' if cnn else 'Transformer'}"
        f"{' channels_last model' if cl_model else ''}{' channels_last input' if cl_input else ''}"
        f"{''.join(' ' + e for e in extras)}: {model.desc}"
    )
    return Case(seed, model.eval(), make_input, rng.choice([1, 2, 3]), cl_model, cl_input, desc)


def _halve(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    """A forward hook that changes its layer's output (a fused call must still run it)."""
    return output * 0.5


def _decorate(model: nn.Module, rng: random.Random) -> list[str]:
    """What a user adds to a model: a forward hook on a layer, a frozen backbone (only the last
    layer trains, as in fine-tuning)."""
    extras = []
    layers = [m for m in model.modules() if type(m) in (nn.Conv2d, nn.Linear)]
    if rng.random() < 0.15:
        rng.choice(layers).register_forward_hook(_halve)
        extras.append("hooked layer")
    if rng.random() < 0.2:
        last = layers[-1]
        for p in model.parameters():
            p.requires_grad_(False)
        for p in last.parameters():
            p.requires_grad_(True)
        extras.append("frozen backbone")
    return extras


def new_state(
    model: nn.Module, draw: Callable[[str, torch.Tensor], torch.Tensor], g: torch.Generator
) -> dict[str, torch.Tensor]:
    """A state dict for ``model`` (on the CPU, in float32, keeping its modules' versions, which
    MNASNet reads on load): integer entries as they are, batch-norm variances in [0.5, 1.5),
    every other floating entry ``draw(name, value)``."""
    own = model.state_dict()
    state: dict[str, torch.Tensor] = collections.OrderedDict()
    state._metadata = own._metadata  # type: ignore[attr-defined]
    for name, value in own.items():
        value = value.detach().cpu()
        if not value.is_floating_point():
            state[name] = value
        elif name.endswith("running_var"):
            state[name] = torch.rand(value.shape, generator=g) + 0.5
        else:
            state[name] = draw(name, value)
    return state


def random_state(model: nn.Module, g: torch.Generator) -> dict[str, torch.Tensor]:
    """New weights and batch-norm statistics for ``model`` (on the CPU, in float32)."""

    def draw(name: str, value: torch.Tensor) -> torch.Tensor:
        return torch.randn(value.shape, generator=g) * (0.5 if value.dim() > 1 else 0.3)

    return new_state(model, draw, g)
