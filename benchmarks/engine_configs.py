"""How much of an engine's own search (EXHAUSTIVE priming) do a few fixed plans find? (issue 25:
the default tune keeps >= 95 % of EXHAUSTIVE's gain.)

For each suite graph the engine supports, in one process on the device clock:

* ``configs``: one STANDARD ``autotune`` over the engine's default plan and K fixed plans, every
  candidate's median and build time. CUDNN_ENGINE: ``cudnn.engine_config`` = 0..K-1 (the i-th
  distinct plan of cuDNN's heuristic list); TRITON_ENGINE: the first K configs of its solver's
  search space (``triton.*`` knobs), in the solver's order;
* ``search``: one EXHAUSTIVE ``autotune`` of the default plan alone (the engine's search, then
  the primed build confirmed against the unprimed default), its plan and median.

Reported per graph: the best of the first k plans (k = 1..K) and the search's plan, each over the
default plan's median; the JSON holds every candidate. Usage (on the GPU; ``--graphs`` takes
substrings of suite file names)::

    python benchmarks/engine_configs.py --out $OUT/cc [--k 6] [--graphs conv,matmul]
    python benchmarks/engine_configs.py --engine TRITON_ENGINE --k 27 --graphs pool_ --out $OUT/tc
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import dnntune as dt  # noqa: E402
from dnntune import allocate_workspace, reference  # noqa: E402
from dnntune.providers.cudnn.engine import ENGINE_CONFIG  # noqa: E402

CUDNN = "CUDNN_ENGINE"
TRITON = "TRITON_ENGINE"


def fixed_plans(engine: str, graph: dt.Graph, k: int) -> list[dict[str, Any]]:
    """The knob settings of the K fixed plans timed beside ``engine``'s default."""
    if engine == CUDNN:
        return [{ENGINE_CONFIG: i} for i in range(k)]
    from dnntune.providers.triton.engine import TritonEngine
    from dnntune.providers.triton.solvers import KNOB_PREFIX, device_limits, solver_for

    match = TritonEngine._try_match(graph)
    if match is None:
        return []
    solver, limits = solver_for(match), device_limits()
    # the space before the solver's pruning: only the configs that fit the device
    space = [c for c in solver.space(match, limits) if solver.check(c, match, limits) is None]
    return [{KNOB_PREFIX + name: v for name, v in c.items()} for c in space[:k]]


def _tune(
    path: Path, handle: dt.Handle, pack: Any, mode: dt.TuneMode, k: int, engine: str
) -> tuple[list[dict[str, Any]], float]:
    g = dt.Graph.load(path)
    g.build_operation_graph(handle)
    engine_id = dt.engine_name_or_id(engine)
    g.add_engine(engine_id)
    if k:
        g.add_engine_variants(
            [dt.EngineVariant(engine_id, knobs) for knobs in fixed_plans(engine, g, k)]
        )
    ws = g.get_estimated_max_workspace_size()
    config = dt.AutotuneConfig(mode=mode, ranking_metric="device", verify=True)
    start = time.perf_counter()
    try:
        results = g.autotune(handle, pack, allocate_workspace(ws, handle.device), ws, config)
    except dt.AutotuneError as exc:
        results = list(exc.results)
    wall = time.perf_counter() - start
    rows = [
        {
            "plan": r.plan_name or r.engine_name,
            "knobs": {s.knob_id: s.value for s in r.knob_settings},
            "ok": r.succeeded,
            "median_ms": r.median_time_ms if r.succeeded else None,
            "compile_ms": r.compile_time_ms,
            "ran_exhaustive": r.ran_exhaustive,
            "reason": r.exhaustive_not_run_reason or r.error_message,
            "rank": r.rank,
        }
        for r in results
    ]
    return rows, wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--suite", type=Path, default=REPO / "benchmarks" / "suite")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--engine", choices=(CUDNN, TRITON), default=CUDNN)
    p.add_argument("--k", type=int, default=6, help="fixed plans beside the default (default 6)")
    p.add_argument("--graphs", default="", help="comma-separated substrings of file names")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    handle = dt.create_handle("cuda")
    wanted = [s for s in a.graphs.split(",") if s]
    out: list[dict[str, Any]] = []
    for path in sorted(a.suite.glob("*.json")):
        if wanted and not any(s in path.name for s in wanted):
            continue
        g0 = dt.Graph.load(path)
        pack = reference.make_inputs(g0, handle.device, seed=0)
        row: dict[str, Any] = {"graph": path.name, "fixed": fixed_plans(a.engine, g0, a.k)}
        try:
            row["configs"], row["configs_s"] = _tune(
                path, handle, pack, dt.TuneMode.STANDARD, a.k, a.engine
            )
            row["search"], row["search_s"] = _tune(
                path, handle, pack, dt.TuneMode.EXHAUSTIVE, 0, a.engine
            )
        except Exception as exc:  # one graph's failure is its row's
            row["error"] = f"{type(exc).__name__}: {exc}"
        out.append(row)
        print(_line(row, a.k), flush=True)
    doc = {"engine": a.engine, "k": a.k, "graphs": out}
    (a.out / f"{a.engine.lower()}_configs.json").write_text(json.dumps(doc, indent=1))
    return 0


def _own(knobs: dict[str, Any]) -> str:
    """A plan's own knobs (less the global ones autotune sets), as a lookup key."""
    return json.dumps(
        {k: v for k, v in knobs.items() if not k.startswith("global.")}, sort_keys=True
    )


def _line(row: dict[str, Any], k: int) -> str:
    if "error" in row:
        return f"{row['graph']}: {row['error']}"
    by = {_own(c["knobs"]): c for c in row["configs"] if c["ok"] and c["median_ms"]}
    default = by.get(_own({}))
    if default is None:
        return f"{row['graph']}: no default plan"
    base = default["median_ms"]
    keys = [_own(knobs) for knobs in row["fixed"]]
    best = []
    for j in range(1, min(k, len(keys)) + 1):
        times = [by[key]["median_ms"] for key in keys[:j] if key in by]
        best.append(f"{base / min(times):.3f}" if times else "-")
    fastest = min(by.values(), key=lambda c: c["median_ms"])
    s = [c for c in row["search"] if c["ok"] and c["rank"] == 0]
    searched = f"{base / s[0]['median_ms']:.3f} {s[0]['plan']}" if s else "-"
    return (
        f"{row['graph'][:60]:60s} default {base * 1000:7.1f} us | best of first k: "
        f"{' '.join(best)} (fastest {fastest['plan']}) | search {searched} "
        f"({row['search_s']:.1f} s; configs {row['configs_s']:.1f} s)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
