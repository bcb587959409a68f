"""``dnntune heuristics``: train, inspect and try the learned engine ranking (HeuristicMode.B).

Mounted by :mod:`dnntune.cli.app` as a sub-app. Exit codes: 0 ok, 1 no training records or an
unreadable model/graph, 2 usage error, 130 interrupted; errors are one line, never a traceback
(the root app's handling, :func:`_guarded`).
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from dnntune import settings
from dnntune._cache_folder import check_root
from dnntune.backend.heuristics import HeuristicMode, problem_preference
from dnntune.backend.learned import (
    DEFAULT_MODEL,
    Decline,
    RankingModel,
    device_class,
    load_model,
    predict,
    problem_of,
)
from dnntune.backend.learned.features import DEFAULT_WEIGHTS
from dnntune.cli._graphs import load_graph
from dnntune.cli._output import error, escape, out_console, warn
from dnntune.cli._train_outputs import check_not_read, check_outputs
from dnntune.errors import DnnTuneError
from dnntune.learning import collect, default_paths, save_model, write_records_file
from dnntune.learning.evaluation import train_and_evaluate, training_params
from dnntune.learning.training import is_cuda_device
from dnntune.overrides.store import atomic_write_text

__all__ = ["app"]

EXIT_FAILED = 1

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(fn: F) -> F:
    """The root app's error handling for a sub-command (``dnntune.cli.app._guarded``): an
    expected error is one line and exit 1, a bug one line (its traceback with ``-v``) and
    exit 1, Ctrl-C exit 130; never a raw traceback.

    Looked up at call time: :mod:`dnntune.cli.app` imports this module while it loads.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from dnntune.cli.app import _guarded as root_guarded

        return root_guarded(fn)(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _finite_non_negative(value: float | None) -> float | None:
    """Option callback: a number >= 0 that a model can store (its file is JSON, which has no
    infinity or NaN; click's own range check would call NaN "not >= 0" without saying why)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"expected a finite number >= 0, got {value}")
    return value


def _device_name(value: str | None) -> str | None:
    """Option callback: a device model name with a letter or digit in it (a blank one keyed
    every record, or the prediction, to device class "unknown", which no device has)."""
    if value is not None and device_class(value) == "unknown":
        raise typer.BadParameter(
            f"expected a device model name such as 'NVIDIA H200' or 'AMD EPYC 7763', got {value!r}"
        )
    return value


def _no_history() -> str:
    """Why the default tuning history is empty, for the error that says so."""
    root = settings.cache_dir()
    cache = root / "autotune-rankings"
    try:
        check_root(root)
    except OSError as exc:  # a file where the folder should be: no cache could be there
        return f"DNNTUNE_CACHE_DIR names {root}: {exc.strerror}; set it to a folder"
    config = settings.heur_config_path()
    named = (
        "DNNTUNE_HEUR_CONFIG_PATH unset"
        if config is None
        else f"DNNTUNE_HEUR_CONFIG_PATH names {config}, which does not exist"
    )
    return f"no exact-match cache at {cache}, {named}"


def _pct(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{100 * value:.1f}%"


def _eval_table(title: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> Table:
    table = Table(title=escape(title))
    columns = ("heuristic", "problems", "top-1", "top-1 clear", "within 2%", "regret geomean")
    for column in (*columns, "p95", "max"):
        table.add_column(column, justify="left" if column == "heuristic" else "right")
    for name, s in (("A (static order)", a), ("B (learned)", b)):
        clear = _pct(s.get("top1_clear"))
        table.add_row(
            name,
            str(s.get("n", 0)),
            _pct(s.get("top1")),
            clear if clear == "-" else f"{clear} of {s.get('n_clear', 0)}",
            _pct(s.get("within_2pct")),
            _pct(s.get("regret_geomean")),
            _pct(s.get("regret_p95")),
            _pct(s.get("regret_max")),
        )
    return table


def _fold_params(p: Mapping[str, Any]) -> str:
    """``k=5 radius=6 op=1`` (``op``: the op-kind weight, where the evaluation stored one)
    and, where an op class has its own, ``(norm: k=3 radius=8)``."""
    own = p.get("per_class") or {}
    extra = "; ".join(
        f"{c}: k={v['k']} radius={v['radius']:g}"
        + (f" op={v['op_weight']:g}" if isinstance(v.get("op_weight"), int | float) else "")
        for c, v in sorted(own.items())
    )
    op = p.get("op_weight")
    weight = f" op={op:g}" if isinstance(op, int | float) else ""
    weight += _rules(p.get("consensus"), p.get("far_gain"))
    return f"k={p['k']} radius={p['radius']:g}{weight}" + (f" ({extra})" if extra else "")


def _rules(consensus: Any, far_gain: Any) -> str:
    """`` consensus=3 far_gain=3`` for the vote rules a model or fold uses ('' for none)."""
    out = f" consensus={consensus}" if isinstance(consensus, int) and consensus else ""
    return out + (f" far_gain={far_gain:g}" if isinstance(far_gain, int | float) else "")


def _show_evaluation(summary: Mapping[str, Any]) -> None:
    console = out_console()
    if not summary.get("problems"):
        # "too little data" was untrue for 17 winner-only problems (new-user audit, session 56)
        console.print(
            "evaluation: no held-out problem could be scored: a score needs problems with two "
            "or more engines timed (bench results, tune reports, records files); override "
            "files and the exact-match cache name each problem's winner only"
        )
        return
    console.print(
        _eval_table(
            f"held-out: {summary['method']}, {summary['folds']} folds, "
            f"{summary['shape_groups']} shapes",
            summary["A"],
            summary["B"],
        )
    )
    console.print(
        f"coverage {_pct(summary['coverage'])} (the rest fell back to A); B changed the pick "
        f"on {summary['changed_pick']} problem(s): {summary['b_better']} better, "
        f"{summary['b_worse']} worse"
    )
    params = ", ".join(_fold_params(p) for p in summary.get("fold_params", []))
    if params:
        console.print(f"per-fold parameters: {params}")
    console.print(
        "top-1 clear: top-1 over the problems whose two fastest engines differ by at least 2 %"
    )
    # records of several devices: each device's scores (the evaluation stores them then)
    for key, what in (("by_op_class", "op class"), ("by_device", "device")):
        split = summary.get(key) or {}
        if split:
            console.print(_split_table(what, split))


def _split_table(what: str, split: Mapping[str, Any]) -> Table:
    """The held-out scores per op class (or per device), one row each."""
    table = Table(title=f"by {what} (held-out)")
    columns = (what, "problems", "answered", "A top-1", "B top-1", "A regret", "B regret")
    for column in columns:
        table.add_column(column, justify="left" if column == what else "right")
    for name, s in split.items():
        table.add_row(
            escape(str(name)),
            str(s["A"].get("n", 0)),
            str(s.get("answered", 0)),
            _pct(s["A"].get("top1")),
            _pct(s["B"].get("top1")),
            _pct(s["A"].get("regret_geomean")),
            _pct(s["B"].get("regret_geomean")),
        )
    return table


@app.command("train")
@_guarded
def train_cmd(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="PATH",
            help="Tuning history: bench results, tune reports, override files, the exact-match "
            "cache, records files, or folders of them (default: $DNNTUNE_CACHE_DIR's "
            "rankings and DNNTUNE_HEUR_CONFIG_PATH's file).",
        ),
    ] = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Where to write the model (JSON).")
    ] = Path("heuristics_model.json"),
    graphs: Annotated[
        list[Path] | None,
        typer.Option(
            "--graphs",
            exists=True,
            help="Folders (or files) of the graph files the results name (repeatable).",
        ),
    ] = None,
    device_name: Annotated[
        str | None,
        typer.Option(
            "--device-name",
            callback=_device_name,
            help="GPU model of sources that name none (tune reports, override entries).",
        ),
    ] = None,
    k: Annotated[
        int | None,
        typer.Option(
            "--k",
            min=1,
            help="Neighbours (default: chosen by grouped K-fold; given, with --radius 3 and "
            "both vote rules unless --radius is given too).",
        ),
    ] = None,
    radius: Annotated[
        float | None,
        typer.Option(
            "--radius",
            callback=_finite_non_negative,
            help="Decline beyond this feature distance, a finite number >= 0, 0: exact matches "
            "only (default: chosen by grouped K-fold; given, with --k 3 unless --k is too).",
        ),
    ] = None,
    folds: Annotated[int, typer.Option("--folds", min=2, help="K of the grouped K-fold.")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the fold assignment.")] = 0,
    records_out: Annotated[
        Path | None, typer.Option("--records-out", help="Also write the records read (JSON).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the evaluation with every case.")
    ] = None,
) -> None:
    """Train the learned engine ranking from tuning history and evaluate it honestly."""
    chosen = list(paths) if paths else default_paths()
    for path in chosen:
        try:
            there = path.exists()
        except OSError as exc:  # a name too long, a folder it may not search
            raise typer.BadParameter(
                f"{path}: cannot look it up: {exc.strerror or exc}", param_hint="PATHS"
            ) from None
        if not there:
            raise typer.BadParameter(f"{path} does not exist", param_hint="PATHS")
    config = settings.heur_config_path()
    if not paths and config is not None and not config.exists() and chosen:
        warn(f"DNNTUNE_HEUR_CONFIG_PATH names {config}, which does not exist; not read")
    if not chosen:
        error(
            f"no tuning history given and none found ({_no_history()}); "
            "pass bench results, override files or folders"
        )
        raise typer.Exit(EXIT_FAILED)
    outputs = (("-o", output), ("--records-out", records_out), ("--json", json_out))
    check_outputs(outputs, [*chosen, *(graphs or [])])
    found = collect(chosen, list(graphs or []), device_name)
    for note in found.notes:
        warn(note)
    if not found.records:
        error(
            f"no training records in {', '.join(str(p) for p in chosen)}; pass "
            "`dnntune bench -o` results, `dnntune tune --report` reports (with --device-name), "
            "override files or the exact-match cache (with --graphs), or folders of them"
        )
        raise typer.Exit(EXIT_FAILED)
    check_not_read(outputs, found.files)
    params = None
    if k is not None or radius is not None:
        base = training_params()
        params = training_params(k=k or base.k, radius=base.radius if radius is None else radius)
    model, evaluation = train_and_evaluate(found.records, params, folds, seed, found.files)
    try:  # written before anything is reported as done
        save_model(model, output)
        if records_out is not None:
            write_records_file(found.records, records_out, sources=found.files)
        if json_out is not None:
            atomic_write_text(json_out, json.dumps(evaluation.to_json(), indent=1) + "\n")
    except DnnTuneError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    console = out_console()
    t = model.training
    console.print(
        f"{t['records']} record(s) from {len(found.files)} file(s): {t['problems']} problem(s) "
        f"({t['measured_problems']} measured, {t['order_only_problems']} winner/order only; "
        f"{t['dropped_single_engine']} with one engine dropped)"
    )
    _show_evaluation(evaluation.summary())
    summary = evaluation.summary()
    if summary.get("problems") and summary["B"]["regret_geomean"] > summary["A"]["regret_geomean"]:
        warn(
            "the learned ranking did worse than the static order on held-out problems; "
            "HeuristicMode.B with this model would be a regression"
        )
    p = model.params
    console.print(
        f"model: {model.point_count} point(s) in {len(model.groups)} group(s), k={p.k}, "
        f"radius={p.radius:g}, op weight={p.weights.get('op', DEFAULT_WEIGHTS['op']):g}, "
        f"margin={p.margin:g}{_rules(p.consensus, p.far_gain)} "
        f"-> {escape(str(output))}"
    )


#: what the library's load error advises: the DNNTUNE_HEUR_MODEL_PATH a run reads, and B's
#: fallback; a file given on the command line needs other advice
_RUNTIME_ADVICE = "; train a model (`dnntune heuristics train"


def _load(model_file: Path) -> RankingModel:
    try:
        return load_model(model_file)
    except DnnTuneError as exc:
        message = str(exc).split(_RUNTIME_ADVICE, 1)[0]
        error(
            f"{message}; give a model that `dnntune heuristics train ... -o FILE` wrote, or "
            f"the one dnntune ships: {DEFAULT_MODEL}"
        )
        raise typer.Exit(EXIT_FAILED) from None


ModelFile = Annotated[
    Path,
    typer.Argument(exists=True, dir_okay=False, metavar="MODEL", help="A heuristics model (JSON)."),
]


@app.command("show")
@_guarded
def show(
    model_file: ModelFile,
    points: Annotated[bool, typer.Option("--points", help="List every trained problem.")] = False,
) -> None:
    """Show what a model holds: parameters, training data, evaluation, groups."""
    model = _load(model_file)
    console = out_console()
    p = model.params
    console.print(
        escape(
            f"{model_file}: created {model.created or '?'} by dnntune "
            f"{model.dnntune_version or '?'}; k={p.k} radius={p.radius:g} margin={p.margin:g} "
            f"min_confidence={p.min_confidence:g}{_rules(p.consensus, p.far_gain)}"
        )
    )
    t = model.training
    if t:
        sources = t.get("sources")
        files = len(sources) if isinstance(sources, list) else "?"
        console.print(
            escape(
                f"trained on {t.get('records', '?')} record(s), "
                f"{t.get('problems', '?')} problem(s) from {files} file(s)"
            )
        )
    if model.evaluation:
        try:
            _show_evaluation(model.evaluation)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # the model's own fields loaded; only the stored evaluation is of another shape
            warn(
                f"{model_file}: the stored evaluation is malformed ({type(exc).__name__}: "
                f"{exc}); not shown. Retrain (`dnntune heuristics train`) to store a new one"
            )
    table = Table(title="groups")
    for column in ("device class", "op class", "points", "fastest engine (points)"):
        table.add_column(column)
    for key in sorted(model.groups):
        g = model.groups[key]
        best = Counter(pt.best() for pt in g.points)
        shown = ", ".join(f"{e} {n}" for e, n in best.most_common())
        table.add_row(escape(g.device_class), escape(g.op_class), str(len(g.points)), escape(shown))
    console.print(table)
    if points:
        listing = Table(title="trained problems")
        for column in ("group", "problem", "engines (slowdown vs fastest)", "records"):
            listing.add_column(column, overflow="fold")
        for key in sorted(model.groups):
            for pt in model.groups[key].points:
                ratios = " ".join(
                    f"{e}={r:.2f}" for e, r in sorted(pt.ratios.items(), key=lambda kv: kv[1])
                )
                listing.add_row(
                    escape(f"{key[0]}/{key[1]}"),
                    escape(pt.problem.label()),
                    escape(ratios),
                    str(pt.records),
                )
        console.print(listing)


@app.command("predict")
@_guarded
def predict_cmd(
    model_file: ModelFile,
    graph: Annotated[
        Path, typer.Option("-g", "--graph", exists=True, dir_okay=False, help="A graph JSON file.")
    ],
    device_name: Annotated[
        str,
        typer.Option(
            "--device-name",
            callback=_device_name,
            help="Device model, e.g. 'NVIDIA H200' or 'AMD EPYC 7763'.",
        ),
    ],
) -> None:
    """Rank the engines for one graph as HeuristicMode.B would (the device's engines in the
    static order as candidates)."""
    model = _load(model_file)
    loaded = load_graph(graph)
    if loaded.graph is None:
        error(f"{graph}: {loaded.error}")
        raise typer.Exit(EXIT_FAILED)
    problem = problem_of(loaded.graph)
    device = device_class(device_name)
    # as training compares with A (learning.training.static_order_names): a CPU gets the CPU
    # order; no engine is measured here, so the device name alone decides
    cuda = is_cuda_device(device, ())
    candidates = list(problem_preference(problem, cuda, HeuristicMode.A))
    result = predict(model, problem, device, candidates)
    console = out_console()
    console.print(f"problem: {escape(problem.label())}")
    console.print(escape(f"static order (A): {', '.join(candidates)}"))
    if isinstance(result, Decline):
        console.print(f"declined: {escape(result.reason)} (HeuristicMode.B falls back to A)")
        return
    console.print(escape(f"learned order (B): {', '.join(result.engines)}"))
    console.print(escape(result.reason))
    for n in result.neighbours:
        console.print(escape(f"  neighbour {n.label}: distance {n.distance:.2f}, fastest {n.best}"))
    if result.knobs:
        console.print(escape(f"suggested knobs (not applied): {result.knobs}"))
