"""Conformance sweep: every plan dnntune can run, on generated graphs, against the reference.

Graphs come from ``dnntune.testing.conformance`` (deterministic from ``--seed`` and the case
index: every op kind, fp32/fp16/bf16, every layout, shape classes tiny / tail / wide_row /
many_rows / large). For each graph and engine a plan must either refuse (``InvalidValueError``
or ``NotSupportedError``) or match ``dnntune.reference`` within the dtype's tolerance, under
each condition (phases run in this order, each until its share of ``--time-budget-s``):

1. ``first_call`` and ``after_100_launches`` of every engine's default plan and the heuristic
   (``HeuristicMode.A``) plan, for every case;
2. the same for every plan the tuner can offer (suggested variants, the ``--oracle`` knob
   product, ``--sweep-knobs``, ``global.benchmarking=1``, cuDNN engine configs 0..N-1, every
   Triton solver config with all knobs pinned) on the first ``--variant-cases`` cases of each
   (op, dtype, shape class) cell; the priming plans write the find and perf databases;
3. ``autotune_winner``: ``dnntune.workflows.tune_graph`` (EXHAUSTIVE, sweep knobs, override file)
   on the first ``--tune-cases`` cases of each (op, dtype) pair; then ``after_tuning``: every
   default and heuristic plan of phase 1 rebuilt and re-checked in this process;
4. ``new_process``: the same re-check in a fresh process that reads the same
   ``DNNTUNE_CACHE_DIR`` (and override file).

Usage (H200; one 10-minute call on 8 GPUs)::

    python benchmarks/conformance.py --device cuda --size full --count 1500 --gpus 8 \
        --time-budget-s 480 --out benchmarks/results/conformance
    python benchmarks/conformance.py --replay OUT/failures/<file>.json   # one failing case
    python benchmarks/conformance.py merge OUT1/results.json OUT2/results.json --out OUT

Writes ``OUT/results.json`` (every check), ``OUT/matrix.md`` (per cell checked/refused/wrong,
machine, versions, exact command) and ``OUT/failures/*.json`` (graph JSON + engine + knobs +
condition + what ran before it: replayable). Progress goes to stderr. Exit code 1 when any plan
is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _src_path import use_checkout_src

    use_checkout_src(__file__)  # PYTHONPATH's dnntune, where it gives one, wins

from _conformance_report import log
from _conformance_sweep import PHASES, SCRIPT, Sweep, phase_ends

__all__ = ["PHASES", "SCRIPT", "Sweep", "main", "phase_ends"]


def shard_cases(args: argparse.Namespace) -> list[Any]:
    from dnntune.testing.conformance import generate_case

    k, n = (int(v) for v in args.shard.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--shard {args.shard}: expected k/n with 1 <= k <= n")
    return [generate_case(args.seed, i, args.size) for i in range(args.count) if i % n == k - 1]


def run_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    from _conformance_report import counts, write

    sweep = Sweep(args)
    if args.recheck_cases:
        from dnntune.testing.conformance import generate_case

        indices = json.loads(Path(args.recheck_cases).read_text())
        cases = [generate_case(args.seed, i, args.size) for i in indices]
        sweep.compile_cases = {c.index for c in sweep.subset(cases, 1, lambda c: (c.op, c.dtype))}
        sweep.recheck(cases, "new_process", "all")
        result = sweep.result(argv, len(cases))
        write(result, sweep.out)
        return 0
    cases = shard_cases(args)
    sweep.compile_cases = {c.index for c in sweep.subset(cases, 1, lambda c: (c.op, c.dtype))}
    sweep.compile_variant_cases = {c.index for c in sweep.subset(cases, 1, lambda c: c.op)}
    log(
        f"{len(cases)} cases (shard {args.shard}), engines {sweep.engines}, cache "
        f"{os.environ.get('DNNTUNE_CACHE_DIR')}"
    )
    phases = args.phases
    done = sweep.phase_defaults(cases) if "defaults" in phases else cases
    if "variants" in phases:
        sweep.phase_variants(done)
    rechecked = []
    if "tuning" in phases:
        sweep.phase_tuning(done)
        rechecked = sweep.recheck(done, "after_tuning", "tuning")
    if "new_process" in phases:
        sweep.phase_new_process(rechecked or done)
    result = sweep.result(argv, len(cases))
    write(result, sweep.out)
    total = counts(result["records"])
    log(f"done: {total} -> {sweep.out / 'matrix.md'}")
    return 1 if total["wrong"] else 0


# ---- several GPUs, merge ---------------------------------------------------------------------
def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` less each of ``flags`` and its value (``--flag v`` or ``--flag=v``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in flags)):
            out.append(arg)
    return out


def run_gpus(args: argparse.Namespace, argv: list[str]) -> int:
    from _conformance_report import counts, merge, write

    procs = []
    outs = []
    for i in range(args.gpus):
        out = Path(args.out) / f"shard{i + 1}"
        outs.append(out / "results.json")
        # --shard k/n with --gpus g: this call runs shards (k-1)*g+1 .. k*g of n*g
        k, n = (int(v) for v in args.shard.split("/"))
        child = _without(argv, ("--gpus", "--shard", "--out"))
        shard = f"{(k - 1) * args.gpus + i + 1}/{n * args.gpus}"
        child = [*child, "--shard", shard, "--out", str(out)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), *child], env=env))
    for p in procs:
        p.wait()
    present = [p for p in outs if p.exists()]
    result = merge(present)
    result["run"]["command"] = "python benchmarks/conformance.py " + shlex.join(argv)
    write(result, Path(args.out))
    total = counts(result["records"])
    log(f"merged {len(present)}/{len(outs)} shards: {total} -> {Path(args.out) / 'matrix.md'}")
    return 1 if total["wrong"] or len(present) < len(outs) else 0


def run_merge(paths: list[str], out: str) -> int:
    from _conformance_report import counts, merge, write

    result = merge([Path(p) for p in paths])
    write(result, Path(out))
    total = counts(result["records"])
    log(f"merged {len(paths)} files: {total} -> {Path(out) / 'matrix.md'}")
    return 1 if total["wrong"] else 0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=None, help="cases (default 1500 cuda, 60 cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--size",
        choices=("small", "full"),
        default=None,
        help="shape scale (default: full on cuda, small on cpu)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--engines", default="", help="comma list (default: all four)")
    p.add_argument("--shard", default="1/1", help="k/n: cases with index %% n == k-1")
    p.add_argument("--gpus", type=int, default=0, help="run one shard per GPU and merge")
    p.add_argument("--out", default="conformance-out")
    p.add_argument("--time-budget-s", type=float, default=480.0)
    p.add_argument(
        "--variant-cases",
        type=int,
        default=1,
        help="cases per (op, dtype, shape class) cell that get every variant",
    )
    p.add_argument(
        "--variant-from",
        type=int,
        default=0,
        help="start the variants phase at this case of its subset (to cover the cells that an "
        "earlier run's budget did not reach)",
    )
    p.add_argument(
        "--no-solver-configs",
        dest="solver_configs",
        action="store_false",
        help="leave out the Triton solver-config pass (the knob pass gets the whole phase)",
    )
    p.add_argument(
        "--no-knob-pass",
        dest="knob_pass",
        action="store_false",
        help="leave out the knob pass (the Triton solver-config pass gets the whole phase)",
    )
    p.add_argument(
        "--tune-cases",
        type=int,
        default=1,
        help="cases per (op, dtype) that get a full EXHAUSTIVE autotune",
    )
    p.add_argument(
        "--compile-cap",
        type=int,
        default=None,
        help="most torch.compile plan builds (default 200 cuda, 40 cpu)",
    )
    p.add_argument(
        "--compile-max-autotune",
        action="store_true",
        help="also TORCH_COMPILE_ENGINE's max-autotune variants (minutes per graph on a GPU)",
    )
    p.add_argument("--launches", type=int, default=100)
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="comma list of the phases to run, in order (default all: "
        + ", ".join(PHASES)
        + "); e.g. --phases variants --variant-cases 3 gives a run's budget to the variants",
    )
    p.add_argument(
        "--replay",
        default=None,
        help="re-run a failures/*.json file, a graph JSON, or a `dnntune bench` results.json",
    )
    p.add_argument("--recheck-cases", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device == "cuda"
    args.size = args.size or ("full" if cuda else "small")
    args.count = args.count if args.count is not None else (1500 if cuda else 60)
    args.compile_cap = args.compile_cap if args.compile_cap is not None else (200 if cuda else 40)
    if not (args.knob_pass or args.solver_configs):
        p.error("--no-knob-pass and --no-solver-configs leave the variants phase nothing to do")
    args.phases = [ph.strip() for ph in args.phases.split(",") if ph.strip()]
    unknown = [ph for ph in args.phases if ph not in PHASES]
    if unknown or not args.phases:
        p.error(f"--phases: unknown phase(s) {unknown}; choose from {', '.join(PHASES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        m = argparse.ArgumentParser(prog="conformance.py merge")
        m.add_argument("results", nargs="+")
        m.add_argument("--out", required=True)
        margs = m.parse_args(argv[1:])
        return run_merge(margs.results, margs.out)
    args = parse(argv)
    cache = None
    if not args.recheck_cases:
        # a cache dir of its own (the new-process re-check inherits it), so the databases
        # this run reads are the ones it wrote, and no override file from elsewhere applies;
        # removed when the run ends (every run left one in /tmp before)
        cache = tempfile.mkdtemp(prefix="dnntune-conformance-")
        os.environ["DNNTUNE_CACHE_DIR"] = cache
        os.environ.pop("DNNTUNE_HEUR_CONFIG_PATH", None)
    try:
        if args.replay:
            from _conformance_replay import run_replay

            return run_replay(args)
        if args.gpus:
            return run_gpus(args, argv)
        return run_sweep(args, argv)
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
