"""benchmarks/conformance.py on the CPU: a tiny sweep, shards and merge, replay, a wrong engine.

The sweep and the shards go through the real entry point (``python benchmarks/conformance.py``)
and check the files it leaves under ``--out``; the wrong-engine sweep and its replay run
in-process with dnntune's fake engines registered (FAKE_ENGINE_WRONG adds 1.0 to every output),
so they show that a wrong plan is found, written to ``failures/`` and replayed as wrong.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import REPO, run_benchmark

from dnntune import testing

sys.path.insert(0, str(REPO / "benchmarks"))

import conformance


def _results(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def test_tiny_sweep_checks_every_condition(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    result = run_benchmark(
        "conformance.py",
        *("--device", "cpu", "--count", "13", "--engines", "TORCH_ENGINE"),
        *("--time-budget-s", "120", "--out", str(out)),
        out=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = _results(out)
    records = data["records"]
    assert {r["op"] for r in records} >= {"conv_fprop", "matmul", "sdpa", "pointwise"}
    conditions = {r["condition"] for r in records}
    assert conditions >= {
        "first_call",
        "after_100_launches",
        "autotune_winner",
        "after_tuning",
        "new_process",
    }
    assert {r["status"] for r in records} <= {"ok", "refused"}
    assert any(r["plan_kind"] == "variant" for r in records)
    run = data["run"]
    assert run["coverage"]["cases_defaults"] == 13
    assert run["not_applicable"].keys() == set()  # TORCH_ENGINE runs on the CPU
    assert "--count 13" in run["command"] and run["versions"]["torch"]
    matrix = (out / "matrix.md").read_text()
    assert "checked/refused/wrong" in matrix and "| conv_fprop | fp32 |" in matrix
    assert "progress" not in result.stdout and "[conformance" in result.stderr


def test_shards_merge_to_the_whole(tmp_path: Path) -> None:
    args = ("--device", "cpu", "--count", "6", "--engines", "TORCH_ENGINE", "--tune-cases", "0")
    for k in (1, 2):
        result = run_benchmark(
            "conformance.py",
            *args,
            *("--shard", f"{k}/2", "--variant-cases", "0", "--out", str(tmp_path / f"s{k}")),
            out=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    shards = [_results(tmp_path / f"s{k}") for k in (1, 2)]
    assert {r["index"] for r in shards[0]["records"]} == {0, 2, 4}
    assert {r["index"] for r in shards[1]["records"]} == {1, 3, 5}
    merged = run_benchmark(
        "conformance.py",
        "merge",
        *(str(tmp_path / f"s{k}" / "results.json") for k in (1, 2)),
        *("--out", str(tmp_path / "m")),
        out=tmp_path,
    )
    assert merged.returncode == 0, merged.stderr[-3000:]
    whole = _results(tmp_path / "m")
    assert len(whole["records"]) == sum(len(s["records"]) for s in shards)
    assert whole["run"]["coverage"]["cases_defaults"] == 6
    assert "merge of:" in whole["run"]["command"]


def test_without_separate_flags() -> None:
    argv = ["--gpus", "8", "--shard=1/2", "--out", "x", "--count", "9"]
    assert conformance._without(argv, ("--gpus", "--shard", "--out")) == ["--count", "9"]


def test_a_wrong_engine_is_found_written_and_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", "")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "wrong"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_WRONG, testing.FAKE_ENGINE_C]):
        rc = conformance.main(
            [
                *("--device", "cpu", "--count", "3", "--variant-cases", "0"),
                *("--engines", "FAKE_ENGINE_WRONG,FAKE_ENGINE_C", "--time-budget-s", "60"),
                *("--out", str(out)),
            ]
        )
        assert rc == 1
        # its own cache folder is removed when the run ends (each run left one behind)
        assert not list(temp.glob("dnntune-conformance-*"))
        records = _results(out)["records"]
        wrong = [r for r in records if r["engine"] == "FAKE_ENGINE_WRONG"]
        assert wrong and all(r["status"] == "wrong" for r in wrong if r["plan_kind"] == "default")
        assert {r["status"] for r in records if r["engine"] == "FAKE_ENGINE_C"} == {"ok"}
        assert any(r["condition"] == "autotune_candidate" for r in wrong)
        failure = Path(wrong[0]["failure_file"])
        doc = json.loads(failure.read_text())
        assert doc["engine"] == "FAKE_ENGINE_WRONG" and doc["graph"]["nodes"]
        assert failure.with_suffix(".graph.json").exists()
        assert "**" in (out / "matrix.md").read_text()  # the wrong cells are bold
        capsys.readouterr()
        assert conformance.main(["--replay", str(failure), "--device", "cpu"]) == 1
        assert "replay: still wrong" in capsys.readouterr().out
        # a `dnntune bench --validate reference -o results.json` file: its failed rows
        bench = tmp_path / "bench.json"
        graph_file = failure.with_suffix(".graph.json")
        row = {"engine": {"name": "FAKE_ENGINE_WRONG"}, "verdict": "failed", "knob_settings": []}
        passed = {"engine": {"name": "FAKE_ENGINE_C"}, "verdict": "passed", "knob_settings": []}
        entry = {"graph_path": str(graph_file), "results": [row, passed]}
        bench.write_text(json.dumps({"graphs": [entry]}))
        assert conformance.main(["--replay", str(bench), "--device", "cpu"]) == 1
        printed = capsys.readouterr().out
        assert "FAKE_ENGINE_WRONG[default] first_call: wrong" in printed
        assert "FAKE_ENGINE_C" not in printed
    # the failing graph once the engine is gone: every default plan passes
    assert conformance.main(["--replay", str(graph_file), "--device", "cpu"]) == 0
    assert "every check passes" in capsys.readouterr().out


def test_guarded_copy_keeps_a_broadcast_input() -> None:
    """A stride-0 (expanded) input gets its guarded buffer too: H200 sweep cases c00831,
    c00922 and c00961 raised 'more than one element of the written-to tensor refers to a
    single memory location' in the harness before any engine ran."""
    import torch
    from _conformance_plans import _guarded, _margins_intact

    base = torch.randn(1, 8, dtype=torch.float16)
    t = base.expand(16, 8)
    margins: list[tuple[torch.Tensor, int, int]] = []
    view = _guarded(t, margins)
    assert view.stride() == (0, 1)
    assert torch.equal(view, t)
    assert view.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert all(_margins_intact(*m) for m in margins)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int8"])
