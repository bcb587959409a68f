"""The forms a model can run in while ``optimize`` decides between them, switched back and forth
for side-by-side timing: each module's class, its ``_dnntune*`` attributes and its CUDA-graph
capture state (graphs kept while the form is put away)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from dnntune.torch.cuda_graphs import GraphedForward
from dnntune.torch.cuda_graphs import attach as attach_cuda_graphs
from dnntune.torch.cuda_graphs import detach as detach_cuda_graphs

__all__ = ["Form", "Forms"]

_OWN = "_dnntune"


@dataclass
class Form:
    """One form of the model: per module, its class, its ``_dnntune*`` attributes and its
    capture state (None: no graphs)."""

    classes: list[type[nn.Module]]
    attributes: list[dict[str, Any]]
    states: list[GraphedForward | None]

    def free(self) -> None:
        """Drop this form's graphs and their memory (it will not be put back)."""
        for state in self.states:
            if state is not None:
                state.clear()
        self.states = [None] * len(self.states)


class Forms:
    """Takes the model's current form away (:meth:`take`) and puts one back (:meth:`put`):
    a form put back gets its own graphs again, and what the calls made of them since (a new
    signature recorded) goes with the form when the next one is put."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self._modules = list(modules)
        self._current: Form | None = None

    def take(self) -> Form:
        """The model's form as it is now; its graphs are detached (the model has none until a
        form is put back)."""
        form = Form(
            [type(m) for m in self._modules],
            [{k: v for k, v in m.__dict__.items() if k.startswith(_OWN)} for m in self._modules],
            [detach_cuda_graphs(m) for m in self._modules],
        )
        if self._current is not None:
            # the form that was on the model gave its graphs to the new one: it keeps none
            self._current.states = [None] * len(self._modules)
            self._current = None
        return form

    def put(self, form: Form) -> None:
        """Put ``form`` on the model (the form on it now keeps its graphs for later)."""
        if form is self._current:
            return
        current = self._current
        for i, m in enumerate(self._modules):
            state = detach_cuda_graphs(m)
            if current is not None:
                current.states[i] = state
            for key in [k for k in m.__dict__ if k.startswith(_OWN)]:
                del m.__dict__[key]
        for m, cls, attributes, state in zip(
            self._modules, form.classes, form.attributes, form.states, strict=True
        ):
            m.__class__ = cls
            m.__dict__.update(attributes)
            attach_cuda_graphs(m, state)
        self._current = form
