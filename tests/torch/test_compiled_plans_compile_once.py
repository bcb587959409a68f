"""A torch.compile plan built in ``optimize``'s tune is compiled once, for the call it runs.

``torch.compile`` guards each argument's ``requires_grad``, also under ``no_grad``: the plan's
trial run on dummies that required no grad, then the layer's first call with its
``nn.Parameter``, compiled it twice (seen as "requires_grad mismatch" recompiles, seconds each
on a fresh Inductor cache). Here ``torch.compile`` is a recorder, so no compiler runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dnntune.torch as dtt


def _recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[bool, ...]]]:
    """``torch.compile`` replaced: each "compiled" plan records the ``requires_grad`` flags of
    every call it gets, by the plan's code name; the first is its trial run."""
    seen: dict[str, list[tuple[bool, ...]]] = {}

    def compile_(fn: Callable[..., Any], **_: object) -> Callable[..., Any]:
        calls = seen.setdefault(fn.__code__.co_name, [])

        def compiled(*args: torch.Tensor) -> Any:
            calls.append(tuple(a.requires_grad for a in args))
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", compile_)
    # no call floor: these small layers' compiled candidates would be skipped as unable to
    # beat TORCH_ENGINE's (autotune.call_floor), and no plan compiled
    from dnntune.providers.torch_compile import TorchCompileEngine

    monkeypatch.setattr(TorchCompileEngine, "has_call_floor", lambda self, handle: False)
    return seen


@pytest.mark.parametrize("make", [lambda: nn.Linear(8, 16), lambda: nn.LayerNorm(8)])
def test_a_compiled_plan_is_compiled_for_the_parameters_it_is_called_with(
    make: Callable[[], nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _recorded(monkeypatch)
    torch.manual_seed(0)
    model = make().eval()  # LayerNorm: its weight is all ones, its bias all zeros
    x = torch.randn(4, 8)
    dtt.optimize(model, (x,), overrides=tmp_path / "o.json", check_speed=False, fuse=False)
    with torch.no_grad():
        model(x)
    assert seen, "no torch.compile plan was built"
    for name, calls in seen.items():
        trial, later = calls[0], calls[1:]
        assert True in trial, f"{name}: the trial run passed no tensor requiring grad"
        # every later call passes the flags the trial run compiled for: no guard fails
        assert later and all(c == trial for c in later), f"{name}: {calls}"
