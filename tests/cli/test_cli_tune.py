"""``dnntune tune``: the override file it writes, append/overwrite, failures, Ctrl-C, reuse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import subprocess_env

import dnntune.workflows.tuning
from dnntune import testing
from dnntune.backend.engine import engine_id_hex

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")


def entries(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    return doc["engine_overrides"]


def test_two_graphs_into_a_v2_file(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "overrides.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 0, result.output

    written = entries(out)
    assert [e["op"] for e in written] == ["matmul", "pointwise"]
    assert {e["engine_name"] for e in written} == {testing.FAKE_ENGINE_C}
    matmul = written[0]
    assert {t["tensor_id"] for t in matmul["tensors"]} == {"a_tensor_uid", "b_tensor_uid"}
    assert {"tensor_id": "a_tensor_uid", "dim": [1, 8, 16], "stride": [128, 16, 1]} in matmul[
        "tensors"
    ]
    meta = matmul["autotune_metadata"]
    assert meta["strategy"] == "fixed_average"
    assert meta["iterations_run"] == 3
    assert meta["mode"] == "standard"
    assert meta["verified"] is True
    assert meta["min_time_ms"] == pytest.approx(0.2)

    out_text = result.stdout
    for column in (
        "winner",
        "runner-up",
        "margin",
        "heuristic",
        "speedup",
        "tuning",
        "break-even",
    ):
        assert column in out_text
    assert "mm_bias_relu" in out_text and "pw_mul" in out_text
    assert "5.00x" in out_text  # heuristic FAKE_ENGINE_A (1.0 ms) vs winner C (0.2 ms)
    assert "400.0%" in out_text  # runner-up A is 5x the winner's time
    assert "tuned 2 of 2 graphs" in out_text
    assert f"DNNTUNE_HEUR_CONFIG_PATH={out}" in out_text


def test_report_json_has_the_comparison(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "o.json", tmp_path / "report.json"
    result = cli(
        "tune",
        "-g",
        str(graph_dir / "a_mm_bias_relu.json"),
        "-o",
        str(out),
        "--report",
        str(report),
        *FAST,
    )
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    assert rec["ok"] is True
    assert rec["winner"]["engine_name"] == testing.FAKE_ENGINE_C
    assert rec["runner_up"]["engine_name"] == testing.FAKE_ENGINE_A
    assert rec["heuristic_plan"] == testing.FAKE_ENGINE_A
    assert rec["speedup"] == pytest.approx(5.0)
    assert rec["margin"] == pytest.approx(4.0)
    assert rec["break_even_calls"] >= 1
    assert rec["written_to"] == str(out)


def test_append_then_overwrite(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    a, b = graph_dir / "a_mm_bias_relu.json", graph_dir / "b_pw_mul.json"
    assert cli("tune", "-g", str(a), "-o", str(out), *FAST).exit_code == 0
    assert [e["op"] for e in entries(out)] == ["matmul"]

    assert cli("tune", "-g", str(b), "-o", str(out), "--append", *FAST).exit_code == 0
    assert [e["op"] for e in entries(out)] == ["matmul", "pointwise"]

    # the same problem again replaces its entry instead of adding one
    assert cli("tune", "-g", str(b), "-o", str(out), *FAST).exit_code == 0
    assert [e["op"] for e in entries(out)] == ["matmul", "pointwise"]

    assert cli("tune", "-g", str(b), "-o", str(out), "--overwrite", *FAST).exit_code == 0
    assert [e["op"] for e in entries(out)] == ["pointwise"]


def test_overwrite_with_several_graphs_keeps_them_all(cli, fakes, graph_dir, tmp_path) -> None:
    out = tmp_path / "o.json"
    assert cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *FAST).exit_code == 0
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), "--overwrite", *FAST)
    assert result.exit_code == 0, result.output
    assert [e["op"] for e in entries(out)] == ["matmul", "pointwise"]


def test_bad_graph_is_skipped_and_exit_code_is_1(
    cli, fakes, graph_dir: Path, bad_graph: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    a, b = graph_dir / "a_mm_bias_relu.json", graph_dir / "b_pw_mul.json"
    result = cli("tune", "-g", str(a), str(bad_graph), str(b), "-o", str(out), *FAST)
    assert result.exit_code == 1
    assert [e["op"] for e in entries(out)] == ["matmul", "pointwise"]
    assert "nodes[1].inputs.in_1_tensor_uid: tensor uid 777 not defined" in result.stderr
    assert "failed" in result.stdout
    assert "tuned 2 of 3 graphs" in result.stdout
    assert "Traceback" not in result.output


def test_bad_first_graph_does_not_stop_overwrite(
    cli, fakes, graph_dir: Path, bad_graph: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    assert cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *FAST).exit_code == 0
    result = cli(
        "tune",
        "-g",
        str(bad_graph),
        str(graph_dir / "a_mm_bias_relu.json"),
        "-o",
        str(out),
        "--overwrite",
        *FAST,
    )
    assert result.exit_code == 1
    assert [e["op"] for e in entries(out)] == ["matmul"]


def test_every_candidate_failing_fails_the_graph(cli, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_FAILS]):
        result = cli("tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), *FAST)
    assert result.exit_code == 1
    assert "b_pw_mul.json" in result.stderr
    assert f"  {testing.FAKE_ENGINE_FAILS}: " in result.stderr  # why the candidate failed
    assert not out.exists()


def test_wrong_answers_never_win_unless_verification_is_off(cli, graph_dir, tmp_path) -> None:
    names = [testing.FAKE_ENGINE_WRONG, testing.FAKE_ENGINE_A]
    graph = str(graph_dir / "b_pw_mul.json")
    verified, unverified = tmp_path / "v.json", tmp_path / "u.json"
    with testing.fake_engines(names=names):
        result = cli("tune", "-g", graph, "-o", str(verified), "--details", *FAST)
        assert result.exit_code == 0, result.output
        assert [e["engine_name"] for e in entries(verified)] == [testing.FAKE_ENGINE_A]
        assert cli("tune", "-g", graph, "-o", str(unverified), "--no-verify", *FAST).exit_code == 0
        assert [e["engine_name"] for e in entries(unverified)] == [testing.FAKE_ENGINE_WRONG]


def test_engine_filter_by_name_and_hex_id(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    graph = str(graph_dir / "b_pw_mul.json")
    by_name, by_id = tmp_path / "n.json", tmp_path / "i.json"
    result = cli("tune", "-g", graph, "-o", str(by_name), "--engine", "FAKE_ENGINE_B", *FAST)
    assert result.exit_code == 0, result.output
    # B is confirmed against the heuristic pick A, which --engine left out: no faster beyond
    # noise, so nothing is written (a later run keeps A), and the table says so
    assert "FAKE_ENGINE_B" in result.output and "kept" in result.output
    assert not by_name.exists()
    assert "1 not written" in result.output and "reuse it" not in result.output

    ids = f"{engine_id_hex(fakes.id(testing.FAKE_ENGINE_A))},{fakes.id(testing.FAKE_ENGINE_B)}"
    result = cli("tune", "-g", graph, "-o", str(by_id), "--engine", ids, *FAST)
    assert result.exit_code == 0, result.output
    assert [e["engine_name"] for e in entries(by_id)] == [testing.FAKE_ENGINE_A]


def test_unknown_engine_is_usage_error(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    result = cli(
        "tune", "-g", str(graph_dir), "-o", str(tmp_path / "o.json"), "--engine", "NO_SUCH_ENGINE"
    )
    assert result.exit_code == 2
    assert "unknown engine 'NO_SUCH_ENGINE'" in result.output
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("--strategy", "fastest"),
        ("--mode", "quick"),
        ("--iters", "0"),
        ("--cache-mode", "lukewarm"),
        ("--ranking-metric", "wallclock"),
        ("--ranking-metric", "throughput", "--cache-mode", "cold"),
        ("--device", "tpu"),
    ],
)
def test_bad_option_values_are_usage_errors(cli, graph_dir: Path, tmp_path: Path, args) -> None:
    result = cli("tune", "-g", str(graph_dir), "-o", str(tmp_path / "o.json"), *args)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("metric", ["device", "throughput"])
def test_ranking_metric_is_used_and_recorded(
    cli, graph_dir: Path, tmp_path: Path, metric: str
) -> None:
    out = tmp_path / "o.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]):
        result = cli(
            "tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out),
            "--ranking-metric", metric, *FAST,
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    (entry,) = entries(out)
    assert entry["engine_name"] == testing.FAKE_ENGINE_A
    assert entry["autotune_metadata"]["ranking_metric"] == metric


def test_exhaustive_mode_primes_and_says_so(cli, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names) as fakes:
        # A's search helps: its primed plan beats the unprimed default that EXHAUSTIVE also times
        fakes.timings.set(testing.FAKE_ENGINE_A, 0.25, {testing.PRIMED_KNOB: 1})
        result = cli(
            "tune",
            "-g",
            str(graph_dir / "b_pw_mul.json"),
            "-o",
            str(out),
            "--mode",
            "exhaustive",
            "--cache-mode",
            "cold",
            *FAST,
        )
    assert result.exit_code == 0, result.output
    (entry,) = entries(out)
    assert entry["engine_name"] == testing.FAKE_ENGINE_A
    meta = entry["autotune_metadata"]
    assert meta["mode"] == "exhaustive"
    assert meta["ran_exhaustive"] is True
    assert meta["cache_mode"] == "cold"


def test_run_until_stable_with_small_cap(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    result = cli(
        "tune",
        "-g",
        str(graph_dir / "b_pw_mul.json"),
        "-o",
        str(out),
        "--strategy",
        "run_until_stable",
        "--max-iters",
        "2",
        "--warmup",
        "0",
    )
    assert result.exit_code == 0, result.output
    (entry,) = entries(out)
    assert entry["autotune_metadata"]["strategy"] == "run_until_stable"
    assert entry["autotune_metadata"]["iterations_run"] <= 2


def test_ctrl_c_keeps_finished_graphs(
    cli, fakes, graph_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o.json"
    real = dnntune.workflows.tuning.tune_graph
    calls: list[str] = []

    def interrupted_second(*args: Any, **kwargs: Any) -> dnntune.workflows.tuning.GraphTuneReport:
        calls.append(kwargs.get("source", ""))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dnntune.workflows.tuning, "tune_graph", interrupted_second)
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST)
    assert result.exit_code == 130
    assert [e["op"] for e in entries(out)] == ["matmul"]
    assert "interrupted" in result.output
    assert "Traceback" not in result.output


def test_a_later_run_reuses_the_file(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "overrides.json"
    assert cli("tune", "-g", str(graph_dir), "-o", str(out), *FAST).exit_code == 0

    plain = cli("run", "-g", str(graph_dir))
    assert plain.exit_code == 0, plain.output
    assert testing.FAKE_ENGINE_A in plain.stdout
    assert "static" in plain.stdout

    reused = cli("run", "-g", str(graph_dir), env={"DNNTUNE_HEUR_CONFIG_PATH": str(out)})
    assert reused.exit_code == 0, reused.output
    assert testing.FAKE_ENGINE_C in reused.stdout
    assert testing.FAKE_ENGINE_A not in reused.stdout
    assert "config" in reused.stdout


def test_real_torch_engine(cli, graph_dir: Path, tmp_path: Path) -> None:
    """The same command on the real TORCH_ENGINE (no fakes), small graphs, fast settings."""
    pytest.importorskip("dnntune.providers.torch_eager")
    out = tmp_path / "o.json"
    result = cli(
        "tune",
        "-g",
        str(graph_dir),
        "-o",
        str(out),
        "--engine",
        "TORCH_ENGINE",
        "--device",
        "cpu",
        *FAST,
    )
    assert result.exit_code == 0, result.output
    assert [(e["op"], e["engine_name"]) for e in entries(out)] == [
        ("matmul", "TORCH_ENGINE"),
        ("pointwise", "TORCH_ENGINE"),
    ]
    assert "(same)" in result.stdout and "1.00x" in result.stdout
    assert "never" in result.stdout


def test_distributed_flag_without_torchrun_is_one_rank(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    local, dist = tmp_path / "local.json", tmp_path / "dist.json"
    assert cli("tune", "-g", str(graph_dir), "-o", str(local), *FAST).exit_code == 0
    result = cli("tune", "-g", str(graph_dir), "-o", str(dist), "--distributed", *FAST)
    assert result.exit_code == 0, result.output
    strip = [{k: v for k, v in e.items() if k != "autotune_metadata"} for e in entries(local)]
    assert [{k: v for k, v in e.items() if k != "autotune_metadata"} for e in entries(dist)] == (
        strip
    )
    assert "tuned 2 of 2 graphs" in result.stdout


def _torchrun_tune(*args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 -m dnntune tune --distributed --device cpu ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["2", "-m", "dnntune", "tune", "--distributed", "--device", "cpu"]
    cmd += ["--dist-timeout-s", "120", *FAST, *args]
    env = subprocess_env()
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, check=False)


@pytest.mark.slow
def test_torchrun_two_ranks(graph_dir: Path, bad_graph: Path, tmp_path: Path) -> None:
    """``torchrun -m dnntune tune --distributed``: two gloo ranks on CPU, rank 0 writes."""
    pytest.importorskip("dnntune.providers.torch_eager")
    out = tmp_path / "o.json"
    proc = _torchrun_tune(
        "-g", str(graph_dir), str(bad_graph), "-o", str(out), "--engine", "TORCH_ENGINE"
    )
    assert proc.returncode != 0, proc.stdout  # the bad graph fails the run (exit code 1)
    assert "nodes[1].inputs.in_1_tensor_uid" in proc.stderr
    assert [(e["op"], e["engine_name"]) for e in entries(out)] == [
        ("matmul", "TORCH_ENGINE"),
        ("pointwise", "TORCH_ENGINE"),
    ]
    assert proc.stdout.count("tuned 2 of 3 graphs") == 1  # rank 0 alone prints


@pytest.mark.slow
def test_torchrun_candidate_shards_say_the_ranks_agree(graph_dir: Path, tmp_path: Path) -> None:
    """``--shard candidates``: rank 0 says whether every rank built the same winner."""
    pytest.importorskip("dnntune.providers.torch_eager")
    out = tmp_path / "o.json"
    proc = _torchrun_tune("-g", str(graph_dir), "-o", str(out), "--shard", "candidates")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("2 ranks built the same winner for all 2 graphs") == 1
    assert len(entries(out)) == 2


def test_sweep_knobs_finds_a_faster_knob_variant(cli, graph_dir: Path, tmp_path: Path) -> None:
    """FAKE_ENGINE_A at its default knobs (1.0 ms) loses to C (0.8 ms); its variant 1 (0.7 ms)
    only takes part with --sweep-knobs, and then wins with its knob in the file."""
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    plain, swept = tmp_path / "plain.json", tmp_path / "swept.json"
    with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.8}):
        assert cli("tune", "-g", str(graph_dir), "-o", str(plain), *FAST).exit_code == 0
        result = cli("tune", "-g", str(graph_dir), "-o", str(swept), *FAST, "--sweep-knobs")
    assert result.exit_code == 0, result.output
    assert {e["engine_name"] for e in entries(plain)} == {testing.FAKE_ENGINE_C}
    winners = entries(swept)
    assert {e["engine_name"] for e in winners} == {testing.FAKE_ENGINE_A}
    for e in winners:
        knobs = {k["knob_id"]: k["value"] for k in e["autotune_metadata"]["knobs"]}
        assert knobs == {"fake.variant": 1}


def test_candidate_mode_reports_ranks_that_built_different_winners(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rank 0's closing line in --shard candidates: agreement, or an error naming the graphs
    whose ranks built different plans (exit code 1)."""
    from dnntune.cli.tune_cmd import _report_agreement

    assert _report_agreement([["A", "A"], ["B", "B"]], 2) == 0
    assert "2 ranks built the same winner for all 2 graphs" in capsys.readouterr().out
    assert _report_agreement([["A", "A"], ["B", "C"], ["D", "E"]], 2) == 1
    err = capsys.readouterr().err
    assert "ranks built different winners for 2 of 3 graphs" in err and "[1, 2]" in err


