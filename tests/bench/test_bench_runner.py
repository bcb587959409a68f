"""``dnntune bench`` through the real entry point, on the fake engines and on CPU engines."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import BENCH_FAST, bench_graph_file, invoke

import dnntune as dt
from dnntune import testing
from dnntune.bench import oracle
from dnntune.bench.config import BenchConfig
from dnntune.bench.results import SuiteResult
from dnntune.bench.runner import BenchRunner
from dnntune.bench.timing import PlanTiming, TimingOptions, time_callable

FAST = BENCH_FAST
_graph_file = bench_graph_file
_invoke = invoke


def test_fake_engines_rows_exit_codes_and_json(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        result = _invoke(
            ["bench", "-g", str(path), *FAST, "--validate", "reference", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1
    assert data["run"]["complete"] is True
    rows = data["graphs"][0]["results"]
    assert [r["engine"]["name"] for r in rows] == ["FAKE_ENGINE_A", "FAKE_ENGINE_C"]
    assert all(r["verdict"] == "passed" for r in rows)
    a, c = rows
    assert a["kernel"]["median_ms"] == pytest.approx(1.0)  # scripted fake timings
    assert c["kernel"]["median_ms"] == pytest.approx(2.0)
    assert a["metrics"]["flops"] > 0 and a["metrics"]["tflops"] > 0
    for r in rows:  # no oracle keys at all without --oracle
        assert not any(k.startswith("oracle") for k in r)
    assert "oracle" not in data["summary"]
    assert "FAKE_ENGINE_A" in result.output and "Summary:" in result.output


def test_wrong_engine_fails_validation_exit_3(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_WRONG, testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(path), *FAST, "--validate", "reference"])
    assert result.exit_code == 3, result.output
    assert "failed" in result.output


def test_failing_engine_row_exit_1_and_csv(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    out = tmp_path / "r.csv"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_FAILS, testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(path), *FAST, "-o", str(out)])
    assert result.exit_code == 1, result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and "error" in lines[1]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    assert _invoke(["bench", "-g", str(path), "--cache-mode", "hot"]).exit_code == 2
    assert _invoke(["bench", "-g", str(tmp_path / "missing.json")]).exit_code == 2
    assert _invoke(["bench"]).exit_code == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("version = 1\nwhat = 3\n")
    assert _invoke(["bench", "--config", str(bad)]).exit_code == 2
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        assert _invoke(["bench", "-g", str(path), "--engine", "NOPE"]).exit_code == 2


def test_toml_recipe_and_cli_precedence(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    recipe = tmp_path / "bench.toml"
    recipe.write_text(
        f'version = 1\ngraphs = ["{path.name}"]\nwarmup = 1\niters = 2\noutput = "from_toml.json"\n'
    )
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "--config", str(recipe), "--iters", "4"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "from_toml.json").read_text())
    assert data["run"]["config"]["iters"] == 4  # the explicit flag wins
    assert data["run"]["config"]["warmup"] == 1  # from the recipe
    assert data["graphs"][0]["results"][0]["kernel"]["n"] == 4


def test_flags_typed_on_the_command_line_beat_the_recipe(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    recipe = tmp_path / "bench.toml"
    recipe.write_text(
        f'version = 1\ngraph = ["{path.name}"]\nwarmup = 1\niters = 2\nquiet = true\n'
        'oracle = true\noutput = "r.json"\n'
    )
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = _invoke(["bench", "--config", str(recipe), "-v", "--no-oracle"])
    assert result.exit_code == 0, result.output  # -v over quiet = true, not "exclude each other"
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["run"]["config"]["verbose"] is True and data["run"]["config"]["quiet"] is False
    assert data["run"]["config"]["oracle"] is False
    assert "oracle" not in data["graphs"][0]["results"][0]
    assert "kernel: n=2" in result.output  # the verbose block


def test_no_oracle_typed_over_a_recipe_that_tunes_drops_its_oracle_settings(
    tmp_path: Path,
) -> None:
    path = _graph_file(tmp_path)
    recipe = tmp_path / "bench.toml"
    recipe.write_text(
        f'version = 1\ngraph = ["{path.name}"]\nwarmup = 1\niters = 2\noutput = "r.json"\n'
        'oracle = true\nbudget-s = 5\noracle-mode = "exhaustive"\n'
    )
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = _invoke(["bench", "--config", str(recipe), "--no-oracle", "-q"])
        typed = _invoke(["bench", "--config", str(recipe), "--no-oracle", "--budget-s", "5"])
    assert result.exit_code == 0, result.output  # was 2: "--budget-s limits --oracle's tuning"
    config = json.loads((tmp_path / "r.json").read_text())["run"]["config"]
    assert config["oracle"] is False
    assert config["budget_s"] is None and config["oracle_mode"] == "standard"
    # a budget typed beside --no-oracle is still the user's own contradiction
    assert typed.exit_code == 2 and "--budget-s limits --oracle" in typed.output


def test_backend_pytorch_typed_over_a_recipe_that_tunes_runs_without_the_oracle(
    tmp_path: Path,
) -> None:
    path = _graph_file(tmp_path)
    recipe = tmp_path / "bench.toml"
    recipe.write_text(
        f'version = 1\ngraph = ["{path.name}"]\nwarmup = 1\niters = 2\noutput = "r.json"\n'
        "oracle = true\nbudget-s = 5\n"
    )
    result = _invoke(["bench", "--config", str(recipe), "--backend", "pytorch", "-q"])
    typed = _invoke(["bench", "--config", str(recipe), "--backend", "pytorch", "--oracle"])
    # was 2: "--oracle tunes dnntune engines; it cannot be used with --backend pytorch"
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "r.json").read_text())["run"]["config"]
    assert config["backend"] == "pytorch" and config["oracle"] is False
    assert config["budget_s"] is None
    assert typed.exit_code == 2 and "cannot be used with --backend pytorch" in typed.output


def test_oracle_block_and_geomean(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    # FAKE_ENGINE_A: default knobs 1.0 ms; the sweep over fake.variant finds faster variants.
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(path), *FAST, "--oracle", "-o", str(out), "-v"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    row_a, row_c = data["graphs"][0]["results"]
    assert row_a["oracle"]["status"] == "ok"
    assert row_a["oracle"]["candidates_total"] >= 4
    delta = row_a["oracle_delta"]
    assert delta["basis"] == "kernel"
    assert delta["speedup"] == pytest.approx(delta["baseline_median_ms"] / delta["tuned_median_ms"])
    assert row_c["oracle"]["tuning_available"] is False  # no knobs: nothing to search
    assert data["summary"]["oracle"]["rows"] >= 1
    assert "Oracle:" in result.output and "oracle" in result.output
    assert "plan FAKE_ENGINE_A[fake.variant=" in result.output  # -v: not eaten as markup


def test_oracle_call_order_is_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ootb benchmark, autotune, baseline re-time, tuned benchmark (seed 003's fix)."""
    path = _graph_file(tmp_path)
    calls: list[str] = []
    original = oracle.run_autotune  # the oracle tunes a plan set of its own, beside the graph

    def spy_autotune(*args: Any, **kwargs: Any) -> Any:
        calls.append("autotune")
        return original(*args, **kwargs)

    monkeypatch.setattr(oracle, "run_autotune", spy_autotune)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        handle = dt.create_handle("cpu")

        def measure(label: str, run: Callable[[], None]) -> PlanTiming:
            calls.append(label)
            return time_callable(run, handle, TimingOptions(warmup=1, iters=3))

        cfg = BenchConfig(graphs=(str(path),), warmup=1, iters=3, oracle=True)
        result = BenchRunner(cfg, handle, [path], measure=measure).run()
    assert calls == ["ootb", "autotune", "baseline", "tuned"]
    assert result.graphs[0]["results"][0]["oracle_delta"] is not None


