"""Real models: ``dnntune.torch.optimize`` against eager, CUDA graphs and ``torch.compile``.

Each model is real library code with random weights (torchvision, timm, transformers; nothing
is downloaded), in eval mode, bf16 on CUDA (fp32 on the CPU), channels_last for the CNNs:
ResNet-50, EfficientNet-B0 (torchvision's, and timm's with its ``BatchNormAct2d``), timm's
RegNetY-016 and ConvNeXt-T, ViT-B/16 (timm), Swin-T and ConvNeXt-T (torchvision), a BERT-base
encoder, GPT-2 small (its ``Conv1D`` layers and ``gelu_new``), CLIP's ViT-B/16 vision tower
(QuickGELU), a LLaMA-style decoder (prefill, also with the default ``use_cache=True``, and
decode against a preallocated ``StaticCache``), the Whisper encoder, and two tiny pure-torch
models (``tiny_cnn``, ``tiny_mlp``) for ``--quick`` and the CPU test. A model whose library is
missing is skipped with its reason.

Variants, all in one process, timed side by side (``_interleaved``: a time-based warm-up each,
then rounds that time every variant over a burst of back-to-back calls, in a rotating order;
the median ms per forward, ``torch.backends.cudnn.benchmark`` on throughout, also while
``optimize`` runs: it decides in the conditions of use):

* ``eager``; ``eager_copy``: the eager forward of a deep copy (every dnntune variant optimizes
  one), the comparison's noise floor; ``eager_graph``: the eager forward recorded once with a
  plain ``torch.cuda.graph`` (input copied into a static buffer, replay, static output read);
  ``eager_graph_clone``: the same with the output copied, as a caller who keeps outputs across
  calls must (and as dnntune's replays do), so the cost of that copy shows;
* ``compile`` (default mode) and ``max_autotune`` (``mode="max-autotune"``), compile seconds
  reported (the first call). A compile past ``--compile-timeout-s`` ends the model's subprocess
  and the model runs again without that variant (a "timeout" cell). dnntune's routing of
  ``F.scaled_dot_product_attention`` and the pools (for good, from its first ``optimize``) is
  installed first, so the compiled code traces what it later runs and is not recompiled (the
  same for the model's rotary-embedding global, which ``optimize`` routes in its modeling
  file: ``dnntune.torch._rotary``);
* ``dnntune``: ``optimize(copy, inputs, policy, overrides, cuda_graph=False)``; ``dnntune_graph``:
  ``cuda_graph=True``; ``dnntune_auto``: ``cuda_graph="auto"`` (it picks among PyTorch's and
  dnntune's forward, each uncaptured or replayed). The three share one override file (fresh
  per model; ``--overrides PATH``: one file for every model and run, so a second run, of
  another tree say, takes the plans the first tuned and the two differ only where their
  graphs do); tune seconds are each ``optimize`` call's wall time (its speed checks included).

Every variant's output is compared with eager's on the same input (max abs error; pass within
bf16 tolerance: element-wise with an absolute part scaled to the output's RMS for the vision
models, the relative error of the norm for the transformers). A failing variant is a cell with
the exception, never the end of the run. By default each model runs in its own subprocess with
a wall-clock limit (``--model-timeout-s``; ``--budget-s`` for the whole run), so a CUDA fault or
a hang costs that model only (``--in-process``: one process, no limits). dnntune's, Inductor's
and Triton's on-disk caches are fresh per model (first-run tuning and compile seconds) unless
``--keep-cache``.

The LLaMA decode step re-runs the same position each call (the cache's write position is
rewound before each step, one in-place copy): real decode advances it, which changes nothing
that is timed here. It attends over the whole static cache, as compiled static-cache decoders do.

Usage::

    python benchmarks/models.py --list
    python benchmarks/models.py --out results/models                      # every model, CUDA
    python benchmarks/models.py --models resnet50,llama_decode --skip-max-autotune
    python benchmarks/models.py --models bert_base,llama_decode --skip-compile \
        --skip-max-autotune --budget-s 280                        # a short GPU session
    python benchmarks/models.py --device cpu --quick --models tiny_cnn,tiny_mlp --skip-compile

Writes ``<out>/models.json`` (after every model) and ``<out>/models.md``, each model's log in
``<out>/logs/`` (``--out`` or ``$OUT`` or ``.``).

This file is the command line and the parent process; the models are in ``_models_zoo.py``,
one model's run (variants, timing, error check) in ``_models_run.py``, the table, summary and
JSON in ``_models_report.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _src_path import use_checkout_src

    use_checkout_src(__file__)  # PYTHONPATH's dnntune, where it gives one, wins

import torch
from _models_report import progress, render, summary, versions, write_json
from _models_run import run_model
from _models_zoo import SPECS, ModelSpec, describe, make_setting

#: the variants whose setup ``--compile-timeout-s`` limits, by the stage a model reports
SKIP_FLAGS_BY_STAGE = {"setup compile": "compile", "setup max_autotune": "max_autotune"}


# ---- running many models ---------------------------------------------------------------------
def _forwarded(args: argparse.Namespace) -> list[str]:
    """The flags a model's subprocess gets (everything but selection and output)."""
    flags = ["--device", args.device, "--policy", args.policy, "--rounds", str(args.rounds)]
    flags += ["--warmup-s", str(args.warmup_s), "--compile-timeout-s", str(args.compile_timeout_s)]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    if args.tune_budget_s is not None:
        flags += ["--tune-budget-s", str(args.tune_budget_s)]
    if args.variants:
        flags += ["--variants", args.variants]
    if getattr(args, "overrides", None):
        flags += ["--overrides", str(Path(args.overrides).resolve())]
    for flag in ("quick", "skip_compile", "skip_max_autotune", "keep_cache"):
        if getattr(args, flag):
            flags.append("--" + flag.replace("_", "-"))
    return flags


