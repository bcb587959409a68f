from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _fresh_torch_integration() -> Iterator[None]:
    from dnntune.torch import _support, config, runtime

    config.reset()
    runtime.cache().clear()
    runtime.module_plans.clear()
    runtime.runtime_stats.decisions.clear()
    _support.reset_warnings()
    yield
    config.reset()
    runtime.cache().clear()
    runtime._handles.clear()  # a handle made under fake engines must not outlive its test


@pytest.fixture(autouse=True)
def _neutral_forward_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """optimize()'s end-to-end check, refine and revert (on by default) act on wall-clock
    timings of the whole forward; on a shared CI machine those would decide at random. Unless
    a test scripts its own clock (monkeypatching ``dnntune.torch.optimize.forward_ms`` again),
    every forward reads the same time: dnntune as fast as eager, nothing refined or reverted.
    ``dnntune.torch.speed.forward_ms`` itself stays real for the tests of the clock."""
    import sys

    import dnntune.torch  # noqa: F401  (loads dnntune.torch.optimize)

    monkeypatch.setattr(
        sys.modules["dnntune.torch.optimize"], "forward_ms", lambda module, inputs: 1.0
    )
    # and no side-by-side re-time at the end: the (scripted) figures above decide
    monkeypatch.setattr(
        sys.modules["dnntune.torch.optimize"], "paired_forward_ms", lambda *args: None
    )
    monkeypatch.setattr(
        sys.modules["dnntune.torch.optimize"], "side_by_side_forward_ms", lambda *args: None
    )


@pytest.fixture
def layer_tunes(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The results of each layer tune an ``optimize`` in the test runs, in order (each tune's
    ``last_autotune_results``: one per candidate, the winner first)."""
    from dnntune.torch import runtime

    tunes: list[list[Any]] = []
    real = runtime._tune

    def recorded(build: Any, *args: Any) -> Any:
        out = real(build, *args)
        tunes.append(build.graph.last_autotune_results)
        return out

    monkeypatch.setattr(runtime, "_tune", recorded)
    return tunes
