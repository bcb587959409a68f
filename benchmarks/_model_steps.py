"""The optimized, eager and exact models of one ``model_conformance.py`` case, kept in step
and checked condition by condition (each value judged by :mod:`_model_checks`)."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from _model_checks import compare, compare_draws, first_wrong_block
from _random_models import Case
from torch import nn

__all__ = ["Models", "eager_guard"]

#: how many inputs the reduced-precision gradient checks draw (``Models.input_grad``,
#: ``Models.train_step``)
_GRAD_DRAWS = 8


class Models:
    """The optimized model, the eager model and the exact (float64, default layout) model,
    kept in step: the same inputs, weights and mode."""

    def __init__(self, case: Case, optimized: nn.Module, eager: nn.Module, exact: nn.Module):
        self.case, self.ours, self.eager, self.exact = case, optimized, eager, exact
        self.failed: list[str] = []
        self.checks = 0

    def forward(self, x: torch.Tensor, what: str) -> None:
        with torch.no_grad():
            exact = self.exact(x.double().contiguous())
            eager = self.eager(x)
            also = self.eager(_other_layout(x))
            for i in range(2):  # the first call of a signature, then its memo
                failed = len(self.failed)
                self._check(self.ours(x), eager, exact, f"{what} (call {i + 1})", also)
                if len(self.failed) > failed and i == 0:
                    where = first_wrong_block(self.ours, self.eager, self.exact, x)
                    if where is not None:
                        self.failed[-1] += f"; first wrong: {where}"

    def _check(
        self, ours: Any, eager: Any, exact: Any, what: str, also: torch.Tensor | None = None
    ) -> None:
        self.checks += 1
        why = compare(ours, eager, exact, what, also)
        if why is not None:
            self.failed.append(why)

    def _draws(self, x: torch.Tensor) -> int:
        """How many inputs a gradient check draws: one in float32, unless the case asks for
        more (a deep real network)."""
        single = x.dtype == torch.float32 and not self.case.float32_draws
        return 1 if single else _GRAD_DRAWS

    def _onednn_twin(self, x: torch.Tensor) -> nn.Module | None:
        """On the CPU: a copy of the eager model in training, run with oneDNN (PyTorch's CPU
        default, which :func:`eager_guard` turns off for the eager model: its strided
        channels-last weight gradient is wrong). Its gradients are eager's error in that mode
        too, the larger of the two counting, as for the layouts: ResNeXt-50's batch norms over
        2x2 maps of 3 images gave dnntune's gradients bit for bit oneDNN eager's, 7x the error
        of eager without it (the first real-model sweep, session 37). A model or input in
        another layout gets a twin in NCHW, fed NCHW copies (:func:`_twin_input`), since oneDNN's
        strided channels-last weight gradient is wrong (dnntune's CPU calls run it on NCHW
        copies too): timm's ReXNet as a channels-last model, seed 4431, failed a batch norm's
        weight gradient at 47x eager's error without oneDNN, and passed with oneDNN off for the
        whole process (session 41)."""
        if x.device.type != "cpu":
            return None
        twin = copy.deepcopy(self.eager)
        case = self.case
        if case.channels_last_model or case.channels_last_input or not x.is_contiguous():
            twin = twin.to(memory_format=torch.contiguous_format)
        return twin

    def load(self, state: dict[str, torch.Tensor]) -> None:
        for m in (self.ours, self.eager, self.exact):
            m.load_state_dict(state)

    def edit_weights(self, g: torch.Generator) -> None:
        with torch.no_grad():
            for a, b, c in zip(
                self.ours.parameters(),
                self.eager.parameters(),
                self.exact.parameters(),
                strict=True,
            ):
                scale = 0.1
                if self.case.relative_edits:
                    scale *= b.detach().float().abs().mean().clamp(min=0.02).item()
                step = (torch.randn(a.shape, generator=g) * scale).to(a.device)
                a.add_(step.to(a.dtype))
                b.add_(step.to(b.dtype))
                c.add_(step.double())

    def input_grad(self, x: torch.Tensor, g: torch.Generator) -> None:
        """The input's gradient in eval mode, over ``_GRAD_DRAWS`` inputs in float16 and
        bfloat16 (the first is ``x``). There a folded batch norm before a ReLU rounds some
        pre-activations to the other side of zero from eager's, as eager's rounding does from
        the exact answer's, and a flipped gate is an error of the gradient's own size: one
        draw's largest error is then heavy-tailed for eager and dnntune alike (bfloat16, seeds
        3004, 3029, 3187, 3262 and 3273 over 40 draws each: dnntune's over eager's from 0.12x
        to 8.95x, median 1.00x; float16, seed 9093's deep residual CNN: 3 of 8 draws beyond
        6 for eager, 5 of 8 for dnntune, at gradients up to 169), while a wrong kernel is
        wrong on every draw (:func:`compare_draws`)."""
        draws = self._draws(x)
        found: list[list[torch.Tensor]] = [[], [], []]
        for i in range(draws):
            xi = x if i == 0 else self.case.make_input(x.shape[0])
            xs = [xi.clone().requires_grad_(), xi.clone().requires_grad_()]
            x64 = xi.double().contiguous().requires_grad_()
            outs = [self.ours(xs[0]), self.eager(xs[1]), self.exact(x64)]
            seed = torch.randn(outs[1].shape, generator=g).to(x.device)
            for grads, out, t in zip(found, outs, (xs[0], xs[1], x64), strict=True):
                grads.append(torch.autograd.grad(out, t, seed.to(out.dtype))[0])
        self.checks += 1
        why = compare_draws(*found, "input_grad")
        if why is not None:
            self.failed.append(why)

    def train_step(self, x: torch.Tensor, g: torch.Generator) -> None:
        """A training step's forward, its buffers (batch-norm statistics) and its parameters'
        gradients; in float16 and bfloat16 the gradients over ``_GRAD_DRAWS`` inputs (the
        first is ``x``), judged as the input's (:meth:`input_grad`): a batch norm over a
        small batch before a ReLU flips gates as eager's rounding does (seed 1, bfloat16 on
        the H100: one draw gave dnntune 5 to 10 times eager's error in the first layers'
        gradients, where isolated, each convolution's gradients equalled eager's)."""
        for m in (self.ours, self.eager, self.exact):
            m.train()
        draws = self._draws(x)
        names = [name for name, _ in self.eager.named_parameters()]
        found: dict[str, list[list[torch.Tensor]]] = {name: [[], [], []] for name in names}
        twin = self._onednn_twin(x)
        also: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        for i in range(draws):
            xi = x if i == 0 else self.case.make_input(x.shape[0])
            ours = self.ours(xi)
            with eager_guard(x.device):
                eager = self.eager(xi)
            exact = self.exact(xi.double().contiguous())
            if i == 0:
                self._check(ours, eager, exact, "train forward")
            seed = torch.randn(eager.shape, generator=g).to(x.device)
            ours.backward(seed.to(ours.dtype))
            with eager_guard(x.device):
                eager.backward(seed.to(eager.dtype))
            exact.backward(seed.double())
            if twin is not None:
                twin(_twin_input(xi)).backward(seed.to(eager.dtype))
                for name, p in twin.named_parameters():
                    if p.grad is not None:
                        also[name].append(p.grad.detach().clone())
                twin.zero_grad(set_to_none=True)
            params = zip(
                names,
                self.ours.parameters(),
                self.eager.parameters(),
                self.exact.parameters(),
                strict=True,
            )
            for name, *three in params:
                grads = [p.grad for p in three]
                if grads[0] is None and grads[1] is None:
                    found.pop(name, None)
                elif grads[0] is None or grads[1] is None:
                    if found.pop(name, None) is not None:
                        self.checks += 1
                        self.failed.append(
                            f"train grad {name}: only one of dnntune and eager has one"
                        )
                elif name in found:
                    for kept, grad in zip(found[name], grads, strict=True):
                        kept.append(grad.detach().clone())
            for m in (self.ours, self.eager, self.exact):
                m.zero_grad(set_to_none=True)
            if i == 0:
                buffers = zip(
                    self.eager.named_buffers(),
                    self.ours.buffers(),
                    self.exact.buffers(),
                    strict=True,
                )
                for (name, eager_buffer), ours_buffer, exact_buffer in buffers:
                    if eager_buffer.is_floating_point():
                        self._check(ours_buffer, eager_buffer, exact_buffer, f"train buffer {name}")
        for name, (ours_grads, eager_grads, exact_grads) in found.items():
            self.checks += 1
            other = also[name] if len(also[name]) == len(ours_grads) else None
            why = compare_draws(ours_grads, eager_grads, exact_grads, f"train grad {name}", other)
            if why is not None:
                self.failed.append(why)
        for m in (self.ours, self.eager, self.exact):
            m.eval()
            m.zero_grad(set_to_none=True)


def _other_layout(x: torch.Tensor) -> torch.Tensor:
    """The same values in the other memory layout: a non-contiguous input's contiguous copy; a
    contiguous image batch channels-last; else the same tensor."""
    if not x.is_contiguous():
        return x.contiguous()
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _twin_input(x: torch.Tensor) -> torch.Tensor:
    """An input of the oneDNN twin: contiguous (NCHW for an image), the layout it runs in."""
    return x.contiguous()


@contextlib.contextmanager
def eager_guard(device: torch.device) -> Iterator[None]:
    """Eager PyTorch's training on the CPU without oneDNN: its weight gradient of a strided
    channels-last convolution is wrong there, and has corrupted the heap (torch 2.13; dnntune
    runs such calls on NCHW copies), which would take this process down; PyTorch's other CPU
    kernels are exact and lay their outputs out the same way."""
    if device.type != "cpu":
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flags' note on TF32 for Intel GPUs
        with torch.backends.mkldnn.flags(enabled=False):
            yield
