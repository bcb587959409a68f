"""dnntune against PyTorch eager, torch.compile max-autotune and the roofline, in one process.

For every graph of a suite (default ``benchmarks/suite``) this measures, on the same buffers
and under the same conditions, PyTorch eager (the ops as a user writes them), ``torch.compile``
with ``mode="max-autotune-no-cudagraphs"`` (and its compile time), dnntune's heuristic plan and
dnntune's tuned plan (and its tuning time), then checks that a fresh build from the override
file picks the tuned plan without benchmarking. The GEMM and copy-bandwidth ceilings are
measured first. See ``_measure.py`` for the per-graph protocol and ``_report.py`` for the
summary. Writes ``$OUT/results.md``, ``$OUT/results.json`` (after every graph, so a cut run
still leaves both) and ``$OUT/overrides.json``.

    python benchmarks/run.py --suite benchmarks/suite --out $OUT
    python benchmarks/run.py --device cpu --quick --suite examples/graphs \\
        --graphs 'llama_rmsnorm,resnet50_maxpool*' --skip-compile --out /tmp/bench

Issue 25's comparison (default tuning against EXHAUSTIVE and max-autotune, HeuristicMode.B
against A; ``_report_tuning.py``) adds two variants and tunes with the library's defaults
(where B's plan is not A's, the two are also timed on call latency, B's training clock):

    python benchmarks/run.py --tune-defaults --exhaustive --heuristic-b --modes warm --out $OUT

Graphs run in round-robin order across categories (conv, GEMM, attention, norm, ...) so that
a run cut by ``--budget-s`` still samples every category; when the budget is spent the current
graph finishes and the rest are marked skipped. ``--compile-budget-s`` caps the time spent in
max-autotune compiles (graphs after it keep the other three variants).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import json
import logging
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    import dnntune  # noqa: F401
except ImportError:  # running from a checkout without an install: use its src/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch
from _ceilings import measure_ceilings
from _measure import MeasureOptions, Session, category_of, measure_graph
from _report import summarize_run, summary_lines, write_results

import dnntune as dt

REPO = Path(__file__).resolve().parent.parent
#: categories in the order the round robin visits them
CATEGORY_ORDER = (
    "conv_fprop",
    "gemm",
    "sdpa",
    "norm",
    "gemm_decode",
    "conv_dgrad",
    "batchnorm",
    "pool",
    "conv_wgrad",
    "pointwise",
    "reduction",
    "other",
)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _say(text: str) -> None:
    print(text, flush=True)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(handle: dt.Handle) -> dict[str, Any]:
    cuda = handle.is_cuda
    return {
        "device": str(handle.device),
        "device_name": torch.cuda.get_device_name(handle.device)
        if cuda
        else handle.device_signature().get("name"),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton"),
        "cudnn_frontend": _version("nvidia-cudnn-frontend"),
        "dnntune": dt.__version__,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cpu_threads": torch.get_num_threads(),
        "selection_env": {k: v for k, v in os.environ.items() if k.startswith("DNNTUNE_")},
    }


# ---- graph selection and order ------------------------------------------------------------------
def select(suite: Path, patterns: str | None) -> list[Path]:
    """Suite files matching the comma-separated patterns (globs, or substrings of the stem)."""
    files = sorted(p for p in suite.glob("*.json") if p.is_file())
    if not patterns:
        return files
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]

    def hit(path: Path) -> bool:
        for pat in wanted:
            if any(ch in pat for ch in "*?["):
                if fnmatch.fnmatch(path.name, pat) or fnmatch.fnmatch(path.stem, pat):
                    return True
            elif pat in path.stem:
                return True
        return False

    return [p for p in files if hit(p)]


def round_robin(paths: list[Path]) -> list[tuple[Path, str]]:
    """Paths with their category, one category after another, so each is sampled early."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        try:
            category = category_of(dt.Graph.load(path))
        except Exception:
            category = "other"
        groups.setdefault(category, []).append(path)
    order = [c for c in CATEGORY_ORDER if c in groups] + sorted(
        c for c in groups if c not in CATEGORY_ORDER
    )
    out: list[tuple[Path, str]] = []
    while any(groups[c] for c in order):
        for c in order:
            if groups[c]:
                out.append((groups[c].pop(0), c))
    return out


