"""Correctness before speed (seed 004): every candidate's output is checked against the reference.

The reference output is computed once per autotune() call from the caller's inputs. Each
candidate then runs once into its OWN freshly allocated output buffers (same dims, strides and
dtype as the caller's, pre-filled with NaN), so no candidate can pass by leaving another
candidate's result in place. A mismatch fails the candidate; it can never win.

When an output shares memory with an input (an in-place graph), the inputs are snapshotted
before anything runs and restored before each candidate and at the end, because timed runs
overwrite them.

Every other graph's inputs are guarded too: a plan that writes into a tensor it only reads
(cuDNN 9.19's engine 5 for layernorm and rmsnorm did, on the H200) corrupts the caller's data
and every candidate after it. So the inputs are snapshotted (or, above
:data:`SNAPSHOT_MAX_BYTES`, fingerprinted) before anything runs; after a candidate's
verification run and after its timed runs they are compared with it. A candidate that changed
an input fails ("wrote into its input ..."), and the inputs are put back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dnntune import reference
from dnntune.rfc import AutotuneConfig

if TYPE_CHECKING:
    import torch

    from dnntune.graph.ir import OpGraph
    from dnntune.graph.tensor import TensorAttributes

__all__ = ["SNAPSHOT_MAX_BYTES", "InputGuard", "Verdict", "Verifier", "outputs_alias_inputs"]

_log = logging.getLogger(__name__)

#: inputs up to this many bytes in all are copied to guard them (restorable); larger inputs get
#: a checksum per tensor instead (a change is still caught, but cannot be undone)
SNAPSHOT_MAX_BYTES = 2 << 30

#: runs a candidate once on the given pack (uid -> tensor); raises on failure
RunWith = Callable[[Mapping[int, "torch.Tensor"]], None]


@dataclass(frozen=True)
class Verdict:
    """One candidate's verification: ``ok`` None means it could not be checked."""

    ok: bool | None
    max_abs_error: float | None = None
    message: str = ""


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def outputs_alias_inputs(graph: OpGraph, pack: Mapping[int, torch.Tensor]) -> bool:
    """True when an output buffer shares memory with an input buffer (an in-place graph)."""
    outputs = {t.uid for t in graph.output_tensors()}
    inputs = [t for uid, t in pack.items() if uid not in outputs]
    for uid in outputs:
        if uid is None or uid not in pack:
            continue
        o0, o1 = _storage_span(pack[uid])
        for t in inputs:
            i0, i1 = _storage_span(t)
            if o0 < i1 and i0 < o1:
                return True
    return False


