"""The compiled helper for the checks before a CUDA-graph replay (``dnntune.backend.native``):
built on first use into the cache folder, shared by processes that build it at once, and never
in the way where it cannot be built (the checks then run in Python, with the same answers)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dnntune import _temp_files
from dnntune.backend import native as _native
from dnntune.torch import _tags

needs_compiler = pytest.mark.skipif(
    not _native.can_build(), reason="no C compiler or Python headers here"
)


@pytest.fixture
def fresh(fresh_native_cache: Path) -> Path:
    """A process that has not looked for the helpers yet, with its own cache folder."""
    return fresh_native_cache


@needs_compiler
def test_the_helper_reads_a_tag_that_moves_on_every_change(fresh: Path) -> None:
    read = _native.reader()
    assert read is not None
    assert list((fresh / "native").glob("*.so")), "built into the cache folder"
    d: dict[str, object] = {"a": 1}
    other: dict[str, object] = {}
    before = read([d, other])
    assert isinstance(before, bytes) and len(before) == 16
    assert read([d, other]) == before
    d["a"] = 2
    assert read([d, other]) != before
    with pytest.raises(TypeError, match="list of dicts"):
        read([d, 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of dicts"):
        read((d,))  # type: ignore[arg-type]
    _native._state.clear()
    assert _native.reader() is not None  # a later process loads the file it finds


def test_no_compiler_means_no_helper_and_the_checks_still_answer(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_native, "_compiler", lambda cxx=False: None)
    assert _native.reader() is None
    with pytest.raises(OSError, match="no C compiler"):
        _native.build(fresh / "elsewhere")
    reader = _tags.tag_reader()
    assert reader is None or reader is _tags._pytorch_tags


def test_a_compiler_error_is_reported_and_tried_once(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_native, "SOURCE", _native.SOURCE + "\n#error broken on purpose\n")
    with pytest.raises(OSError, match="broken on purpose"):
        _native.build(fresh / "native")
    assert _native.reader() is None
    assert not list((fresh / "native").glob("*.so")), "no half-built file left"
    monkeypatch.setattr(_native, "build", lambda folder, cxx=False: pytest.fail("built twice"))
    assert _native.reader() is None


def test_disabled_by_the_environment(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    assert _native.reader() is None
    assert not (fresh / "native").exists()


@needs_compiler
def test_without_a_cache_folder_it_builds_in_a_temporary_one(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNNTUNE_DISABLE_CACHE", "1")
    assert _native.reader() is not None
    assert not (fresh / "native").exists()


def _build_in(folder: str) -> str:
    return str(_native.build(Path(folder)))


@needs_compiler
def test_processes_that_build_at_once_share_one_complete_file(fresh: Path) -> None:
    folder = fresh / "native"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        paths = pool.map(_build_in, [str(folder)] * 3)
    assert len(set(paths)) == 1
    assert [p.name for p in folder.iterdir()] == [Path(paths[0]).name], "no temporary left"
    module = _native._load(Path(paths[0]))
    assert module.versions([{}])


def _build_hanging_in_the_compiler(folder: str, ready: Any) -> None:
    def hang(*args: Any, **kwargs: Any) -> None:
        ready.set()
        time.sleep(600)

    _native.subprocess.run = hang  # type: ignore[assignment]  # this process only
    _native.build(Path(folder))


@needs_compiler
def test_a_build_killed_mid_build_leaves_a_folder_the_next_build_removes(fresh: Path) -> None:
    """The compile and its check take seconds: a process killed meanwhile (kill -9, the OOM
    killer, Ctrl-C twice) left its ``tmp<random>`` build folder in the cache for good."""
    folder = fresh / "native"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_build_hanging_in_the_compiler, args=(str(folder), ready))
    proc.start()
    assert ready.wait(timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    (left,) = folder.iterdir()
    assert left.is_dir() and left.name.endswith(".tmpdir")
    assert f".{_temp_files._owner()}-{proc.pid}." in left.name
    assert any(left.iterdir()), "the source it was compiling"
    built = _native.build(folder)
    assert [p.name for p in folder.iterdir()] == [built.name]


@needs_compiler
def test_an_earlier_versions_build_folder_goes_once_a_day_old(fresh: Path) -> None:
    folder = fresh / "native"
    old, new = folder / "tmpab_cd123", folder / "tmpzzzzzzzz"
    for d in (old, new):
        d.mkdir(parents=True)
        (d / "half.c").write_text("int x;")
    then = time.time() - 2 * _temp_files.STALE_AGE_S
    os.utime(old, (then, then))
    built = _native.build(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([built.name, new.name])


@needs_compiler
def test_a_folder_others_can_write_to_is_not_used(fresh: Path) -> None:
    folder = fresh / "native"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # the umask may have masked it
    assert _native.reader() is not None  # built in a temporary folder instead
    assert not list(folder.iterdir())


needs_cxx = pytest.mark.skipif(
    not _native.can_build(cxx=True), reason="no C++ compiler or Python headers here"
)


@needs_cxx
def test_the_pointer_helper_reads_each_tensors_storage(fresh: Path) -> None:
    import struct

    import torch

    read = _native.pointer_reader()
    assert read is not None
    assert list((fresh / "native").glob("_dnntune_pointers_*")), "built into the cache folder"
    p = torch.nn.Parameter(torch.zeros(4))
    ts = (torch.ones(8)[3:], p)
    before = read(ts)
    assert before == struct.pack("2Q", ts[0].data_ptr(), p.data_ptr())
    p.data = torch.ones(4)  # new storage, the same tensor object and version
    assert read(ts) != before and read(ts) == struct.pack("2Q", ts[0].data_ptr(), p.data_ptr())
    with pytest.raises(RuntimeError, match="doesn't have storage"):
        read((torch.zeros(2).to_sparse(),))  # PyTorch's C++ exception, caught
    with pytest.raises(TypeError, match="tuple of tensors"):
        read([p])  # type: ignore[arg-type]


@needs_cxx
def test_a_pointer_helper_that_fails_its_check_is_not_kept(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a helper that reads the wrong pointers: its check in a fresh process refuses it
    broken = _native.POINTERS_SOURCE.replace(
        "reinterpret_cast<uintptr_t>(data_ptr(PyTuple_GET_ITEM(tensors, i))))",
        "reinterpret_cast<uintptr_t>(data_ptr(PyTuple_GET_ITEM(tensors, i))) + 1)",
    )
    assert broken != _native.POINTERS_SOURCE
    monkeypatch.setattr(_native, "POINTERS_SOURCE", broken)
    with pytest.raises(OSError, match="failed its check"):
        _native.build(fresh / "native", cxx=True)
    assert _native.pointer_reader() is None
    assert not list((fresh / "native").glob("_dnntune_pointers_*")), "no file left"


def test_no_cxx_compiler_means_no_pointer_helper(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _native._compiler
    monkeypatch.setattr(_native, "_compiler", lambda cxx=False: None if cxx else real(cxx))
    assert _native.pointer_reader() is None
    with pytest.raises(OSError, match="no C\\+\\+ compiler"):
        _native.build(fresh / "elsewhere", cxx=True)
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    _native._state.clear()
    monkeypatch.setattr(_native, "_compiler", real)
    assert _native.pointer_reader() is None


def _builder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dnntune-native-build"]


@needs_compiler
def test_prefetch_builds_both_helpers_in_the_background_once(fresh: Path) -> None:
    _native.prefetch()
    for thread in _builder_threads():
        thread.join(timeout=300)
    assert "read" in _native._state and "pointers" in _native._state
    assert _native._state["read"] is not None
    if _native.can_build(cxx=True) and _native._state["pointers"] is not None:
        assert list((fresh / "native").glob("_dnntune_pointers_*"))
    _native.prefetch()  # once per process
    assert not _builder_threads()
    assert _native.reader() is _native._state["read"]  # what the background built


def test_prefetch_does_nothing_when_disabled(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    _native.prefetch()
    assert not _builder_threads() and not _native._state


def test_one_helper_never_waits_for_the_other_s_build(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C++ helper's check takes seconds; a caller of the C reader meanwhile goes on."""
    started, release = threading.Event(), threading.Event()

    def slow_pointer_reader() -> None:
        started.set()
        release.wait(timeout=60)

    monkeypatch.setattr(_native, "_make_pointer_reader", slow_pointer_reader)
    monkeypatch.setattr(_native, "_make_reader", lambda: "the C reader")
    building = threading.Thread(target=_native.pointer_reader)
    building.start()
    try:
        assert started.wait(timeout=60)
        assert _native.reader() == "the C reader"  # not blocked behind the pointer build
        assert "pointers" not in _native._state
    finally:
        release.set()
        building.join(timeout=60)
    assert _native._state["pointers"] is None


