"""``backend.estimates``: plan-spec workspace estimates that build nothing, as a tune under a
time budget takes them (``dnntune.torch``'s per-layer tune)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dnntune.backend.estimates import (
    DEFERRED_WORKSPACE_BYTES,
    builds_allowed,
    deferred_workspace_size,
    estimates_without_builds,
)


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


def _spy_on_variants(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether builds were allowed at each ``add_suggested_variants`` call from now on."""
    from dnntune.autotune import variants

    seen: list[bool] = []
    real = variants.add_suggested_variants

    def spy(graph: Any, exclude: frozenset[str] = frozenset()) -> int:
        seen.append(builds_allowed())
        return real(graph, exclude=exclude)

    monkeypatch.setattr(variants, "add_suggested_variants", spy)
    return seen


def test_the_deferred_workspace_has_room_on_a_gpu_only() -> None:
    assert deferred_workspace_size(1 << 10, "cuda") == DEFERRED_WORKSPACE_BYTES == 64 << 20
    assert deferred_workspace_size(1 << 30, "cuda") == 1 << 30
    assert deferred_workspace_size(1 << 10, "cpu") == 1 << 10


def test_a_budgeted_graph_tune_adds_its_variants_without_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dnntune tune --budget-s`` (``workflows.tuning.tune_graph``) alike."""
    import dnntune as dt
    from dnntune import testing
    from dnntune.workflows.tuning import TuneOptions, tune_graph

    seen = _spy_on_variants(monkeypatch)
    for budget, allowed in ((30.0, False), (None, True)):
        seen.clear()
        report = tune_graph(
            testing.small_pointwise_graph(),
            dt.create_handle("cpu"),
            TuneOptions(time_budget_s=budget),
        )
        assert report.ok, report.error
        assert seen == [allowed], budget


def test_a_budgeted_layer_tune_adds_its_variants_without_builds(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dnntune.torch``'s tune of a layer signature adds the engines' suggested variants
    without building their plans under a time budget (their builds come in the search, if it
    reaches them), and as before without one."""
    import dnntune.torch as dtt
    from dnntune.torch import runtime

    seen = _spy_on_variants(monkeypatch)
    for budget, allowed in ((30.0, False), (None, True)):
        runtime.cache().clear()
        seen.clear()
        model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()
        x = torch.randn(3, 8)
        path = tmp_path / f"ov_{budget}.json"
        dtt.optimize(model, (x,), policy="tune", overrides=path, time_budget_s=budget)
        assert seen and all(s is allowed for s in seen), (budget, seen)
    assert builds_allowed()
