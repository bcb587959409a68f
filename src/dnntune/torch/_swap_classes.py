"""Which class ``optimize`` swaps a module's class for: dnntune's module class for PyTorch's
own (:data:`dnntune.torch.modules.SWAPS`), and stand-ins made at run time for an RMSNorm
written as transformers writes it (:func:`dnntune.torch._transformers.rms_norm_like`), whose
forward runs one ``rms_norm``, and for transformers' ``Conv1D`` (GPT-2's linear layer,
:func:`dnntune.torch._transformers.conv1d_like`), which runs one dnntune ``linear`` on its
transposed weight, with the activation after it as the epilogue where a fused call asks, and
for timm's ``LayerNorm`` (:func:`dnntune.torch._timm.layer_norm_like`), whose forward runs one
dnntune ``layer_norm`` as ``nn.LayerNorm``'s stand-in does, and for torchvision's Swin window
attention (:mod:`dnntune.torch._window_attention`), whose forward calls its linear children
and one ``scaled_dot_product_attention``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dnntune.torch import functional as dtf
from dnntune.torch._armed import ARMED, compiling, take_armed
from dnntune.torch._buffers import version_of
from dnntune.torch._calls import PYTORCH_FLAG
from dnntune.torch._subclass import shared_stand_in
from dnntune.torch._support import pytorch_route, residual_fits, tracing
from dnntune.torch._timm import layer_norm_like
from dnntune.torch._transformers import conv1d_like, rms_norm_like
from dnntune.torch._window_attention import window_attention_forward, window_attention_like
from dnntune.torch.modules import ATTRIBUTED, SWAPS, _attributed, _grad_wanted

__all__ = ["conv1d_layer", "swap_class", "swapped_class"]

_is_grad_enabled = torch.is_grad_enabled

#: the class attributes that mark a stand-in running a transformers RMSNorm, or a Conv1D, on
#: dnntune
_RMS_STAND_IN = "_dnntune_rms_norm"
_CONV1D_STAND_IN = "_dnntune_conv1d"
_LAYER_NORM_STAND_IN = "_dnntune_timm_layer_norm"
_WINDOW_STAND_IN = "_dnntune_window_attention"
_STAND_INS = (_RMS_STAND_IN, _CONV1D_STAND_IN, _LAYER_NORM_STAND_IN, _WINDOW_STAND_IN)


def swap_class(module: nn.Module) -> type[nn.Module] | None:
    """The dnntune class ``module``'s class is swapped for, or None: dnntune's module class for
    PyTorch's own (:data:`SWAPS`), and a stand-in that runs ``rms_norm`` for an RMSNorm written
    as transformers writes it (:func:`_transformers.rms_norm_like`), ``linear`` for GPT-2's
    ``Conv1D``, ``layer_norm`` for timm's ``LayerNorm``."""
    target = SWAPS.get(type(module))
    if target is None and rms_norm_like(module):
        cls = type(module)
        target = shared_stand_in(
            cls, _RMS_STAND_IN, {"forward": _rms_norm_forward(cls.forward), _RMS_STAND_IN: True}
        )
    if target is None and conv1d_like(module):
        cls = type(module)
        attrs = {
            "forward": _conv1d_forward(cls.forward),
            "fused_activation": _conv1d_fused_activation,
            "fused_tail": _conv1d_fused_tail,
            _CONV1D_STAND_IN: True,
        }
        target = shared_stand_in(cls, _CONV1D_STAND_IN, attrs)
    if target is None and layer_norm_like(module):
        cls = type(module)
        attrs = {"forward": _layer_norm_forward(cls.forward), _LAYER_NORM_STAND_IN: True}
        target = shared_stand_in(cls, _LAYER_NORM_STAND_IN, attrs)
    if target is None and window_attention_like(module):
        cls = type(module)
        attrs = {"forward": window_attention_forward(cls.forward), _WINDOW_STAND_IN: True}
        target = shared_stand_in(cls, _WINDOW_STAND_IN, attrs)
    return target


