"""``Graph.execute``'s bound path reading the pack's addresses through the compiled pointer
reader (:func:`dnntune.backend.native.ready_pointer_reader`) for a plan that takes pointers:
the same answers as with ``Tensor.data_ptr`` per tensor, on new buffers, in-place updates,
overlapping buffers and tensors without storage; and the reader is only ever taken when it is
at hand, never built on the caller's time.

cuDNN itself needs a GPU: its plan runs here on the fake frontend graph of
``fake_cudnn`` (it resolves the addresses back to the CPU tensors living there).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_cudnn import FakeFrontendGraph, make_cudnn_plan

import dnntune as dt
from dnntune.backend import native
from dnntune.backend.pack_aliasing import Aliasing
from dnntune.backend.pack_binding import PackBinding

needs_cxx = pytest.mark.skipif(
    not native.can_build(cxx=True), reason="no C++ compiler or Python headers here"
)


@pytest.fixture
def fresh(fresh_native_cache: Path) -> Path:
    """A process that has not looked for the helpers yet, with its own cache folder."""
    return fresh_native_cache


@pytest.fixture
def cudnn_plan(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FakeFrontendGraph]:
    return make_cudnn_plan(monkeypatch)


def _add_graph() -> dt.Graph:
    """y = x + w on uids 1, 2, 3: what the fake frontend graph computes."""
    g = dt.Graph("add", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [8], uid=1)
    w = g.tensor("W", [8], uid=2)
    g.pointwise(x, w, mode=dt.PointwiseMode.ADD).set_output(True).set_name("Y").set_uid(3)
    g.validate()
    return g


def _binding(plan: Any, read: Callable[[tuple[Any, ...]], bytes] | None) -> PackBinding:
    g = _add_graph()
    io = {t.uid: t for t in g.io_tensors()}
    uids = [1, 2, 3]
    layout = [(torch.float32, torch.Size([8]), (1,), True)] * 3
    return PackBinding(
        plan,
        dt.create_handle("cpu"),
        None,
        uids,
        layout,
        plan.bind(uids),
        Aliasing(g, [io[u] for u in uids]),
        pointer_call=plan.bind_pointers(uids),
        read_pointers=read,
    )


@needs_cxx
def test_the_bound_path_reads_every_address_in_one_native_call(
    fresh: Path, cudnn_plan: tuple[Any, FakeFrontendGraph]
) -> None:
    plan, frontend = cudnn_plan
    real = native.pointer_reader()
    assert real is not None
    reads: list[int] = []

    def read(tensors: tuple[Any, ...]) -> bytes:
        reads.append(len(tensors))
        return real(tensors)

    binding = _binding(plan, read)
    x, w, y = torch.randn(8), torch.randn(8), torch.empty(8)
    frontend.register(x, w, y)
    assert binding.run({1: x, 2: w, 3: y}, None)
    torch.testing.assert_close(y, x + w)
    assert reads == [3]
    # new buffers (new addresses): a new pack; an input updated in place: read again
    x2 = torch.randn(8)
    frontend.register(x2)
    assert binding.run({1: x2, 2: w, 3: y}, None)
    torch.testing.assert_close(y, x2 + w)
    w.mul_(-3.0)
    assert binding.run({1: x2, 2: w, 3: y}, None)
    torch.testing.assert_close(y, x2 + w)
    assert reads == [3, 3, 3]
    assert frontend.packs[-1] is frontend.packs[-2]  # one pack per address set (bytes keys)
    # an output overlapping an input (not exactly in place) is refused, as on the full path
    big = torch.randn(9)
    frontend.register(big[:8], big[1:])
    with pytest.raises(dt.InvalidValueError, match="shares memory with input X"):
        binding.run({1: big[:8], 2: w, 3: big[1:]}, None)
    # a tensor without storage (the reader raises RuntimeError): the full path decides
    sparse_like = torch.zeros(8).to_sparse()
    assert binding.run({1: sparse_like, 2: w, 3: y}, None) is False


def test_the_reader_answers_as_data_ptr_does(cudnn_plan: tuple[Any, FakeFrontendGraph]) -> None:
    """The same packs with and without the reader (a stand-in that packs ``data_ptr``s)."""
    import struct

    plan, frontend = cudnn_plan

    def read(tensors: tuple[Any, ...]) -> bytes:
        return struct.pack(f"{len(tensors)}Q", *(t.data_ptr() for t in tensors))

    x, w, y = torch.randn(8), torch.randn(8), torch.empty(8)
    frontend.register(x, w, y)
    for reader in (None, read):
        y.zero_()
        assert _binding(plan, reader).run({1: x, 2: w, 3: y}, None)
        torch.testing.assert_close(y, x + w)
    assert frontend.packs[0] == frontend.packs[1]


def test_the_reader_is_never_built_on_the_callers_time(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[None] = []
    monkeypatch.setattr(native, "prefetch", lambda: started.append(None))
    monkeypatch.setattr(native, "build", lambda *a, **k: pytest.fail("built on the hot path"))
    assert native.ready_pointer_reader() is None  # no file yet: none, and a build started
    assert started == [None]
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    assert native.ready_pointer_reader() is None
    assert started == [None]


@needs_cxx
def test_a_reader_built_earlier_is_loaded_without_a_build(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert native.pointer_reader() is not None  # an earlier process built the file
    monkeypatch.setattr(native, "_state", {})  # this process has not loaded it
    monkeypatch.setattr(native, "_check_in_a_fresh_process", lambda *a: pytest.fail("checked"))
    monkeypatch.setattr(native, "prefetch", lambda: pytest.fail("no build is needed"))
    read = native.ready_pointer_reader()
    assert read is not None and native.ready_pointer_reader() is read
    t = torch.ones(3)
    assert read((t,)) == t.data_ptr().to_bytes(8, "little")
