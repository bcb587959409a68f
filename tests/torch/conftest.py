from __future__ import annotations

from collections.abc import Iterator

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
