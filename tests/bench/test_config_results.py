"""TOML recipes, the results schema, compare, and the oracle delta rules."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
from pathlib import Path

import pytest

from dnntune.bench.compare import compare_results
from dnntune.bench.config import BenchConfig, BenchConfigError, load_toml
from dnntune.bench.oracle import oracle_delta
from dnntune.bench.plot import plot_bars
from dnntune.bench.results import SCHEMA_VERSION, SuiteResult, strict_json
from dnntune.bench.timing import PlanTiming
from dnntune.errors import InvalidValueError
from dnntune.measure.stats import summarize


def _timing(samples: list[float]) -> PlanTiming:
    s = summarize(samples)
    return PlanTiming(
        kernel=s,
        host=s,
        first_call_ms=0.0,
        warmup_iters=0,
        cache_mode="warm",
        timer="fake",
        capped=False,
    )


def test_oracle_delta_uses_medians_not_means() -> None:
    delta = oracle_delta(_timing([1, 1, 1, 10]), _timing([0.5, 0.5, 0.5, 9]))
    assert delta is not None
    assert delta["speedup"] == pytest.approx(2.0)
    assert delta["basis"] == "kernel"
    assert delta["delta_ms"] == pytest.approx(0.5)


def test_oracle_delta_of_one_plan_timed_twice_is_one() -> None:
    """Tuning kept the heuristic plan: the two timings differ by the clock's noise only."""
    delta = oracle_delta(_timing([1.0, 1.0, 1.0]), _timing([1.4, 1.5, 1.4]), same_plan=True)
    assert delta is not None
    assert delta["speedup"] == 1.0 and delta["delta_ms"] == 0.0 and delta["same_plan"]
    assert delta["tuned_median_ms"] == pytest.approx(1.4)  # as measured
    assert not oracle_delta(_timing([1.0]), _timing([0.5]))["same_plan"]  # type: ignore[index]


def test_oracle_delta_none_without_baseline_or_when_invalid() -> None:
    assert oracle_delta(None, _timing([1.0])) is None
    assert oracle_delta(_timing([1.0]), None) is None
    assert oracle_delta(_timing([1.0]), _timing([0.5]), valid=False) is None
    assert oracle_delta(_timing([0.0]), _timing([0.5])) is None


def test_toml_recipe_parses_and_resolves_paths(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    recipe = tmp_path / "bench.toml"
    recipe.write_text(
        'version = 1\ngraphs = ["g"]\nwarmup = 3\niters = 7\noracle = true\n'
        'rtol = 1\noutput = "out.json"\n'
    )
    data = load_toml(recipe)
    assert data["warmup"] == 3 and data["iters"] == 7 and data["oracle"] is True
    assert data["graphs"] == (str((tmp_path / "g").resolve()),)
    assert data["output"] == str(tmp_path / "out.json")
    assert isinstance(data["rtol"], float)
    cfg = BenchConfig(**data).merged({"iters": 9}).check()
    assert cfg.iters == 9 and cfg.warmup == 3


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("warmup = 3\n", "version = 1"),
        ("version = 2\n", "version = 1"),
        ("version = 1\nbogus = 1\n", "unknown key 'bogus'"),
        ("version = 1\nwarmup = 'x'\n", "warmup must be an integer"),
        ("version = 1\noracle = 1\n", "oracle must be true or false"),
        ("version = 1\nwarmup = true\n", "warmup must be an integer"),
        ("version = 1\nrtol = '1e-3'\n", "rtol must be a number, got '1e-3'"),
        ("version = 1\ngraphs = [1]\n", "graphs must be a list of strings (graph files"),
        ("version = 1\ngraphs = 'g'\n", "graphs must be a list of strings, got 'g'"),
        ("version = 1\nwarmup = 1\nwarmup = 2\n", "invalid TOML"),
        ("version = 1\nmin-time-ms = 1\nmin_time_ms = 2\n", "set the same option"),
        ("version = 1\n[[[", "invalid TOML"),
    ],
)
def test_toml_errors_are_usage_errors(tmp_path: Path, body: str, fragment: str) -> None:
    recipe = tmp_path / "bad.toml"
    recipe.write_text(body)
    with pytest.raises(BenchConfigError, match=re.escape(fragment)):
        load_toml(recipe)


