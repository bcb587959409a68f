"""The public surface (issue 24): what users and benchmarks/ need is exported by the package
and its documented subpackages, and is the same object as the implementation's."""

from __future__ import annotations

import dnntune as dt
from dnntune import autotune, bench, measure, reference, workflows
from dnntune.backend import plan_choice, plans, variant_pack


def test_workflows_inputs_and_plan_values_are_top_level_names() -> None:
    assert dt.tune_graph is workflows.tune_graph and dt.tune_graphs is workflows.tune_graphs
    assert dt.TuneOptions is workflows.TuneOptions and dt.run_graph is workflows.run_graph
    assert dt.GraphTuneReport is workflows.GraphTuneReport
    assert dt.GraphRunReport is workflows.GraphRunReport
    assert dt.time_interleaved is workflows.time_interleaved  # interleaved timing of plans
    assert dt.make_inputs is reference.make_inputs
    assert dt.allocate_workspace is plans.allocate_workspace
    assert dt.normalize_variant_pack is variant_pack.normalize_variant_pack
    assert dt.choose_plan is plan_choice.choose_plan and dt.PlanChoice is plan_choice.PlanChoice
    assert set(dt.__all__) <= set(dir(dt))


def test_subpackages_export_what_benchmarks_use() -> None:
    for name in ("steady_sample", "latency_sample", "interleaved_rounds", "cold_flush"):
        assert name in measure.__all__
    for name in ("execute_sampler", "confirm_winner", "add_suggested_variants", "sweep_variants"):
        assert name in autotune.__all__
    for name in ("time_callable", "TimingOptions", "graph_metrics"):
        assert name in bench.__all__
    assert "heuristic_plan" in workflows.__all__
    for module in (dt, autotune, bench, measure, workflows):
        assert all(hasattr(module, name) for name in module.__all__)