def swapped_class(module: nn.Module) -> type[nn.Module] | None:
    """The dnntune class ``module`` already runs as (an earlier ``optimize`` swapped it), or
    None."""
    for mark in _STAND_INS:
        if getattr(type(module), mark, False):  # (under a stand-in made on top of it)
            return next(c for c in type(module).__mro__ if c.__dict__.get(mark))
    return next((t for t in SWAPS.values() if isinstance(module, t)), None)


def conv1d_layer(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D`` (:func:`conv1d_like`) or an earlier
    ``optimize``'s stand-in for one: a linear layer a fused call can give its activation."""
    return conv1d_like(module) or bool(getattr(type(module), _CONV1D_STAND_IN, False))


def _conv1d_weights(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stand-in's transposed weight ([out, in], a view) and bias where it still runs as a
    ``Conv1D`` (its forward not replaced on the instance, its weight [in, out] and bias
    [out]), else None. The view is kept while it is the weight's (GPT-2 has 48 such layers;
    a view made per call costs a microsecond or more of host time each)."""
    state = module.__dict__
    params = state["_parameters"]
    weight, bias = params.get("weight"), params.get("bias")
    if "forward" in state or weight is None or bias is None:
        return None
    if weight.dim() != 2 or bias.dim() != 1 or weight.shape[1] != bias.shape[0]:
        return None
    kept = state.get(_TRANSPOSED)
    if (
        kept is None
        or kept[0] is not weight
        or kept[1].data_ptr() != weight.data_ptr()  # ``weight.data = ...`` since
        or kept[1].shape != weight.shape[::-1]
        # written in place since (an optimizer step): a view made under no_grad of a weight
        # written with grad mode on may not be used again (PyTorch raises on its next view:
        # the model sweep's GPT-2, seed 34)
        or kept[2] != version_of(weight)
        # grad mode: a view made under no_grad (optimize's example forward, an eval loop)
        # has no grad_fn and carries no gradient back to the weight, though it reads as
        # requiring one; the fused calls read this view (eval-mode fine-tuning left GPT-2's
        # c_fc and c_proj weights without gradients). One made in grad mode is not used for
        # a weight frozen since (its output would require grad where eager's does not)
        or (_is_grad_enabled() and (kept[1].grad_fn is None) == weight.requires_grad)
    ):
        kept = state[_TRANSPOSED] = (weight, weight.t(), version_of(weight))
    return kept[1], bias


#: where a Conv1D stand-in keeps its weight's transposed view, with the weight it is of
_TRANSPOSED = "_dnntune_weight_t"


def _conv1d_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The forward of transformers' ``Conv1D`` on dnntune: ``linear`` on the transposed weight
    (``x @ weight + bias``, as its ``addmm``), and its own forward where refine flagged it,
    gradients are wanted (its own arithmetic trains, as a transformers RMSNorm's does) or the
    call is not of a tensor of the weight's type."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if pytorch_route.on:  # the forward runs on PyTorch's route (._route_race)
            return original(self, x)
        if not compiling() and ARMED.get() is not None:  # a parent's residual add (_armed)
            out = take_armed(self, x, lambda h, r, a: _conv1d_fused_tail(self, h, r, a))
            if out is not None:
                return out
        found = _conv1d_weights(self)
        if (
            found is None
            or self.__dict__.get(PYTORCH_FLAG)
            or tracing()
            or not isinstance(x, torch.Tensor)
            or x.dtype != found[0].dtype
            or not x.dim()
            or (_is_grad_enabled() and _grad_wanted(x, self, "weight", "bias"))
        ):
            return original(self, x)
        weight_t, bias = found
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(self, lambda: dtf.linear(x, weight_t, bias))
        return dtf.linear(x, weight_t, bias)

    return forward


def _conv1d_fused_activation(
    self: nn.Module, x: torch.Tensor, activation: str
) -> torch.Tensor | None:
    """This ``Conv1D`` + ``activation`` as one graph (eval mode; GPT-2's ``c_fc`` before its
    ``gelu_new``, eight elementwise passes in eager), or None to run them apart."""
    found = _conv1d_weights(self)
    if found is None or self.training or self.__dict__.get(PYTORCH_FLAG) or tracing():
        return None
    weight_t, bias = found
    return _attributed(self, lambda: dtf.linear(x, weight_t, bias, activation=activation))


def _conv1d_fused_tail(
    self: nn.Module, x: torch.Tensor, residual: torch.Tensor, activation: str | None
) -> torch.Tensor | None:
    """This ``Conv1D`` + ``residual`` (+ ``activation``) as one graph (eval mode; GPT-2's MLP
    ``c_proj`` before the block's residual add), or None to run them apart: the checks of
    ``DnnTuneLinear.fused_tail``."""
    found = _conv1d_weights(self)
    if found is None or self.training or self.__dict__.get(PYTORCH_FLAG) or tracing():
        return None
    weight_t, bias = found
    if (
        not isinstance(x, torch.Tensor)
        or x.dtype != weight_t.dtype
        or not x.dim()
        or not residual_fits(x, residual, weight_t.shape[0])
    ):
        return None
    return _attributed(
        self, lambda: dtf.linear(x, weight_t, bias, activation=activation, residual=residual)
    )


def _layer_norm_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The forward of timm's ``LayerNorm`` on dnntune: ``layer_norm`` with the module's
    ``normalized_shape``, weight, bias and ``eps``, as ``DnnTuneLayerNorm`` runs it; its own
    forward where refine flagged it, gradients are wanted, its fast-norm flag was turned on
    since, its weight or bias is a plain attribute, or the call is not of a tensor."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        state = self.__dict__
        if (
            pytorch_route.on  # the forward runs on PyTorch's route (._route_race)
            or state.get(PYTORCH_FLAG)
            or state.get("_fast_norm") is not False
            or tracing()
            or not isinstance(x, torch.Tensor)
            or (_is_grad_enabled() and _grad_wanted(x, self, "weight", "bias"))
        ):
            return original(self, x)
        params = state["_parameters"]
        if "weight" not in params or "bias" not in params:
            # one set as a plain attribute (a hypernetwork's step): the dict has it not, and
            # normalising without it was wrong by its whole effect (new-user audit of training)
            return original(self, x)
        weight, bias = params["weight"], params["bias"]
        shape, eps = state["normalized_shape"], state["eps"]
        if ATTRIBUTED in state:  # optimize's example forward
            return _attributed(self, lambda: dtf.layer_norm(x, shape, weight, bias, eps))
        return dtf.layer_norm(x, shape, weight, bias, eps)

    return forward


#: the input types whose ``rms_norm`` computes as transformers' RMSNorm does, in float32
_FLOAT32_STATISTICS = (torch.float32, torch.float16, torch.bfloat16)


def _rms_norm_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The forward of a transformers RMSNorm on dnntune: ``rms_norm`` over the last dimension
    with the module's ``weight`` and ``variance_epsilon``, where the weight has the input's
    type (its forward then gives that type; another weight type gives the promoted one, and the
    module's own forward runs), and PyTorch's arithmetic as the module writes it for a float64
    input (the module computes in float32, ``rms_norm`` in float64), where refine
    flagged it, gradients are wanted or the input is not contiguous (that arithmetic lays its
    output out as its input, ``rms_norm`` contiguous: a transposed batch into LLaMA, Mistral,
    Qwen and Phi-3 came out in another layout than eager's, the first real-model sweep)."""

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self._parameters.get("weight")
        if (
            pytorch_route.on  # the forward runs on PyTorch's route (._route_race)
            or self.__dict__.get(PYTORCH_FLAG)
            or tracing()  # a recorded program records the module's own arithmetic
            or weight is None
            or not isinstance(hidden_states, torch.Tensor)
            or weight.dtype != hidden_states.dtype
            # the module computes in float32 whatever the input's type; rms_norm computes a
            # float64 input in float64 (off eager's numbers by float32's rounding, 1e-7)
            or hidden_states.dtype not in _FLOAT32_STATISTICS
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
