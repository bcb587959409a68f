"""What ``optimize``'s report says of the fusions (:mod:`dnntune.torch.fusion`): per fused
layer, what it took in (its per-module line: ``conv1: Conv2d + bn1 (batchnorm, folded) +
residual add + relu``), and which batch norm is folded into which conv."""

from __future__ import annotations

from torch import nn

from dnntune.torch._bn_fold import folds
from dnntune.torch.fusion import Fusion, fuse_sequential, hooked

__all__ = [
    "by_first_name",
    "folded_into",
    "folds_now",
    "fuse_sequential_into",
    "fused_layer",
    "traced_into",
]


def _parts(f: Fusion) -> tuple[str, str, list[str]]:
    """(the prefix of the fused module's children, the layer, the batch norms folded into it)."""
    layer, *folded = f.branch.split(" + ")
    return (f"{f.module}." if f.module else ""), layer, folded


def fused_layer(f: Fusion) -> str:
    """The name of the layer that runs ``f``'s fused graph."""
    prefix, layer, _ = _parts(f)
    return prefix + layer


def fusion_layers(f: Fusion) -> list[str]:
    """The names of the layer that runs ``f`` and of the batch norms folded into it."""
    prefix, layer, folded = _parts(f)
    return [prefix + n for n in (layer, *folded)]


def folded_into(fusions: list[Fusion]) -> dict[str, str]:
    """Batch norm name -> the conv it is folded into (a conv and the batch norm after it)."""
    out: dict[str, str] = {}
    for f in fusions:
        prefix, layer, folded = _parts(f)
        out.update((prefix + bn, prefix + layer) for bn in folded)
    return out


def folds_now(f: Fusion, modules: dict[str, nn.Module]) -> bool:
    """Every batch norm ``f`` folds into its conv folds as the modules are now."""
    conv = fused_layer(f)
    return all(
        folds(modules[conv], modules[bn])
        for bn, into in folded_into([f]).items()
        if into == conv and conv in modules and bn in modules
    )


def by_first_name(
    fused: dict[str, list[str]], fusions: list[Fusion], first: dict[str, str]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """``fused`` and :func:`folded_into` by each layer's first qualified name (``first``: every
    name to the first, as ``named_modules()`` gives it): a module held in two places is one row
    of the report, and what a fusion found at another of its names (a conv shared by two
    Sequentials, at ``b.0``) is that row's."""
    folded = {first.get(bn, bn): first.get(c, c) for bn, c in folded_into(fusions).items()}
    fused_at: dict[str, list[str]] = {}
    for layer, parts in fused.items():
        fused_at.setdefault(first.get(layer, layer), []).extend(parts)
    return fused_at, folded


def traced_into(fusions: list[Fusion], fused: dict[str, list[str]]) -> None:
    """Per traced fusion, what its layer took in (``fused``, by the layer's name), as the
    Sequential ones read: the report's per-module line named none of them (new-user audit,
    session 15)."""
    for f in fusions:
        prefix, layer, folded = _parts(f)
        what = fused.setdefault(prefix + layer, [])
        what.extend(f"{prefix}{bn} (batchnorm, folded)" for bn in folded)
        if f.residual:
            what.append("residual add")
        if f.activation:
            what.append(f.activation)
        if f.multiply:
            what.append("multiply")


def fuse_sequential_into(
    seq: nn.Sequential, name: str, fused: dict[str, list[str]], fusions: list[Fusion]
) -> None:
    """Fuse ``seq``'s children (:func:`fuse_sequential`): per fused layer, what it took in
    (``fused``, by the layer's name) and the fusion (``fusions``, as the traced ones read)."""
    prefix = f"{name}." if name else ""
    for f in fuse_sequential(seq):
        if hooked(*(seq.get_submodule(n) for n in (f.layer, f.folded, f.act) if n is not None)):
            # while a hook of the user's is set the fusion runs its modules one by one (each
            # hook sees its module's call): not listed, since it does not run (new-user audit)
            continue
        what = fused.setdefault(f"{prefix}{f.layer}", [])
        if f.folded is not None:
            what.append(f"{prefix}{f.folded} (batchnorm, folded)")
        if f.act is not None:
            what.append(f"{prefix}{f.act} ({f.activation})")
        layers = f.layer if f.folded is None else f"{f.layer} + {f.folded}"
        fusions.append(Fusion(name, layers, f.activation, residual=False))