# ---- the run ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--suite", type=Path, default=REPO / "benchmarks" / "suite")
    p.add_argument("--out", type=Path, default=None, help="output folder (default $OUT)")
    p.add_argument("--quick", action="store_true", help="fewer samples; warm mode only")
    p.add_argument(
        "--graphs", default=None, help="comma-separated globs or substrings of file names to run"
    )
    p.add_argument(
        "--modes",
        default=None,
        help="cache modes, e.g. warm,cold (default warm,cold; warm with --quick)",
    )
    p.add_argument("--skip-compile", action="store_true", help="no torch.compile max-autotune")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="wall-time budget; past it the current graph ends and the rest are skipped",
    )
    p.add_argument(
        "--compile-budget-s",
        type=float,
        default=None,
        help="cap on max-autotune compile time in total (default: half the budget)",
    )
    p.add_argument(
        "--compile-timeout-s",
        type=float,
        default=90.0,
        help="per-graph max-autotune compile timeout",
    )
    p.add_argument(
        "--engines",
        default="",
        help="comma-separated engines autotune may choose from (default: all)",
    )
    p.add_argument("--iters", type=int, default=None, help="timed samples per variant and mode")
    p.add_argument("--warmup", type=int, default=None, help="warmup calls per round")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds")
    p.add_argument("--no-verify", action="store_true", help="skip the reference checks")
    p.add_argument(
        "--candidate-timeout-s",
        type=float,
        default=60.0,
        help="autotune's candidate_timeout_s (compile + benchmark of one candidate). Keep it well "
        "above a Triton JIT compile: a timed-out candidate's thread is abandoned, still running "
        "GPU work, and on the H200 a 1 s limit broke later CUDA-graph captures in the process",
    )
    p.add_argument(
        "--sweep-knobs",
        action="store_true",
        help="also tune knob variants, as `dnntune tune --sweep-knobs` (slower tuning)",
    )
    p.add_argument(
        "--ranking-metric",
        choices=("device", "latency"),
        default="device",
        help="the clock the tuner ranks candidates on (default device: the clock this suite "
        "reports, so the tuned plan is chosen under the conditions it is compared under; "
        "latency adds each call's host submit time, as `dnntune tune` does by default)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="DNNTUNE_CACHE_DIR for the run, kept (default: a fresh temporary folder, removed when "
        "the run ends)",
    )
    p.add_argument(
        "--keep-compile-caches",
        action="store_true",
        help="reuse Inductor's and Triton's on-disk caches (default: fresh ones, so compile "
        "and tuning times are what a first run pays)",
    )
    p.add_argument(
        "--tune-defaults",
        action="store_true",
        help="tune with AutotuneConfig's defaults (strategy, iterations, confirmation) instead "
        "of the suite's fixed settings; the clock, --engines and the timeout stay",
    )
    p.add_argument(
        "--exhaustive",
        action="store_true",
        help="also tune each graph in TuneMode.EXHAUSTIVE (after the default tune; issue 25)",
    )
    p.add_argument(
        "--heuristic-b",
        action="store_true",
        help="also time HeuristicMode.B's plan, built without tuning (issue 25); where it is "
        "not A's, the two are also timed side by side on call latency, the clock B's labels "
        "are timed on",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--shard",
        default=None,
        help="K/N: run only the K-th of N interleaved slices of the ordered suite (1-based), "
        "to split one suite over several device calls; combine them with --merge",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="combine the results.json of these output folders into --out (no measuring)",
    )
    return p.parse_args(argv)


def _options(args: argparse.Namespace) -> MeasureOptions:
    modes = args.modes or ("warm" if args.quick else "warm,cold")
    parsed = tuple(m.strip() for m in modes.split(",") if m.strip())
    bad = [m for m in parsed if m not in ("warm", "cold")]
    if bad or not parsed:
        raise SystemExit(f"--modes: expected warm and/or cold, got {modes!r}")
    compile_budget = args.compile_budget_s
    if compile_budget is None:
        compile_budget = 0.5 * args.budget_s
    return MeasureOptions(
        modes=parsed,
        warmup=args.warmup if args.warmup is not None else (3 if args.quick else 10),
        iters=args.iters if args.iters is not None else (12 if args.quick else 60),
        rounds=args.rounds if args.rounds is not None else (2 if args.quick else 3),
        compile=not args.skip_compile,
        compile_timeout_s=args.compile_timeout_s,
        compile_budget_s=compile_budget,
        tune_warmup=1 if args.quick else 3,
        tune_max_iters=10 if args.quick else 30,
        tune_candidate_timeout_s=args.candidate_timeout_s,
        tune_engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()),
        tune_sweep_knobs=args.sweep_knobs,
        tune_ranking_metric=args.ranking_metric,
        tune_defaults=args.tune_defaults,
        exhaustive=args.exhaustive,
        heuristic_b=args.heuristic_b,
        verify=not args.no_verify,
        seed=args.seed,
    )


