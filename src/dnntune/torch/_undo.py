"""What ``optimize`` changes in a model, recorded before it changes anything, so that the
model can be put back: whole (an ``optimize`` that raised), to PyTorch's forward (a revert), or
switched back and forth for side-by-side timing."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import is_lazy

from dnntune.torch._subclass import original_class
from dnntune.torch.cuda_graphs import GraphedForward
from dnntune.torch.cuda_graphs import attach as attach_cuda_graphs
from dnntune.torch.cuda_graphs import detach as detach_cuda_graphs
from dnntune.torch.cuda_graphs import forget as forget_cuda_graphs

__all__ = ["Undo"]


class Undo:
    """What ``optimize`` changes in a model, recorded first so it can be put back: every
    submodule's class (swaps, fusions, folding, routing and CUDA-graph replay all swap classes)
    and the ``_dnntune*`` attributes it sets on instances (the example forward's attribution
    among them)."""

    def __init__(self, module: nn.Module) -> None:
        self.root = module
        self.classes = [(m, type(m)) for m in module.modules()]
        # what an earlier optimize() left (put back by restore)
        self.state = [
            {k: v for k, v in m.__dict__.items() if k.startswith("_dnntune")}
            for m, _ in self.classes
        ]

    def restore(self) -> None:
        """Put the model back as it was before this ``optimize`` (an optimize that raised):
        classes, ``_dnntune*`` attributes, and no CUDA graphs of a module that had none."""
        self._to_pytorch()
        for (m, cls), state in zip(self.classes, self.state, strict=True):
            m.__class__ = _settled(m, cls)  # an earlier optimize's class, where there was one
            m.__dict__.update(state)
            if not getattr(cls, "_dnntune_graphed", False):
                forget_cuda_graphs(m)

    def revert(self) -> None:
        """Put the model back to PyTorch's forward, its CUDA graphs forgotten (no block
        replays alone)."""
        self._to_pytorch()
        forget_cuda_graphs(self.root)
        self.compact()

    def compact(self) -> None:
        """Rebuild each module's attribute dict as a fresh table: ``refine`` and the side by
        side timing switch modules between their two states dozens of times, each adding and
        deleting ``_dnntune*`` attributes, which leaves the dicts grown and sparse; a reverted
        model should run PyTorch's forward exactly as a model never optimized (and an
        optimized one read its attributes from compact tables too)."""
        for m, _ in self.classes:
            state = dict(m.__dict__)
            m.__dict__.clear()
            m.__dict__.update(state)

    def to_pytorch(self) -> None:
        """Every module on its class from before any ``optimize``, no ``_dnntune*`` attribute
        (CUDA-graph capture states are left to the caller: ``detach`` them first)."""
        self._to_pytorch()

    def _to_pytorch(self) -> None:
        for m, cls in self.classes:
            # the class from before any optimize(): a model optimized twice goes back to
            # PyTorch's own, not to the first optimize's classes stripped of their state
            m.__class__ = _settled(m, original_class(cls))
            for key in [k for k in m.__dict__ if k.startswith("_dnntune")]:
                del m.__dict__[key]

    def switcher(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """(to PyTorch's forward, back to the optimized one): for timing both side by side.
        The optimized state (classes, ``_dnntune`` attributes, captured graphs) is taken as it
        is now and put back whole."""
        optimized = [
            (m, type(m), {k: v for k, v in m.__dict__.items() if k.startswith("_dnntune")})
            for m, _ in self.classes
        ]
        graphs: list[tuple[nn.Module, GraphedForward | None]] = []

        def to_pytorch() -> None:
            if not graphs:
                graphs.extend((m, detach_cuda_graphs(m)) for m, _ in self.classes)
            self._to_pytorch()

        def to_optimized() -> None:
            for m, cls, attrs in optimized:
                m.__class__ = cls
                m.__dict__.update(attrs)
            for m, state in graphs:
                attach_cuda_graphs(m, state)
            graphs.clear()

        return to_pytorch, to_optimized


def _settled(m: nn.Module, cls: type) -> type:
    """``cls``, or for a lazy module (``nn.LazyBatchNorm2d``) materialized since it was taken
    (its first forward ran inside ``optimize``), the class PyTorch gave it then
    (``cls_to_become``): a put-back leaves it materialized, as PyTorch's own class (a revert
    made it a ``LazyBatchNorm2d`` again, holding materialized tensors)."""
    become = getattr(cls, "cls_to_become", None)
    if become is None or not issubclass(cls, LazyModuleMixin):
        return cls
    tensors = (*m.parameters(recurse=False), *m.buffers(recurse=False))
    return cls if any(map(is_lazy, tensors)) else become
