"""``dnntune tune`` keeps the heuristic plan when the winner is not confirmed (issue 21)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dnntune import testing

FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")
ONE = "a_mm_bias_relu.json"


@pytest.fixture
def lucky() -> Iterator[testing.FakeEngines]:
    """C reads 0.5 ms in the tuning pass (verification, warmup, 3 samples), then runs at its
    true 2.0 ms; the heuristic pick A takes 1.0 ms. The pass ranks C first."""
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    timings = {testing.FAKE_ENGINE_C: [0.5] * 5 + [2.0] * 100_000}
    with testing.fake_engines(names=names, timings=timings) as f:
        yield f


def test_an_unconfirmed_winner_is_not_written_as_faster(
    cli, lucky, graph_dir: Path, tmp_path: Path
) -> None:
    out, report = tmp_path / "o.json", tmp_path / "report.json"
    result = cli("tune", "-g", str(graph_dir / ONE), "-o", str(out), "--report", str(report), *FAST)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(out.read_text())["engine_overrides"]
    assert entry["engine_name"] == testing.FAKE_ENGINE_A  # the heuristic plan, kept
    (rec,) = json.loads(report.read_text())
    assert rec["winner"]["engine_name"] == testing.FAKE_ENGINE_A
    assert rec["decision"] == "kept_default_slower" and rec["kept_heuristic"] is True
    assert rec["speedup"] == 1.0
    conf = rec["confirmation"]
    assert conf["winner"] == testing.FAKE_ENGINE_C and conf["default"] == testing.FAKE_ENGINE_A
    assert conf["speedup"] == pytest.approx(0.5) and conf["rounds"] >= 10
    # the written plan's times are the heuristic plan's, not the challenger's that lost
    assert rec["winner_retimed_ms"] == pytest.approx(1.0) == rec["heuristic_time_ms"]
    assert "kept (slower)" in result.stdout and "1 kept the heuristic pick" in result.stdout
    # whose speed: "ran 0.50x of its speed" read as FAKE_ENGINE_C's own, the ratio unnamed
    assert (
        "kept the heuristic plan: FAKE_ENGINE_C ran at 0.50x the heuristic plan's speed (its "
        "time / FAKE_ENGINE_C's) in" in " ".join(result.stderr.split())
    )


def test_a_confirmed_win_says_so(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "o.json", tmp_path / "report.json"
    result = cli("tune", "-g", str(graph_dir / ONE), "-o", str(out), "--report", str(report), *FAST)
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    assert rec["decision"] == "confirmed" and rec["kept_heuristic"] is False
    assert rec["speedup"] == pytest.approx(5.0)  # from the confirmation's rounds
    assert rec["heuristic_time_ms"] == pytest.approx(1.0)
    assert rec["winner_retimed_ms"] == pytest.approx(0.2)
    assert "faster" in result.stdout and "confirmed beyond noise" in result.stdout
    (entry,) = json.loads(out.read_text())["engine_overrides"]
    assert entry["engine_name"] == testing.FAKE_ENGINE_C


def test_details_show_the_confirmation(cli, lucky, graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(graph_dir / ONE), "-o", str(out), "--details", *FAST)
    assert result.exit_code == 0, result.output
    assert "(heuristic plan)" in result.stdout
    assert "kept_default_slower" in result.stdout and "interleaved" in result.stdout


def test_a_win_timed_on_a_busy_cpu_is_not_written(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    """The fake clock scripts a CPU whose timing threads wait for a core 60 % of the time:
    the confirmed-looking win is kept as unsure, the heuristic plan is written, and the
    table and the line say why (issue 21, session 17)."""
    fakes.clock.busy_share = 0.6
    out, report = tmp_path / "o.json", tmp_path / "report.json"
    result = cli("tune", "-g", str(graph_dir / ONE), "-o", str(out), "--report", str(report), *FAST)
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    assert rec["decision"] == "kept_default_unsure" and rec["kept_heuristic"] is True
    assert rec["confirmation"]["cpu_wait_share"] == pytest.approx(0.6, abs=0.01)
    assert rec["confirmation"]["speedup"] == pytest.approx(5.0)
    (entry,) = json.loads(out.read_text())["engine_overrides"]
    assert entry["engine_name"] == testing.FAKE_ENGINE_A
    assert "kept (CPU busy)" in result.stdout
    assert "the CPU was busy: the timing threads waited for a core 60% of the time" in " ".join(
        result.output.split()
    )


def test_the_time_column_comes_from_the_confirmation(cli, graph_dir: Path, tmp_path: Path) -> None:
    """C reads 0.1 ms in the sweep (lucky first samples), then runs at 0.2 ms; the heuristic
    pick A takes 1.0 ms. The table's time is the confirmed 0.2 ms, not the sweep's 0.1."""
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    timings = {testing.FAKE_ENGINE_C: [0.1] * 5 + [0.2] * 100_000}
    report = tmp_path / "report.json"
    with testing.fake_engines(names=names, timings=timings):
        result = cli(
            "tune",
            "-g",
            str(graph_dir / ONE),
            "-o",
            str(tmp_path / "o.json"),
            "--report",
            str(report),
            *FAST,
        )
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    assert rec["decision"] == "confirmed"
    assert rec["winner"]["min_time_ms"] == pytest.approx(0.1)
    assert rec["winner_retimed_ms"] == pytest.approx(0.2)
    assert "0.2000 ms" in result.stdout and "0.1000 ms" not in result.stdout


def test_a_heuristic_plan_that_always_fails_leaves_the_winner_written(
    cli, graph_dir: Path, tmp_path: Path
) -> None:
    """The heuristic pick fails in the session and again when `tune` confirms the two
    finished plans: the verified winner is written, unconfirmed (audit, session 17: it was
    reported as the heuristic plan kept, and nothing was written)."""
    names = [testing.FAKE_ENGINE_FAILS, testing.FAKE_ENGINE_C]
    out, report = tmp_path / "o.json", tmp_path / "report.json"
    with testing.fake_engines(names=names):
        result = cli(
            "tune", "-g", str(graph_dir / ONE), "-o", str(out), "--report", str(report), *FAST
        )
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    assert rec["heuristic_plan"] == testing.FAKE_ENGINE_FAILS
    assert rec["decision"] == "default_failed" and rec["kept_heuristic"] is False
    (entry,) = json.loads(out.read_text())["engine_overrides"]
    assert entry["engine_name"] == testing.FAKE_ENGINE_C


def test_a_kept_heuristic_plan_an_engine_filter_left_out_is_named_with_its_own_time(
    cli, graph_dir: Path, tmp_path: Path
) -> None:
    """--engine C, where the heuristic pick A (1.0 ms) beats C (4.0 ms): the row named C with
    A's time (audit, session 18). It names the plan kept, A, with A's time; C is the
    runner-up, and the report gives each plan its own confirmed time."""
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    out, report = tmp_path / "o.json", tmp_path / "report.json"
    with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 4.0}):
        result = cli(
            "tune", "-g", str(graph_dir / ONE), "-o", str(out), "--report", str(report),
            "--engine", testing.FAKE_ENGINE_C, *FAST,
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    (rec,) = json.loads(report.read_text())
    assert rec["decision"] == "kept_default_slower"
    assert rec["winner"]["plan"] == testing.FAKE_ENGINE_C
    assert rec["winner_retimed_ms"] == pytest.approx(4.0)
    assert rec["chosen_plan"] == testing.FAKE_ENGINE_A
    assert rec["chosen_time_ms"] == pytest.approx(1.0) == rec["heuristic_time_ms"]
    (row,) = [line for line in result.stdout.splitlines() if "kept (slower)" in line]
    cells = [c.strip() for c in row.split("│")]
    assert cells[2:6] == [testing.FAKE_ENGINE_A, "1.000 ms", "1/1", testing.FAKE_ENGINE_C]
    assert "(same)" in cells
    assert f"{testing.FAKE_ENGINE_A} 1.000 ms (heuristic" in result.output


def test_details_keep_the_knobs_of_plan_names_and_the_graph_name(
    cli, graph_dir: Path, tmp_path: Path
) -> None:
    """A's knob variant fake.variant=1 (0.7 ms) beats its default (1.0 ms): Rich took
    "[fake.variant=1]" in the caption (and "[v2]" in a graph's name, the title) for markup
    and dropped it (audit, session 18)."""
    doc = json.loads((graph_dir / ONE).read_text())
    doc["name"] = "mm[v2]"
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(doc))
    out = tmp_path / "o.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = cli("tune", "-g", str(graph), "-o", str(out), "--details", "--sweep-knobs", *FAST)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert "mm[v2]: candidates" in flat
    assert f"confirmed: {testing.FAKE_ENGINE_A}[fake.variant=1] vs default" in flat


def test_a_heuristic_win_timed_on_a_busy_cpu_says_so(cli, graph_dir: Path, tmp_path: Path) -> None:
    """The heuristic pick A is also the fastest, so there is no confirmation; the sweep ran on
    a CPU whose timing threads waited for a core 60 % of the time. Its time is the sweep's and
    not to be trusted (a 0.04 ms CPU layernorm read 40 ms beside two busy processes on 2
    cores, session 20): the table, the line and the report say so, and the idle run does not."""
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    timings = {testing.FAKE_ENGINE_B: 2.0, testing.FAKE_ENGINE_C: 3.0}
    for busy in (0.6, 0.0):
        report = tmp_path / f"report{busy}.json"
        with testing.fake_engines(names=names, timings=timings) as fakes:
            fakes.clock.busy_share = busy
            result = cli(
                "tune",
                "-g",
                str(graph_dir / ONE),
                "-o",
                str(tmp_path / f"o{busy}.json"),
                "--report",
                str(report),
                *FAST,
            )
        assert result.exit_code == 0, result.output
        (rec,) = json.loads(report.read_text())
        assert rec["decision"] == "winner_is_default"
        assert rec["timed_while_busy"] is bool(busy)
        text = " ".join(result.output.split())
        if busy:
            assert rec["cpu_wait_share"] == pytest.approx(0.6, abs=0.01)
            assert rec["cost"]["timing_cpu_wait_share"] == pytest.approx(0.6, abs=0.01)
            assert "heuristic (CPU busy)" in result.stdout
            assert "1 graph was timed while the CPU was busy" in text
            assert "waited for a core 60% of the time): not to be trusted" in text
        else:
            assert rec["cpu_wait_share"] == 0.0
            assert "CPU busy" not in text and "not to be trusted" not in text
