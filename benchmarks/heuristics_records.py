"""Build the training records of the shipped HeuristicMode.B model from the repo's results.

The H200 sessions left their measurements in the benchmark harness's own formats, not in
``dnntune bench`` results files. This script turns the ones ranked on call latency (dnntune's
default ranking clock, the clock the heuristic pick is judged on) into one records file that
``dnntune heuristics train`` reads:

* ``benchmarks/run.py`` suite results (``dnntune-suite-results/1``) of 2026-11-29: quick,
  session 2 and session 3 "before": every succeeded autotune candidate's median, the plain
  engine name as its default-config time, ``ENGINE[knob=value]`` plans as tuned configs;
* the session 4 ``dnntune tune --report`` of the whole suite (winner and runner-up), read by
  ``dnntune.learning.collect`` itself;
* ``decision_quality.py --quick`` of sessions 7, 8 and 11 (the same 14 graphs each time,
  rebuilt with ``decision_quality.py``'s own builders): the independent re-time of every plan;
* ``decision_stability.json`` of session 2 (the examples): the independent medians;
* the suite of session 24 (``run.py --ranking-metric latency``, 46 graphs, the engines of
  2026-12-03): every succeeded candidate's median, as for the Nov 29 suite runs. Where it
  measured a problem, it **replaces** the Nov 29 records of that problem (the suite runs and
  the session 4 report): those timed engines that have changed since (Triton's layernorm
  16384x4096 went from 0.10-0.11 ms to 0.068 ms), and a geometric mean with them would keep
  labels that no longer hold (session 23's suite: HeuristicMode.B's cuDNN picks for four large
  norms, from the Nov 29 labels, were 0.69-0.96x of Triton's).

Left out, and why: session 3 "after" (ranked on device time, ``tune_ranking_metric=device``,
which favours torch.compile's kernels and hides its host cost); the ``bench --oracle`` JSON of
sessions 10 and 11 (``oracle_*.json``: ``dnntune bench`` times device time); session 8's GEMV
decision quality (only its markdown was kept: no per-engine medians); the CPU decision-quality
runs (another device, a busy machine).

``--device h100`` builds the H100 records instead (``h100_records.json``): the three suite
runs of session 57 (``run.py --ranking-metric latency --skip-compile --heuristic-b --modes
warm --seed 1/2/3``, one session on an NVIDIA H100 80GB HBM3, the engines of tree 108e88f),
one record per graph per run, merged by geometric mean when training, as the H200 re-times
are. No earlier H100 session left suite results ranked on call latency. Usage (from the repo
root)::

    python benchmarks/heuristics_records.py            # -> benchmarks/heuristics/h200_records.json
    python benchmarks/heuristics_records.py --device h100   # -> .../h100_records.json
    dnntune heuristics train benchmarks/heuristics/h200_records.json \\
        benchmarks/heuristics/h100_records.json -o src/dnntune/backend/learned/default_model.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from decision_quality import gpu_graphs  # noqa: E402

from dnntune.backend.learned import device_class, problem_of  # noqa: E402
from dnntune.graph import OpGraph  # noqa: E402
from dnntune.graph.json_format import graph_from_dict  # noqa: E402
from dnntune.learning import Record, collect, write_records_file  # noqa: E402

DEVICE = "NVIDIA H200"
RESULTS = REPO / "benchmarks" / "results"
SUITE = REPO / "benchmarks" / "suite"
EXAMPLES = REPO / "examples" / "graphs"
SUITE_RUNS = (
    "h200_2026-11-29_quick/results.json",
    "h200_2026-11-29_s2/suite_results.json",
    "h200_2026-11-29_s3/suite_before_results.json",
)
TUNE_REPORT = "h200_2026-11-29_s4/x2_graph_sharded_report.json"
#: ``decision_quality.py --quick`` on the H200 (the same 14 graphs each time, independent
#: re-times on call latency): sessions 7, 8 and 11
DECISION_QUALITY = (
    "h200_2026-12-01_s7/decision_quality.json",
    "h200_2026-12-01_s8/decision_quality_quick_31786d8.json",
    "h200_2026-12-02_s11/decision_quality_quick_39b0746.json",
)
#: the full decision-quality set (41 graphs) of sessions 14 and 16, added with ``--full-dq``:
#: with them the held-out top-1 of mode B fell to mode A's (62.4 %, 85 problems; session 16),
#: so the shipped model is not yet trained on them
FULL_DECISION_QUALITY = (
    "h200_2026-12-02_s14/decision_quality_full_031ff1d.json",
    "h200_2026-12-02_s16/decision_quality_full_f5db952.json",
)
DECISION_STABILITY = "h200_2026-11-29_s2/decision_stability.json"
#: suite runs on the current engines, ranked on call latency, oldest first: they replace the
#: Nov 29 records (``SUITE_RUNS`` and ``TUNE_REPORT``) of every problem they measured, and a
#: later one replaces an earlier one's records of the problems it measured again (session 25:
#: the three pooling graphs after Triton's global-pool default config changed)
CURRENT_SUITE_RUNS = (
    "h200_2026-12-03_s24/suite_latency/results.json",
    "h200_2026-12-03_s25/pool_latency/results.json",
)
SUPERSEDED = (*SUITE_RUNS, TUNE_REPORT)
H100_DEVICE = "NVIDIA H100 80GB HBM3"
#: session 57's three suite runs on the H100 (seeds 1, 2, 3; one session, one machine): each
#: graph's records are three independent measurements of it, merged by geometric mean
H100_SUITE_RUNS = tuple(f"h100_2026-12-07_s57/relabel/lat{k}/results.json" for k in (1, 2, 3))
_PLAN = re.compile(r"^(?P<engine>[A-Z0-9_]+)(?:\[(?P<knobs>.*)\])?$")


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_plan(label: str) -> tuple[str, dict[str, Any]] | None:
    """``"TORCH_ENGINE[torch.intermediate_type=io]"`` -> (engine, knobs); None if not a plan."""
    m = _PLAN.match(label.strip())
    if m is None:
        return None
    knobs = {}
    for part in filter(None, (m.group("knobs") or "").split(",")):
        key, _, value = part.partition("=")
        knobs[key.strip()] = _value(value.strip())
    return m.group("engine"), knobs


def _record(
    graph: OpGraph, medians: dict[str, float], source: str, device: str = DEVICE
) -> Record | None:
    times: dict[str, float] = {}
    configs: dict[str, dict[str, Any]] = {}
    for label, ms in medians.items():
        plan = parse_plan(label)
        if plan is None or not isinstance(ms, int | float) or ms <= 0:
            continue
        engine, knobs = plan
        if not knobs:
            times[engine] = min(ms, times.get(engine, ms))
        elif engine not in configs or ms < configs[engine]["time_ms"]:
            configs[engine] = {"knobs": knobs, "time_ms": ms}
    configs = {e: c for e, c in configs.items() if e in times}
    if not times:
        return None
    return Record(problem_of(graph), device_class(device), times, configs, False, source)


def _load(path: Path) -> OpGraph:
    return graph_from_dict(json.loads(path.read_text()), OpGraph)


def suite_records(rel: str, device: str = DEVICE) -> list[Record]:
    """One record per graph of a ``run.py`` suite results file measured on ``device``."""
    doc = json.loads((RESULTS / rel).read_text())
    assert doc.get("schema") == "dnntune-suite-results/1", rel
    assert doc["environment"].get("device_name") == device, rel
    out = []
    for i, g in enumerate(doc["graphs"]):
        cands = ((g.get("variants") or {}).get("tuned") or {}).get("candidates") or []
        medians = {
            (c.get("plan") or c["engine"]): c["median_time_ms"]
            for c in cands
            if c.get("succeeded") and c.get("median_time_ms")
        }
        source = f"benchmarks/results/{rel}#graphs[{i}]"
        r = _record(_load(SUITE / g["file"]), medians, source, device)
        if r is not None:
            out.append(r)
    return out


def dq_records(rel: str) -> list[Record]:
    doc = json.loads((RESULTS / rel).read_text())
    assert doc["args"]["gpu"] == DEVICE, rel
    graphs = dict(gpu_graphs())
    out = []
    for i, g in enumerate(doc["graphs"]):
        graph = graphs[g["graph"]]
        graph.validate()
        r = _record(graph, g["independent_median_ms"], f"benchmarks/results/{rel}#graphs[{i}]")
        if r is not None:
            out.append(r)
    return out


def stability_records() -> list[Record]:
    doc = json.loads((RESULTS / DECISION_STABILITY).read_text())
    assert doc["device"] == DEVICE
    out = []
    for i, g in enumerate(doc["graphs"]):
        graph = _load(EXAMPLES / f"{g['graph']}.json")
        source = f"benchmarks/results/{DECISION_STABILITY}#graphs[{i}]"
        r = _record(graph, g["independent_median_ms"], source)
        if r is not None:
            out.append(r)
    return out


def _measured(r: Record) -> tuple[Any, str]:
    """What a record measured: its problem on its device class."""
    return (r.problem.key(), r.device_class)


def supersede(records: list[Record], current: list[Record]) -> tuple[list[Record], list[str]]:
    """``records`` less the Nov 29 records (``SUPERSEDED``) of problems that ``current``
    measured, and the sources of those dropped."""
    keys = set(map(_measured, current))
    old = tuple(f"benchmarks/results/{rel}" for rel in SUPERSEDED)
    kept, dropped = [], []
    for r in records:
        if r.source.startswith(old) and _measured(r) in keys:
            dropped.append(r.source)
        else:
            kept.append(r)
    return kept, dropped


def newer(earlier: list[Record], later: list[Record]) -> list[Record]:
    """``earlier`` less its records of the problems ``later`` measured, then ``later``: a later
    run on the current engines replaces an earlier one where they overlap."""
    keys = set(map(_measured, later))
    return [r for r in earlier if _measured(r) not in keys] + later


def h100_main(out: Path) -> int:
    """Write the H100 records (``H100_SUITE_RUNS``) to ``out``."""
    records: list[Record] = []
    counts: dict[str, int] = {}
    for rel in H100_SUITE_RUNS:
        counts[rel] = len(got := suite_records(rel, H100_DEVICE))
        records += got
    write_records_file(
        records,
        out,
        device=H100_DEVICE,
        built_by="benchmarks/heuristics_records.py --device h100",
        sources=counts,
        left_out={
            "h100_2026-12-07_s57/relabel/lat*/overrides.json": "the same runs' winners only",
        },
    )
    for rel, n in counts.items():
        print(f"{n:4d} records  {rel}")
    print(f"{len(records)} records -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "--device",
        choices=("h200", "h100"),
        default="h200",
        help="whose records to build (default h200; h100: session 57's three suite runs)",
    )
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        help="records file (default benchmarks/heuristics/<device>_records.json)",
    )
    p.add_argument(
        "--full-dq",
        action="store_true",
        help="also the full decision-quality sets of sessions 14 and 16 (41 graphs each; H200)",
    )
    a = p.parse_args(argv)
    out = a.out or REPO / f"benchmarks/heuristics/{a.device}_records.json"
    if a.device == "h100":
        if a.full_dq:
            p.error("--full-dq is an H200 set; it does not apply to --device h100")
        return h100_main(out)
    records: list[Record] = []
    counts: dict[str, int] = {}
    for rel in SUITE_RUNS:
        got = suite_records(rel)
        counts[rel] = len(got)
        records += got
    report = collect([RESULTS / TUNE_REPORT], [SUITE], device_name=DEVICE)
    for r in report.records:  # sources relative to the repo, as the others
        r.source = r.source.replace(str(REPO) + "/", "")
    counts[TUNE_REPORT] = len(report.records)
    records += report.records
    for rel in DECISION_QUALITY + (FULL_DECISION_QUALITY if a.full_dq else ()):
        counts[rel] = len(got := dq_records(rel))
        records += got
    counts[DECISION_STABILITY] = len(got := stability_records())
    records += got
    current: list[Record] = []
    for rel in CURRENT_SUITE_RUNS:
        counts[rel] = len(got := suite_records(rel))
        current = newer(current, got)
    records, replaced = supersede(records, current)
    records += current
    write_records_file(
        records,
        out,
        device=DEVICE,
        built_by="benchmarks/heuristics_records.py",
        sources=counts,
        left_out={
            "h200_2026-11-29_s3/suite_after_results.json": "ranked on device time",
            "h200_2026-12-0*_s1*/oracle_*.json": "dnntune bench --oracle: device time",
            "h200_2026-12-01_s8/decision_quality_gemv_ad29e36.md": "markdown only, no medians",
            "cpu_2026-12-01_s6/*": "CPU runs on a loaded machine",
            f"{len(replaced)} Nov 29 records (h200_2026-11-29_*)": "their problems measured "
            "again on the current engines (CURRENT_SUITE_RUNS), which replace them",
        },
    )
    for rel, n in counts.items():
        print(f"{n:4d} records  {rel}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"{len(records)} records -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