def test_oracle_failure_is_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _graph_file(tmp_path)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise dt.AutotuneError("no candidate succeeded", [])

    monkeypatch.setattr(oracle, "run_autotune", broken)
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = _invoke(["bench", "-g", str(path), *FAST, "--oracle", "-o", str(out)])
    assert result.exit_code == 0, result.output  # a tuning failure never changes the exit code
    row = json.loads(out.read_text())["graphs"][0]["results"][0]
    assert row["status"] == "success" and row["kernel"] is not None
    assert "no candidate succeeded" in row["oracle_error"]
    assert row["oracle_delta"] is None


def test_oracle_error_names_the_engines_own_failure(tmp_path: Path) -> None:
    """Seed 003: when no candidate succeeds, oracle_error carries the target engine's own
    failure, not only autotune()'s count of failures (the row keeps no results to look in)."""
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    # unvalidated, the OOTB row runs; every tuned candidate fails autotune()'s verification
    with testing.fake_engines(names=[testing.FAKE_ENGINE_WRONG]):
        result = _invoke(["bench", "-g", str(path), *FAST, "--oracle", "-o", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["graphs"][0]["results"][0]
    assert row["status"] == "success" and row["oracle_delta"] is None
    assert "all engines failed" in row["oracle_error"]
    assert "FAKE_ENGINE_WRONG: failed verification" in row["oracle_error"], row["oracle_error"]


def test_oracle_error_skips_candidates_the_caller_excluded() -> None:
    wrong = dt.AutotuneResult(engine_name="E", plan_name="E[k=1]", error_message="boom")
    filtered = dt.AutotuneResult(
        engine_name="F", error_message="Plan excluded by engineIdFilter.", excluded_by_caller=True
    )
    unsupported = dt.AutotuneResult(
        engine_name="E", error_message="not here", failure_kind="unsupported"
    )
    exc = dt.AutotuneError("autotune: all failed", [filtered, unsupported, wrong])
    assert oracle.oracle_error(exc) == "AutotuneError: autotune: all failed. E[k=1]: boom"
    assert oracle.oracle_error(ValueError("x")) == "ValueError: x"


def test_interrupt_leaves_partial_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _graph_file(tmp_path, "a"), _graph_file(tmp_path, "b")
    out = tmp_path / "r.json"
    original = BenchRunner.run_graph

    def interrupt_second(self: BenchRunner, path: Path) -> dict[str, Any]:
        if path.stem == "b":
            raise KeyboardInterrupt
        return original(self, path)

    monkeypatch.setattr(BenchRunner, "run_graph", interrupt_second)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(first), str(second), *FAST, "-o", str(out)])
    assert result.exit_code == 130
    data = json.loads(out.read_text())
    assert data["run"]["complete"] is False
    assert [g["graph_name"] for g in data["graphs"]] == ["a"]


