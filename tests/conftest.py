"""Shared test setup: GPU tests skip cleanly without CUDA; caches go to a temp dir."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent

# CI (CI=true) draws the same Hypothesis examples on every run, so that a red run is about the
# change, not the draw; a developer's run explores new examples (and keeps failing ones in
# .hypothesis/). A failure CI never saw prints its graph JSON for replay either way.
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else "default")
EXAMPLES = REPO / "examples" / "graphs"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _cuda_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_env(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every test gets its own cache dir and no inherited selection variables."""
    cache = tmp_path_factory.mktemp("dnntune-cache")
    for name in list(os.environ):
        if name.startswith("DNNTUNE_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(cache))
    # warn-once memories are per process: each test starts as a new process would
    import sys

    for module in ("dnntune.overrides.format", "dnntune.overrides.policy"):
        reported = getattr(sys.modules.get(module), "_REPORTED", None)
        if reported is not None:
            reported.clear()
    yield
    # A CLI invocation installs its console handler on the "dnntune" logger; it must not leak
    # into later tests (the library itself never prints).
    import logging

    logger = logging.getLogger("dnntune")
    for handler in list(logger.handlers):
        if getattr(handler, "_dnntune_cli_handler", False):
            logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture
def cuda_handle():  # type: ignore[no-untyped-def]
    import dnntune as dt

    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    return dt.create_handle("cuda")


@pytest.fixture
def cpu_handle():  # type: ignore[no-untyped-def]
    import dnntune as dt

    return dt.create_handle("cpu")


@pytest.fixture
def fresh_native_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A process that has not looked for dnntune's compiled helpers yet
    (``dnntune.backend.native``), with its own cache folder (yielded)."""
    from dnntune.backend import native

    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_key_locks", {})
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DNNTUNE_DISABLE_NATIVE", raising=False)
    monkeypatch.delenv("DNNTUNE_DISABLE_CACHE", raising=False)
    yield tmp_path
