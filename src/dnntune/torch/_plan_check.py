"""Checking a plan on its first call: one run on the call's own inputs into fresh outputs,
compared with ``dnntune.reference`` as a tuned candidate is (seed 004). Used by
:func:`dnntune.torch.runtime.kernel_for` for heuristic plans and the override file's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from dnntune.backend.engine import Plan
from dnntune.backend.handle import Handle
from dnntune.backend.plans import allocate_workspace
from dnntune.errors import DnnTuneError
from dnntune.reference import make_inputs
from dnntune.torch._budget import verify
from dnntune.torch._support import callers_rng_kept
from dnntune.torch.config import TorchConfig

if TYPE_CHECKING:
    from dnntune.torch.runtime import GraphBuild

__all__ = ["check_plan", "pack_of", "room_to_check"]


def check_plan(
    build: GraphBuild,
    handle: Handle,
    inputs: Sequence[torch.Tensor],
    config: TorchConfig,
    plan: Plan,
) -> tuple[bool | None, str]:
    """Run ``plan`` once on the call's own inputs into fresh outputs and compare them with the
    reference within the data type's tolerance, as a tuned candidate is compared (seed 004).
    (True, ""): right; (False, why): wrong; (None, why): not checked, ``why`` empty where
    nothing needs saying. Not checked: PyTorch's own op (the comparison's baseline itself), a
    build inside a CUDA-graph recording (a check waits for the device), a check whose copies
    would crowd the device (:func:`room_to_check`), and ``verify=False``."""
    device = inputs[0].device
    if (
        not config.verify
        or plan.runs_eager_ops
        or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    ):
        return None, ""
    pack = pack_of(build, inputs)
    if not room_to_check(pack.values(), device):
        return None, "too little free device memory"
    workspace = allocate_workspace(plan.workspace_size, handle.device)
    uids = [t.uid for t in (*build.inputs, *build.outputs) if t.uid is not None]
    call = plan.bind(uids)  # the call the layer's kernel makes (:class:`Kernel`)

    def run(p: Mapping[int, torch.Tensor]) -> None:
        call([p[uid] for uid in uids], workspace)

    with callers_rng_kept(device):
        checked = verify(build.graph, pack, run, handle)
    return checked.ok, checked.message


def room_to_check(tensors: Iterable[torch.Tensor], device: torch.device) -> bool:
    """Whether the device has room for a check's copies: the reference's float32 copies of
    the graph's tensors, the check's own outputs and the copies that guard the inputs (an LLM's
    vocabulary projection is gigabytes in float32). A model that fills the GPU keeps its
    layers' plans unchecked rather than run out of memory in its first forward."""
    if device.type != "cuda":
        return True
    need = sum(t.numel() * max(4, t.element_size()) for t in tensors) * 3
    free, _ = torch.cuda.mem_get_info(device)
    # and what PyTorch's allocator holds unused (the driver counts it as taken)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return need < free // 2


def pack_of(build: GraphBuild, inputs: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    """The call's inputs and fresh outputs of the graph's layout, by uid: what a plan is
    checked, tuned and raced on.

    A floating-point input whose elements are all equal (an example batch of ``torch.zeros``
    or ``torch.ones``, a bias initialised to zero, a norm's weight to one) is replaced by the
    reference's random values for it (:func:`dnntune.reference.make_inputs`): on zeros a plan
    that mishandles that operand, or whatever it multiplies, gives the reference's answer
    (``0 * anything``), and on a constant image a convolution whose kernel is flipped does
    too, so a wrong plan passed its check on such a first call and then ran every later call
    of the signature, on real data, wrong."""
    zero = [_constant(value) for value in inputs]
    drawn: dict[int, torch.Tensor] = {}
    if any(zero):
        try:
            drawn = make_inputs(build.graph, inputs[0].device)
        except DnnTuneError:  # a layout the reference cannot fill: the call's own values
            drawn = {}
    pack: dict[int, torch.Tensor] = {}
    for t, value, is_zero in zip(build.inputs, inputs, zero, strict=True):
        assert t.uid is not None
        if is_zero and t.uid in drawn:
            # as the call's own requires it: a torch.compile plan built for this call guards
            # on the flag (providers._torch.first_call), so the tune runs what later calls run
            value = drawn[t.uid].requires_grad_(value.requires_grad)
        pack[t.uid] = value
    for t in build.outputs:
        assert t.uid is not None
        assert t.data_type is not None
        pack[t.uid] = torch.empty_strided(
            t.dims, t.strides, dtype=t.data_type.to_torch(), device=inputs[0].device
        )
    return pack


def _constant(value: torch.Tensor) -> bool:
    """A floating-point tensor with elements, every one of them the same number (one pass,
    no tensor of the input's size made; a NaN anywhere: not constant)."""
    if not value.is_floating_point() or value.numel() == 0:
        return False
    if value.element_size() == 1:  # float8: no aminmax kernel; its own zeros only
        return not bool(value.view(torch.uint8).any())
    low, high = torch.aminmax(value)
    return bool(low == high)