def test_compare_command(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C], timings={"FAKE_ENGINE_C": 2.0}):
        assert _invoke(["bench", "-g", str(path), *FAST, "-o", str(a)]).exit_code == 0
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C], timings={"FAKE_ENGINE_C": 4.0}):
        assert _invoke(["bench", "-g", str(path), *FAST, "-o", str(b)]).exit_code == 0
    regressed = _invoke(["bench", "compare", str(a), str(b)])
    assert regressed.exit_code == 1 and "slower" in regressed.output
    improved = _invoke(["bench", "compare", str(b), str(a)])
    assert improved.exit_code == 0 and "faster" in improved.output


def test_compare_names_a_file_that_is_no_results_file(tmp_path: Path) -> None:
    """An override or graph file got "schema_version None is not 1; re-run dnntune bench"
    (new-user audit, session 15): the kind of file is what is wrong, not its version."""
    overrides = tmp_path / "overrides.json"
    overrides.write_text('{"version": 2, "engine_overrides": []}')
    graph = _graph_file(tmp_path)
    for path, kind in ((overrides, "engine-override file"), (graph, "graph file")):
        res = _invoke(["bench", "compare", str(path), str(path)])
        assert res.exit_code == 2, res.output
        assert "not a dnntune bench results file" in res.output and kind in res.output
        assert "schema_version" not in res.output
    old = tmp_path / "old.json"
    old.write_text('{"schema_version": 0, "graphs": []}')
    res = _invoke(["bench", "compare", str(old), str(old)])
    assert res.exit_code == 2 and "schema_version 0 is not 1" in res.output


def test_compare_fails_when_a_row_failed_or_vanished_in_b(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C], timings={"FAKE_ENGINE_C": 2.0}):
        assert _invoke(["bench", "-g", str(path), *FAST, "-o", str(a)]).exit_code == 0
    doc = json.loads(a.read_text())
    doc["graphs"][0]["results"] = []  # the engine did not run in B
    b.write_text(json.dumps(doc))
    lost = _invoke(["bench", "compare", str(a), str(b)])
    assert lost.exit_code == 1 and "missing in B" in lost.output
    bad = _invoke(["bench", "compare", str(a), str(a), "--threshold", "-5"])
    assert bad.exit_code == 2 and "--threshold must be" in bad.output


