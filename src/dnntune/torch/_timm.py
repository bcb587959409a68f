"""timm's classes that dnntune computes in place of their own forward, known by module and
name (dnntune does not import timm): a leaf, imported by :mod:`dnntune.torch.modules` and the
fused calls."""

from __future__ import annotations

__all__ = ["norm_act_class"]

#: timm's batch norm with its activation (``timm.layers.norm_act``; dnntune does not import
#: timm): ``nn.BatchNorm2d.forward``'s arithmetic, then its ``drop`` and ``act`` children
_NORM_ACTS = frozenset(
    {("timm.layers.norm_act", "BatchNormAct2d"), ("timm.models.layers.norm_act", "BatchNormAct2d")}
)


def norm_act_class(cls: type) -> bool:
    """Whether ``cls`` is exactly timm's ``BatchNormAct2d`` (not a subclass of it); decided
    once per class (a fused call asks on every call)."""
    known = _NORM_ACT_CLASSES.get(cls)
    if known is None:
        known = _NORM_ACT_CLASSES[cls] = (cls.__module__, cls.__qualname__) in _NORM_ACTS
    return known


_NORM_ACT_CLASSES: dict[type, bool] = {}