def test_a_shifted_case_puts_its_buffers_one_element_off_sixteen_bytes(dtype: str) -> None:
    """A quarter of the cases run on buffers that start one element past a 16-byte boundary
    (cuDNN GEMMs returned wrong numbers on such views, H100): same values, same layout,
    margins on both sides still checked."""
    import torch
    from _conformance_plans import _guarded, _margins_intact, shifted_case

    t = torch.arange(24).to(getattr(torch, dtype)).reshape(4, 6)[:, :5]
    margins: list[tuple[torch.Tensor, int, int]] = []
    view = _guarded(t, margins, shifted=True)
    assert torch.equal(view, t) and view.stride() == t.stride()
    assert view.data_ptr() % 16 == t.element_size()
    assert all(_margins_intact(*m) for m in margins)
    ((raw, front, back),) = margins
    raw[front - 1] = 0
    assert not _margins_intact(raw, front, back)
    assert [shifted_case(i) for i in range(8)] == [False, False, False, True] * 2


def test_phases_give_a_run_to_the_variants(tmp_path: Path) -> None:
    """--phases variants: no default-plan pass first, the whole budget for the variants (the
    H200 run covered the defaults of all 1,500 cases, then ran out of time in the variants)."""
    out = tmp_path / "variants"
    result = run_benchmark(
        "conformance.py",
        *("--device", "cpu", "--count", "4", "--engines", "TORCH_ENGINE", "--phases", "variants"),
        *("--time-budget-s", "120", "--out", str(out)),
        out=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = _results(out)
    assert {r["plan_kind"] for r in data["records"]} == {"variant"}
    run = data["run"]
    assert "cases_defaults" not in run["coverage"] and run["coverage"]["cases_variants"] >= 1
    assert run["caps"]["phases"] == ["variants"]
    assert run["caps"]["phase_end_shares"] == {"variants": 1.0}


def test_phase_shares_and_unknown_phases() -> None:
    ends = conformance.phase_ends(["variants", "tuning"])
    assert list(ends) == ["variants", "tuning"]
    assert ends["variants"] == pytest.approx(0.23 / 0.40) and ends["tuning"] == pytest.approx(1.0)
    with pytest.raises(SystemExit):
        conformance.parse(["--phases", "defaults,warmup"])


def test_the_variants_phase_can_run_one_pass_alone(tmp_path: Path) -> None:
    """--no-knob-pass gives the variants phase to the Triton solver configs (the H200 runs
    that covered the rest of the cells); leaving out both passes is a usage error."""
    assert conformance.parse(["--no-knob-pass"]).knob_pass is False
    assert conformance.parse([]).knob_pass is True
    with pytest.raises(SystemExit):
        conformance.parse(["--no-knob-pass", "--no-solver-configs"])
    out = tmp_path / "solver_only"
    result = run_benchmark(
        "conformance.py",
        *("--device", "cpu", "--count", "4", "--engines", "TORCH_ENGINE", "--phases", "variants"),
        *("--no-knob-pass", "--time-budget-s", "60", "--out", str(out)),
        out=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    coverage = _results(out)["run"]["coverage"]
    # TORCH_ENGINE has no solver configs: without the knob pass it checks no variant
    assert coverage["cases_variants"] == 0 and coverage["cases_variants_planned"] >= 1


def test_without_triton_the_knob_pass_has_the_whole_variants_phase(tmp_path: Path) -> None:
    """The solver-config pass runs only where TRITON_ENGINE does: on the CPU it had nothing to
    check yet held back 40 % of the phase, so the knob pass stopped early (session 24's CPU
    sweep: 184 of 312 cells)."""
    out = tmp_path / "knobs_only"
    result = run_benchmark(
        "conformance.py",
        *("--device", "cpu", "--count", "4", "--engines", "TORCH_ENGINE", "--phases", "variants"),
        *("--time-budget-s", "60", "--out", str(out)),
        out=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "variants (knobs)" in said and "variants (solver configs)" not in said
    coverage = _results(out)["run"]["coverage"]
    assert coverage["cases_variants"] >= 1 and coverage["cases_variants_triton_solver_configs"] == 0


def test_matrix_rounds_the_shares_it_shows_and_the_json_keeps_them(tmp_path: Path) -> None:
    """matrix.md printed ``"tuning": 0.8500000000000001`` (0.45 + 0.23 + 0.17 in floats); it
    shows 0.85, and results.json keeps the float as computed."""
    from _conformance_sweep import PHASES, phase_ends

    shares = phase_ends(list(PHASES))
    assert repr(shares["tuning"]) == "0.8500000000000001"  # what the sweep records
    doc = {
        "run": {
            "command": "python benchmarks/conformance.py",
            "caps": {"launches": 100, "phase_end_shares": {**shares, "x": 0.5844155844155844}},
            "coverage": {"cases_defaults": 0},
        },
        "records": [],
    }
    src = tmp_path / "in.json"
    src.write_text(json.dumps(doc))
    result = run_benchmark(
        "conformance.py", "merge", str(src), "--out", str(tmp_path / "m"), out=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    matrix = (tmp_path / "m" / "matrix.md").read_text()
    assert '"phase_end_shares": {"defaults": 0.45, "variants": 0.68, "tuning": 0.85, ' in matrix
    assert '"x": 0.584}' in matrix and "0.8500000000000001" not in matrix
    assert '"launches": 100,' in matrix  # integers stay integers
    kept = _results(tmp_path / "m")["run"]["caps"]["phase_end_shares"]
    assert kept["tuning"] == shares["tuning"] and kept["x"] == 0.5844155844155844


@pytest.mark.parametrize("out_type", ["INT32", "BOOLEAN"])
def test_an_unwritten_integer_or_boolean_output_is_wrong(out_type: str) -> None:
    """Integer and boolean outputs were poisoned with 0 before a check, so a plan that wrote
    nothing passed wherever the answer was 0 or False (helper-81, session 21)."""
    import torch
    from _conformance_plans import Problem

    import dnntune as dt

    g = dt.Graph(name="unwritten", io_data_type=dt.DataType.INT32)
    a = g.tensor("A", [4, 8], data_type=dt.DataType.INT32)
    b = g.tensor("B", [4, 8], data_type=dt.DataType.INT32)
    mode = dt.PointwiseMode.SUB if out_type == "INT32" else dt.PointwiseMode.CMP_GT
    g.pointwise(a, b, mode=mode).set_output(True).set_data_type(dt.DataType[out_type])
    problem = Problem.make(g.to_dict(), dt.create_handle("cpu"))
    (uid,) = problem.expected
    # the answer 0 (False) everywhere: what the old poison already held
    problem.expected = {uid: torch.zeros_like(problem.pack[uid])}
    problem.poison_outputs()
    assert problem.compare().status == "wrong"
    problem.pack[uid].copy_(problem.expected[uid])
    assert problem.compare().status == "ok"
