"""The compiled-plan path end to end with the real engines (cuDNN parity, RFC 0013 A.1).

validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans ->
execute, the plan-indexed calls, their call-order errors, and the manual benchmarking loop of
the cuDNN autotuning sample as RFC 0013 Appendix A.1 ports it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import reference, testing


def _expect_matches(g: dt.Graph, pack: dict[int, torch.Tensor]) -> None:
    expected = reference.run(g, pack)
    for t in g.output_tensors():
        assert t.uid is not None
        cmp = reference.compare(pack[t.uid], expected[t.uid], reference.tolerance_for(g, t))
        assert cmp.ok, f"{g.get_plan_name()}: {cmp.message}"


def _graph(handle: dt.Handle) -> dt.Graph:
    g = testing.small_conv_graph()
    g.validate()
    g.build_operation_graph(handle)
    return g


@pytest.mark.slow
def test_all_builds_one_plan_per_applicable_engine(cpu_handle: dt.Handle) -> None:
    g = _graph(cpu_handle)
    applicable = [e.name for e in dt.get_registry().applicable(g, cpu_handle)]
    assert {"TORCH_ENGINE", "TORCH_COMPILE_ENGINE"} <= set(applicable)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    count = g.get_execution_plan_count()
    assert sorted(g.get_plan_name_at_index(i) for i in range(count)) == sorted(applicable)
    for i in range(count):
        pack = reference.make_inputs(g, "cpu", seed=i)
        g.execute_plan_at_index(cpu_handle, pack, None, i)
        _expect_matches(g, pack)


def test_heuristics_choice_builds_only_the_first_plan(cpu_handle: dt.Handle) -> None:
    g = _graph(cpu_handle)
    g.create_execution_plans([dt.HeuristicMode.A]).check_support()
    g.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    assert g.get_plan_name() == g.get_plan_name_at_index(0) == "TORCH_ENGINE"
    pack = reference.make_inputs(g, "cpu")
    g.execute(cpu_handle, pack)
    _expect_matches(g, pack)
    for i in range(1, g.get_execution_plan_count()):
        with pytest.raises(
            dt.BadStateError,
            match=rf"plan {i} .* is not compiled: call "
            r"build_plans\(ALL\) or build_plan_at_index",
        ):
            g.execute_plan_at_index(cpu_handle, pack, None, i)


def test_build_plan_at_index_selects_the_plan_execute_runs(cpu_handle: dt.Handle) -> None:
    g = _graph(cpu_handle)
    g.create_execution_plans([dt.HeuristicMode.FALLBACK])
    index = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())].index(
        "TORCH_ENGINE"
    )
    g.build_plan_at_index(index)
    assert g.get_plan_name() == "TORCH_ENGINE"
    assert g.get_workspace_size() == 0
    pack = reference.make_inputs(g, "cpu")
    g.execute(cpu_handle, pack)
    _expect_matches(g, pack)


def test_create_execution_plan_ext_one_engine_with_knobs(cpu_handle: dt.Handle) -> None:
    g = _graph(cpu_handle)
    g.create_execution_plan_ext("TORCH_ENGINE", {"torch.memory_format": "channels_last"})
    assert g.get_execution_plan_count() == 1
    g.check_support().build_plans()
    assert g.get_plan_name() == "TORCH_ENGINE[torch.memory_format=channels_last]"
    with pytest.raises(dt.InvalidValueError, match="unknown engine 'NOPE_ENGINE'"):
        g.create_execution_plan_ext("NOPE_ENGINE")


# ---- call order and mutual exclusion --------------------------------------------------------
def test_calls_out_of_order_are_bad_state(cpu_handle: dt.Handle) -> None:
    g = testing.small_conv_graph()
    with pytest.raises(dt.BadStateError, match=r"build_operation_graph\(handle\) first"):
        g.create_execution_plans([dt.HeuristicMode.A])
    g.build_operation_graph(cpu_handle)
    pack = reference.make_inputs(g, "cpu")
    for call in (
        g.check_support,
        g.build_plans,
        g.get_execution_plan_count,
        lambda: g.build_plan_at_index(0),
        lambda: g.execute_plan_at_index(cpu_handle, pack, None, 0),
    ):
        with pytest.raises(dt.BadStateError, match=r"call create_execution_plans\(modes\) first"):
            call()
    with pytest.raises(dt.BadStateError, match="no plan selected"):
        g.execute(cpu_handle, pack)
    g.create_execution_plans([dt.HeuristicMode.A])
    with pytest.raises(dt.BadStateError, match="no plan selected"):
        g.execute(cpu_handle, pack)
    with pytest.raises(dt.BadStateError, match="no plan selected"):
        g.get_workspace_size()
    with pytest.raises(dt.BadStateError, match=r"no compiled plans: call build_plans\(\) first"):
        g.get_autotune_workspace_size()


def test_plan_paths_exclude_each_other(cpu_handle: dt.Handle) -> None:
    specs_first = _graph(cpu_handle)
    specs_first.add_engine("TORCH_ENGINE")
    with pytest.raises(dt.BadStateError, match="mutually exclusive"):
        specs_first.create_execution_plans([dt.HeuristicMode.A])
    with pytest.raises(dt.BadStateError, match="mutually exclusive"):
        specs_first.create_execution_plan_ext("TORCH_ENGINE")
    plans_first = _graph(cpu_handle)
    plans_first.create_execution_plans([dt.HeuristicMode.A])
    with pytest.raises(dt.BadStateError, match="mutually exclusive"):
        plans_first.add_engines(["TORCH_ENGINE"])


def test_variant_pack_errors_reach_the_caller(cpu_handle: dt.Handle) -> None:
    g = _graph(cpu_handle)
    g.create_execution_plans([dt.HeuristicMode.A]).check_support().build_plans()
    pack = reference.make_inputs(g, "cpu")
    x = next(t for t in g.tensors if t.name == "X")
    missing = dict(pack)
    del missing[x.uid]  # type: ignore[arg-type]
    with pytest.raises(dt.InvalidValueError, match=rf"missing tensor uid\(s\): {x.uid} \(X\)"):
        g.execute(cpu_handle, missing)
    wrong = dict(pack)
    wrong[x.uid] = pack[x.uid].double()  # type: ignore[index]
    with pytest.raises(dt.InvalidValueError, match=r"tensor X .*dtype torch.float64"):
        g.execute(cpu_handle, wrong)
    g.execute(cpu_handle, {**pack, 12345: torch.zeros(3)})  # extra uids are ignored


# ---- the manual benchmarking loop of RFC 0013 Appendix A.1 ----------------------------------
def _manual_loop(g: dt.Graph, handle: dt.Handle, time_plan_ms: object) -> list[float]:
    """The cuDNN sample's loop with dnntune's plan-indexed calls; returns the times."""
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    plan_count = g.get_execution_plan_count()
    ws = max(g.get_workspace_size_plan_at_index(i) for i in range(plan_count))
    workspace = torch.empty(ws, dtype=torch.uint8, device=handle.device) if ws else None
    pack = reference.make_inputs(g, handle.device)
    times = [10.0] * plan_count
    for i in range(plan_count):
        try:
            g.execute_plan_at_index(handle, pack, workspace, i)  # warm-up
        except dt.DnnTuneError:
            continue
        times[i] = time_plan_ms(lambda i=i: g.execute_plan_at_index(handle, pack, workspace, i))  # type: ignore[operator]
    best = min(range(plan_count), key=times.__getitem__)
    g.build_plan_at_index(best)
    for t in g.output_tensors():
        pack[t.uid].zero_()  # type: ignore[index]
    g.execute(handle, pack, workspace)
    assert g.get_plan_name() == g.get_plan_name_at_index(best)
    _expect_matches(g, pack)
    return times


@pytest.mark.slow
def test_manual_benchmark_loop_cpu(cpu_handle: dt.Handle) -> None:
    def time_ms(run: object) -> float:
        start = time.perf_counter()
        for _ in range(10):
            run()  # type: ignore[operator]
        return (time.perf_counter() - start) * 1e3 / 10

    times = _manual_loop(_graph(cpu_handle), cpu_handle, time_ms)
    assert all(t > 0 for t in times)


@pytest.mark.gpu
@pytest.mark.slow
def test_manual_benchmark_loop_cuda(cuda_handle: dt.Handle) -> None:
    stream = torch.cuda.Stream()
    cuda_handle.set_stream(stream)

    def time_ms(run: object) -> float:
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(10):
            run()  # type: ignore[operator]
        stop.record(stream)
        stop.synchronize()
        return float(start.elapsed_time(stop)) / 10

    times = _manual_loop(_graph(cuda_handle), cuda_handle, time_ms)
    assert all(t > 0 for t in times)


def test_a_plan_never_runs_a_graph_changed_since_it_was_built(cpu_handle: dt.Handle) -> None:
    """A node added after the plan was built: its output would never be computed (the old
    pack ran silently through the cached fast path, a new one raised a bare KeyError)."""
    g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    a, b = g.tensor(name="A", dims=[1, 8, 16]), g.tensor(name="B", dims=[1, 16, 4])
    y = g.matmul(a, b)
    y.set_output(True)
    g.build_operation_graph(cpu_handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    g.build_plans()
    old = {a: torch.randn(1, 8, 16), b: torch.randn(1, 16, 4), y: torch.empty(1, 8, 4)}
    g.execute(cpu_handle, old)  # binds the fast path
    y.set_output(False)
    z = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    z.set_output(True)
    new = {a: old[a], b: old[b], z: torch.empty(1, 8, 4)}
    for pack in (old, new):
        with pytest.raises(dt.BadStateError, match=r"changed .* since its plan was built"):
            g.execute(cpu_handle, pack)
    g.build_operation_graph(cpu_handle)  # the graph alone: the old plan still refused
    with pytest.raises(dt.BadStateError, match="since its plan was built"):
        g.execute(cpu_handle, new)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.check_support()
    g.build_plans()
    g.execute(cpu_handle, new)
    torch.testing.assert_close(new[z], torch.relu(old[a] @ old[b]), atol=1e-5, rtol=1e-5)


def _mm_grown_after_its_plans(handle: dt.Handle) -> tuple[dt.Graph, dict, torch.Tensor]:
    """A matmul whose plans were built, then a ReLU output added (the audit's reproducer)."""
    g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    a, b = g.tensor(name="A", dims=[1, 8, 16]), g.tensor(name="B", dims=[1, 16, 4])
    y = g.matmul(a, b)
    y.set_output(True)
    g.build_operation_graph(handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.build_plans(dt.BuildPlanPolicy.ALL)
    z = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD)
    z.set_output(True)
    out = torch.full((1, 8, 4), float("nan"))
    pack = {a: torch.randn(1, 8, 16), b: torch.randn(1, 16, 4), y: torch.empty(1, 8, 4), z: out}
    return g, pack, out


@pytest.mark.parametrize(
    "step",
    [
        lambda g, h, p: (g.build_operation_graph(h), g.build_plans()),
        lambda g, h, p: g.build_plan_at_index(0),
        lambda g, h, p: g.execute_plan_at_index(h, p, None, 0),
        lambda g, h, p: g.autotune(h, p, None, config=dt.AutotuneConfig(verify=False)),
        lambda g, h, p: g.check_support(),
    ],
    ids=["build_plans", "build_plan_at_index", "execute_plan_at_index", "autotune", "support"],
)
def test_plans_made_before_the_graph_changed_never_run_it(cpu_handle: dt.Handle, step: Any) -> None:
    """Rebuilding or indexing the old plans re-selected a plan compiled for the old graph, and
    the new output stayed NaN (32 of 32): every path refuses them now."""
    g, pack, out = _mm_grown_after_its_plans(cpu_handle)
    with pytest.raises(dt.BadStateError, match=r"create_execution_plans\(\) again"):
        step(g, cpu_handle, pack)
    assert out.isnan().all()
    g.create_execution_plans([dt.HeuristicMode.A])
    g.build_plans()
    g.execute(cpu_handle, pack)
    assert not out.isnan().any()


@pytest.mark.parametrize("edit", ["set_output", "unset_output", "set_dims", "set_data_type"])
def test_a_tensor_edited_after_the_build_is_a_changed_graph(
    cpu_handle: dt.Handle, edit: str
) -> None:
    """set_output() after the build was not noticed: the new output was never written, and an
    output unmarked gave a bare KeyError."""
    g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    a, b = g.tensor(name="A", dims=[1, 8, 16]), g.tensor(name="B", dims=[1, 16, 4])
    c = g.matmul(a, b)
    y = g.pointwise(c, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True)
    c.set_output(edit == "unset_output")
    g.build(cpu_handle, [dt.HeuristicMode.A])
    pack = {a: torch.randn(1, 8, 16), b: torch.randn(1, 16, 4), y: torch.empty(1, 8, 4)}
    if edit == "unset_output":
        pack[c] = torch.empty(1, 8, 4)
    g.execute(cpu_handle, pack)  # binds the fast path
    if edit == "set_output":
        c.set_output(True)
    elif edit == "unset_output":
        c.set_output(False)
    elif edit == "set_dims":
        a.set_dims([1, 8, 16])  # the same dims: still an edit the plans never saw
    else:
        b.set_data_type(dt.DataType.FLOAT)
    with pytest.raises(dt.BadStateError, match="since its plan was built"):
        g.execute(cpu_handle, pack)


def test_a_plan_is_not_serialized_for_a_graph_edited_since(cpu_handle: dt.Handle) -> None:
    """serialize_plan() after an edit wrote the old plan under the edited graph's key (new-user
    audit, session 15): refused as execute() is, through the graph and through the plan."""
    g = dt.Graph(name="mm", io_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    a, b = g.tensor(name="A", dims=[1, 8, 16]), g.tensor(name="B", dims=[1, 16, 4])
    g.matmul(a, b).set_output(True)
    g.build(cpu_handle, [dt.HeuristicMode.A])
    plan = g.active_plan
    assert plan is not None and g.serialize_plan()
    b.set_strides([64, 1, 16])  # another layout: another graph key
    with pytest.raises(dt.BadStateError, match="before serialize_plan"):
        g.serialize_plan()
    with pytest.raises(dt.BadStateError, match="since its plan was built"):
        plan.serialize()
    g.build(cpu_handle, [dt.HeuristicMode.A])
    assert '"graph_key"' in g.serialize_plan()


def test_execute_refuses_a_handle_or_workspace_that_is_not_one(cpu_handle: dt.Handle) -> None:
    g = _graph(cpu_handle)
    g.create_execution_plans([dt.HeuristicMode.A])
    g.build_plans()
    pack = testing.make_pack(g)
    for bad in (None, "cpu"):
        with pytest.raises(dt.InvalidValueError, match="expected a Handle"):
            g.execute(bad, pack)  # type: ignore[arg-type]
        with pytest.raises(dt.InvalidValueError, match="expected a Handle"):
            g.execute_plan_at_index(bad, pack, None, 0)  # type: ignore[arg-type]
    with pytest.raises(dt.InvalidValueError, match="workspace must be a torch tensor"):
        g.execute(cpu_handle, pack, "abc")  # type: ignore[arg-type]


@pytest.mark.parametrize("dims", [[1, 8.9, 16], [1, 8.0, 16], [1, True, 16]])
def test_a_tensor_with_dims_that_are_not_integers_is_refused(dims: list) -> None:
    """The builder truncated 8.9 to 8, where the JSON loader refuses it."""
    g = dt.Graph(name="x", io_data_type=dt.DataType.FLOAT)
    with pytest.raises(dt.InvalidValueError, match="integers"):
        g.tensor(name="A", dims=dims)
    t = g.tensor(name="B", dims=[1, 2])
    with pytest.raises(dt.InvalidValueError, match="strides must be integers"):
        t.set_strides([2.5, 1])
