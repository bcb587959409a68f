"""Triton's once-a-process setup in the background (``providers/triton/warm_start.py``): its
installation key and its driver helper are made once, off the caller's thread; without Triton,
or where they fail, nothing changes."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator

import pytest

from dnntune.providers.triton import warm_start


class _Driver:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @property
    def active(self) -> _Driver:
        return self

    @property
    def utils(self) -> object:
        self.calls.append(f"utils:{threading.current_thread().name}")
        return object()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(warm_start, "_started", False)
    yield


def _fake_triton(monkeypatch: pytest.MonkeyPatch, calls: list[str], key_fails: bool) -> None:
    triton = types.ModuleType("triton")
    runtime = types.ModuleType("triton.runtime")
    cache = types.ModuleType("triton.runtime.cache")

    def triton_key() -> str:
        calls.append(f"key:{threading.current_thread().name}")
        if key_fails:
            raise OSError("a package file could not be read")
        return "k"

    cache.triton_key = triton_key  # type: ignore[attr-defined]
    runtime.cache = cache  # type: ignore[attr-defined]
    runtime.driver = _Driver(calls)  # type: ignore[attr-defined]
    triton.runtime = runtime  # type: ignore[attr-defined]
    for name, module in (
        ("triton", triton),
        ("triton.runtime", runtime),
        ("triton.runtime.cache", cache),
    ):
        monkeypatch.setitem(sys.modules, name, module)


def _join() -> None:
    for t in threading.enumerate():
        if t.name == "dnntune-triton-warm":
            t.join(10)


def test_the_key_and_the_driver_helper_are_made_once_in_the_background(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    _fake_triton(monkeypatch, calls, key_fails=False)
    warm_start.prefetch()
    warm_start.prefetch()  # once per process
    _join()
    assert calls == ["key:dnntune-triton-warm", "utils:dnntune-triton-warm"]


def test_a_failure_or_no_triton_changes_nothing(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    _fake_triton(monkeypatch, calls, key_fails=True)
    warm_start.prefetch()  # the key fails: logged at debug, the helper is left to Triton
    _join()
    assert calls == ["key:dnntune-triton-warm"]
    monkeypatch.setattr(warm_start, "_started", False)
    monkeypatch.setitem(sys.modules, "triton", None)  # no Triton at all: an ImportError
    monkeypatch.delitem(sys.modules, "triton.runtime")
    monkeypatch.delitem(sys.modules, "triton.runtime.cache")
    warm_start.prefetch()
    _join()
    assert calls == ["key:dnntune-triton-warm"]


@pytest.mark.gpu
def test_triton_key_is_cached_after_the_warm_start(fresh: None) -> None:
    """On a machine with Triton and a GPU, the real setup runs and leaves the key cached."""
    cache = pytest.importorskip("triton.runtime.cache")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    key = getattr(cache, "triton_key", None)
    if key is None:
        pytest.skip("this Triton keeps its key elsewhere")
    key.cache_clear()  # made by the warm start, not by an earlier test of this process
    warm_start.prefetch()
    _join()
    assert key.cache_info().currsize == 1