def test_an_output_that_cannot_be_written_is_refused_before_any_graph_runs(
    tmp_path: Path,
) -> None:
    path = _graph_file(tmp_path)
    blocker = tmp_path / "afile"
    blocker.write_text("")
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        under_a_file = _invoke(["bench", "-g", str(path), *FAST, "-o", str(blocker / "r.json")])
        assert under_a_file.exit_code == 2 and "not a directory" in under_a_file.output
        onto_the_graph = _invoke(["bench", "-g", str(path), *FAST, "-o", str(path)])
    assert onto_the_graph.exit_code == 2 and "one of the graphs" in onto_the_graph.output
    assert json.loads(path.read_text())["nodes"]  # the graph is untouched


def test_real_cpu_engine_pytorch_backend_and_cold_cache(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    result = _invoke(
        [
            "bench",
            "-g",
            str(path),
            *FAST,
            "--backend",
            "pytorch",
            "--validate",
            "reference",
            "--cache-mode",
            "cold",
            "--device",
            "cpu",
            "-o",
            str(out),
        ]
    )
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["graphs"][0]["results"][0]
    assert row["provider"] == "pytorch" and row["verdict"] == "passed"
    assert row["timing"]["cache_mode"] == "cold"


def test_kernel_time_uses_the_gated_device_clock_when_the_timer_has_one(tmp_path: Path) -> None:
    path = _graph_file(tmp_path)

    class GatedTimer:
        """A timer whose gated device clock reads half of its span (as when host gaps hide)."""

        kind = "gated"

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def synchronize(self) -> None:
            self.inner.synchronize()

        def time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
            return float(self.inner.time_ms(fn, repeats))

        def device_time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
            return float(self.inner.time_ms(fn, repeats)) / 2

    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        handle = dt.create_handle("cpu")
        handle.set_timer(GatedTimer(handle.timer))
        cfg = BenchConfig(graphs=(str(path),), warmup=1, iters=3)
        result = BenchRunner(cfg, handle, [path]).run()
    row = result.graphs[0]["results"][0]
    assert row["kernel"]["median_ms"] == pytest.approx(1.0)  # FAKE_ENGINE_C: 2.0 ms span
    assert row["timing"]["timer"] == "gated"


def test_binary_graph_file_is_one_error_line_and_the_run_completes(tmp_path: Path) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(binary), str(path), *FAST, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if "binary.json" in line]
    assert lines == [
        f"{binary}: error: not a UTF-8 text file (byte 0x89 at offset 0); a graph file is JSON text"
    ]
    data = json.loads(out.read_text())
    assert data["run"]["complete"] is True
    assert [g["status"] for g in data["graphs"]] == ["error", "ok"]
    assert data["graphs"][1]["results"][0]["status"] == "success"


