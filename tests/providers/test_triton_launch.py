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
