"""timm's classes that dnntune computes in place of their own forward, known by module and
name (dnntune does not import timm): a leaf, imported by :mod:`dnntune.torch.modules` and the
fused calls."""

from __future__ import annotations

__all__ = ["layer_norm_like", "norm_act_class"]

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


#: timm's ``LayerNorm`` (``timm.layers.norm``: ViT's, DeiT's and many more models' norm layer):
#: an ``nn.LayerNorm`` whose forward calls ``F.layer_norm`` with the module's own settings
#: unless its ``_fast_norm`` flag (set at construction from timm's global) is on
_LAYER_NORMS = frozenset(
    {("timm.layers.norm", "LayerNorm"), ("timm.models.layers.norm", "LayerNorm")}
)


def layer_norm_like(module: object) -> bool:
    """Whether ``module`` is exactly timm's ``LayerNorm`` (not a subclass), running its class's
    own forward (none set on the instance) with its fast-norm path off: ``nn.LayerNorm``'s
    arithmetic, which dnntune's ``layer_norm`` computes."""
    cls = type(module)
    state = getattr(module, "__dict__", {})
    return (
        (cls.__module__, cls.__qualname__) in _LAYER_NORMS
        and getattr(getattr(cls, "forward", None), "__qualname__", None) == "LayerNorm.forward"
        and "forward" not in state
        and state.get("_fast_norm") is False
    )