def _optimize_calls_prefetch(monkeypatch: pytest.MonkeyPatch, device: str) -> bool:
    import torch
    from torch import nn

    import dnntune.torch as dtt

    calls: list[None] = []
    monkeypatch.setattr(_native, "prefetch", lambda: calls.append(None))
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to(device).eval()
    dtt.optimize(model, (torch.randn(2, 8, device=device),), policy="heuristic", overrides=None)
    return bool(calls)


def test_optimize_leaves_the_helpers_alone_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _optimize_calls_prefetch(monkeypatch, "cpu")


@pytest.mark.gpu
def test_optimize_starts_building_the_helpers_for_a_cuda_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _optimize_calls_prefetch(monkeypatch, "cuda")


@needs_cxx
def test_a_recording_never_waits_for_the_pointer_reader_and_takes_it_once_built(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuda_graph="auto" records PyTorch's forward as optimize begins, while the background
    build runs: the recording's checks read the pointers in Python until the reader is built,
    then the first check that finds them unchanged takes the reader's snapshot. A change is
    seen before and after. (Weights keeps CUDA tensors only; the CPU's are set here.)"""
    import torch
    from torch import nn

    from dnntune.torch._baked import Weights

    started: list[None] = []
    monkeypatch.setattr(_native, "prefetch", lambda: started.append(None))
    model = nn.Linear(4, 4)
    w = Weights(model)
    assert w._pointers is None and w._upgrade and started == [None]  # not waited for
    w._tensors = (model.weight, model.bias)
    w._ptrs = w._read_pointers()
    assert w.unchanged() and w._upgrade  # not built yet: still Python
    reader = _native.pointer_reader()  # the background build ends
    assert reader is not None
    assert w.unchanged() and not w._upgrade and w._pointers is reader
    assert w._ptrs == reader(w._tensors)
    model.weight.data = torch.zeros(4, 4)  # new storage: seen through the reader
    assert not w.unchanged()
    # a change made before the reader came is seen first, and no snapshot is taken of it
    other = nn.Linear(4, 4)
    monkeypatch.setattr(_native, "_state", {})
    late = Weights(other)
    late._tensors = (other.weight,)
    late._ptrs = late._read_pointers()
    other.weight.data = torch.ones(4, 4)
    monkeypatch.setattr(_native, "_state", {"pointers": reader})
    assert not late.unchanged() and late._upgrade


def test_without_a_reader_a_recording_stops_looking_for_one(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch import nn

    from dnntune.torch._baked import Weights

    monkeypatch.setattr(_native, "prefetch", lambda: None)
    w = Weights(nn.Linear(2, 2))
    assert w._upgrade
    monkeypatch.setattr(_native, "_state", {"pointers": None})  # the build failed here
    assert w.unchanged() and not w._upgrade and w._pointers is None
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    monkeypatch.setattr(_native, "_state", {})
    assert not Weights(nn.Linear(2, 2))._upgrade


@needs_compiler
@pytest.mark.parametrize("damage", ["empty", "truncated", "not a library"])
def test_a_helper_file_that_does_not_load_is_built_again(fresh: Path, damage: str) -> None:
    """A crash after the rename but before the data reached the disk leaves an empty or short
    file under the helper's name; every later process loaded it, failed, and went without the
    helper (logged at debug level only)."""
    folder = fresh / "native"
    built = _native.build(folder)
    data = built.read_bytes()
    built.write_bytes({"empty": b"", "truncated": data[:200], "not a library": b"x" * 100}[damage])
    read = _native.reader()
    assert read is not None
    assert read([{}])
    rebuilt = built.read_bytes()  # built again (not byte for byte: the build folder differs)
    assert rebuilt[:8] == data[:8] and len(rebuilt) > 1000