def test_toml_keys_may_be_spelled_like_the_long_options(tmp_path: Path) -> None:
    recipe = tmp_path / "bench.toml"
    recipe.write_text(
        'version = 1\ngraph = ["g.json"]\nmin-time-ms = 2\nmax-input-gb = 1\n'
        'engine = ["TORCH_ENGINE,REFERENCE", 7]\n'
    )
    data = load_toml(recipe)
    assert data["graphs"] == (str((tmp_path / "g.json").resolve()),)
    assert data["min_time_ms"] == 2.0 and data["max_input_gb"] == 1.0
    assert data["engines"] == ("TORCH_ENGINE", "REFERENCE", "7")  # split as on the command line


def test_toml_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    recipe = tmp_path / "bench.toml"
    recipe.write_bytes(b"version = 1\ndevice = '\xff\xfe'\n")
    with pytest.raises(BenchConfigError, match="not UTF-8 text"):
        load_toml(recipe)


@pytest.mark.parametrize("name", ["rtol", "atol", "max_input_gb", "min_time_ms"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0])
def test_config_refuses_a_tolerance_or_limit_that_is_not_finite(name: str, value: float) -> None:
    flag = "--" + name.replace("_", "-")
    with pytest.raises(BenchConfigError, match=f"{flag} must be a finite number >= 0"):
        BenchConfig(**{name: value}).check()  # type: ignore[arg-type]


def test_config_range_checks() -> None:
    with pytest.raises(BenchConfigError, match="--iters"):
        BenchConfig(iters=0).check()
    with pytest.raises(BenchConfigError, match="--cache-mode"):
        BenchConfig(cache_mode="hot").check()
    with pytest.raises(BenchConfigError, match="--backend pytorch"):
        BenchConfig(oracle=True, backend="pytorch").check()
    with pytest.raises(BenchConfigError, match=r"\.json or \.csv"):
        BenchConfig(output="x.txt").check()


def _suite(rows: list[dict], oracle: bool = False, cache_mode: str = "warm") -> SuiteResult:
    return SuiteResult(
        run={"complete": True, "config": {"cache_mode": cache_mode}},
        environment={},
        graphs=[{"graph_id": "g1", "graph_name": "g", "status": "ok", "results": rows}],
        oracle=oracle,
    )


def _row(median: float, iqr: float = 0.0, verdict: str = "unchecked", **extra: object) -> dict:
    return {
        "provider": "dnntune",
        "engine": {"id": "0x1", "name": "E"},
        "status": "success" if verdict != "error" else "error",
        "verdict": verdict,
        "kernel": {"median_ms": median, "iqr_ms": iqr, "n": 3},
        **extra,
    }


def test_results_round_trip_strict_json(tmp_path: Path) -> None:
    suite = _suite([_row(1.0, extra=float("nan"))])
    out = tmp_path / "r.json"
    suite.write(out)
    data = SuiteResult.load(out)
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["graphs"][0]["results"][0]["extra"] is None  # NaN -> null
    assert "oracle" not in data["summary"]
    assert strict_json({"a": [float("inf")]}) == {"a": [None]}
    csv_path = tmp_path / "r.csv"
    suite.write(csv_path)
    assert csv_path.read_text().splitlines()[0].startswith("graph_name,graph_id")


def test_results_csv_has_a_row_for_a_graph_that_never_reached_an_engine(tmp_path: Path) -> None:
    suite = _suite([_row(1.0)])
    suite.graphs.append(
        {
            "graph_id": None,
            "graph_name": "broken",
            "status": "error",
            "message": "GraphError: bad json",
            "results": [],
        }
    )
    out = tmp_path / "r.csv"
    suite.write(out)
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["graph_name"] for r in rows] == ["broken", "g"]
    assert rows[0]["verdict"] == "error"
    assert rows[0]["message"] == "GraphError: bad json"