def test_an_error_outside_dnntune_fails_one_graph_and_the_others_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RuntimeError (say, CUDA out of memory) in one graph: that graph errors, the run goes on."""
    from dnntune.bench import runner

    first, second = _graph_file(tmp_path, "a"), _graph_file(tmp_path, "b")
    out = tmp_path / "r.json"
    original = runner.graph_metrics

    def out_of_memory(graph: Any) -> Any:
        if graph.name == "a":
            raise RuntimeError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return original(graph)

    monkeypatch.setattr(runner, "graph_metrics", out_of_memory)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(first), str(second), *FAST, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert f"{first}: error: RuntimeError: CUDA out of memory" in result.output
    data = json.loads(out.read_text())
    assert data["run"]["complete"] is True
    assert [g["status"] for g in data["graphs"]] == ["error", "ok"]
    assert data["graphs"][1]["results"][0]["status"] == "success"


def _results_file(path: Path, median_ms: float, iqr_ms: float) -> Path:
    row = {
        "provider": "dnntune",
        "engine": {"id": "0x1", "name": "E"},
        "status": "success",
        "verdict": "unchecked",
        "kernel": {"median_ms": median_ms, "iqr_ms": iqr_ms, "n": 20},
    }
    SuiteResult(
        run={"complete": True, "config": {"cache_mode": "warm"}},
        environment={},
        graphs=[{"graph_id": "g1", "graph_name": "g", "status": "ok", "results": [row]}],
    ).write(path)
    return path


def test_compare_judges_a_30x_change_on_a_ratio_scale_both_ways(tmp_path: Path) -> None:
    """0.1 ms -> 3.0 ms with IQRs of half the median: a regression, and swapped an improvement.

    On the old ``A/B - 1`` scale the change could not go below -1, so this 30x slowdown was
    "within noise" (exit 0) while the same files swapped said "faster".
    """
    fast = _results_file(tmp_path / "fast.json", 0.1, 0.05)
    slow = _results_file(tmp_path / "slow.json", 3.0, 1.5)
    regressed = _invoke(["bench", "compare", str(fast), str(slow), "--json"])
    assert regressed.exit_code == 1, regressed.output
    (row,) = json.loads(regressed.output)
    assert row["verdict"] == "slower"
    assert row["speedup"] == pytest.approx(0.1 / 3.0)
    assert row["log_ratio"] == pytest.approx(math.log(30.0))
    improved = _invoke(["bench", "compare", str(slow), str(fast), "--json"])
    assert improved.exit_code == 0, improved.output
    (back,) = json.loads(improved.output)
    assert back["verdict"] == "faster"
    assert back["log_ratio"] == pytest.approx(-row["log_ratio"])
    assert back["noise_pct"] == pytest.approx(row["noise_pct"])  # the same limit either way
    table = _invoke(["bench", "compare", str(fast), str(slow)])
    assert table.exit_code == 1 and "slower" in table.output


def test_compare_noise_is_symmetric_and_on_the_same_scale(tmp_path: Path) -> None:
    """A 1.5x change is within noise when each side's IQR is its median, in either direction."""
    a = _results_file(tmp_path / "a.json", 1.0, 1.0)
    b = _results_file(tmp_path / "b.json", 1.5, 1.5)
    for first, second in ((a, b), (b, a)):
        result = _invoke(["bench", "compare", str(first), str(second), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)[0]["verdict"] == "within noise"


def test_plot_without_matplotlib_exits_2_before_benchmarking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(
            ["bench", "-g", str(path), *FAST, "-o", str(out), "--plot", str(tmp_path / "p.png")]
        )
    assert result.exit_code == 2, result.output
    assert "--plot needs matplotlib" in result.output
    assert "pip install 'dnntune[plot]'" in result.output
    assert not out.exists()  # nothing was benchmarked
    assert "dnntune bench:" not in result.output


def test_a_huge_padded_input_is_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    doc = json.loads(testing.small_matmul_graph().to_json())
    doc["name"] = "huge"
    a = doc["tensors"][0]
    a["strides"] = [a["strides"][0], 400_000_000, 1]  # A's rows 4 * 10**8 elements apart
    huge.write_text(json.dumps(doc))
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(huge), str(path), *FAST, "-o", str(out)])
        assert _invoke(["bench", "-g", str(path), *FAST, "--max-input-gb", "-1"]).exit_code == 2
    assert result.exit_code == 1, result.output
    data = json.loads(out.read_text())
    assert data["run"]["complete"] is True
    refused, ok = data["graphs"]
    assert refused["status"] == "error" and ok["status"] == "ok"
    assert "more than the limit of 8.00 GiB" in refused["message"]
    assert "--max-input-gb" in refused["message"]
    assert f"{huge}: error: inputs/reference: graph 'huge' needs" in result.output


def test_a_row_that_writes_into_its_input_fails_and_later_rows_get_the_inputs_back(
    tmp_path: Path,
) -> None:
    # issue 20: one plan writing into x made every later row of the graph wrong
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    names = [testing.FAKE_ENGINE_CLOBBERS, testing.FAKE_ENGINE_C, testing.FAKE_ENGINE_A]
    with testing.fake_engines(names=names):
        result = _invoke(
            ["bench", "-g", str(path), *FAST, "--validate", "reference", "-o", str(out)]
        )
    assert result.exit_code == 3, result.output
    rows = json.loads(out.read_text())["graphs"][0]["results"]
    verdicts = {r["engine"]["name"]: r for r in rows}
    bad = verdicts[testing.FAKE_ENGINE_CLOBBERS]
    assert bad["verdict"] == "failed"
    assert "wrote into its input" in bad["correctness"]["message"]
    names_in_order = [r["engine"]["name"] for r in rows]
    after = names_in_order[names_in_order.index(testing.FAKE_ENGINE_CLOBBERS) + 1 :]
    assert after, names_in_order  # a row ran after the culprit, on restored inputs
    for name in after:
        assert verdicts[name]["verdict"] == "passed", verdicts[name]["correctness"]


