"""The same plans timed through each call path, side by side (issue 21, session 16).

A tune's confirmation read a winner 5-19 % faster than cuDNN's heuristic plan on small GEMMs
(30-60 µs) that the independent re-time (``decision_quality.py``, through ``Graph.execute``)
read equal or slower. This tunes a graph as ``decision_quality.py`` does (``tune_graph``,
STANDARD), then times the winner and the heuristic plan in interleaved rounds through:

* ``raw``: ``Plan.execute(pack, workspace)`` (what the tuner called until def9313);
* ``bound``: the plan's bound call (``Plan.bind``: what the tuner, ``Graph.execute`` and the
  ``dnntune.torch`` layers call);
* ``graph``: ``Graph.execute`` (the user's path: the bound call after its pack check).

on the tuner's clock (``execute_sampler``, the default ``AutotuneConfig``), and prints the
confirmation's speedup beside the winner/heuristic ratio on each path.

    PYTHONPATH=src:benchmarks python benchmarks/call_paths.py gemm_m64_k4096_n4096 [...]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import decision_quality as dq

import dnntune as dt
from dnntune import TuneOptions, allocate_workspace, reference, tune_graph
from dnntune.autotune.confirm import execute_sampler
from dnntune.workflows.tuning import heuristic_plan


def _paths(graph: dt.Graph, handle: dt.Handle, pack: dict, ws: object) -> dict[str, Callable]:
    plan = graph._active_plan  # the plan Graph.execute runs
    assert plan is not None
    uids = list(pack)
    tensors = [pack[u] for u in uids]
    bound = plan.bind(uids)
    return {
        "raw": lambda: plan.execute(pack, ws),
        "bound": lambda: bound(tensors, ws),
        "graph": lambda: graph.execute(handle, pack, ws),
    }


def run(name: str, handle: dt.Handle, tunes: int, rounds: int) -> None:
    graphs = dq.gpu_graphs() if handle.is_cuda else dq.cpu_graphs()
    doc = next(g for k, g in graphs if name in k or name in g.name).to_dict()
    options = TuneOptions(mode=dt.TuneMode.STANDARD)
    config = options.autotune_config()
    for i in range(tunes):
        tuned = dt.Graph.from_json(doc)
        report = tune_graph(tuned, handle, options)
        heur = dt.Graph.from_json(doc).build(handle, [dt.HeuristicMode.A])
        choice = heuristic_plan(dt.Graph.from_json(doc), handle, dt.HeuristicMode.A)
        c = report.confirmation
        said = f"{c.verdict} {c.speedup:.3f}x" if c is not None and c.speedup else "-"
        print(f"{name} tune {i}: {report.winner_plan} against {choice.name}: {said}")
        pack = reference.make_inputs(heur, handle.device, seed=0)
        ws = allocate_workspace(
            max(tuned.get_workspace_size(), heur.get_workspace_size()), handle.device
        )
        fns = {f"winner_{k}": f for k, f in _paths(tuned, handle, pack, ws).items()}
        fns |= {f"heuristic_{k}": f for k, f in _paths(heur, handle, pack, ws).items()}
        samplers = {k: execute_sampler(handle, f, config) for k, f in fns.items()}
        samples: dict[str, list[float]] = {k: [] for k in samplers}
        labels = list(samplers)
        for r in range(rounds):
            for k in labels[r % len(labels) :] + labels[: r % len(labels)]:
                samples[k].append(samplers[k]())
        us = {k: 1e3 * statistics.median(v) for k, v in samples.items()}
        print("   µs:", {k: round(v, 2) for k, v in us.items()})
        print(
            "   heuristic / winner:",
            {
                p: round(us[f"heuristic_{p}"] / us[f"winner_{p}"], 3)
                for p in ("raw", "bound", "graph")
            },
        )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("graphs", nargs="+", help="decision_quality graph names (substrings)")
    p.add_argument("--tunes", type=int, default=2)
    p.add_argument("--rounds", type=int, default=120)
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    a = p.parse_args()
    import torch

    handle = dt.create_handle(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for name in a.graphs:
        run(name, handle, a.tunes, a.rounds)


if __name__ == "__main__":
    main()
