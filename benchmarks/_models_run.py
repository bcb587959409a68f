"""One model of ``benchmarks/models.py`` in this process: every variant set up, checked
against eager's output and timed side by side (``run_model``).

Variants: ``eager``, ``eager_graph`` (a plain ``torch.cuda.graph`` recording), ``compile`` and
``max_autotune`` (``torch.compile``), ``dnntune``, ``dnntune_graph`` and ``dnntune_auto``
(``dnntune.torch.optimize`` with ``cuda_graph`` False, True and "auto").
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _models_zoo import ModelSpec, Setting, Workload, describe, make_setting
from torch.utils._pytree import tree_map

import dnntune.torch as dtt
from dnntune.errors import InvalidValueError

VARIANTS = (
    "eager",
    "eager_copy",
    "eager_graph",
    "eager_graph_clone",
    "compile",
    "max_autotune",
    "dnntune",
    "dnntune_graph",
    "dnntune_auto",
)
#: the compiled variants early: a compile cut by ``--compile-timeout-s`` then costs only the
#: setups before it when the model runs again without that variant
SETUP_ORDER = VARIANTS
#: the pass bound of a variant's error against eager's output, by dtype
TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-2}


# ---- variants --------------------------------------------------------------------------------
class NotApplicable(Exception):
    """A variant that does not run here (a skip flag, no CUDA, an uncapturable forward)."""


@dataclass
class Context:
    setting: Setting
    args: argparse.Namespace
    overrides: Path


@dataclass
class Prepared:
    fn: Callable[[], Any]
    info: dict[str, Any] = field(default_factory=dict)


def _sync(s: Setting) -> None:
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)


def _eager(w: Workload, ctx: Context) -> Prepared:
    model, inputs = w.model, w.inputs
    return Prepared(lambda: model(*inputs))


def _eager_copy(w: Workload, ctx: Context) -> Prepared:
    """The eager forward of a deep copy (as every dnntune variant optimizes one): the noise
    floor of the comparison, and the check that copying a model alone changes nothing."""
    model, inputs = copy.deepcopy(w.model), w.inputs
    return Prepared(lambda: model(*inputs))


def _eager_graph(w: Workload, ctx: Context, clone: bool = False) -> Prepared:
    """The eager forward recorded once with a plain ``torch.cuda.graph``: the input copied into
    the static buffer, a replay, and the static output read (``clone``: a copy of it, which a
    caller who keeps outputs across calls must make, as dnntune's replays do)."""
    if ctx.setting.device.type != "cuda":
        raise NotApplicable("CUDA only")
    model, inputs = w.model, w.inputs
    static = [t.clone() for t in inputs]
    try:
        side = torch.cuda.Stream(ctx.setting.device)
        side.wait_stream(torch.cuda.current_stream(ctx.setting.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                model(*static)
        torch.cuda.current_stream(ctx.setting.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = model(*static)
    except Exception as exc:
        _sync(ctx.setting)
        raise NotApplicable(f"not capturable: {describe(exc)}") from exc

    def replay() -> Any:
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        graph.replay()
        return out

    def replay_clone() -> Any:
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        graph.replay()
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out)

    return Prepared(replay_clone if clone else replay)


def _compiled(mode: str | None, skip: str) -> Callable[[Workload, Context], Prepared]:
    def setup(w: Workload, ctx: Context) -> Prepared:
        if getattr(ctx.args, skip):
            raise NotApplicable(f"skipped (--{skip.replace('_', '-')})")
        compiled = torch.compile(copy.deepcopy(w.model), mode=mode)
        inputs = w.inputs
        start = time.perf_counter()
        compiled(*inputs)  # compiles (max-autotune: and benchmarks its kernels)
        _sync(ctx.setting)
        return Prepared(lambda: compiled(*inputs), {"compile_s": time.perf_counter() - start})

    return setup


def _dnntune(cuda_graph: bool | str) -> Callable[[Workload, Context], Prepared]:
    def setup(w: Workload, ctx: Context) -> Prepared:
        if cuda_graph is not False and ctx.setting.device.type != "cuda":
            # without CUDA, "auto" is cuda_graph=False: the dnntune cell
            raise NotApplicable("CUDA only")
        model, inputs = copy.deepcopy(w.model), w.inputs
        start = time.perf_counter()
        try:
            report = dtt.optimize(
                model,
                inputs,
                policy=ctx.args.policy,
                overrides=ctx.overrides,
                cuda_graph=cuda_graph,  # type: ignore[arg-type]  # a newer optimize takes "auto"
                time_budget_s=ctx.args.tune_budget_s,
            )
        except (TypeError, InvalidValueError) as exc:
            if cuda_graph == "auto" and "cuda_graph" in str(exc):
                raise NotApplicable("cuda_graph='auto' not supported") from exc
            raise
        info = {
            "tune_s": time.perf_counter() - start,
            "tuning_s": report.tuning_time_ms / 1e3,
            "reverted": report.reverted,
            "swapped": len(report.swapped),
            "autotune_calls": report.autotune_calls,
            "check_speedup": report.speedup,
            # cuda_graph="auto": what it kept, and the forward times it decided on
            "choice": getattr(report, "choice", None),
            "check_eager_ms": report.eager_forward_ms,
            "check_eager_graph_ms": getattr(report, "eager_graph_ms", None),
            "check_ms": report.forward_ms,
            # each option's timing before optimize changed anything and side by side at its end
            "check_readings_ms": getattr(report, "auto_readings_ms", None) or None,
            "report": str(report),
        }
        return Prepared(lambda: model(*inputs), info)

    return setup


SETUPS: dict[str, Callable[[Workload, Context], Prepared]] = {
    "eager": _eager,
    "eager_copy": _eager_copy,
    "eager_graph": _eager_graph,
    "eager_graph_clone": lambda w, ctx: _eager_graph(w, ctx, clone=True),
    "compile": _compiled(None, "skip_compile"),
    "max_autotune": _compiled("max-autotune", "skip_max_autotune"),
    "dnntune": _dnntune(False),
    "dnntune_graph": _dnntune(True),
    "dnntune_auto": _dnntune("auto"),
}


def _output(value: Any) -> torch.Tensor:
    """The tensor a forward's result is compared by: itself, or its first tensor (a
    transformers ModelOutput's last_hidden_state or logits)."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value
    for item in items:
        if isinstance(item, torch.Tensor):
            return item
    raise TypeError(f"no tensor in the output ({type(value).__name__})")


def _error(out: torch.Tensor, ref: torch.Tensor, compare: str, tol: float) -> dict[str, Any]:
    if out.shape != ref.shape:
        return {"pass": False, "error_note": f"shape {tuple(out.shape)} != {tuple(ref.shape)}"}
    a, b = out.detach().double(), ref.detach().double()
    diff = (a - b).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
    if not bool(torch.isfinite(a).all()):
        ok = False
    elif compare == "norm":
        ok = rel <= tol
    else:  # random-weight outputs are not unit scale: the absolute part follows their RMS
        scale = max(1.0, float(b.square().mean().sqrt()))
        ok = bool((diff <= tol * scale + tol * b.abs()).all())
    return {"max_abs_err": max_abs, "rel_err": rel, "pass": ok}


def _setup(
    name: str, w: Workload, ctx: Context, ref: torch.Tensor
) -> tuple[Prepared | None, dict[str, Any]]:
    """Prepare one variant and check its output: (the prepared call or None, its cell)."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.simplefilter("ignore", quiet)  # the libraries' notices, not problems
        try:
            with torch.no_grad():
                prepared = SETUPS[name](w, ctx)
                out = _output(prepared.fn()).clone()
            _sync(ctx.setting)
        except NotApplicable as exc:
            return None, {"status": "n/a", "reason": str(exc)}
        except Exception as exc:
            return None, {"status": "error", "reason": describe(exc)}
    cell: dict[str, Any] = {"status": "ok", "setup_s": time.perf_counter() - start}
    cell |= prepared.info
    cell |= _error(out, ref, w.compare, TOLERANCE[ctx.setting.dtype])
    if caught:
        cell["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return prepared, cell


# ---- timing ----------------------------------------------------------------------------------
def _interleaved(
    fns: dict[str, Callable[[], Any]], s: Setting, warmup_s: float, rounds: int
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per-call ms of every variant, per round, timed side by side; and the variants that
    raised (their reason). As ``torch_e2e._side_by_side``: each variant warms up for at least
    ``warmup_s`` and 3 calls (and sizes its burst to about 10 ms); then each round times
    every variant, in a rotating order, over its burst of back-to-back calls with one sync
    (CUDA events on CUDA), so a clock change or a noisy neighbour hits all alike."""
    cuda = s.device.type == "cuda"
    bursts: dict[str, int] = {}
    failed: dict[str, str] = {}
    for name, fn in fns.items():
        try:
            n, t0 = 0, time.perf_counter()
            while n < 3 or time.perf_counter() - t0 < warmup_s:
                fn()
                n += 1
                if n % 5 == 0:
                    _sync(s)
            _sync(s)
            t0, n_timed = time.perf_counter(), 3
            for _ in range(n_timed):
                fn()
            _sync(s)
            per_call = (time.perf_counter() - t0) / n_timed
            bursts[name] = max(3, min(200, int(0.010 / max(per_call, 1e-7))))
        except Exception as exc:
            failed[name] = f"while timing: {describe(exc)}"
    samples: dict[str, list[float]] = {name: [] for name in bursts}
    for r in range(rounds):
        names = [n for n in bursts if n not in failed]
        if not names:
            break
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = fns[name], bursts[name]
            try:
                samples[name].append(_burst_ms(fn, n, s, cuda))
            except Exception as exc:
                failed[name] = f"while timing: {describe(exc)}"
    return {k: v for k, v in samples.items() if k not in failed and v}, failed


def _burst_ms(fn: Callable[[], Any], n: int, s: Setting, cuda: bool) -> float:
    _sync(s)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / n
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e3 / n


# ---- one model -------------------------------------------------------------------------------
def run_model(
    spec: ModelSpec, args: argparse.Namespace, on_update: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Build, set up every variant, time them side by side; the row (also passed to
    ``on_update`` at the start of every stage, so a run cut short keeps what finished)."""
    s = make_setting(args)
    row: dict[str, Any] = {"model": spec.name, "family": spec.family, "status": "ok"}
    row |= {"description": spec.description, "dtype": str(s.dtype).removeprefix("torch.")}
    row["variants"] = {}
    reason = spec.unavailable()
    if reason:
        return row | {"status": "skipped", "reason": reason}

    def stage(name: str) -> None:
        row.update(stage=name, stage_started=time.time())
        on_update(row)

    if s.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    _route_like_dnntune()
    with tempfile.TemporaryDirectory() as tmp, _fresh_cache(tmp, args.keep_cache):
        stage("build")
        try:
            w, ref = _build(spec, s)
        except Exception as exc:
            del row["stage"], row["stage_started"]
            return row | {"status": "error", "reason": f"build: {describe(exc)}"}
        _route_globals_like_dnntune(w.model)
        row["inputs"] = [[*t.shape] for t in w.inputs]
        shared = getattr(args, "overrides", None)
        ctx = Context(s, args, Path(shared) if shared else Path(tmp) / "ov.json")
        fns: dict[str, Callable[[], Any]] = {}
        chosen = [v for v in (getattr(args, "variants", "") or "").split(",") if v]
        unknown = sorted(set(chosen) - set(VARIANTS))
        if unknown:
            raise ValueError(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
        for name in [v for v in SETUP_ORDER if not chosen or v in chosen]:
            stage(f"setup {name}")
            prepared, row["variants"][name] = _setup(name, w, ctx, ref)
            if prepared is not None:
                fns[name] = prepared.fn
        stage("timing")
        _time_variants(row["variants"], fns, s, args)
        del row["stage"], row["stage_started"], fns, w
        _release(s)
    return row


def _build(spec: ModelSpec, s: Setting) -> tuple[Workload, torch.Tensor]:
    """The workload (seeded, built on the device; the libraries' warnings kept quiet) and
    eager's output, the reference of every variant."""
    torch.manual_seed(0)
    with warnings.catch_warnings(), s.device:
        warnings.simplefilter("ignore")
        w = spec.build(s)
    with torch.no_grad():
        w.model(*w.inputs)  # cudnn.benchmark picks its algorithms here, outside any timing
        return w, _output(w.model(*w.inputs)).clone()


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _route_like_dnntune() -> None:
    """Route ``F.scaled_dot_product_attention`` and the pools as dnntune's first ``optimize``
    does (for good, for every caller), before anything is compiled: the compiled variants
    trace the functions they later run with, and are not recompiled while timed."""
    from dnntune.torch.routing import install_routers

    install_routers()


def _route_globals_like_dnntune(model: torch.nn.Module) -> None:
    """Route the model's rotary embedding function and transformers' grouped-heads predicate
    as dnntune's ``optimize`` will (for good, in their modules: :mod:`dnntune.torch._rotary`,
    :mod:`dnntune.torch._grouped_heads`), before anything is compiled: a compiled variant
    guards on those globals, and would compile again while timed once ``optimize`` had
    replaced them. Outside an optimized forward the routes run the functions as written."""
    try:
        from dnntune.torch._rotary import install_rotary
    except ImportError:  # a tree from before the route (session 42)
        return
    install_rotary(model)
    try:
        from dnntune.torch._grouped_heads import install_grouped_heads
    except ImportError:  # a tree from before the route (session 43)
        return
    install_grouped_heads()


def _time_variants(
    cells: dict[str, dict[str, Any]],
    fns: dict[str, Callable[[], Any]],
    s: Setting,
    args: argparse.Namespace,
) -> None:
    """Time the prepared variants side by side; their medians, rounds and speedups go into
    their cells (a variant that raised while timed becomes an error cell)."""
    graphs = _dynamo_graphs()
    with torch.no_grad():
        samples, failed = _interleaved(fns, s, args.warmup_s, args.rounds)
    if _dynamo_graphs() != graphs:  # a compiled variant recompiled while warmed up or timed
        for name in ("compile", "max_autotune"):
            if name in fns:
                cells[name]["recompiled_while_timed"] = _dynamo_graphs() - graphs
    for name, reason in failed.items():
        cells[name] |= {"status": "error", "reason": reason}
    eager_ms = statistics.median(samples["eager"]) if "eager" in samples else None
    for name, rounds in samples.items():
        cells[name] |= {"median_ms": statistics.median(rounds), "rounds_ms": rounds}
        if eager_ms:
            cells[name]["speedup"] = eager_ms / cells[name]["median_ms"]


#: the on-disk caches that make a second tune or compile fast: fresh per model by default
CACHE_VARIABLES = ("DNNTUNE_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@contextlib.contextmanager
def _fresh_cache(tmp: str, keep: bool) -> Iterator[None]:
    """dnntune's, Inductor's and Triton's caches in ``tmp``, so tuning and compile seconds are
    first-run costs, alike for both (``keep``: the caches as the environment sets them)."""
    if keep:
        yield
        return
    previous = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    for name in CACHE_VARIABLES:
        os.environ[name] = str(Path(tmp) / name.lower())
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _release(s: Setting) -> None:
    gc.collect()
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)
        torch.cuda.empty_cache()
    with contextlib.suppress(Exception):
        torch._dynamo.reset()
