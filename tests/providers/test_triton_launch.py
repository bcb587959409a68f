"""``Launch``'s direct path on the CPU, with a scripted Triton: after the first launch it calls
the compiled kernel with the pointers as integers (Triton's launcher takes an int as the
address, where a tensor costs a ``data_ptr()`` call and a driver query each), and a pointer off
the 16-byte alignment Triton specialized on goes back through Triton's own launch path."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from dnntune.providers.triton.kernels.launch import Launch


class _Compiled:
    function = "fn"
    packed_metadata = "meta"

    def __init__(self) -> None:
        self.runs: list[tuple[Any, ...]] = []

    def run(self, *args: Any) -> None:
        self.runs.append(args)


class _Kernel:
    """``kernel[grid](*args, **meta)``: Triton's normal launch path, which returns the
    compiled kernel; ``arg_names`` as a JITFunction has them."""

    arg_names = ("x", "y", "n", "BLOCK")

    def __init__(self) -> None:
        self.compiled = _Compiled()
        self.slow_launches: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **meta: Any) -> _Compiled:
            self.slow_launches.append(args)
            return self.compiled

        return launch


@pytest.fixture
def triton_36(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``triton`` 3.6 module: no launch hooks, a current device and stream."""
    fake = types.ModuleType("triton")
    fake.__version__ = "3.6.0"  # type: ignore[attr-defined]
    hooks = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    fake.knobs = types.SimpleNamespace(runtime=hooks)  # type: ignore[attr-defined]
    runtime = types.ModuleType("triton.runtime")
    active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 7)
    runtime.driver = types.SimpleNamespace(active=active)  # type: ignore[attr-defined]
    fake.runtime = runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setitem(sys.modules, "triton.runtime", runtime)


def test_the_direct_launch_passes_the_pointers_as_integers(triton_36: None) -> None:
    kernel = _Kernel()
    launch = Launch(kernel, (4,), {"BLOCK": 128}, n_ptrs=2)
    x, y = torch.empty(64), torch.empty(64)
    launch((x, y, 64))  # the first launch: Triton's path, then the direct one is set up
    assert len(kernel.slow_launches) == 1 and not kernel.compiled.runs
    launch((x, y, 64))
    (run,) = kernel.compiled.runs
    grid, stream, head, hooks = run[:3], run[3], run[4:6], run[6:9]
    assert grid == (4, 1, 1) and stream == 7 and head == ("fn", "meta") and hooks == (None,) * 3
    # the pointers as ints (their addresses), then the scalars and the constexpr tail
    assert run[9:] == (x.data_ptr(), y.data_ptr(), 64, 128)
    assert all(type(a) is int for a in run[9:11])


def test_a_misaligned_pointer_takes_tritons_own_path(triton_36: None) -> None:
    kernel = _Kernel()
    launch = Launch(kernel, (4,), {"BLOCK": 128}, n_ptrs=2)
    x, y = torch.empty(64), torch.empty(64)
    launch((x, y, 64))
    shifted = x[1:]  # 4 bytes past an aligned start: off Triton's 16-byte specialization
    assert shifted.data_ptr() % 16
    launch((shifted, y, 63))
    assert not kernel.compiled.runs and len(kernel.slow_launches) == 2
    assert kernel.slow_launches[-1][0] is shifted


def _bound(kernel: _Kernel) -> tuple[Launch, Any, list[Any]]:
    """A launcher's bound call (``Launch.bind``) for the pack uids (10: x, 20: y) taken in the
    caller's order (y, x), and what its fallback (the pack's path) was called with."""
    launch = Launch(kernel, (4,), {"BLOCK": 128}, n_ptrs=2)
    fallen: list[Any] = []

    def fallback(tensors: Any, workspace: Any) -> None:
        fallen.append(tensors)
        by_uid = dict(zip((20, 10), tensors, strict=True))
        launch((by_uid[10], by_uid[20], 64))

    return launch, launch.bind((10, 20), (64,), (20, 10), fallback), fallen


def test_a_bound_call_launches_directly_in_the_kernels_order(triton_36: None) -> None:
    kernel = _Kernel()
    _, call, fallen = _bound(kernel)
    x, y = torch.empty(64), torch.empty(64)
    call((y, x), None)  # nothing compiled yet: the pack's path, which sets up the direct one
    assert len(fallen) == 1 and len(kernel.slow_launches) == 1
    call((y, x), None)
    (run,) = kernel.compiled.runs
    assert len(fallen) == 1 and len(kernel.slow_launches) == 1
    # the kernel's order (x, y), not the caller's; then the scalars and the constexpr tail
    assert run[:3] == (4, 1, 1) and run[3] == 7
    assert run[9:] == (x.data_ptr(), y.data_ptr(), 64, 128)


def test_a_bound_call_with_a_misaligned_pointer_takes_the_pack_path(triton_36: None) -> None:
    kernel = _Kernel()
    _, call, fallen = _bound(kernel)
    x, y = torch.empty(64), torch.empty(64)
    call((y, x), None)
    shifted = x[1:]
    call((y, shifted), None)
    assert not kernel.compiled.runs and len(fallen) == 2
    assert kernel.slow_launches[-1][0] is shifted


def test_a_bound_call_without_every_uid_is_the_fallback(triton_36: None) -> None:
    launch = Launch(_Kernel(), (4,), {"BLOCK": 128}, n_ptrs=2)

    def fallback(tensors: Any, workspace: Any) -> None:
        raise AssertionError

    assert launch.bind((10, 20), (64,), (10, 30), fallback) is fallback


