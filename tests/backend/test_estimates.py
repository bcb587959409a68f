"""``backend.estimates``: plan-spec workspace estimates that build nothing, as a tune under a
time budget takes them (``dnntune.torch``'s per-layer tune)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dnntune.backend.estimates import builds_allowed, estimates_without_builds


def test_builds_are_allowed_outside_the_context_only() -> None:
    assert builds_allowed()
    with estimates_without_builds():
        assert not builds_allowed()
        with estimates_without_builds():
            assert not builds_allowed()
        assert not builds_allowed()
    assert builds_allowed()


def test_an_error_inside_leaves_builds_allowed() -> None:
    with pytest.raises(RuntimeError), estimates_without_builds():
        raise RuntimeError("boom")
    assert builds_allowed()


def test_a_budgeted_layer_tune_adds_its_variants_without_builds(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dnntune.torch``'s tune of a layer signature adds the engines' suggested variants
    without building their plans under a time budget (their builds come in the search, if it
    reaches them), and as before without one."""
    import dnntune.torch as dtt
    from dnntune.torch import runtime

    seen: list[bool] = []
    real = runtime.add_suggested_variants

    def spy(graph: Any, exclude: frozenset[str] = frozenset()) -> int:
        seen.append(builds_allowed())
        return real(graph, exclude=exclude)

    monkeypatch.setattr(runtime, "add_suggested_variants", spy)
    for budget, allowed in ((30.0, False), (None, True)):
        runtime.cache().clear()
        seen.clear()
        model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()
        x = torch.randn(3, 8)
        path = tmp_path / f"ov_{budget}.json"
        dtt.optimize(model, (x,), policy="tune", overrides=path, time_budget_s=budget)
        assert seen and all(s is allowed for s in seen), (budget, seen)
    assert builds_allowed()