def test_results_write_keeps_the_file_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out = tmp_path / "r.json"
        _suite([_row(1.0)]).write(out)
        assert stat.S_IMODE(out.stat().st_mode) == 0o644  # not mkstemp's 0600
        out.chmod(0o640)
        _suite([_row(2.0)]).write(out)
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_plot_bars_use_the_confirming_oracle_medians() -> None:
    same = oracle_delta(_timing([2.0] * 5), _timing([1.9] * 5), same_plan=True)
    faster = oracle_delta(_timing([2.0] * 5), _timing([1.0] * 5))
    data = _suite(
        [
            _row(3.0, oracle_delta=same),
            _row(3.0, oracle_delta=faster),
            _row(5.0),
            {**_row(1.0), "kernel": None},  # an untimed row draws no bars
        ]
    ).to_dict()
    labels, ootb, tuned = plot_bars(data)
    assert labels == ["g\nE"] * 3
    assert ootb == [2.0, 2.0, 5.0]  # the warm baseline, not the row's first timing (3.0)
    assert tuned[:2] == [2.0, 1.0]  # a kept plan draws the baseline again
    assert math.isnan(tuned[2])


def test_results_load_rejects_other_schema(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(InvalidValueError, match="schema_version 99"):
        SuiteResult.load(p)


def test_exit_code_precedence() -> None:
    assert _suite([_row(1.0)]).exit_code() == 0
    assert _suite([_row(1.0), _row(1.0, verdict="error")]).exit_code() == 1
    assert _suite([_row(1.0, verdict="error"), _row(1.0, verdict="failed")]).exit_code() == 3


def test_oracle_summary_geomean() -> None:
    rows = [
        _row(1.0, oracle_delta={"speedup": 2.0}),
        _row(1.0, oracle_delta={"speedup": 0.5}),
        _row(1.0, oracle_delta=None),
    ]
    summary = _suite(rows, oracle=True).summary()
    assert summary["oracle"]["rows"] == 2
    assert summary["oracle"]["geomean_speedup"] == pytest.approx(1.0)
    assert summary["oracle"]["excluded"] == 1


def test_compare_noise_aware_verdicts() -> None:
    a = _suite([_row(1.0, iqr=0.01)]).to_dict()
    faster = _suite([_row(0.5, iqr=0.005)]).to_dict()
    noisy = _suite([_row(0.9, iqr=0.3)]).to_dict()
    slower = _suite([_row(2.0, iqr=0.01)]).to_dict()
    assert compare_results(a, faster)[0].verdict == "faster"
    assert compare_results(a, faster)[0].speedup == pytest.approx(2.0)
    assert compare_results(a, noisy)[0].verdict == "within noise"
    assert compare_results(a, slower)[0].verdict == "slower"
    with pytest.raises(InvalidValueError, match="cache modes"):
        compare_results(a, _suite([_row(1.0)], cache_mode="cold").to_dict())


def test_compare_counts_rows_that_failed_or_vanished_in_b_as_regressions() -> None:
    """A regression gate must not pass when an engine crashed or went missing in B (before,
    such rows were dropped and the comparison passed)."""
    a = _suite([_row(1.0), _row(2.0, engine={"id": "0x2", "name": "F"})]).to_dict()
    b = _suite([_row(1.0, verdict="error"), _row(0.0, engine={"id": "0x3", "name": "G"})])
    rows = {r.engine: r.verdict for r in compare_results(a, b.to_dict())}
    assert rows == {"E": "failed in B", "F": "missing in B"}  # G's median 0 is no timing
    b2 = _suite([_row(1.0), _row(2.0, engine={"id": "0x2", "name": "F"}),
                 _row(3.0, engine={"id": "0x4", "name": "H"})]).to_dict()  # fmt: skip
    assert {r.engine: r.verdict for r in compare_results(a, b2)}["H"] == "new in B"
    for bad in (-5.0, float("nan"), float("inf")):
        with pytest.raises(InvalidValueError, match="--threshold must be"):
            compare_results(a, b2, bad)
