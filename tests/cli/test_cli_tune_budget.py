"""Issue 25: ``--budget-s`` / ``--run-budget-s`` on ``dnntune tune`` and ``--budget-s`` on
``dnntune bench --oracle``, through the real entry point on the fake engines' clock."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app

FAST = ("--warmup", "1")


def _dear_compiles(f: testing.FakeEngines) -> None:
    """Every compile takes 100 ms on the fake clock; FAKE_ENGINE_B is the dearest engine."""
    for name in f.engines:
        f.timings.set_compile(name, 100.0)
    f[testing.FAKE_ENGINE_B].compile_cost = 50.0


def test_tune_budget_skips_and_reports(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    _dear_compiles(fakes)
    out, report = tmp_path / "o.json", tmp_path / "r.json"
    graph = str(graph_dir / "b_pw_mul.json")
    result = cli(
        "tune", "-g", graph, "-o", str(out), "--budget-s", "0.22", "--report", str(report), *FAST
    )
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    cost = rec["cost"]
    assert cost["time_budget_s"] == 0.22 and cost["skipped_budget"] >= 1
    assert cost["budget_used_s"] < 0.22 * 1.5
    assert {"compile_ms", "priming_ms", "timing_ms", "recheck_ms", "confirm_ms"} <= set(cost)
    assert rec["ok"] and rec["candidates_skipped_budget"] == cost["skipped_budget"]
    assert rec["candidates_excluded"] == 0  # the caller excluded none: the budget skipped them
    assert "skipped)" in result.stdout and "tuning time went to: compile" in result.stdout
    assert "candidate(s) skipped" in result.stdout


def test_tune_details_name_each_skipped_variant() -> None:
    """A variant the budget skipped was never compiled: it has no plan name, so --details names
    its engine and knobs (before, every skipped variant read as the bare engine name), written
    as plan names are (``E[e.tile=64,e.warps=4]``; it read ``E [e.tile=64, e.warps=4]`` beside
    the tried variants' ``E[...]``)."""
    from dnntune.backend.knobs import KnobSetting
    from dnntune.rfc import AutotuneResult
    from dnntune.workflows.tune_report import plan_label

    plain = AutotuneResult(engine_name="E")
    knobbed = AutotuneResult(
        engine_name="E", knob_settings=[KnobSetting("e.tile", 64), KnobSetting("e.warps", 4)]
    )
    assert plan_label(plain) == "E" and plan_label(knobbed) == "E[e.tile=64,e.warps=4]"
    assert plan_label(AutotuneResult(engine_name="E", plan_name="E#3")) == "E#3"


def test_tune_run_budget_splits_over_the_graphs(cli, fakes, graph_dir, tmp_path) -> None:
    report = tmp_path / "r.json"
    result = cli(
        "tune",
        "-g",
        str(graph_dir),
        "-o",
        str(tmp_path / "o.json"),
        "--run-budget-s",
        "4",
        "--budget-s",
        "3",
        "--report",
        str(report),
        *FAST,
    )
    assert result.exit_code == 0, result.output
    first, second = json.loads(report.read_text())
    assert first["cost"]["time_budget_s"] == pytest.approx(2.0, abs=0.5)  # 4 s over 2 graphs
    assert 0.0 < second["cost"]["time_budget_s"] <= 3.0
    # the cost line says the run budget given, not the sum of the graphs' shares, which grow
    # as earlier graphs underspend (it said "budget 6.83 s" of a 4 s run; audit, session 18)
    used = first["cost"]["budget_used_s"] + second["cost"]["budget_used_s"]
    flat = " ".join(result.stdout.split())
    assert f"run budget 4.00 s over 2 graph(s), {used:.2f} s used by their tuning" in flat
    # ... and what the run's wall clock, on which the run budget is spent, said
    assert re.search(r"s used by their tuning, \d+\.\d\d s by the run \(on whose clock", flat)


def test_a_per_graph_budget_is_said_per_graph(cli, fakes, graph_dir, tmp_path) -> None:
    result = cli(
        "tune", "-g", str(graph_dir), "-o", str(tmp_path / "o.json"), "--budget-s", "0.5", *FAST
    )
    assert result.exit_code == 0, result.output
    assert "budget 0.50 s per graph over 2 graph(s)" in " ".join(result.stdout.split())


def test_the_cost_line_names_the_run_budget_given() -> None:
    from dnntune.cli.tune_view import cost_line
    from dnntune.workflows.tuning import GraphTuneReport

    def spent(share: float, used: float) -> GraphTuneReport:
        cost = {"time_budget_s": share, "budget_used_s": used, "skipped_budget": 1}
        return GraphTuneReport(graph_name="g", cost=cost)

    # four graphs of a 4 s run, each underspending its growing share
    reports = [spent(1.0, 0.1), spent(1.3, 0.1), spent(1.9, 0.1), spent(3.7, 0.1)]
    line = cost_line(reports, run_budget_s=4.0)
    assert "run budget 4.00 s over 4 graph(s), 0.40 s used, 4 candidate(s) skipped" in line
    assert "7.90" not in line
    assert "budgets of 1.00 to 3.70 s over 4 graph(s)" in cost_line(reports)


def test_the_cost_line_says_the_run_clock_a_run_budget_is_spent_on() -> None:
    """A run budget is split on the run's wall clock, which loading, inputs, the heuristic
    plans and writing also use: a 0.3 s run budget over 3 CPU graphs read "0.13 s used, 2
    candidate(s) skipped" when the run had taken 1.8 s and the later graphs got 1 ms each
    (audit, session 19). The line says both."""
    from dnntune.cli.tune_view import cost_line
    from dnntune.workflows.tuning import GraphTuneReport

    cost = {"time_budget_s": 0.1, "budget_used_s": 0.05, "skipped_budget": 1}
    reports = [GraphTuneReport(graph_name=f"g{i}", cost=dict(cost)) for i in range(3)]
    line = cost_line(reports, run_budget_s=0.3, run_elapsed_s=1.8)
    assert "run budget 0.30 s over 3 graph(s), 0.15 s used by their tuning, 1.80 s by the run" in (
        line
    )
    assert line.endswith(", 3 candidate(s) skipped")
    # a per-graph budget is spent on each autotune() call's own clock: no run time is said
    assert "by the run" not in cost_line(reports, run_elapsed_s=1.8)


def test_the_cost_line_names_the_time_no_part_accounts_for() -> None:
    """The parts named (compile, priming, timing, re-check, confirmation) left out the rest of
    the call: an isolated call on the CPU took 2.14 s of a 0.05 s budget, 11 ms of it in the
    parts named (the worker's start was the rest; audit, session 19). It is "other"."""
    from dnntune.cli.tune_view import cost_line
    from dnntune.workflows.tuning import GraphTuneReport

    cost = {
        "compile_ms": 7.0,
        "priming_ms": 0.0,
        "timing_ms": 4.0,
        "recheck_ms": 0.0,
        "confirm_ms": 0.0,
        "total_ms": 2140.0,
    }
    # a compiled-plan call counts compiles made before it: never a negative "other"
    before = {**cost, "compile_ms": 900.0, "total_ms": 100.0}
    reports = [GraphTuneReport(graph_name="g", cost=cost), GraphTuneReport("h", cost=before)]
    line = cost_line(reports)
    assert "confirmation 0.00 s, other 2.13 s (reference outputs, the heuristic pick" in line


def test_tune_cost_line_has_other(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    result = cli("tune", "-g", str(graph_dir), "-o", str(tmp_path / "o.json"), *FAST)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert re.search(r"confirmation \d+\.\d\d s, other \d+\.\d\d s \(reference outputs", flat)


@pytest.mark.parametrize(
    "args",
    [
        ("--budget-s", "0"),
        ("--budget-s", "-1"),
        ("--run-budget-s", "0"),
        ("--budget-s", "x"),
        ("--budget-s", "inf"),
    ],
)
def test_tune_bad_budget_is_a_usage_error(cli, fakes, graph_dir: Path, tmp_path, args) -> None:
    result = cli("tune", "-g", str(graph_dir), "-o", str(tmp_path / "o.json"), *args)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "o.json").exists()


def _bench(args: list[str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def test_bench_oracle_budget(graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    graph = str(graph_dir / "b_pw_mul.json")
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]) as f:
        f.timings.set_compile(testing.FAKE_ENGINE_A, 100.0)
        result = _bench(
            [
                "bench",
                "-g",
                graph,
                "--warmup",
                "1",
                "--iters",
                "3",
                "--oracle",
                "--budget-s",
                "0.3",
                "-o",
                str(out),
            ]
        )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["graphs"][0]["results"]
    row_a = next(r for r in rows if r["engine"]["name"] == testing.FAKE_ENGINE_A)
    oracle = row_a["oracle"]
    assert oracle["status"] == "ok"
    # 0.3 s over 2 engines, less what building the row's plan specs took
    assert 0.1 < oracle["cost"]["time_budget_s"] <= 0.15
    assert oracle["candidates_skipped_budget"] >= 1
    assert oracle["candidates_skipped_budget"] == oracle["cost"]["skipped_budget"]


def test_a_row_whose_search_the_budget_skipped_is_not_a_tuned_row(
    graph_dir: Path, tmp_path: Path
) -> None:
    """Every variant of A skipped by the budget: the row read "1.00x (kept)" and counted in
    "Oracle: 1 tuned row(s)" (audit, session 18). It reads as not searched (budget), as C
    (no knobs) reads "no-search", and neither is a tuned row."""
    out = tmp_path / "r.json"
    graph = str(graph_dir / "b_pw_mul.json")
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]) as f:
        # the default plan's own timing in the tune spends the budget (its build is the row's:
        # the tune takes the row's plan, PlanSet.prebuilt), so no variant gets a turn
        f.timings.set(testing.FAKE_ENGINE_A, 100.0).set_compile(testing.FAKE_ENGINE_A, 500.0)
        result = _bench(
            ["bench", "-g", graph, "--warmup", "1", "--iters", "3", "--oracle", "--budget-s",
             "0.3", "-o", str(out)]
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = {r["engine"]["name"]: r for r in data["graphs"][0]["results"]}
    a = rows[testing.FAKE_ENGINE_A]["oracle"]
    assert a["tuning_available"] is False and a["candidates_skipped_budget"] >= 1
    assert data["summary"]["oracle"]["rows"] == 0
    assert data["summary"]["oracle"]["not_searched"] == 2
    assert data["summary"]["oracle"]["not_searched_budget"] == 1
    table = {line.split()[0]: line for line in result.output.splitlines() if "FAKE_ENGINE" in line}
    assert table[testing.FAKE_ENGINE_A].rstrip().endswith("not searched (budget)")
    assert "(kept)" not in table[testing.FAKE_ENGINE_A]
    assert table[testing.FAKE_ENGINE_C].rstrip().endswith("no-search")
    flat = " ".join(result.output.split())
    assert "Oracle: 0 tuned row(s)" in flat
    assert "2 row(s) not searched (one candidate; 1 because the budget skipped the rest)" in flat


@pytest.mark.parametrize(
    "args", [["--oracle", "--budget-s", "0"], ["--oracle", "--budget-s", "-2"], ["--budget-s", "1"]]
)
def test_bench_bad_budget_is_a_usage_error(graph_dir: Path, args: list[str]) -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = _bench(["bench", "-g", str(graph_dir), *args])
    assert result.exit_code == 2, result.output
    assert "--budget-s" in result.output


@pytest.mark.parametrize("mode", ["standard", "exhaustive"])
def test_bench_oracle_mode(graph_dir: Path, tmp_path: Path, mode: str) -> None:
    """``--oracle-mode`` reaches each row's tuning: the oracle block names the mode it ran."""
    out = tmp_path / "r.json"
    graph = str(graph_dir / "b_pw_mul.json")
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        args = ["bench", "-g", graph, *FAST, "--iters", "3", "--oracle", "--oracle-mode", mode]
        result = _bench([*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["graphs"][0]["results"][0]
    assert row["oracle"]["status"] == "ok" and row["oracle"]["mode"] == mode
    assert f"oracle tuned in {mode} mode" in result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--oracle", "--oracle-mode", "full"], "standard or exhaustive"),
        (["--oracle-mode", "exhaustive"], "add --oracle"),
    ],
)
def test_bench_bad_oracle_mode_is_a_usage_error(
    graph_dir: Path, args: list[str], fragment: str
) -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = _bench(["bench", "-g", str(graph_dir), *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output


def test_bench_oracle_counts_its_setup(graph_dir: Path, tmp_path: Path) -> None:
    """Building the plan specs (workspace estimates build plans) is part of the oracle's wall
    time and of its budget: ``cost.setup_ms`` says how much, and the budget autotune() got is
    what the setup left."""
    out = tmp_path / "r.json"
    graph = str(graph_dir / "b_pw_mul.json")
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        args = ["bench", "-g", graph, *FAST, "--iters", "3", "--oracle", "--budget-s", "5"]
        result = _bench([*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    oracle = json.loads(out.read_text())["graphs"][0]["results"][0]["oracle"]
    setup_ms = oracle["cost"]["setup_ms"]
    assert 0.0 < setup_ms <= oracle["tuning_wall_ms"]
    assert oracle["cost"]["total_ms"] <= oracle["tuning_wall_ms"]
    assert oracle["cost"]["time_budget_s"] == pytest.approx(5.0 - setup_ms / 1e3, abs=0.05)


def test_a_row_the_budget_left_unsearched_has_no_speedup_in_the_csv_and_says_so_with_v(
    graph_dir: Path, tmp_path: Path
) -> None:
    """The CSV wrote ``oracle_speedup=1.0`` for rows the table reads "no-search" or "not
    searched (budget)" (the JSON summary leaves them out of the geomean), and ``-v`` said
    "1/1 candidates benchmarked (0 failed)" without the skipped ones (new-user audit, session
    56)."""
    out = tmp_path / "r.csv"
    graph = str(graph_dir / "b_pw_mul.json")
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]) as f:
        f.timings.set(testing.FAKE_ENGINE_A, 100.0).set_compile(testing.FAKE_ENGINE_A, 500.0)
        result = _bench(
            ["bench", "-v", "-g", graph, "--warmup", "1", "--iters", "3", "--oracle",
             "--budget-s", "0.3", "-o", str(out)]
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    import csv

    rows = {r["engine_name"]: r for r in csv.DictReader(out.read_text().splitlines())}
    assert rows[testing.FAKE_ENGINE_A]["oracle_speedup"] == ""
    assert rows[testing.FAKE_ENGINE_C]["oracle_speedup"] == ""
    flat = " ".join(result.output.split())
    seen = re.search(
        r"1/(\d+) candidates benchmarked \(0 failed, (\d+) skipped by the budget\)", flat
    )
    assert seen is not None, flat
    # the count adds up: the one benchmarked and those the budget skipped (it read "1/1")
    assert int(seen[1]) == 1 + int(seen[2]) > 1


def test_a_variant_this_device_cannot_run_is_not_counted_as_skipped_by_the_budget(
    tmp_path: Path,
) -> None:
    """TORCH_ENGINE's ``torch.cuda_graph=1`` cannot run on the CPU: under a spent budget it read
    "Plan skipped (time budget)" and counted among the candidates a larger budget would try
    (new-user audit, session 56). It is unsupported here, as its compile says, whatever the
    budget (the real engine, on this machine's CPU)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CUDA-graph variant runs on a GPU")
    graph = (
        Path(__file__).parents[2] / "examples/graphs/resnet50_conv1x1_s2_bias_relu_nhwc_fp16.json"
    )
    report = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        ["tune", "-g", str(graph), "-o", str(tmp_path / "o.json"), "--sweep-knobs",
         "--engine", "TORCH_ENGINE", "--budget-s", "0.001", "--report", str(report),
         "--details", "--warmup", "1"],
        env={"COLUMNS": "250"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    # the default plan spends the budget; io, channels_last and tf32 are skipped for it
    assert (rec["candidates_not_applicable"], rec["candidates_skipped_budget"]) == (1, 3)
    flat = " ".join(result.output.split())
    assert re.search(r"TORCH_ENGINE\[torch\.cuda_graph=1\] .{0,60}NotSupportedError", flat)


def test_the_cost_line_says_a_budget_under_ten_milliseconds_as_given() -> None:
    """``--budget-s 0.001`` read "budget 0.00 s per graph": a budget of zero, which the option
    refuses (new-user audit, session 61)."""
    from dnntune.cli.tune_view import cost_line
    from dnntune.workflows.tuning import GraphTuneReport

    def spent(share: float) -> GraphTuneReport:
        cost = {"time_budget_s": share, "budget_used_s": 0.2, "skipped_budget": 1}
        return GraphTuneReport(graph_name="g", cost=cost)

    assert "budget 0.001 s per graph over 1 graph(s)" in cost_line([spent(0.001)])
    assert "budgets of 0.001 to 0.50 s over 2 graph(s)" in cost_line([spent(0.001), spent(0.5)])
    assert "run budget 0.005 s over 1 graph(s)" in cost_line([spent(0.005)], run_budget_s=0.005)
