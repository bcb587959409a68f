"""``benchmarks/conformance.py --replay FILE``: re-run failing cases from the files a sweep (or
``dnntune bench``) wrote, each plan's first call and 100 launches, after the same priming and
tuning that ran before it in the original process."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from _conformance_report import log

__all__ = ["replay_items", "replay_one", "run_replay"]


def replay_items(path: Path) -> list[dict[str, Any]]:
    """What ``--replay FILE`` re-runs: a failures/*.json of this script (one plan), a plain
    graph JSON (every engine's default plan), or a ``dnntune bench -o results.json`` file (each
    failed row, and each oracle plan that failed the reference, with its knobs)."""
    doc = json.loads(path.read_text())
    if "graph" in doc:
        return [doc]
    if "graphs" not in doc:
        return [{"graph": doc, "engine": None, "knobs": {}, "condition": "first_call"}]
    items = []
    for entry in doc["graphs"]:
        graph_path = Path(entry.get("graph_path") or "")
        if not graph_path.exists():
            graph_path = path.parent / graph_path
        for row in entry.get("results", []):
            engine = row["engine"]["name"]
            tuned = row.get("oracle") or {}
            wrong_tuned = (tuned.get("correctness") or {}).get("match") is False
            for knobs, failed in (
                (row.get("knob_settings", []), row.get("verdict") == "failed"),
                (tuned.get("knob_settings", []), wrong_tuned),
            ):
                if failed and graph_path.is_file():
                    items.append(
                        {
                            "graph": json.loads(graph_path.read_text()),
                            "engine": engine,
                            "knobs": {k["knob_id"]: k["value"] for k in knobs},
                            "condition": "first_call",
                            "source": f"{graph_path} ({engine} row of {path})",
                        }
                    )
    return items


def run_replay(args: argparse.Namespace) -> int:
    """Re-run failing cases: each plan's first call and 100 launches, after (for the tuned
    conditions) the same priming and tuning that ran before it in the original process."""
    import dnntune as dt

    items = replay_items(Path(args.replay))
    if not items:
        print(f"replay: nothing failed in {args.replay}")
        return 0
    handle = dt.create_handle(args.device)
    wrong = sum(replay_one(item, handle, args.seed) for item in items)
    print("replay: still wrong" if wrong else "replay: every check passes")
    return 1 if wrong else 0


def _redo_history(history: dict[str, Any], handle: Any, seed: int) -> None:
    """The priming and tuning that ran in the original process before the failing check."""
    from _conformance_plans import BENCHMARKING, PlanSpec, Problem, build, shifted_case

    import dnntune as dt
    from dnntune import TuneOptions, tune_graph
    from dnntune.testing.conformance import generate_case

    case_seed, size = history.get("seed", 0), history.get("size", "small")
    for index in history.get("primed", []):
        other = Problem.make(
            generate_case(case_seed, index, size).doc(),
            handle,
            seed=seed,
            shifted=shifted_case(index),
        )
        for engine in ("CUDNN_ENGINE", "TRITON_ENGINE", "TORCH_ENGINE"):
            build(other, PlanSpec(engine, {BENCHMARKING: 1}))
        log(f"replay: primed case {index}")
    override = Path(os.environ["DNNTUNE_CACHE_DIR"]) / "conformance_overrides.json"
    for index in history.get("tuned", []):
        g = dt.Graph.from_json(generate_case(case_seed, index, size).doc())
        options = TuneOptions(mode=dt.TuneMode.EXHAUSTIVE, sweep_knobs=True, max_iterations=20)
        tune_graph(g, handle, options, output=override)
        log(f"replay: tuned case {index}")
    if override.exists():
        os.environ["DNNTUNE_HEUR_CONFIG_PATH"] = str(override)


def replay_one(doc: dict[str, Any], handle: Any, seed: int) -> int:
    """Replay one item of :func:`replay_items`; how many checks were wrong."""
    from _conformance_plans import (
        ENGINES,
        Outcome,
        PlanSpec,
        Problem,
        build,
        build_heuristic,
        check_after_launches,
        check_first_call,
        plan_specs,
        shifted_case,
        unavailable,
    )

    print(f"replay: {doc.get('source') or doc.get('case', {}).get('name', 'graph')}")
    index = doc.get("case", {}).get("index")
    shifted = isinstance(index, int) and shifted_case(index)
    problem = Problem.make(doc["graph"], handle, seed=seed, shifted=shifted)
    if doc.get("condition") in ("after_tuning", "new_process", "autotune_winner"):
        _redo_history(doc.get("history", {}), handle, seed)
    engine = doc.get("engine")
    if engine and engine not in ("HEURISTIC_A", "AUTOTUNE_WINNER", "REFERENCE"):
        specs = [PlanSpec(engine, doc.get("knobs", {}))]
    else:
        here = [e for e in ENGINES if e not in unavailable(list(ENGINES), handle.device.type)]
        specs = [s for e in here for s in plan_specs(problem.graph, e, variants=False)]
    wrong = 0
    for spec in specs:
        built = build(problem, spec)
        if isinstance(built, Outcome):
            print(f"  {spec.label()}: {built.status}: {built.reason}")
            wrong += built.status in ("wrong", "error")
            continue
        for name, check in (
            ("first_call", check_first_call),
            ("after_100_launches", check_after_launches),
        ):
            outcome = check(problem, built)
            print(f"  {spec.label()} {name}: {outcome.status} {outcome.reason}")
            wrong += outcome.status in ("wrong", "error")
    heuristic = build_heuristic(problem)
    if not isinstance(heuristic, Outcome):
        outcome = check_first_call(problem, heuristic)
        print(f"  heuristic A ({heuristic.name}) first_call: {outcome.status} {outcome.reason}")
        wrong += outcome.status in ("wrong", "error")
    return wrong