class _MatmulKernel(_Kernel):
    """The generated matmul kernel's arguments as ``matmul.source`` writes them (one bias
    input, one output), then its constexprs."""

    arg_names = (
        "p_a", "p_b", "p_ws", "p_in0", "p_out0",
        "s_in0_b", "s_in0_m", "s_in0_n", "s_out0_b", "s_out0_m", "s_out0_n",
        "M", "N", "K", "BATCH", "s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn",
        "BLOCK_M", "BLOCK_N",
    )  # fmt: skip


def _matmul_launcher(split: int) -> Any:
    """A ``MatmulLauncher`` of a 4x8 @ 8x16 GEMM + bias (uids A 1, B 2, bias 3, Y 4) whose
    kernels are scripted (its real constructor generates and compiles Triton source)."""
    from dnntune.providers.triton.kernels.launch import gatherer
    from dnntune.providers.triton.kernels.matmul import MatmulLauncher

    launcher = object.__new__(MatmulLauncher)
    launcher.m, launcher.n, launcher.k, launcher.batch = 4, 16, 8, 1
    launcher.a_uid, launcher.b_uid, launcher.op_uids = 1, 2, [3, 4]
    launcher._ops = gatherer(launcher.op_uids)
    launcher.strides = [0, 0, 1, 64, 16, 1]
    launcher.ab_strides = [32, 8, 1, 128, 16, 1]
    launcher.split = split
    meta = {"BLOCK_M": 16, "BLOCK_N": 32}
    launcher.mm = Launch(_MatmulKernel(), (1, split, 1), meta, 5)
    launcher.reduce = Launch(_Kernel(), (1, 1, 1), {"BLOCK": 16}, 3)
    launcher.workspace_bytes = 0 if split == 1 else 4096
    return launcher


def _bound_matmul(launcher: Any, order: tuple[int, ...]) -> tuple[Any, list[Any]]:
    """``launcher``'s bound call for the uids in ``order``, and the calls that went to its
    fallback (the pack's path, which launches through the launcher)."""
    fallen: list[Any] = []

    def fallback(tensors: Any, workspace: Any) -> None:
        fallen.append(tensors)
        launcher(dict(zip(order, tensors, strict=True)), workspace)

    call = launcher.bind(order, fallback)
    assert call is not fallback
    return call, fallen


def test_a_bound_matmul_launches_what_the_pack_path_launches(triton_36: None) -> None:
    """Issue 22: Graph.execute's bound call of a Triton GEMM launches the compiled kernel
    directly, with exactly the arguments the pack's path gives it (A, B, A in the unused
    workspace slot, the epilogue's tensors, strides and sizes), whatever order the caller
    binds the uids in; before the kernel is compiled it takes the pack's path."""
    launcher = _matmul_launcher(split=1)
    a, b, bias, y = torch.empty(32), torch.empty(128), torch.empty(16), torch.empty(64)
    pack = {1: a, 2: b, 3: bias, 4: y}
    call, fallen = _bound_matmul(launcher, (4, 3, 2, 1))  # the caller's order: outputs first
    call((y, bias, b, a), None)  # not compiled yet: the pack's path, which compiles
    assert len(fallen) == 1 and not launcher.mm.kernel.compiled.runs
    launcher(pack, None)  # the pack's path, now direct
    call((y, bias, b, a), None)  # the bound call, direct
    assert len(fallen) == 1
    via_pack, bound = launcher.mm.kernel.compiled.runs
    assert bound == via_pack
    ptrs = (a.data_ptr(), b.data_ptr(), a.data_ptr(), bias.data_ptr(), y.data_ptr())
    assert bound[9:14] == ptrs
    assert bound[14:] == (0, 0, 1, 64, 16, 1, 4, 16, 8, 1, 32, 8, 1, 128, 16, 1, 16, 32)


def test_a_bound_split_k_matmul_launches_what_the_pack_path_launches(triton_36: None) -> None:
    """A split-K plan's bound call launches the GEMM and its reduction directly, with the
    workspace where the pack's path puts it, once both kernels are compiled; a workspace that
    is missing or too small goes to the pack's path, which names it."""
    import dnntune as dt

    launcher = _matmul_launcher(split=4)
    a, b, bias, y = torch.empty(32), torch.empty(128), torch.empty(16), torch.empty(64)
    ws = torch.empty(4096, dtype=torch.uint8)
    pack = {1: a, 2: b, 3: bias, 4: y}
    call, fallen = _bound_matmul(launcher, (2, 1, 4, 3))
    call((b, a, y, bias), ws)  # nothing compiled yet: the pack's path
    assert len(fallen) == 1
    launcher(pack, ws)  # the pack's path, now direct for both kernels
    call((b, a, y, bias), ws)
    assert len(fallen) == 1
    mm_pack, mm_bound = launcher.mm.kernel.compiled.runs
    red_pack, red_bound = launcher.reduce.kernel.compiled.runs
    assert mm_bound == mm_pack and red_bound == red_pack
    assert mm_bound[9:14] == (
        a.data_ptr(),
        b.data_ptr(),
        ws.data_ptr(),
        bias.data_ptr(),
        y.data_ptr(),
    )
    assert red_bound[9:12] == (ws.data_ptr(), bias.data_ptr(), y.data_ptr())
    for bad in (None, torch.empty(100, dtype=torch.uint8)):
        with pytest.raises(dt.InvalidValueError, match="workspace of 4096 bytes"):
            call((b, a, y, bias), bad)
    assert len(launcher.mm.kernel.compiled.runs) == 2  # nothing launched for a bad workspace