def _run_isolated(
    spec: ModelSpec, args: argparse.Namespace, out: Path, deadline: float
) -> dict[str, Any]:
    """``run_model`` in a subprocess; its log in ``out/logs``. A compile that runs past
    ``--compile-timeout-s`` ends the subprocess, and the model runs again without that variant
    (a timeout cell); each subprocess has ``--model-timeout-s``, and none runs past
    ``deadline`` (``time.monotonic()``, from ``--budget-s``)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{spec.name}.log"
    log.write_text("")
    timed_out: dict[str, str] = {}
    while True:
        limit_s = min(args.model_timeout_s, deadline - time.monotonic())
        row, problem = _attempt(spec, args, log, [*timed_out], limit_s)
        variant = SKIP_FLAGS_BY_STAGE.get(problem or "")
        if variant is None or variant in timed_out:
            break
        timed_out[variant] = f"compile over --compile-timeout-s {args.compile_timeout_s:g} s"
    for variant, reason in timed_out.items():
        row.setdefault("variants", {})[variant] = {"status": "timeout", "reason": reason}
    return row


def _attempt(
    spec: ModelSpec, args: argparse.Namespace, log: Path, skip: list[str], limit_s: float
) -> tuple[dict[str, Any], str | None]:
    """One subprocess run of the model, at most ``limit_s``: its row, and what cut it short
    (a compile stage that ran too long, "timeout", "exit code N") or None."""
    with tempfile.TemporaryDirectory() as tmp, log.open("a") as sink:
        row_file = Path(tmp) / "row.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", spec.name]
        cmd += ["--json-out", str(row_file), *_forwarded(args)]
        cmd += [f"--skip-{v.replace('_', '-')}" for v in skip]
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        started, problem = time.time(), None
        row: dict[str, Any] = {"model": spec.name, "family": spec.family, "variants": {}}
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                with contextlib.suppress(OSError, ValueError):  # not written yet
                    row = json.loads(row_file.read_text())
                now, stage = time.time(), row.get("stage", "")
                if stage in SKIP_FLAGS_BY_STAGE:
                    problem = stage if now - row["stage_started"] > args.compile_timeout_s else None
                if problem is None and now - started > limit_s:
                    problem = "timeout"
                if problem:
                    break
        finally:  # a cut (or this process ended by SIGTERM): the subprocess and its workers
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if row_file.exists():
            row = json.loads(row_file.read_text())
    stage = row.pop("stage", None)
    row.pop("stage_started", None)
    where = f" during {stage}" if stage else ""
    if problem == "timeout":
        reason = f"over its time limit ({limit_s:.0f} s){where}"
        row |= {"status": "timeout", "reason": reason}
    elif problem is None and proc.returncode != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1][:300] if lines else "no output"
        problem = f"exit code {proc.returncode}"
        row |= {"status": "error", "reason": f"{problem}{where}: {last} (see {log})"}
    return row, problem


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--list", action="store_true", help="list the models and whether they run")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default bf16 on CUDA")
    p.add_argument("--policy", choices=["tune", "heuristic"], default="tune")
    p.add_argument(
        "--tune-budget-s",
        type=float,
        help="optimize(time_budget_s=...): the most seconds of each model's tuning pass",
    )
    p.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    p.add_argument("--warmup-s", type=float, default=0.3, help="warm-up per variant")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument(
        "--variants", default="", help="comma-separated variants to run (default: all of them)"
    )
    p.add_argument("--skip-max-autotune", action="store_true")
    p.add_argument("--compile-timeout-s", type=float, default=300)
    p.add_argument("--model-timeout-s", type=float, default=600, help="per model subprocess")
    p.add_argument(
        "--budget-s", type=float, help="start no model after this, cut the one running then"
    )
    p.add_argument(
        "--in-process", action="store_true", help="no subprocess per model (and no time limits)"
    )
    p.add_argument(
        "--keep-cache", action="store_true", help="dnntune's, Inductor's, Triton's caches as set"
    )
    p.add_argument(
        "--overrides",
        type=Path,
        help="one override file for every dnntune variant and model (default: a fresh one per"
        " model): a later run reads the plans an earlier one tuned",
    )
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    p.add_argument("--one", help=argparse.SUPPRESS)  # a subprocess's model
    p.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
    if args.list:
        for spec in SPECS.values():
            state = spec.unavailable() or "available"
            print(f"{spec.name:16} {spec.family:8} {state:40.200} {spec.description}")
        return 0
    if args.one:
        json_out = args.json_out or Path(f"{args.one}.json")

        def save(row: dict[str, Any]) -> None:
            json_out.with_suffix(".tmp").write_text(json.dumps(row, indent=1))
            json_out.with_suffix(".tmp").replace(json_out)  # whole, for the parent to read

        save(run_model(SPECS[args.one], args, save))
        return 0
    wanted = [m for m in args.models.split(",") if m] or list(SPECS)
    unknown = [m for m in wanted if m not in SPECS]
    if unknown:
        print(f"unknown model(s): {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {
        "benchmark": "models",
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    doc |= {"versions": versions(make_setting(args)), "models": []}
    if not args.in_process:
        # ``timeout`` (or any SIGTERM) ends the run through Python: the running model's
        # subprocess is ended too, and models.json keeps what finished
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    deadline = time.monotonic() + (args.budget_s or math.inf)
    for name in wanted:
        spec, start = SPECS[name], time.perf_counter()
        if time.monotonic() >= deadline:
            reason = f"not started: over --budget-s {args.budget_s:g} s"
            row = {"model": name, "status": "skipped", "reason": reason, "variants": {}}
        elif args.in_process or spec.unavailable():
            try:
                row = run_model(spec, args, lambda row: None)
            except Exception as exc:  # a bug here must not end the other models' run
                row = {"model": name, "status": "error", "reason": describe(exc), "variants": {}}
        else:
            row = _run_isolated(spec, args, args.out, deadline)
        doc["models"].append(row)
        doc["summary"] = [summary(doc["models"], v) for v in ("dnntune_auto", "dnntune_graph")]
        write_json(args.out, doc)
        print(progress(row, time.perf_counter() - start), flush=True)
    table = render(doc["models"])
    (args.out / "models.md").write_text(f"# Real models\n\n{table}\n")
    print(f"\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