class Verifier:
    """Holds the reference outputs of one autotune() call and checks candidates against them."""

    def __init__(self, graph: OpGraph, pack: Mapping[int, torch.Tensor], config: AutotuneConfig):
        self.graph = graph
        self.pack = dict(pack)
        self.config = config
        self.outputs: list[TensorAttributes] = list(graph.output_tensors())
        self._output_uids = {t.uid for t in self.outputs}
        self.in_place = outputs_alias_inputs(graph, self.pack)
        self._snapshot: dict[int, torch.Tensor] = {}
        if self.in_place:
            # Taken before any candidate runs: these are the inputs the caller gave.
            self._snapshot = {
                uid: t.detach().clone()
                for uid, t in self.pack.items()
                if uid not in self._output_uids
            }
            _log.info("autotune: outputs alias inputs; inputs are restored before each candidate")
        names = {t.uid: t.name for t in graph.input_tensors() if t.uid is not None and t.name}
        self._guard = InputGuard(self.pack, self._output_uids, self.in_place, names)
        self._expected: dict[int, torch.Tensor] | None = None
        #: the caller's inputs' scale over well-scaled ones: the default tolerance's absolute
        #: part grows with it (:func:`dnntune.reference.data_scale`); an atol given is kept
        self.scale = reference.data_scale(graph, self.pack) if config.atol is None else 1.0
        self.unavailable: str | None = None
        self._reference_failed = False

    # ---- reference ------------------------------------------------------------------------
    def _reference(self) -> dict[int, torch.Tensor] | None:
        if self._expected is not None or self._reference_failed:
            return self._expected
        self.restore_inputs()
        try:
            expected = reference.run(self.graph, self.pack)
        except Exception as exc:  # the reference cannot compute this graph: say so, go on
            self._give_up(f"the reference could not run the graph: {type(exc).__name__}: {exc}")
            return None
        self._expected = {uid: expected[uid] for uid in self._output_uids if uid in expected}
        return self._expected

    def _give_up(self, why: str) -> None:
        self._reference_failed = True
        self.unavailable = why
        _log.warning("autotune: verification unavailable: %s; candidates are not verified", why)
        return None

    def prepare(self) -> None:
        """Compute the reference now (before any candidate can touch the inputs)."""
        self._reference()

    def restore_inputs(self) -> None:
        """Put the caller's inputs back (in-place graphs only)."""
        for uid, saved in self._snapshot.items():
            self.pack[uid].copy_(saved)

    # ---- checking -------------------------------------------------------------------------
    def _fresh_pack(self) -> dict[int, torch.Tensor]:
        import torch

        fresh = dict(self.pack)
        for t in self.outputs:
            assert t.uid is not None
            like = self.pack[t.uid]
            buf = torch.empty_strided(
                tuple(like.shape), tuple(like.stride()), dtype=like.dtype, device=like.device
            )
            if buf.is_floating_point() or buf.is_complex():
                buf.fill_(math.nan)
            else:
                buf.fill_(0)
            fresh[t.uid] = buf
        return fresh

    def check(self, run_with: RunWith, synchronize: Callable[[], None]) -> Verdict:
        """Run a candidate once into fresh output buffers and compare with the reference.

        Exceptions from ``run_with`` propagate (the caller reports an execution failure).
        """
        expected = self._reference()
        if expected is None:
            return Verdict(None, None, self.unavailable or "")

        self.restore_inputs()
        fresh = self._fresh_pack()
        run_with(fresh)
        synchronize()
        result = reference.check_outputs(
            self.graph,
            fresh,
            expected,
            self.outputs,
            self.config.rtol,
            self.config.atol,
            scale=self.scale,
        )
        worst = result.max_abs_error
        problems = [
            f"output {o.tensor.name or o.uid} (uid {o.uid}): {o.comparison.message}"
            for o in result.failed
        ]
        clobbered = self.inputs_changed()
        if clobbered:
            problems.insert(0, clobbered)
        if problems:
            return Verdict(False, worst, "; ".join(problems))
        return Verdict(True, worst, "")

    def inputs_changed(self) -> str:
        """'' when every guarded input still holds the caller's values; otherwise what changed
        (and the inputs are put back where a copy allows)."""
        return self._guard.changed()


class InputGuard:
    """The caller's input buffers as they were before any candidate ran: ``changed()`` says
    which ones a plan wrote into since, and puts them back (see the module docstring)."""

    def __init__(
        self,
        pack: Mapping[int, torch.Tensor],
        output_uids: Collection[int | None],
        in_place: bool = False,
        names: Mapping[int, str] | None = None,
    ) -> None:
        self._pack = pack
        self._names = dict(names or {})
        # in-place graphs overwrite their inputs by design: they are restored, not guarded
        uids = [] if in_place else [u for u in pack if u not in output_uids]
        total = sum(_nbytes(pack[u]) for u in uids)
        self._copy = total <= SNAPSHOT_MAX_BYTES
        self._saved: dict[int, Any] = {
            u: (pack[u].detach().clone() if self._copy else _checksum(pack[u])) for u in uids
        }

    def changed(self) -> str:
        """'' when every guarded input is as it was; else what changed (restored if copied)."""
        if not self._saved:
            return ""
        import torch

        hit: list[str] = []
        for uid, saved in self._saved.items():
            now = self._pack[uid]
            if self._copy:
                same = torch.equal(_bytes(now), _bytes(saved))
            else:
                same = _checksum(now) == saved
            if not same:
                hit.append(f"{self._names.get(uid, f'uid {uid}')} (uid {uid})")
                if self._copy:
                    now.copy_(saved)
                else:  # cannot be undone: blame only the candidate that did it
                    self._saved[uid] = _checksum(now)
        if not hit:
            return ""
        fix = "restored" if self._copy else "NOT restored (too large to copy; rebuild them)"
        return (
            f"wrote into its input(s) {', '.join(hit)}, which it only reads; the inputs were {fix}"
        )


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * int(t.element_size())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values as raw bytes (NaN compares equal to itself)."""
    import torch

    flat = t.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8) if flat.numel() else flat


def _checksum(t: torch.Tensor) -> tuple[int, int]:
    """A cheap fingerprint of a large tensor's bytes: their sum and a position-weighted sum,
    taken in chunks so that no int64 copy of the whole tensor is ever made."""
    import torch

    raw = _bytes(t)
    total = weighted = 0
    chunk = 1 << 26
    for start in range(0, raw.numel(), chunk):
        part = raw[start : start + chunk].to(torch.int64)
        idx = torch.arange(start + 1, start + 1 + part.numel(), device=part.device) % 65521
        total += int(part.sum())
        weighted += int((part * idx).sum())
    return total, weighted
