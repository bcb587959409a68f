"""A tune report teaches what the tuner decided, not what its sweep's medians said.

``dnntune tune`` confirms the sweep's winner against the heuristic plan in interleaved rounds
and keeps the heuristic plan unless the winner is faster beyond noise; the override file then
holds the heuristic plan. ``heuristics train`` learned from the sweep's medians, where a lucky
challenger looked faster: the learned ranking contradicted the override file the same tune
wrote (found by an audit). The reports here come from the real ``dnntune tune`` on fake
engines and the fake clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from learning_helpers import F, matmul
from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app
from dnntune.learning import collect, merge
from dnntune.learning.records import TIE_STEP

A, B, C = testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C
FAST = ("--strategy", "fixed_average", "--iters", "3", "--warmup", "1")
#: a CPU's name: the fake engines run on the CPU, and a GPU's name would be refused
DEVICE = "Test CPU"


def _tune(
    tmp_path: Path,
    timings: Mapping[str, Any],
    names: Sequence[str] = (A, B, C),
    extra: Sequence[str] = (),
    busy: float | None = None,
) -> tuple[Path, Path, dict[str, Any]]:
    """Tune one small matmul; (report, override file, the report's entry)."""
    graphs = tmp_path / "graphs"
    graphs.mkdir(exist_ok=True)
    matmul(8, 16, 8, F).save(graphs / "mm.json")
    report, out = tmp_path / "report.json", tmp_path / "overrides.json"
    args = ["tune", "-g", str(graphs / "mm.json"), "-o", str(out), "--report", str(report)]
    with testing.fake_engines(names=list(names), timings=dict(timings)) as fakes:
        if busy is not None:
            fakes.clock.busy_share = busy
        res = CliRunner().invoke(app, [*args, *extra, *FAST])
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(report.read_text())
    return report, out, entry


def _times(report: Path) -> dict[str, float]:
    found = collect([report], [report.parent / "graphs"], device_name=DEVICE)
    assert not found.notes, found.notes
    (record,) = found.records
    return record.times_ms


def test_a_challenger_the_confirmation_found_slower_is_learned_slower(tmp_path: Path) -> None:
    """C reads 0.5 ms in the sweep, then runs at 2.0 ms; the heuristic pick A takes 1.0 ms.
    The report's runner-up C has the faster median (0.5 against A's 1.0): learned as 2x
    faster than the plan tuning kept and wrote."""
    report, out, entry = _tune(tmp_path, {C: [0.5] * 5 + [2.0] * 100_000})
    assert entry["decision"] == "kept_default_slower"
    assert entry["runner_up"]["engine_name"] == C and entry["runner_up"]["median_time_ms"] == 0.5
    (written,) = json.loads(out.read_text())["engine_overrides"]
    assert written["engine_name"] == A
    assert _times(report) == pytest.approx({A: 1.0, C: 2.0})  # the confirmation's rounds


def test_a_tie_is_learned_as_the_kept_plan_first_by_nothing_measurable(tmp_path: Path) -> None:
    """C reads 0.5 ms in the sweep, then runs at A's 1.0 ms: the confirmation proves a tie and
    keeps A. Learned: A first, C a tie (TIE_STEP behind), not C 2x faster."""
    report, _, entry = _tune(tmp_path, {C: [0.5] * 5 + [1.0] * 100_000})
    assert entry["decision"] == "kept_default_tie"
    times = _times(report)
    assert times == pytest.approx({A: 1.0, C: 1.0 + TIE_STEP}, rel=1e-9)
    (merged,) = merge(collect([report], [tmp_path / "graphs"], device_name=DEVICE).records)
    assert merged.best == A


def test_a_kept_plan_an_engine_filter_left_out_joins_the_record(tmp_path: Path) -> None:
    """--engine C B: the heuristic pick A (1.0 ms) is no candidate, C (1.0 ms) ties with it
    in `tune`'s own confirmation, and nothing is written. The record had C first and no A;
    now A is first, C tied with it, and B keeps its sweep ratio to C."""
    report, out, entry = _tune(tmp_path, {C: 1.0, B: 1.5}, extra=("--engine", C, "--engine", B))
    assert entry["decision"] == "kept_default_tie" and entry["winner"]["engine_name"] == C
    assert not out.exists()
    times = _times(report)
    assert times == pytest.approx({A: 1.0, C: 1.0 + TIE_STEP, B: 1.5}, rel=1e-9)


def test_a_kept_plan_found_faster_outside_the_candidates(tmp_path: Path) -> None:
    """--engine C, where A (1.0 ms) beats C (4.0 ms): the record held C alone (a problem with
    one engine teaches nothing); now it says A is 4x faster, as the confirmation found."""
    report, _, entry = _tune(tmp_path, {C: 4.0}, names=(A, C), extra=("--engine", C))
    assert entry["decision"] == "kept_default_slower" and entry["runner_up"] is None
    assert _times(report) == pytest.approx({A: 1.0, C: 4.0})


def test_a_confirmed_winner_adds_the_heuristic_plan_it_beat(tmp_path: Path) -> None:
    report, out, entry = _tune(tmp_path, {C: 0.2})
    assert entry["decision"] == "confirmed"
    assert json.loads(out.read_text())["engine_overrides"][0]["engine_name"] == C
    assert _times(report) == pytest.approx({C: 0.2, A: 1.0})


def test_timings_the_tuner_did_not_trust_are_not_learned(tmp_path: Path) -> None:
    """The fake clock scripts a CPU whose timing threads wait for a core 60 % of the time:
    tuning keeps A as unsure. The report's medians (C 0.2 ms, A 1.0) were learned as C 5x
    faster; the entry is skipped with a note."""
    report, _, entry = _tune(tmp_path, {C: 0.2}, busy=0.6)
    assert entry["decision"] == "kept_default_unsure"
    found = collect([report], [tmp_path / "graphs"], device_name=DEVICE)
    assert not found.records
    (note,) = found.notes
    assert note.startswith(f"{report}: [0]: timed while the CPU was busy") and "60%" in note


def _entry(winner: tuple[str, float], runner_up: tuple[str, float], **extra: Any) -> dict:
    def plan(name: str, ms: float) -> dict[str, Any]:
        return {"engine_name": name, "plan": name, "median_time_ms": ms, "knobs": {}}

    return {
        "graph": "mm",
        "source": "mm.json",
        "graph_key": "k",
        "device": "cuda:0",
        "ok": True,
        "winner": plan(*winner),
        "runner_up": plan(*runner_up),
        **extra,
    }


def test_a_winner_ranked_first_though_its_median_is_slower_stays_first(tmp_path: Path) -> None:
    """A report from before the confirmation (the shipped model's session-4 report has two
    such entries): tuning ranked CUDNN first (on re-measured times, not the first pass's
    medians) though its median was 0.2 % slower. The medians made TORCH the label; now it is
    a tie, CUDNN first."""
    (tmp_path / "graphs").mkdir()
    matmul(8, 16, 8).save(tmp_path / "graphs" / "mm.json")
    report = tmp_path / "report.json"
    entries = [_entry(("CUDNN_ENGINE", 0.1066), ("TORCH_ENGINE", 0.1064), margin=-0.0018)]
    report.write_text(json.dumps(entries))
    found = collect([report], [tmp_path / "graphs"], device_name="NVIDIA H200")
    (record,) = found.records
    assert record.times_ms == pytest.approx(
        {"CUDNN_ENGINE": 0.1066, "TORCH_ENGINE": 0.1066 * (1 + TIE_STEP)}, rel=1e-9
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"cost": {"timing_cpu_wait_share": 0.5}}, "waited for a core 50% of the sweep"),
        ({"timed_while_busy": True}, "taken on a busy CPU"),
    ],
)
def test_a_sweep_timed_on_a_busy_cpu_is_not_learned(
    tmp_path: Path, extra: dict[str, Any], says: str
) -> None:
    """No confirmation (the winner is the heuristic plan), but the sweep's own timing
    threads waited for a core half the time: the report marks its times untrusted."""
    (tmp_path / "graphs").mkdir()
    matmul(8, 16, 8).save(tmp_path / "graphs" / "mm.json")
    report = tmp_path / "report.json"
    report.write_text(json.dumps([_entry(("CUDNN_ENGINE", 0.05), ("TORCH_ENGINE", 0.08), **extra)]))
    found = collect([report], [tmp_path / "graphs"], device_name="NVIDIA H200")
    assert not found.records
    (note,) = found.notes
    assert note.startswith(f"{report}: [0]: timed while the CPU was busy") and says in note


