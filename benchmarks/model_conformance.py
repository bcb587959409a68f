"""Model conformance: random models through ``dnntune.torch.optimize``, against PyTorch.

``conformance.py`` checks every plan on generated graphs; this checks what a user's model sees
after ``optimize``: the fusion rewrites (conv + batch norm + activation, residual adds,
activations after a layer), the routing of each op, the memo of each call signature and the
CUDA-graph replays, on random models written the ways model code writes them
(``_random_models.py``). Each model is drawn from its seed, optimized, and checked under each
condition against a float64 copy of the eager model in the default layout (the exact answer),
beside the eager model itself (PyTorch's own error, and the layout of its outputs):

* ``example``: the example input, twice (the first call of each signature, then its memo);
* ``batch``: a larger batch, and ``batch <n>`` each of batches 1-4 not run otherwise;
  ``layout``: the other memory layout (channels-last or NCHW for a CNN, a transposed input for
  a transformer);
* ``new_weights``: after ``load_state_dict`` with new weights and statistics; ``weight_edit``:
  after an in-place edit of every parameter (an optimizer step);
* ``input_grad``: in eval mode, the gradient of the input (a saliency map, an attack); in
  float16 and bfloat16 over 8 draws, judged by the median or the mean of their largest errors;
* ``train``: a train-mode forward, the gradient of every parameter, the batch-norm statistics
  it updated; ``eval_after_train``: eval mode again.

A forward that fails names the first block whose output is wrong (the modules named down to
two levels, in the order the forward runs them: ``first wrong: block features.1: ...``), where
one is.

A value passes when its error against the exact answer is at most 4 times eager PyTorch's own
error (on the same values in either memory layout: its error depends on the layout), or within
the dtype's floor (float32 1e-3, float16 5e-3, bfloat16 3e-2, relative to the
output's largest magnitude where that exceeds 1); an output must also have eager's shape, dtype
and strides (over the dims with more than one element). A model eager PyTorch itself cannot
run (a kernel larger than its input, an in-place op autograd refuses) is counted as invalid and
skipped.

Usage::

    python benchmarks/model_conformance.py --count 200 --seed 0                # the CPU
    python benchmarks/model_conformance.py --count 200 --kernel-path           # dnntune's kernels
    python benchmarks/model_conformance.py --count 100 --check-speed           # with the races
    python benchmarks/model_conformance.py --device cuda --dtype bfloat16 --count 300 \\
        --time-budget-s 500                                                    # the H200
    python benchmarks/model_conformance.py --replay 1061 --policy tune         # one model again

``--policy`` is ``heuristic``, ``tune`` or ``mixed`` (each model draws one); ``--kernel-path``
makes every heuristic plan take dnntune's kernel path (TORCH_ENGINE's plan marked as not
PyTorch's own op, as a cuDNN or Triton winner would be), which a CPU otherwise rarely takes. On
CUDA each model also draws ``cuda_graph`` (False, True or "auto"). Writes ``OUT/results.json``
(every model and check) and ``OUT/failures/seed_<n>.json`` (the model, the checks that failed
and the command that replays it). Progress goes to stderr. Exit code 1 when any check failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from _model_checks import compare, compare_draws
from _model_steps import Models, eager_guard
from _random_models import Case, make_case, random_state
from _real_models import available, zoo_case, zoo_entries

# the judgement of one value, where the tests and replays read it
__all__ = ["check_model", "compare", "compare_draws", "parse_args", "run"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: batch sizes every model is also run at, in its example's layout: each is a call signature
#: with plans of its own, and a plan can be wrong at one batch size alone (seed 21 on the H100,
#: session 36: right at batches 1 and 3, wrong at 2, in either layout)
_BATCHES = (1, 2, 3, 4)


@dataclass
class Result:
    seed: int
    desc: str
    status: str  # ok, wrong, crash, invalid
    policy: str = ""
    cuda_graph: bool | str = False
    fusions: int = 0
    on_dnntune: int = 0
    #: plans (heuristic or the override file's) whose check on their first call failed: those
    #: layers were decided again (PyTorch's op for a heuristic plan)
    rejected: int = 0
    #: a wrong model's kernels, one line per call signature its checks built (op, first
    #: input's shape, strides and type, the plan and where it came from)
    kernels: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    checks: int = 0
    seconds: float = 0.0


def _eager_runs(case: Case, device: str) -> bool:
    """Whether eager PyTorch runs the model: eval on a larger batch, a train step."""
    probe = copy.deepcopy(case.model)
    try:
        with torch.no_grad():
            probe(case.make_input(case.batch + 2))
        probe.train()
        with eager_guard(torch.device(device)):
            probe(case.make_input(case.batch + 1)).sum().backward()
    except RuntimeError:
        return False
    return True


def kernel_path_heuristic(graph: Any, handle: Any) -> Any:
    """TORCH_ENGINE's default plan marked as not PyTorch's own op: ``dnntune.torch`` then runs
    the graph on its kernel path, as it runs a cuDNN or Triton winner (the tests' own
    ``torch_models.kernel_plan``, which a script outside ``tests/`` cannot import)."""
    import dnntune as dt

    graph.build_operation_graph(handle)
    graph.create_execution_plan_ext("TORCH_ENGINE")
    graph.check_support()
    graph.build_plans(dt.BuildPlanPolicy.HEURISTICS_CHOICE)
    plan = graph.active_plan
    plan.runs_eager_ops = False
    return plan


def case_maker(args: argparse.Namespace) -> Callable[[int], Case]:
    """How a seed becomes a model: drawn at random, or with ``--zoo``, a real model (the
    zoo's ``seed % len``, of those whose library imports here: the others are named on
    stderr)."""
    dtype = _DTYPES[args.dtype]
    if args.zoo is None:
        return lambda seed: make_case(seed, args.device, dtype)
    entries, missing = available(zoo_entries(args.zoo))
    for library, why in missing.items():
        print(f"--zoo: leaving out the {library} models ({why})", file=sys.stderr)
    if not entries:
        raise SystemExit(f"--zoo {args.zoo}: none of these models can be built here")
    return lambda seed: zoo_case(seed, entries, args.device, dtype)


def check_model(
    seed: int, args: argparse.Namespace, workdir: Path, draw: Callable[[int], Case] | None = None
) -> Result:
    """Draw (``draw``: default, a random model), optimize and check the model of ``seed``."""
    import dnntune.torch as dtt
    from dnntune.torch import runtime

    start = time.perf_counter()
    try:
        case = (draw or case_maker(args))(seed)
    except Exception as exc:  # a real model its library cannot build here
        failed = [f"{type(exc).__name__}: {exc}", traceback.format_exc()[-2000:]]
        return Result(seed, "the model could not be built", "crash", failed=failed)
    rng = random.Random(seed * 7919 + 1)  # the run's own draws: the model stays the seed's
    policy = (
        rng.choice(["heuristic", "heuristic", "tune"]) if args.policy == "mixed" else args.policy
    )
    cuda_graph: bool | str = rng.choice([False, True, "auto"]) if args.device == "cuda" else False
    result = Result(seed, case.desc, "ok", policy, cuda_graph)
    if not _eager_runs(case, args.device):
        result.status = "invalid"
        return result
    g = torch.Generator().manual_seed(seed + 1)
    eager = copy.deepcopy(case.model)
    exact = copy.deepcopy(case.model).double().to(memory_format=torch.contiguous_format)
    x = case.make_input(case.batch)
    stats = runtime.runtime_stats
    rejected = stats.heuristic_rejected + stats.stored_rejected
    known = {key for key, _ in runtime.cache().snapshot()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fallbacks and speed notes are results here
            report = dtt.optimize(
                case.model,
                (x,),
                policy=policy,
                overrides=workdir / f"overrides_{seed}.json",
                cuda_graph=cuda_graph,  # type: ignore[arg-type]
                # the speed check also installs the races of routes for the other inputs
                check_speed=cuda_graph == "auto" or args.check_speed,
                revert_if_slower=False,
                time_budget_s=args.tune_budget_s if policy == "tune" else None,
            )
            result.fusions = len(report.fusions)
            result.on_dnntune = len(report.engines())
            models = Models(case, case.model, eager, exact)
            _run_checks(models, case, x, g)
    except Exception as exc:  # a crash is a finding, with its traceback
        result.status = "crash"
        result.failed = [f"{type(exc).__name__}: {exc}", traceback.format_exc()[-2000:]]
        result.seconds = time.perf_counter() - start
        return result
    result.failed, result.checks = models.failed, models.checks
    result.rejected = stats.heuristic_rejected + stats.stored_rejected - rejected
    if models.failed:
        built = [(key, k) for key, k in runtime.cache().snapshot() if key not in known]
        result.kernels = [_kernel_line(key, k) for key, k in built]
    result.status = "wrong" if models.failed else "ok"
    result.seconds = time.perf_counter() - start
    return result


def _kernel_line(key: Any, kernel: Any) -> str:
    """``conv2d [2, 16, 1, 1] (16, 1, 16, 16) torch.bfloat16: CUDNN_ENGINE (heuristic)``."""
    signature = key[0] if isinstance(key, tuple) and key else key
    op = signature[0] if isinstance(signature, tuple) and signature else signature
    first = signature[1] if isinstance(signature, tuple) and len(signature) > 1 else None
    shown = ""
    if isinstance(first, tuple) and len(first) >= 3:
        shown = f" {list(first[0])} {tuple(first[1])} {first[2]}"
    return f"{op}{shown}: {kernel.plan.name} ({kernel.source})"


def _run_checks(models: Models, case: Case, x: torch.Tensor, g: torch.Generator) -> None:
    models.forward(x, "example")
    models.forward(case.make_input(case.batch + 2), "batch")
    for b in _BATCHES:  # each batch a signature with plans of its own
        if b not in (case.batch, case.batch + 1, case.batch + 2):
            models.forward(case.make_input(b), f"batch {b}")
    other = case.make_input(case.batch + 1)
    if other.dim() == 4:
        fmt = torch.contiguous_format if case.channels_last_input else torch.channels_last
        models.forward(other.contiguous(memory_format=fmt), "layout")
    else:
        models.forward(other.transpose(0, 1).contiguous().transpose(0, 1), "layout")
    state = (case.new_state or random_state)(models.eager, g)
    for k, v in state.items():  # in place: the dict keeps its module versions (_metadata)
        state[k] = v.to(x.device)
    models.load(state)
    models.forward(x, "new_weights")
    models.edit_weights(g)
    models.forward(x, "weight_edit")
    models.input_grad(x, g)
    models.train_step(case.make_input(case.batch + 1), g)
    models.forward(x, "eval_after_train")


def _versions() -> dict[str, str]:
    import dnntune

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dnntune": dnntune.__version__,
        "machine": platform.node(),
    }
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name()
    return out


def _replay_command(seed: int, args: argparse.Namespace) -> str:
    flags = [f"--device {args.device}", f"--dtype {args.dtype}", f"--policy {args.policy}"]
    if args.kernel_path:
        flags.append("--kernel-path")
    if args.zoo is not None:
        flags.append(f"--zoo {args.zoo}")
    return f"python benchmarks/model_conformance.py --replay {seed} " + " ".join(flags)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.kernel_path:
        from dnntune.torch import runtime

        runtime._heuristic = kernel_path_heuristic
    seeds = [args.replay] if args.replay is not None else range(args.seed, args.seed + args.count)
    draw = case_maker(args)
    results: list[Result] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dnntune-models-") as tmp:
        for seed in seeds:
            if args.replay is None and time.perf_counter() - start > args.time_budget_s:
                print(f"time budget spent after {len(results)} models", file=sys.stderr)
                break
            r = check_model(seed, args, Path(tmp), draw)
            results.append(r)
            _progress(r, len(results), start, args.replay is not None, 1 if args.zoo else 20)
            if r.status in ("wrong", "crash"):
                failures = out / "failures"
                failures.mkdir(exist_ok=True)
                record = {**asdict(r), "replay": _replay_command(seed, args)}
                (failures / f"seed_{seed}.json").write_text(json.dumps(record, indent=1))
            # after every model: a run stopped by a timeout keeps what it checked (the GPU's
            # first zoo run, session 38, was killed before its one write at the end)
            _write_results(out, args, results)
    # written after each model; a run that checked none still leaves its (empty) results
    summary = _summary(results) if results else _write_results(out, args, results)
    print(
        f"{summary['models']} models ({summary['invalid']} invalid in eager PyTorch), "
        f"{summary['checks']} checks: {summary['wrong']} wrong, {summary['crash']} crashed; "
        f"{summary['with_fusions']} with fusions; {summary['plans_rejected']} plans failed "
        f"their check; {time.perf_counter() - start:.0f} s; "
        f"{out / 'results.json'}"
    )
    return 1 if summary["wrong"] or summary["crash"] else 0


def _write_results(out: Path, args: argparse.Namespace, results: list[Result]) -> dict[str, int]:
    """``results.json`` with the models checked so far (written whole, then renamed over the
    last one); its summary."""
    summary = _summary(results)
    doc = {
        "benchmark": "model_conformance",
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": _versions(),
        "summary": summary,
        "models": [asdict(r) for r in results],
    }
    partial = out / "results.json.partial"
    partial.write_text(json.dumps(doc, indent=1))
    partial.replace(out / "results.json")
    return summary


def _progress(r: Result, n: int, start: float, verbose: bool, every: int) -> None:
    if r.status in ("wrong", "crash") or verbose:
        print(
            f"[{n}] seed {r.seed} {r.status} ({r.policy}, cuda_graph={r.cuda_graph}): {r.desc}",
            file=sys.stderr,
        )
        for line in r.failed[:8]:
            print(f"    {line}", file=sys.stderr)
    elif n % every == 0:  # every model of the zoo (a real model takes seconds to minutes)
        print(f"[{n}] {time.perf_counter() - start:.0f} s", file=sys.stderr)


def _summary(results: list[Result]) -> dict[str, int]:
    def count(status: str) -> int:
        return sum(r.status == status for r in results)

    return {
        "models": len(results),
        "ok": count("ok"),
        "wrong": count("wrong"),
        "crash": count("crash"),
        "invalid": count("invalid"),
        "checks": sum(r.checks for r in results),
        "with_fusions": sum(r.fusions > 0 for r in results),
        "plans_rejected": sum(r.rejected for r in results),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100, help="models (default 100)")
    p.add_argument("--seed", type=int, default=0, help="the first model's seed")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--dtype",
        choices=sorted(_DTYPES),
        default=None,
        help="default: float32 on the CPU, bfloat16 on CUDA",
    )
    p.add_argument("--policy", choices=["heuristic", "tune", "mixed"], default="mixed")
    p.add_argument(
        "--tune-budget-s",
        type=float,
        default=3.0,
        help="optimize's time_budget_s where a model tunes (default 3)",
    )
    p.add_argument(
        "--kernel-path",
        action="store_true",
        help="every heuristic plan runs on dnntune's kernel path",
    )
    p.add_argument(
        "--check-speed",
        action="store_true",
        help="optimize with check_speed=True everywhere (default: only with cuda_graph='auto'): "
        "the conditions' other inputs then race dnntune's route against PyTorch's forward",
    )
    p.add_argument(
        "--zoo",
        default=None,
        metavar="NAMES",
        help="real models instead of random ones: 'all', or names or libraries, comma-separated "
        "(torchvision, timm, transformers; seed s runs the zoo's model s modulo its size)",
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=float("inf"),
        help="start no model after this many seconds",
    )
    p.add_argument(
        "--replay",
        type=int,
        default=None,
        metavar="SEED",
        help="check only this seed's model, printing every detail",
    )
    p.add_argument(
        "--out",
        default=os.environ.get("OUT", "model_conformance"),
        help="output folder (default $OUT, else ./model_conformance)",
    )
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here (use --device cpu)")
    if args.count < 1:
        p.error("--count must be at least 1")
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
