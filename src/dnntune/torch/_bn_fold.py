"""Folding an eval-mode batch norm into the convolution before it: whether a pair folds
(:func:`foldable`, and :func:`folds` for ``optimize``'s report), the folded weights and bias
(:func:`fold_bn`), and their per-conv cache (:func:`folded`), which :class:`~dnntune.torch.
modules.DnnTuneConv2d`'s fused calls read on every forward.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from dnntune.torch._subclass import original_class
from dnntune.torch._support import OPTIMIZER_STEPS, foreign_capture, unsupported_kind
from dnntune.torch._timm import norm_act_class
from dnntune.torch.graphs import memory_format_of

__all__ = ["fold_bn", "foldable", "folded", "folds"]


def foldable(conv: nn.Module, bn: nn.Module) -> bool:
    """A batch norm that computes with fixed statistics (eval mode, running statistics kept):
    one that normalises with the batch's own statistics cannot be folded into weights. Its batch
    norm must compute what ``nn.BatchNorm2d`` computes: that class or dnntune's stand-in for it,
    or timm's ``BatchNormAct2d`` (the same arithmetic, then a dropout and an activation of its
    own, which the caller folds in or declines: ``_fused_calls.norm_act``), never another
    subclass, and neither
    module may have a forward of its own set on the instance. Neither may be parametrized
    (``weight_norm``, ``register_parametrization``): its weight is then computed on every call
    from tensors the fold does not track. Nor may a tensor the fold reads be a plain attribute
    (``del conv.weight; conv.weight = hypernet(z)``): :func:`folded` tracks the sources in the
    parameter and buffer dicts (a conv's raised KeyError inside the user's forward, and a batch
    norm's weight set so kept the fold of the first one; new-user audit of training)."""
    return (
        (_PLAIN_BN.get(type(bn)) or _plain_batch_norm(type(bn)))  # a dict lookup once known
        and not bn.training
        and bn.running_mean is not None
        and bn.running_var is not None
        and "parametrizations" not in conv._modules
        and "parametrizations" not in bn._modules
        and _REGISTERED_CONV.issubset(conv._parameters)
        and _REGISTERED_BN.issubset(bn._parameters)
        and _REGISTERED_STATS.issubset(bn._buffers)
        and "forward" not in bn.__dict__
        and "forward" not in conv.__dict__
    )


def folds(conv: nn.Module, bn: nn.Module) -> bool:
    """Whether a fused call folds ``bn`` into ``conv`` as the two are now (``fused_bn``'s
    conditions less the per-call ones): for ``optimize``'s report, which lists a fold only
    where one runs (a batch norm keeping no running statistics, or a conv with another
    ``padding_mode``, ran apart while the report said "folded"). A string padding
    (``"same"``, ``"valid"``) folds: the functional op takes it."""
    return (
        not conv.training
        and getattr(conv, "padding_mode", None) == "zeros"
        and bool(foldable(conv, bn))
    )


#: what each module keeps in its parameter or buffer dict (an absent parameter as None there)
_REGISTERED_CONV = frozenset(("weight", "bias"))
_REGISTERED_BN = frozenset(("weight", "bias"))
_REGISTERED_STATS = frozenset(("running_mean", "running_var"))

#: class -> whether its batch norm computes exactly nn.BatchNorm2d's (it, a stand-in for it, or
#: timm's BatchNormAct2d), decided once
_PLAIN_BN: dict[type, bool] = {}


def _plain_batch_norm(cls: type) -> bool:
    """``cls`` is ``nn.BatchNorm2d`` or a class ``optimize`` puts in its place (its own
    ``DnnTuneBatchNorm2d``, a run-time stand-in for that), or timm's ``BatchNormAct2d``, whose
    forward is ``nn.BatchNorm2d``'s arithmetic before its dropout and activation: any other
    subclass, though it derives from ``nn.BatchNorm2d``, may compute otherwise. Decided once per
    class."""
    plain = _PLAIN_BN.get(cls)
    if plain is None:
        origin = original_class(cls)
        plain = _PLAIN_BN[cls] = origin is nn.BatchNorm2d or norm_act_class(origin)
    return plain


def folded(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The folded weights and bias, recomputed only when a parameter or statistic changed, or
    None when a parameter or statistic is not a plain strided tensor (a subclass such as
    DTensor: :func:`unsupported_kind`), which the cache cannot track by address.

    The cache holds the source tensors themselves (so their identities cannot be reused)
    with each one's address and version counter (``num_batches_tracked``'s too: a training
    forward updates the statistics without counting their versions): an in-place update (an
    optimizer step, ``load_state_dict``, ``copy_``, a training forward), a swapped tensor or a
    ``.data`` assignment is always honoured; so is any optimizer step (a fused optimizer
    counts no versions: ``OPTIMIZER_STEPS``). It lives in the module's ``__dict__``, outside
    its state_dict. The sources are read from the modules' parameter and buffer dicts
    (``nn.Module.__getattr__`` costs more than the check itself).
    """
    cp, bp, bb = conv._parameters, bn._parameters, bn._buffers
    sources = (
        cp["weight"],
        cp.get("bias"),
        bp.get("weight"),
        bp.get("bias"),
        bb.get("running_mean"),
        bb.get("running_var"),
        # a training forward updates the statistics in place without counting a version
        # (PyTorch's batch-norm kernel), but it counts this one's (``add_(1)``)
        bb.get("num_batches_tracked"),
    )
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in sources[:4]):
        # gradients wanted in eval mode (fine-tuning under frozen statistics): the fold is part
        # of the autograd graph, so the conv's and batch norm's parameters get their gradients
        return fold_bn(conv, bn, differentiable=True)
    if sources[0] is not None and foreign_capture(sources[0]):
        # a user's own capture: folded inside it, so each replay folds the weights as they are
        # then; not cached (its values exist only in replays). docs/torch.md, CUDA graphs
        return fold_bn(conv, bn)
    cached = conv.__dict__.get("_dnntune_fold")
    # each check one C-level map over the tensors (no Python loop on the hot path)
    if (
        cached is not None
        and all(map(operator.is_, cached[0], sources))
        and cached[1] == bn.eps
        and cached[7] == OPTIMIZER_STEPS[0]
        and cached[3] == tuple(map(_version, cached[2]))
        and cached[4] == tuple(map(_data_ptr, cached[2]))
    ):
        return cached[5], cached[6]
    present = tuple(t for t in sources if t is not None)
    if unsupported_kind(present) is not None:
        return None  # the sources the cache held were plain: a hit above needs no check
    weight, bias = fold_bn(conv, bn)
    if any(t.is_inference() for t in present):
        # a model built under torch.inference_mode: its tensors keep no version counter, so
        # a change to them cannot be seen: folded afresh on every call, never cached (reading
        # the versions raised RuntimeError inside the user's forward; new-user audit)
        conv.__dict__.pop("_dnntune_fold", None)
        return weight, bias
    versions, addresses = tuple(map(_version, present)), tuple(map(_data_ptr, present))
    fold = (sources, bn.eps, present, versions, addresses, weight, bias, OPTIMIZER_STEPS[0])
    conv.__dict__["_dnntune_fold"] = fold
    return weight, bias


_version = operator.attrgetter("_version")
_data_ptr = torch.Tensor.data_ptr


def fold_bn(
    conv: nn.Conv2d, bn: nn.BatchNorm2d, differentiable: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Conv weights and bias with an eval-mode batch norm folded in."""
    assert bn.running_mean is not None and bn.running_var is not None
    # fp32 at least, the weights' own type when wider (a float64 model keeps its precision)
    wide = torch.promote_types(conv.weight.dtype, torch.float32)
    # never inference tensors, even under torch.inference_mode: the cached fold also serves
    # later calls whose input needs gradients, which autograd must be able to save it for
    with (
        torch.inference_mode(False),
        torch.set_grad_enabled(differentiable and torch.is_grad_enabled()),
    ):
        inv = torch.rsqrt(bn.running_var.to(wide) + bn.eps)
        gamma = bn.weight.to(wide) if bn.weight is not None else torch.ones_like(inv)
        beta = bn.bias.to(wide) if bn.bias is not None else torch.zeros_like(inv)
        scale = gamma * inv
        weight = (conv.weight.to(wide) * scale.view(-1, 1, 1, 1)).to(conv.weight.dtype)
        base = conv.bias.to(wide) if conv.bias is not None else torch.zeros_like(inv)
        bias = ((base - bn.running_mean.to(wide)) * scale + beta).to(conv.weight.dtype)
    weight = weight.contiguous(memory_format=memory_format_of(conv.weight))
    return weight, bias