def test_engine_declining_at_build_is_not_supported_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that passes the applicability check but declines the graph when its default
    plan is built (CUDNN_ENGINE's float32 matmuls on the H200) is a not_supported row: exit 0,
    counted apart from errors, and --oracle does not report a failed tune for it."""
    from dnntune.bench import rows as bench_rows
    from dnntune.errors import NotSupportedError

    real = bench_rows.build_ootb

    def declining(ctx: Any, engine: dt.Engine) -> Any:
        if engine.name == testing.FAKE_ENGINE_A:
            raise NotSupportedError("FAKE_ENGINE_A declines float32 matmuls by default")
        return real(ctx, engine)

    monkeypatch.setattr(bench_rows, "build_ootb", declining)
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        result = _invoke(
            ["bench", "-g", str(path), *FAST, "--validate", "reference", "--oracle", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    a, c = data["graphs"][0]["results"]
    assert (a["status"], a["verdict"]) == ("not_supported", "not_supported")
    assert "declines float32 matmuls" in a["message"]
    assert a["oracle_error"] is None and a["oracle"] is None
    assert c["verdict"] == "passed"
    assert data["summary"]["not_supported"] == 1 and data["summary"]["errors"] == 0
    assert "1 not supported" in result.output
    # one progress line per graph, also when the output is not a terminal
    assert "[1/1] mm: 2 row(s), 1 not supported, 1 passed" in result.output


def test_names_with_brackets_are_printed_as_they_are(tmp_path: Path) -> None:
    """Rich took "[v2]" (a graph's name) and "[run]" (a folder of the results path) for markup
    and dropped them from compare's table and the "Results:" line (audit, session 18)."""
    path = _graph_file(tmp_path, "mm[v2]")
    folder = tmp_path / "[run]"
    folder.mkdir()
    a, b = folder / "a.json", folder / "b.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        first = _invoke(["bench", "-g", str(path), *FAST, "-o", str(a)])
        assert _invoke(["bench", "-g", str(path), *FAST, "-o", str(b)]).exit_code == 0
    assert first.exit_code == 0, first.output
    assert "[run]" in first.output  # the "Results:" line names the file as it is
    compared = _invoke(["bench", "compare", str(a), str(b)])
    assert "mm[v2]" in compared.output


def test_rows_timed_on_a_busy_cpu_are_flagged(tmp_path: Path) -> None:
    """The fake clock scripts timing threads that wait for a core 60 % of the time: every row
    carries the share and a "CPU busy" warning (the table's "*"), and an idle run none (a bench
    row's times on a busy CPU were shown as any other's: audit, session 19)."""
    path = _graph_file(tmp_path)
    for busy in (0.6, 0.0):
        out = tmp_path / f"r{busy}.json"
        with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]) as fakes:
            fakes.clock.busy_share = busy
            result = _invoke(["bench", "-g", str(path), *FAST, "-v", "-o", str(out)])
        assert result.exit_code == 0, result.output
        rows = json.loads(out.read_text())["graphs"][0]["results"]
        assert len(rows) == 2
        for row in rows:
            flagged = [w for w in row["warnings"] if w.startswith("CPU busy")]
            if busy:
                assert row["timing"]["cpu_wait_share"] == pytest.approx(0.6, abs=0.01)
                assert flagged == [
                    "CPU busy: the timing threads waited for a core 60% of the time; these "
                    "times are not to be trusted"
                ]
            else:
                assert row["timing"]["cpu_wait_share"] == 0.0 and not flagged
        assert ("CPU busy" in " ".join(result.output.split())) is bool(busy)


def test_a_failed_rows_budget_share_goes_to_the_rows_after_it(tmp_path: Path) -> None:
    """``--budget-s`` is the graph's, shared by its rows as they go: the first row's plan fails,
    so it tunes nothing and the next row's share is the whole budget (less the failed row's
    wall time), not half of it (helper-70's audit, session 20: the failed row's half went
    unused)."""
    path = _graph_file(tmp_path)
    out = tmp_path / "r.json"
    names = [testing.FAKE_ENGINE_FAILS, testing.FAKE_ENGINE_A]
    with testing.fake_engines(names=names):
        result = _invoke(
            ["bench", "-g", str(path), *FAST, "--oracle", "--budget-s", "4", "-o", str(out)]
        )
    assert result.exit_code == 1, result.output  # the failing row
    rows = {r["engine"]["name"]: r for r in json.loads(out.read_text())["graphs"][0]["results"]}
    assert rows[testing.FAKE_ENGINE_FAILS]["oracle"] is None
    budget_s = rows[testing.FAKE_ENGINE_A]["oracle"]["cost"]["time_budget_s"]
    assert 3.0 < budget_s <= 4.0  # before: 2.0 (4 s over two rows)