def _warm_compiler(session: Session) -> float:
    """One tiny compile first, so the first graph's compile time excludes torch's start-up."""
    start = time.perf_counter()
    try:
        import torch._dynamo

        x = torch.ones(64, device=session.handle.device)
        torch.compile(lambda t: t * 2 + 1, dynamic=False)(x)
        session.synchronize()
        torch._dynamo.reset()
    except Exception as exc:  # the per-graph compiles will report the problem
        _say(f"compiler warm-up failed: {type(exc).__name__}: {exc}")
    return time.perf_counter() - start


def _line(i: int, n: int, row: dict[str, Any], elapsed: float) -> str:
    if row.get("status") != "ok":
        return f"[{i}/{n}] {row['file']}: {row.get('status')}: {row.get('error')}"
    timing: dict[str, Any] = next(iter(row.get("timing", {}).values()), {})
    v = row["variants"]

    def ms(name: str) -> str:
        value = timing.get(name, {}).get("median_ms")
        return "-" if value is None else f"{value:.4f}"

    parts = [f"eager {ms('eager')}"]
    if v["compile"].get("compile_s") is not None:
        parts.append(f"max-autotune {ms('compile')} (compile {v['compile']['compile_s']:.2f}s)")
    parts.append(f"heuristic {ms('heuristic')} {v['heuristic'].get('plan', '-')}")
    tune_s = v["tuned"].get("tuning_s") or 0.0
    parts.append(f"tuned {ms('tuned')} {v['tuned'].get('plan', '-')} (tune {tune_s:.2f}s)")
    for name, label in (("heuristic_b", "B"), ("exhaustive", "exhaustive")):
        if name in v:
            info = v[name]
            cost = f" (tune {info['tuning_s']:.2f}s)" if info.get("tuning_s") is not None else ""
            parts.append(f"{label} {ms(name)} {info.get('plan', '-')}{cost}")
    ws = row.get("warm_start", {})
    if ws.get("ok"):
        parts.append(f"warm start {ws['build_ms']:.1f}ms {'=' if ws.get('picked_tuned') else '!='}")
    return (
        f"[{i}/{n}] {row['file']} ({row['elapsed_s']:.1f}s, total {elapsed:.0f}s): "
        + " | ".join(parts)
    )


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        raise SystemExit("--out is required when $OUT is not set")
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        return merge(args.merge, out, argv)
    # a cache folder of its own unless one is given, removed when the run ends: every run
    # left one in /tmp with its Inductor and Triton caches (70 on this machine; the tests of
    # this script run it 7 times)
    own_cache = None if args.cache_dir else Path(tempfile.mkdtemp(prefix="dnntune-bench-cache-"))
    try:
        return _run_suite(args, argv, out, started, args.cache_dir or own_cache)
    finally:
        if own_cache is not None:
            shutil.rmtree(own_cache, ignore_errors=True)


