"""dnntune-backed module classes. ``optimize`` swaps a module's class for one of these, so its
parameters, buffers and state_dict keys stay exactly as they were; a module of one saves
(``torch.save``, pickle) as the PyTorch class it stands in for (:class:`_subclass.StandIn`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from dnntune.torch import _bn_fold
from dnntune.torch import functional as dtf
from dnntune.torch._armed import ARMED, compiling, take_armed
from dnntune.torch._bn_fold import foldable
from dnntune.torch._calls import PYTORCH_FLAG, _pytorch_forced, pytorch_when_flagged
from dnntune.torch._memo import module_tails
from dnntune.torch._subclass import StandIn
from dnntune.torch._support import (
    pytorch_route,
    residual_fits,
    tracing,
    warn_fallback,
)
from dnntune.torch.runtime import using_module

T = TypeVar("T")
_is_grad_enabled = torch.is_grad_enabled

__all__ = [
    "ATTRIBUTED",
    "DnnTuneBatchNorm2d",
    "DnnTuneConv2d",
    "DnnTuneLayerNorm",
    "DnnTuneLinear",
    "DnnTuneRMSNorm",
    "SWAPS",
]

#: the instance attribute ``optimize()`` sets to a module's name for its example forward: the
#: plans the module's calls take are listed under that name in its report. Read in the
#: modules' own methods, never through forward hooks: PyTorch's ``nn.TransformerEncoderLayer``
#: leaves its fused inference kernel for the layer-by-layer path when one of its modules has a
#: hook, so the example forward ran layers the model's forward never calls (new-user audit)
ATTRIBUTED = "_dnntune_attr"


def _attributed(module: nn.Module, call: Callable[[], T]) -> T:
    """``call()``, its plans attributed to ``module`` while ``optimize()`` builds its report."""
    name = module.__dict__.get(ATTRIBUTED)
    if name is None:
        return call()
    with using_module(name):
        return call()


def _grad_wanted(input: torch.Tensor, module: nn.Module, *names: str) -> bool:
    """Gradients are wanted from this call: a norm module then runs PyTorch's own forward, as
    its training does (an expected path, so no fallback warning). The parameters are looked up
    only when grad mode is on: ``module.weight`` goes through ``nn.Module.__getattr__``, about
    0.3 µs each, which inference (no_grad, inference_mode) does not pay. False while PyTorch
    records the program (:func:`tracing`): the dnntune op then runs PyTorch's functional op with
    the arguments PyTorch's forward passes, so a trace records the same in either grad mode
    (and ``torch.fx`` reads no proxy's ``requires_grad`` as a bool, nor
    ``BatchNorm2d._check_input_dim``'s test of one)."""
    if not torch.is_grad_enabled() or tracing():
        return False
    if input.requires_grad:
        return True
    params = module._parameters  # the one dict nn.Module.__getattr__ would search
    for name in names:
        # a parametrized weight (weight_norm, spectral_norm) is a property, not in the dict
        p = params[name] if name in params else getattr(module, name, None)
        if p is not None and p.requires_grad:
            return True
    return False


class DnnTuneConv2d(nn.Conv2d, StandIn):
    """nn.Conv2d on dnntune. Its forward is the conv alone, wherever it is called; the caller
    that runs it before a BatchNorm2d or an activation (a fused ``nn.Sequential``, a traced
    forward: :mod:`dnntune.torch.fusion`) asks it for the fused graph (eval mode). A string
    padding (``"same"``, ``"valid"``) runs on dnntune as explicit padding per side; another
    ``padding_mode`` than zeros runs PyTorch's forward."""

    _dnntune_origin = nn.Conv2d  # saved as nn.Conv2d (_subclass.StandIn)

    @pytorch_when_flagged
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if pytorch_route.on:  # the forward runs on PyTorch's route (._route_race)
            return super().forward(input)
        if self.padding_mode != "zeros":
            out = super().forward(input)  # first: an input PyTorch refuses raises, unwarned
            _warn_padding(self)
            return out
        weight, bias = _param(self, "weight"), _param(self, "bias")
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(self, lambda: self._conv(input, weight, bias, None, None))
        return self._conv(input, weight, bias, None, None)

    @pytorch_when_flagged
    def fused_activation(self, input: torch.Tensor, activation: str) -> torch.Tensor | None:
        """This conv + ``activation`` as one graph (eval mode), or None to run them apart."""
        if self.training or self.padding_mode != "zeros":
            return None
        return _attributed(
            self,
            lambda: self._conv(
                input, _param(self, "weight"), _param(self, "bias"), activation, None
            ),
        )

    @pytorch_when_flagged
    def fused_bn(
        self, input: torch.Tensor, bn: nn.BatchNorm2d, activation: str | None
    ) -> torch.Tensor | None:
        """This conv with ``bn`` folded into its weights (+ ``activation``) as one graph, for a
        batch norm called right after it in a traced forward (eval mode), or None to run them
        apart (so while PyTorch records the program: :func:`tracing`; the fold is cached)."""
        if self.training or not foldable(self, bn) or tracing():
            return None
        # an unbatched (3-D) input: the conv takes it and BatchNorm2d refuses it, so run apart
        # to raise as eager does (folded, it returned a tensor; new-user audit, session 55)
        if self.padding_mode != "zeros" or input.dim() != 4:
            return None
        folded = _bn_fold.folded(self, bn)
        if folded is None:
            return None
        weight, bias = folded
        return _attributed(self, lambda: self._conv(input, weight, bias, activation, None))

    @pytorch_when_flagged
    def fused_tail(
        self,
        input: torch.Tensor,
        residual: torch.Tensor,
        activation: str | None,
        bn: nn.BatchNorm2d | None = None,
    ) -> torch.Tensor | None:
        """This conv (with ``bn``, the batch norm after it, folded) + ``residual``
        (+ ``activation``) as one graph, or None when that is not this layer's eval-mode
        computation."""
        return _attributed(self, lambda: self._fused_tail(input, residual, activation, bn))

    def _fused_tail(
        self,
        input: torch.Tensor,
        residual: torch.Tensor,
        activation: str | None,
        bn: nn.BatchNorm2d | None,
    ) -> torch.Tensor | None:
        if self.padding_mode != "zeros":
            return None
        if self.training:
            return None
        if bn is None:
            return self._conv(
                input, _param(self, "weight"), _param(self, "bias"), activation, residual
            )
        if not foldable(self, bn) or tracing() or input.dim() != 4:  # as fused_bn
            return None
        folded = _bn_fold.folded(self, bn)
        if folded is None:
            return None
        weight, bias = folded
        return self._conv(input, weight, bias, activation, residual)

    def _conv(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None,
        residual: torch.Tensor | None,
    ) -> torch.Tensor:
        return dtf.conv2d(
            input,
            weight,
            bias,
            self.stride,
            self.padding,  # ints, or "same"/"valid": the functional op resolves it
            self.dilation,
            self.groups,
            activation=activation,
            residual=residual,
        )


def _warn_padding(conv: nn.Conv2d) -> None:
    """The one-time fallback warning (per reason) for a conv whose ``padding_mode`` dnntune's
    graphs do not model (reflect, replicate, circular): the report's "see the fallback
    warning" and the docs' Fallback section promise one. None while PyTorch records the
    program or for a module refine put on PyTorch's ops (expected routes)."""
    if tracing() or _pytorch_forced.get():
        return
    warn_fallback("conv2d", f"padding_mode={conv.padding_mode!r} is not supported (zeros is)")


def _param(module: nn.Module, name: str) -> Any:
    """``module.<name>`` for a registered parameter (or None), read from its ``_parameters``:
    ``nn.Module.__getattr__`` costs several times the dict lookup on every forward."""
    try:
        return module._parameters[name]
    except KeyError:  # not a registered parameter (a parametrization, a plain attribute)
        return getattr(module, name)


class DnnTuneBatchNorm2d(nn.BatchNorm2d, StandIn):
    """BatchNorm2d on dnntune in eval mode (PyTorch's own when it normalises with the batch's
    statistics: training, or no running statistics kept)."""

    _dnntune_origin = nn.BatchNorm2d  # saved as nn.BatchNorm2d (_subclass.StandIn)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if (
            pytorch_route.on  # the forward runs on PyTorch's route (._route_race)
            or self.training
            or self.running_mean is None
            or self.running_var is None
        ):
            return super().forward(input)
        if _grad_wanted(input, self, "weight", "bias"):  # frozen statistics, fine-tuning
            return super().forward(input)
        if not tracing():  # PyTorch's refusal of a 3-D or 5-D input (a proxy has no rank)
            self._check_input_dim(input)
        # the momentum PyTorch's forward passes (unused in eval mode): a trace records the same
        momentum = 0.0 if self.momentum is None else self.momentum
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(self, lambda: self._eval(input, momentum))
        return self._eval(input, momentum)

    def _eval(self, input: torch.Tensor, momentum: float) -> torch.Tensor:
        return dtf.batch_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            False,
            momentum,
            self.eps,
        )


