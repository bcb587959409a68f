"""The plan both torch engines build: a run function and the uids of its arguments."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch

from dnntune.backend.engine import BoundCall, Engine, Plan, VariantPack
from dnntune.backend.knobs import KnobSetting
from dnntune.errors import DnnTuneError, ExecutionError

__all__ = ["ProgramPlan", "RunFn"]

#: the bare switch behind torch.no_grad (the context manager costs a microsecond per call)
_set_grad_enabled = cast(
    Callable[[bool], None], getattr(torch._C, "_set_grad_enabled", torch.set_grad_enabled)
)

#: runs a lowered (or compiled) graph on its positional tensors; may return output values
RunFn = Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]


def _gatherer(uids: tuple[int, ...]) -> Callable[[Any], Sequence[torch.Tensor]]:
    """The tensors of ``uids`` from a pack (or of positions from a sequence), in order,
    gathered by one C call."""
    if len(uids) == 1:
        (uid,) = uids
        return lambda pack: (pack[uid],)
    if not uids:
        return lambda pack: ()
    return operator.itemgetter(*uids)


class ProgramPlan(Plan):
    """A plan that calls ``run`` on the variant pack's tensors in ``arg_uids`` order.

    When ``result_uids`` is given, ``run`` returns those outputs and the plan copies them into
    the caller's buffers (for compiled CUDA-graph runs, whose outputs live in a private pool).
    """

    def __init__(
        self,
        engine: Engine,
        knob_settings: Sequence[KnobSetting],
        arg_uids: Sequence[int],
        run: RunFn,
        result_uids: Sequence[int] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(engine, knob_settings, 0, metadata)
        self.arg_uids: tuple[int, ...] = tuple(arg_uids)
        self.result_uids: tuple[int, ...] = tuple(result_uids)
        self._run = run
        self._gather = _gatherer(self.arg_uids)

    def bind(self, uids: Sequence[int]) -> BoundCall:
        """The program called on the caller's tensors directly: no pack, and no gather when
        ``uids`` are the program's arguments in order (dnntune.torch's kernels pass them so)."""
        if self.result_uids:
            return super().bind(uids)  # results are copied out by uid: keep execute's path
        keys = tuple(uids)
        missing = [u for u in self.arg_uids if u not in keys]
        if missing:
            raise ValueError(f"plan {self.name}: bind() needs uid(s) {missing}")
        gather: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] | None = None
        if keys != self.arg_uids:
            gather = _gatherer(tuple(keys.index(u) for u in self.arg_uids))
        run, name, grad_enabled = self._run, self.name, torch.is_grad_enabled

        def call(tensors: Sequence[torch.Tensor], workspace: torch.Tensor | None) -> None:
            args = tensors if gather is None else gather(tensors)
            grad = grad_enabled()
            if grad:
                _set_grad_enabled(False)
            try:
                run(args)
            except DnnTuneError:
                raise
            except RuntimeError as exc:
                raise ExecutionError(f"plan {name}: execution failed: {exc}") from exc
            finally:
                if grad:
                    _set_grad_enabled(True)

        return call

    def execute(
        self,
        variant_pack: VariantPack,
        workspace: torch.Tensor | None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        args = self._gather(variant_pack)
        # a plan computes values, not gradients: inputs that require grad must not make the
        # caller's output buffers part of an autograd graph
        grad = torch.is_grad_enabled()
        if grad:
            _set_grad_enabled(False)
        try:
            if stream is None:
                results = self._run(args)
            else:
                with torch.cuda.stream(stream):
                    results = self._run(args)
            if self.result_uids:
                for uid, value in zip(self.result_uids, results, strict=True):
                    variant_pack[uid].copy_(value)
        except DnnTuneError:
            raise
        except RuntimeError as exc:
            raise ExecutionError(f"plan {self.name}: execution failed: {exc}") from exc
        finally:
            if grad:
                _set_grad_enabled(True)