def _run_suite(
    args: argparse.Namespace, argv: list[str] | None, out: Path, started: float, cache_dir: Path
) -> int:
    options = _options(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    # A clean selection state: no override file from elsewhere, fresh engine databases.
    os.environ.pop("DNNTUNE_HEUR_CONFIG_PATH", None)
    os.environ["DNNTUNE_CACHE_DIR"] = str(cache_dir)
    if not args.keep_compile_caches:
        # Compile times are first-run costs: neither max-autotune nor dnntune's engines may
        # find kernels from an earlier run on disk.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
        os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    overrides = out / "overrides.json"
    overrides.unlink(missing_ok=True)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    handle = dt.create_handle(device)
    paths = select(args.suite, args.graphs)
    if not paths:
        raise SystemExit(f"no graphs in {args.suite} match {args.graphs!r}")
    ordered = round_robin(paths)
    if args.shard:
        k, n = _shard(args.shard)
        ordered = ordered[k - 1 :: n]
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
    _say(f"dnntune suite: {len(ordered)} graphs from {args.suite} on {device}; out {out}")

    ceilings = measure_ceilings(handle, quick=args.quick)
    _say(
        f"ceilings: {ceilings['gemm']['tflops']:.1f} TFLOP/s ({ceilings['gemm']['what']}), "
        f"{ceilings['copy']['gbps']:.1f} GB/s copy"
    )
    session = Session(handle, options, overrides, ceilings["ridge_flop_per_byte"])
    session.deadline = started + args.budget_s
    if options.exhaustive:
        session.exhaustive_overrides_path = out / "overrides_exhaustive.json"
        session.exhaustive_overrides_path.unlink(missing_ok=True)
    doc: dict[str, Any] = {
        "schema": "dnntune-suite-results/1",
        "started_at": _now(),
        "finished_at": None,
        "complete": False,
        "command": command,
        "argv": list(argv or sys.argv[1:]),
        "environment": environment(handle),
        "options": {
            **vars(options),
            "modes": list(options.modes),
            "quick": args.quick,
            "budget_s": args.budget_s,
            "suite": str(args.suite),
            "timer": handle.timer.kind,
            "device": device,
            "cache_dir": str(cache_dir),
            "overrides": str(overrides),
            "fresh_compile_caches": not args.keep_compile_caches,
        },
        "ceilings": ceilings,
        "graphs": [],
    }
    if options.compile:
        doc["compile_warmup_s"] = _warm_compiler(session)

    rows: list[dict[str, Any]] = []
    try:
        for i, (path, category) in enumerate(ordered, 1):
            elapsed = time.perf_counter() - started
            if elapsed >= args.budget_s:
                rows.append(
                    {
                        "file": path.name,
                        "category": category,
                        "status": "skipped",
                        "error": f"time budget of {args.budget_s:g} s spent",
                    }
                )
                continue
            _say(f"[{i}/{len(ordered)}] {path.name} ({category}) ...")
            row = measure_graph(session, path)
            row.setdefault("category", category)
            rows.append(row)
            _say(_line(i, len(ordered), row, time.perf_counter() - started))
            _write(out, doc, rows, options, started, complete=False)
        doc["complete"] = True
    finally:
        doc["finished_at"] = _now()
        _write(out, doc, rows, options, started, complete=doc["complete"])
    _say(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    for line in summary_lines(doc["summary"]):
        _say(line)
    return 0 if all(r.get("status") != "error" for r in rows) else 1


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard: expected K/N, got {text!r}") from None
    if not 1 <= k <= n:
        raise SystemExit(f"--shard: K must be in 1..N, got {text!r}")
    return k, n


def merge(folders: list[Path], out: Path, argv: list[str] | None) -> int:
    """One results.json/md from several runs' (shards, or a re-run of skipped graphs).

    Rows are matched by file name; a measured row replaces a skipped one and a later measured
    row replaces an earlier one. Ceilings, machine and options come from the first folder.
    """
    docs = [json.loads((f / "results.json").read_text()) for f in folders]
    first = docs[0]
    rows: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for row in doc["graphs"]:
            old = rows.get(row["file"])
            if old is None or row.get("status") != "skipped":
                rows[row["file"]] = row
    merged = dict(first)
    merged["graphs"] = list(rows.values())
    merged["merged_from"] = [
        {
            "folder": str(f),
            "command": d["command"],
            "started_at": d["started_at"],
            "ceilings": d["ceilings"],
            "device_name": d["environment"].get("device_name"),
        }
        for f, d in zip(folders, docs, strict=True)
    ]
    merged["command"] = " ; ".join(d["command"] for d in docs)
    merged["complete"] = all(d.get("complete") for d in docs)
    merged["wall_s"] = sum(float(d.get("wall_s") or 0.0) for d in docs)
    merged["finished_at"] = max(str(d.get("finished_at") or "") for d in docs) or None
    merged["summary"] = summarize_run(
        merged["graphs"], first["ceilings"], first["options"]["modes"]
    )
    write_results(out, merged)
    _say(f"merged {len(folders)} runs ({len(rows)} graphs) into {out / 'results.md'}")
    return 0


def _write(
    out: Path,
    doc: dict[str, Any],
    rows: list[dict[str, Any]],
    options: MeasureOptions,
    started: float,
    complete: bool,
) -> None:
    doc["graphs"] = rows
    doc["complete"] = complete
    doc["wall_s"] = time.perf_counter() - started
    doc["summary"] = summarize_run(rows, doc["ceilings"], options.modes)
    write_results(out, doc)


if __name__ == "__main__":
    sys.exit(main())