class DnnTuneLinear(nn.Linear, StandIn):
    """nn.Linear on dnntune; a caller that runs it before an activation, a residual add or a
    multiply asks it for the fused graph (:meth:`fused_activation`, :meth:`fused_tail`,
    :meth:`fused_multiply`, eval mode)."""

    _dnntune_origin = nn.Linear  # saved as nn.Linear (_subclass.StandIn)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # one frame before the op (six linears per transformer block): PyTorch's own where
        # refine flagged the module (``pytorch_when_flagged``, inlined: dnntune's op would run
        # F.linear then), the parameters read from their dict (``_param``, inlined)
        if pytorch_route.on:  # the forward runs on PyTorch's route (._route_race)
            return super().forward(input)
        if not compiling() and ARMED.get() is not None:  # a parent's residual add (_armed)
            out = take_armed(self, input, self.fused_tail)
            if out is not None:
                return out
        if self.__dict__.get(PYTORCH_FLAG):
            return super().forward(input)
        params = self._parameters
        weight = params["weight"] if "weight" in params else self.weight  # noqa: SIM401
        bias = params["bias"] if "bias" in params else self.bias  # noqa: SIM401
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(self, lambda: dtf.linear(input, weight, bias))  # type: ignore[arg-type]
        return dtf.linear(input, weight, bias)  # type: ignore[arg-type]  # weight is set

    @pytorch_when_flagged
    def fused_activation(self, input: torch.Tensor, activation: str) -> torch.Tensor | None:
        """This linear + ``activation`` as one graph (eval mode), or None to run them apart."""
        if self.training:
            return None
        return _attributed(
            self,
            lambda: dtf.linear(
                input, _param(self, "weight"), _param(self, "bias"), activation=activation
            ),
        )

    @pytorch_when_flagged
    def fused_tail(
        self, input: torch.Tensor, residual: torch.Tensor, activation: str | None
    ) -> torch.Tensor | None:
        """This linear + ``residual`` (+ ``activation``) as one graph (eval mode, a residual of
        the output's shape and type), or None to run them apart."""
        out = self._with_operand(input, residual, activation=activation, residual=residual)
        name = self.__dict__.get(ATTRIBUTED)
        if out is not None and name is not None:  # optimize's example forward: its report
            module_tails.add(name)
        return out

    @pytorch_when_flagged
    def fused_multiply(self, input: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor | None:
        """This linear times ``multiplier`` as one graph (eval mode, a multiplier of the
        output's shape and type: a gated MLP's activated gate), or None to run them apart."""
        return self._with_operand(input, multiplier, multiplier=multiplier)

    def _with_operand(
        self, input: torch.Tensor, operand: torch.Tensor, **epilogue: Any
    ) -> torch.Tensor | None:
        """``dtf.linear`` with ``epilogue`` taking ``operand``, a tensor of the output's shape
        and type, in eval mode; else None."""
        if self.training or tracing():  # tracing: a proxy's shape is no tuple
            return None
        if not residual_fits(input, operand, self.out_features):
            return None
        return _attributed(self, lambda: dtf.linear(input, self.weight, self.bias, **epilogue))


class DnnTuneLayerNorm(nn.LayerNorm, StandIn):
    """nn.LayerNorm on dnntune for inference (PyTorch's own when gradients are wanted)."""

    _dnntune_origin = nn.LayerNorm  # saved as nn.LayerNorm (_subclass.StandIn)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # one frame before the op (a layer norm runs twice per transformer block): PyTorch's
        # own where refine flagged the module (``pytorch_when_flagged``, inlined) or gradients
        # are wanted; the parameters read from their dict (``_param``, inlined)
        if (
            pytorch_route.on  # the forward runs on PyTorch's route (._route_race)
            or self.__dict__.get(PYTORCH_FLAG)
            or (_is_grad_enabled() and _grad_wanted(input, self, "weight", "bias"))
        ):
            return super().forward(input)
        # not params.get(name, self.weight): that reads nn.Module.__getattr__ on every call
        params = self._parameters
        weight = params["weight"] if "weight" in params else self.weight  # noqa: SIM401
        bias = params["bias"] if "bias" in params else self.bias  # noqa: SIM401
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(
                self, lambda: dtf.layer_norm(input, self.normalized_shape, weight, bias, self.eps)
            )
        return dtf.layer_norm(input, self.normalized_shape, weight, bias, self.eps)


class DnnTuneRMSNorm(nn.RMSNorm, StandIn):
    """nn.RMSNorm on dnntune for inference (PyTorch's own when gradients are wanted)."""

    _dnntune_origin = nn.RMSNorm  # saved as nn.RMSNorm (_subclass.StandIn)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # one frame before the op, as DnnTuneLayerNorm's
        if (
            pytorch_route.on  # as DnnTuneLayerNorm's
            or self.__dict__.get(PYTORCH_FLAG)
            or (_is_grad_enabled() and _grad_wanted(input, self, "weight"))
        ):
            return super().forward(input)
        params = self._parameters
        weight = params["weight"] if "weight" in params else self.weight  # noqa: SIM401
        # normalized_shape: a tuple (nn.RMSNorm makes it one)
        if ATTRIBUTED in self.__dict__:  # optimize's example forward
            return _attributed(
                self, lambda: dtf.rms_norm(input, self.normalized_shape, weight, self.eps)
            )
        return dtf.rms_norm(input, self.normalized_shape, weight, self.eps)


SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv2d: DnnTuneConv2d,
    nn.Linear: DnnTuneLinear,
    nn.LayerNorm: DnnTuneLayerNorm,
    nn.RMSNorm: DnnTuneRMSNorm,
    nn.BatchNorm2d: DnnTuneBatchNorm2d,
}