def test_a_kept_plan_the_report_gives_no_time_is_skipped(tmp_path: Path) -> None:
    """kept_heuristic, but the confirmation has no paired times (its challenger broke at
    once) and the heuristic plan is not among the report's plans: nothing says where it
    stands, and the sweep's order would contradict the decision."""
    (tmp_path / "graphs").mkdir()
    matmul(8, 16, 8).save(tmp_path / "graphs" / "mm.json")
    report = tmp_path / "report.json"
    conf: dict[str, Any] = {"verdict": "kept_default_unsure", "kept_default": True}
    conf |= {"winner": "CUDNN_ENGINE", "default": "TRITON_ENGINE"}
    conf |= {"speedup": None, "winner_ms": 0.0, "default_ms": 0.0}
    entries = [
        _entry(
            ("CUDNN_ENGINE", 0.05),
            ("TORCH_ENGINE", 0.08),
            kept_heuristic=True,
            decision="kept_default_unsure",
            confirmation=conf,
        )
    ]
    report.write_text(json.dumps(entries))
    found = collect([report], [tmp_path / "graphs"], device_name="NVIDIA H200")
    assert not found.records
    assert any("kept the heuristic plan TRITON_ENGINE" in n for n in found.notes)


def test_train_learns_the_plan_the_override_file_holds(tmp_path: Path) -> None:
    """Through `dnntune heuristics train`: the model's point for the tuned problem ranks
    first the engine the same tune wrote to the override file."""
    report, out, _ = _tune(tmp_path, {C: [0.5] * 5 + [2.0] * 100_000})
    (written,) = json.loads(out.read_text())["engine_overrides"]
    model = tmp_path / "model.json"
    args = ["heuristics", "train", str(report), "--graphs", str(tmp_path / "graphs")]
    res = CliRunner().invoke(app, [*args, "--device-name", DEVICE, "-o", str(model)])
    assert res.exit_code == 0, res.output
    (group,) = json.loads(model.read_text())["groups"]
    (point,) = group["points"]
    assert min(point["ratios"], key=point["ratios"].get) == written["engine_name"] == A
    assert point["ratios"] == pytest.approx({A: 1.0, C: 2.0})
