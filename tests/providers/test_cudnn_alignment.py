"""cuDNN plans on misaligned tensors run on aligned copies (providers/cudnn/alignment.py).

On an H100 (cuDNN 9.19) a plan built for 16-byte aligned tensors and given a view 2 bytes into
its buffer raised ``CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER`` (a convolution) or returned
wrong numbers without an error (a fused GEMM: max error 6.8). Here, on the CPU: the byte spans
a graph's tensors cover, the pack check that finds a misaligned call, the staging that copies
those tensors' bytes (and back for outputs, the gaps of a strided output kept), and a
``CudnnPlan`` over a fake frontend that reads memory at the addresses it is given, as cuDNN
does. The GPU test is tests/providers/test_cudnn_alignment_gpu.py."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune.backend.variant_pack import MisalignedPointers, PointerPacks
from dnntune.providers.cudnn.alignment import ALIGNMENT, Staging, _alias, byte_spans, misaligned

F = dt.DataType.FLOAT
H = dt.DataType.HALF
CPU = torch.device("cpu")


def _at(buffer: torch.Tensor, offset: int, dims: list[int], strides: list[int]) -> torch.Tensor:
    """A view ``offset`` elements into ``buffer``."""
    return buffer.as_strided(dims, strides, offset)


def test_byte_spans_cover_first_to_last_element() -> None:
    g = dt.Graph(name="add", io_data_type=H, compute_data_type=F)
    x = g.tensor("X", dims=[2, 3], strides=[8, 1], data_type=H)  # rows padded to 8
    w = g.tensor("W", dims=[2, 3], strides=[0, 1], data_type=H)  # broadcast rows
    y = g.pointwise(x, w, mode=dt.PointwiseMode.ADD, name="add")
    y.set_output(True).set_data_type(H)
    g.validate()
    assert x.uid is not None and w.uid is not None and y.uid is not None
    spans = byte_spans(g, [x.uid, w.uid, y.uid])
    assert spans[x.uid] == (8 + 2 + 1) * 2  # last element at offset 10
    assert spans[w.uid] == 3 * 2
    assert spans[y.uid] == 6 * 2
    assert byte_spans(g, [x.uid]) == {x.uid: 22}


def test_misaligned_is_about_sixteen_bytes() -> None:
    assert ALIGNMENT == 16
    assert not misaligned([0, 16, 512, 0x7F0000001000])
    assert misaligned([16, 18]) and misaligned([8])


def test_a_pack_is_refused_for_a_misaligned_plan_tensor_only() -> None:
    packs = PointerPacks((1, None, 2), {7: 4242}, ALIGNMENT)
    assert packs.get((0x1000, 0x2003, 0x3000)) == {7: 4242, 1: 0x1000, 2: 0x3000}  # not the plan's
    with pytest.raises(MisalignedPointers) as caught:
        packs.get((0x1000, 0x2000, 0x3002))
    assert caught.value.pointers == (0x1000, 0x2000, 0x3002)
    with pytest.raises(MisalignedPointers) as caught:
        packs.get(struct.pack("3Q", 0x1008, 0x2000, 0x3000))
    assert caught.value.pointers == (0x1008, 0x2000, 0x3000)
    assert len(packs) == 1  # nothing kept for a refused call
    assert PointerPacks((1,)).get((0x1001,)) == {1: 0x1001}  # no alignment asked: as before


def _add_at(pointers: tuple[int, ...], n: int) -> None:
    """y = x + w on float32 vectors of ``n`` elements at ``pointers`` (x, w, y): what a plan
    does, reading and writing memory by address."""
    x, w, y = (_alias(p, 4 * n, CPU).view(torch.float32) for p in pointers)
    y.copy_(x + w)


def test_staging_runs_on_aligned_copies_and_copies_outputs_back() -> None:
    n = 5
    buffer = torch.arange(64, dtype=torch.float32)
    x = _at(buffer, 1, [n], [1])  # 4 bytes in: misaligned
    w = torch.ones(n)
    out_buffer = torch.full((64,), -7.0)
    y = _at(out_buffer, 3, [n], [1])
    seen: list[tuple[int, ...]] = []

    def execute(pointers: tuple[int, ...]) -> None:
        seen.append(pointers)
        _add_at(pointers, n)

    staging = Staging({1: 4 * n, 2: 4 * n, 3: 4 * n}, frozenset({3}), CPU)
    staging.run((1, 2, 3), (x.data_ptr(), w.data_ptr(), y.data_ptr()), execute)
    ((px, pw, py),) = seen
    assert px % ALIGNMENT == 0 and py % ALIGNMENT == 0
    assert pw == w.data_ptr()  # aligned already: the caller's own
    torch.testing.assert_close(y, torch.arange(1, 1 + n, dtype=torch.float32) + 1)
    assert (out_buffer[:3] == -7).all() and (out_buffer[3 + n :] == -7).all()


def test_staging_keeps_the_gaps_of_a_strided_output() -> None:
    out_buffer = torch.full((32,), -1.0)
    y = _at(out_buffer, 1, [3], [4])  # elements 1, 5, 9: the rest is someone else's

    def execute(pointers: tuple[int, ...]) -> None:
        (py,) = pointers
        view = _alias(py, 4 * 9, CPU).view(torch.float32)
        view[0::4] = torch.tensor([10.0, 20.0, 30.0])

    Staging({3: 4 * 9}, frozenset({3}), CPU).run((3,), (y.data_ptr(),), execute)
    assert y.tolist() == [10.0, 20.0, 30.0]
    assert out_buffer.tolist() == [-1.0] + [10.0, -1, -1, -1, 20.0, -1, -1, -1, 30.0] + [-1.0] * 22


class _AddressFrontend:
    """cuDNN's ``_execute_plan_at_index`` on CPU memory: y = x + w at the pack's addresses."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.packs: list[dict[int, int]] = []

    def _execute_plan_at_index(self, pack: dict[int, int], ws: int, index: int, h: int) -> None:
        self.packs.append(pack)
        _add_at((pack[1], pack[2], pack[3]), self.n)