def test_an_engine_filter_never_labels_another_engine_the_heuristic_plan(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    """With the heuristic pick (A) filtered out, --details labelled B "(heuristic plan)" while
    the summary named A (new-user audit, session 15)."""
    out = tmp_path / "overrides.json"
    engines = f"{testing.FAKE_ENGINE_B},{testing.FAKE_ENGINE_C}"
    result = cli(
        "tune", "-g", str(graph_dir), "-o", str(out), "--engine", engines, "--details", *FAST
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if testing.FAKE_ENGINE_B in line]
    assert rows and not any("(heuristic plan)" in line for line in rows)
    assert "(baseline: the heuristics' pick of the engines tuned)" in result.stdout


def test_details_say_the_engine_option_left_a_candidate_out(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    """--details noted a candidate --engine left out as "Plan excluded by engineIdFilter.",
    the RFC's field name, which a command-line user never typed."""
    out = tmp_path / "overrides.json"
    result = cli(
        "tune", "-g", str(graph_dir / "b_pw_mul.json"), "-o", str(out), "--engine",
        testing.FAKE_ENGINE_A, "--details", *FAST,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if testing.FAKE_ENGINE_C in line]
    assert rows and all("left out by --engine" in line for line in rows)
    assert "engineIdFilter" not in result.output


FP8_MATMUL = {
    "name": "mm_fp8",
    "compute_data_type": "float",
    "io_data_type": "fp8_e4m3",
    "intermediate_data_type": "float",
    "tensors": [
        {
            "uid": 0,
            "name": "X",
            "dims": [4, 64],
            "strides": [64, 1],
            "data_type": "fp8_e4m3",
            "virtual": False,
        },
        {
            "uid": 1,
            "name": "W",
            "dims": [64, 32],
            "strides": [32, 1],
            "data_type": "fp8_e4m3",
            "virtual": False,
        },
        {
            "uid": 2,
            "name": "Y",
            "dims": [4, 32],
            "strides": [32, 1],
            "data_type": "fp8_e4m3",
            "virtual": False,
        },
    ],
    "nodes": [
        {
            "name": "matmul",
            "type": "MatmulAttributes",
            "compute_data_type": "float",
            "inputs": {"a_tensor_uid": 0, "b_tensor_uid": 1},
            "outputs": {"c_tensor_uid": 2},
        }
    ],
}


def test_a_graph_no_engine_runs_here_says_why(cli, tmp_path: Path) -> None:
    """An fp8 matmul on the CPU: tune said "add_engine_configs: no engine configs given; pass
    at least one", an internal call's complaint, where run named each engine's reason
    (new-user audit, session 55); add_all_engines itself now raises that reason."""
    path = tmp_path / "fp8.json"
    path.write_text(json.dumps(FP8_MATMUL))
    result = cli("tune", "-g", str(path), "-o", str(tmp_path / "o.json"), "--device", "cpu")
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "no engine configs given" not in text
    assert "no engine supports graph 'mm_fp8' on cpu: TORCH_ENGINE: tensor X" in text
    assert "TORCH_ENGINE: TORCH_ENGINE" not in text and "try CUDNN_ENGINE or TRITON_ENGINE" in text
    import dnntune as dt

    graph = dt.Graph.load(path)
    graph.build_operation_graph(dt.create_handle("cpu"))
    with pytest.raises(dt.NotSupportedError, match="no engine supports graph 'mm_fp8' on cpu"):
        graph.add_all_engines()