def _plan(monkeypatch: pytest.MonkeyPatch, n: int) -> tuple[Any, _AddressFrontend]:
    from dnntune.providers.cudnn import engine as cudnn_engine
    from dnntune.providers.cudnn import plan as cudnn_plan

    monkeypatch.setattr(cudnn_plan, "raw_stream_getter", lambda: lambda device: 0)
    monkeypatch.setattr(cudnn_plan, "current_stream_ptr", lambda device: 0)
    monkeypatch.setattr(cudnn_plan, "cudnn_handle", lambda device, stream: 99)
    frontend = _AddressFrontend(n)
    problem = SimpleNamespace(
        graph=frontend,
        io_uids=(1, 2, 3),
        scalar_pointers={},
        device_index=0,
        lowered=SimpleNamespace(spans={1: 4 * n, 2: 4 * n, 3: 4 * n}, outputs=frozenset({3})),
        runner=lambda index: (frontend._execute_plan_at_index, index),
        # no serialized(): no direct call, the frontend's execute
    )
    plan = cudnn_plan.CudnnPlan(cudnn_engine.CudnnEngine(), (), problem, 0, 0, {})  # type: ignore[arg-type]
    plan._staging = Staging(plan._staging.spans, plan._staging.outputs, CPU)
    return plan, frontend


@pytest.mark.parametrize("path", ["execute", "bind", "bind_pointers", "bind_bytes"])
@pytest.mark.parametrize(("x_at", "y_at"), [(1, 0), (0, 2), (3, 1), (0, 0)])
def test_a_cudnn_plan_on_misaligned_views_gives_the_right_answer(
    monkeypatch: pytest.MonkeyPatch, path: str, x_at: int, y_at: int
) -> None:
    n = 7
    plan, frontend = _plan(monkeypatch, n)
    x_buffer, out_buffer = torch.arange(32, dtype=torch.float32), torch.zeros(32)
    x, w = _at(x_buffer, x_at, [n], [1]), torch.full((n,), 0.5)
    y = _at(out_buffer, y_at, [n], [1])
    if path == "execute":
        plan.execute({1: x, 2: w, 3: y}, None)
    elif path == "bind":
        plan.bind((1, 2, 3))((x, w, y), None)
    elif path == "bind_pointers":
        plan.bind_pointers((1, 2, 3))((x.data_ptr(), w.data_ptr(), y.data_ptr()), None)
    else:
        addresses = struct.pack("3Q", x.data_ptr(), w.data_ptr(), y.data_ptr())
        plan.bind_pointers((1, 2, 3))(addresses, None)
    torch.testing.assert_close(y, torch.arange(x_at, x_at + n, dtype=torch.float32) + 0.5)
    (pack,) = frontend.packs
    assert not misaligned(pack.values())  # cuDNN saw aligned addresses only
    aligned = x_at == 0 and y_at == 0
    assert (pack[1] == x.data_ptr() and pack[3] == y.data_ptr()) is aligned
