"""``dnntune bench``: benchmark graphs per engine (OOTB rows), ``--oracle``, and ``compare``.

Exit codes: 0 ok, 1 an engine row or a graph errored, 2 usage or config error, 3 a row failed
validation, 130 interrupted (the results file is left with ``run.complete: false``).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperGroup

import dnntune as dt
from dnntune.backend.registry import get_registry
from dnntune.bench.config import BenchConfig, BenchConfigError, load_toml, split_engines
from dnntune.bench.plot import plot_results, require_matplotlib
from dnntune.bench.report import (
    LEGEND,
    ORACLE_LEGEND,
    format_ms,
    graph_table,
    oracle_summary_line,
    row_messages,
    summary_line,
)
from dnntune.bench.results import CSV_COLUMNS
from dnntune.bench.runner import BenchRunner
from dnntune.cli._device import cli_device_message
from dnntune.cli._graphs import DEFAULT_MAX_INPUT_GB, expand_graph_paths
from dnntune.cli._output import (
    NO_DOCUMENT,
    err_console,
    error,
    escape,
    existing_document,
    out_console,
    warn,
)
from dnntune.cli.bench_compare import compare
from dnntune.cli.tune_checks import check_engines_run_here
from dnntune.errors import DnnTuneError, InvalidValueError
from dnntune.overrides.store import check_writable

__all__ = ["app"]


def expand_graph_flags(args: list[str]) -> list[str]:
    """``-g a b c`` -> ``-g a -g b -g c`` (click options take one value each)."""
    out: list[str] = []
    in_graphs = pending = False
    for token in args:
        if token in ("-g", "--graph"):
            in_graphs = pending = True
            out.append(token)
        elif in_graphs and not token.startswith("-"):
            out.extend([token] if pending else ["-g", token])
            pending = False
        else:
            in_graphs = pending = False
            out.append(token)
    return out


class _BenchGroup(TyperGroup):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_graph_flags(args))


app = typer.Typer(
    cls=_BenchGroup,
    help="Benchmark graphs per engine; --oracle compares heuristic vs tuned plans.",
)


def _explicit(ctx: typer.Context) -> set[str]:
    """Names of options the user typed (so TOML values are overridden only by those)."""
    explicit = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            explicit.add(name)
    return explicit


def _build_config(ctx: typer.Context, params: dict[str, Any]) -> BenchConfig:
    base: dict[str, Any] = {}
    if params["config"]:
        base = load_toml(params["config"])
    explicit = _explicit(ctx)
    mapping = {
        "graph": "graphs",
        "engine": "engines",
    }
    merged = dict(base)
    for name, value in params.items():
        field = mapping.get(name, name)
        if name == "config":
            continue
        if name in explicit or field not in base:
            if name == "graph":
                value = tuple(value or [])
            if name == "engine":
                value = split_engines(value or [])
                if name in explicit and not value:
                    # `--engine ""` (an empty shell variable) ran every engine, silently
                    raise BenchConfigError(
                        "--engine names no engine; give names or ids, comma separated "
                        "(dnntune engines lists them), or leave it out for every engine"
                    )
            merged[field] = value
    # a flag typed on the command line beats the recipe's opposite (-v over quiet = true)
    for typed, other in (("verbose", "quiet"), ("quiet", "verbose")):
        if typed in explicit and params[typed] and other not in explicit:
            merged[other] = False
    # --backend pytorch typed over a recipe's oracle = true: the oracle tunes dnntune engines,
    # so the typed backend turns it off (it was a usage error, "cannot be used with --backend")
    pytorch_typed = "backend" in explicit and params["backend"] == "pytorch"
    if pytorch_typed and "oracle" not in explicit and merged.get("oracle"):
        merged["oracle"] = False
    else:
        pytorch_typed = False
    # --no-oracle typed over a recipe that tunes: the recipe's --oracle-only settings go with
    # its oracle = true (they were a usage error, "--budget-s limits --oracle's tuning")
    if ("oracle" in explicit and not params["oracle"]) or pytorch_typed:
        for name in ("budget_s", "oracle_mode"):
            if name not in explicit:
                merged[name] = getattr(_DEFAULTS, name)
    return BenchConfig(**merged).check()


_DEFAULTS = BenchConfig()


@app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    graph: Annotated[
        list[str] | None, typer.Option("-g", "--graph", help="Graph file, dir or glob.")
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed launches per row.")] = 10,
    iters: Annotated[int, typer.Option("--iters", help="Minimum timed launches per row.")] = 100,
    min_time_ms: Annotated[
        float,
        typer.Option("--min-time-ms", help="Keep sampling until the summed time reaches this."),
    ] = 0.0,
    cache_mode: Annotated[
        str, typer.Option("--cache-mode", help="warm | cold (flush the LLC before each sample).")
    ] = "warm",
    seed: Annotated[int, typer.Option("--seed", help="Input data seed.")] = 0,
    engine: Annotated[
        list[str] | None, typer.Option("--engine", help="Engine names or ids, comma list.")
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="dnntune | pytorch (a plain eager baseline row).")
    ] = "dnntune",
    validate: Annotated[
        str, typer.Option("--validate", help="none | reference (adds correctness verdicts).")
    ] = "none",
    rtol: Annotated[
        float | None, typer.Option("--rtol", help="Relative tolerance (default per dtype).")
    ] = None,
    atol: Annotated[
        float | None, typer.Option("--atol", help="Absolute tolerance (default per dtype).")
    ] = None,
    oracle: Annotated[
        bool,
        typer.Option(
            "--oracle/--no-oracle",
            help="Also autotune each engine and compare with its heuristic plan.",
        ),
    ] = False,
    budget_s: Annotated[
        float | None,
        typer.Option(
            "--budget-s",
            help="--oracle: wall-time budget of each graph's tuning in seconds, shared by its "
            "engines (cheap, likely candidates first; the rest skipped and reported).",
            show_default=False,
        ),
    ] = None,
    oracle_mode: Annotated[
        str,
        typer.Option(
            "--oracle-mode",
            help="--oracle: standard (plans and knob variants) | exhaustive (also the engines' "
            "own searches: cuDNN benchmarking, torch.compile max-autotune; slow).",
        ),
    ] = "standard",
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="results.json or results.csv")
    ] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Per-row detail.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress output.")] = False,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu | cuda (default: cuda if available).")
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option("--plot", help="Draw OOTB vs tuned to this PNG (needs dnntune[plot])."),
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="TOML recipe (version = 1); flags override it.")
    ] = None,
    max_input_gb: Annotated[
        float,
        typer.Option(
            "--max-input-gb",
            help="Refuse a graph whose input and output buffers need more GiB than this "
            "(padded strides included), before allocating them; 0: no limit.",
        ),
    ] = DEFAULT_MAX_INPUT_GB,
) -> None:
    """Benchmark every graph x engine; with --oracle, also the tuned plan of each engine."""
    if ctx.invoked_subcommand is not None:
        return
    params = dict(ctx.params)
    try:
        cfg = _build_config(ctx, params)
        _check_tolerances(cfg)
        if not cfg.graphs:
            raise BenchConfigError(
                "give at least one graph: -g FILE|DIR|GLOB (or graphs = [...] in --config)"
            )
        graph_paths = expand_graph_paths(cfg.graphs)
        if cfg.plot:
            # before the benchmark, not after it: a missing extra must not cost the whole run
            require_matplotlib()
    except (BenchConfigError, FileNotFoundError, TypeError, InvalidValueError) as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    code = _run(cfg, graph_paths)
    raise typer.Exit(code)


def _check_tolerances(cfg: BenchConfig) -> None:
    """``--rtol``/``--atol`` without ``--validate reference`` compared nothing, silently."""
    given = [flag for flag, v in (("--rtol", cfg.rtol), ("--atol", cfg.atol)) if v is not None]
    if given and cfg.validate != "reference":
        raise BenchConfigError(
            f"{' and '.join(given)} set the tolerance of --validate reference, and rows are "
            "compared with the reference only then; add --validate reference"
        )


def _graph_line(payload: dict[str, Any], total: int, seconds: float) -> str:
    """``[3/21] name: 4 row(s), 4 passed, 12.3 s`` for one finished graph."""
    graph = payload["graph"]
    rows = graph.get("results", [])
    verdicts = Counter(str(r.get("verdict")) for r in rows)
    parts = [f"{len(rows)} row(s)", *(f"{n} {v.replace('_', ' ')}" for v, n in verdicts.items())]
    if graph.get("status") != "ok":
        parts = [str(graph.get("status")).replace("_", " ")]
    name = graph.get("graph_name")
    return f"[{payload['index'] + 1}/{total}] {name}: {', '.join(parts)}, {seconds:.1f} s"


def _output_problem(cfg: BenchConfig, graph_paths: list[Path]) -> str:
    """Why ``--output`` or ``--plot`` cannot be written ("" when they can): a path that is a
    folder or under a file, an unwritable folder, or one of the graphs being benchmarked."""
    inputs = {p.resolve() for p in graph_paths}
    # a folder gets a file name of this kind suggested (it was overrides.json, tune's file)
    outputs = (("--output", cfg.output, "results.json"), ("--plot", cfg.plot, "bench.png"))
    for flag, path, example in outputs:
        if not path:
            continue
        if Path(path).resolve() in inputs:
            return f"{flag} {path} is one of the graphs to benchmark; write the results elsewhere"
        try:
            check_writable(path, example=example)
        except DnnTuneError as exc:
            return f"{flag}: {exc}"
    if cfg.output and not _replaceable(Path(cfg.output).expanduser()):
        # an override file, a graph or another program's CSV was replaced silently, exit 0
        return (
            f"--output {cfg.output} exists and is not a dnntune bench results file; -o would "
            f"replace it: name a new file (e.g. results{Path(cfg.output).suffix}) or remove it "
            "first"
        )
    return ""


def _replaceable(path: Path) -> bool:
    """``-o`` may replace ``path``: nothing there, an empty file, or bench results of the
    same format (a JSON results document, or a CSV with the results' header)."""
    if path.suffix.lower() == ".csv":
        if not path.is_file() or path.stat().st_size == 0:
            return True
        try:
            with path.open(encoding="utf-8", newline="") as f:
                header = f.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError):
            return False
        return header == ",".join(CSV_COLUMNS)
    doc = existing_document(path)
    return doc is NO_DOCUMENT or (
        isinstance(doc, dict) and "schema_version" in doc and isinstance(doc.get("graphs"), list)
    )


def _run(cfg: BenchConfig, graph_paths: list[Path]) -> int:
    out, err = out_console(), err_console()
    problem = _output_problem(cfg, graph_paths)
    if problem:  # before any graph runs: a write that fails at the end loses the whole run
        error(problem)
        return 2
    try:
        handle = dt.create_handle(cfg.device)
    except DnnTuneError as exc:
        error(cli_device_message(str(exc)))
        return 2
    known = [e for e in cfg.engines if get_registry().find(e) is not None]
    if known and len(known) == len(cfg.engines):  # an unknown name is named by the runner
        # as tune: --engine naming only engines that cannot run here is a usage error (it
        # was a "no engines" line per graph and exit 0); some of them: a warning each
        try:
            check_engines_run_here(known, handle)
        except typer.BadParameter as exc:
            error(f"--engine: {exc.message}")
            return 2
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=cfg.quiet,
        transient=True,
    )
    task = progress.add_task("bench", total=len(graph_paths))
    started = [time.perf_counter()]

    def on_event(event: str, payload: dict[str, Any]) -> None:
        if event == "graph_start":
            started[0] = time.perf_counter()
            progress.update(task, description=f"bench {Path(payload['path']).stem}")
        elif event == "warning":
            if not cfg.quiet:
                warn(payload["message"], progress.console)
        elif event == "graph_done":
            progress.advance(task)
            if not cfg.quiet:  # one line per graph, also where the bar cannot show (a log)
                line = _graph_line(payload, len(graph_paths), time.perf_counter() - started[0])
                progress.console.print(line, soft_wrap=True, highlight=False, markup=False)

    try:
        runner = BenchRunner(cfg, handle, graph_paths, argv=sys.argv, on_event=on_event)
    except DnnTuneError as exc:
        error(str(exc))
        return 2
    for message in runner.warnings:
        warn(message)
    interrupted = False
    with progress:
        try:
            result = runner.run()
        except KeyboardInterrupt:
            interrupted = True
            result = runner.result
    out.print(
        escape(
            f"dnntune bench: {len(graph_paths)} graph(s) on {handle.device} "
            f"({result.environment['device'].get('name')}); warmup {cfg.warmup}, iters "
            f"{cfg.iters}, cache {cfg.cache_mode}, seed {cfg.seed}"
            + (f"; oracle tuned in {cfg.oracle_mode} mode" if cfg.oracle else "")
        )
    )
    for g in result.graphs:
        if not g.get("results") and g.get("status") != "ok":
            # a graph that never reached an engine (unreadable, invalid, no engine): one line
            out.print(
                Text(f"{g.get('graph_path')}: {g.get('status')}: {g.get('message')}", style="red")
            )
            continue
        out.print(graph_table(g, cfg.oracle))
        for line in row_messages(g):
            out.print(line)
        if cfg.verbose:
            _verbose(out, g)
    out.print(LEGEND + (ORACLE_LEGEND if cfg.oracle else ""), style="dim")
    summary = result.summary()
    out.print(summary_line(summary))
    if cfg.oracle:
        oracle_line = oracle_summary_line(summary)
        if oracle_line:
            out.print(oracle_line)
    if cfg.output and runner.write_error is None:
        out.print(escape(f"Results: {cfg.output}"))
    elif cfg.output:
        error(f"--output: {runner.write_error}; the results shown above were not saved")
    if cfg.plot and cfg.output is None:
        warn("--plot needs the results; drawing from memory")
    if cfg.plot:
        try:
            plot_results(result.to_dict(), cfg.plot)
        except (DnnTuneError, OSError) as exc:
            error(f"--plot {cfg.plot}: {exc}")
    if interrupted:
        saved = cfg.output and runner.write_error is None
        warn(
            "interrupted: the results file holds the graphs finished so far (complete: false)"
            if saved
            else "interrupted: the graphs finished so far are shown above"
        )
        return 130
    code = result.exit_code()
    # a results file asked for and not written is a failure (3, a failed row, still wins)
    return 1 if code == 0 and runner.write_error is not None else code


def _verbose(out: Any, graph: dict[str, Any]) -> None:
    for r in graph.get("results", []):
        name = (r.get("engine") or {}).get("name")
        out.print(
            f"  [bold]{escape(str(name))}[/]: plan {escape(str(r.get('plan_name')))} "
            f"build {format_ms(r.get('build_ms'))}"
        )
        for kind in ("kernel", "host"):
            s = r.get(kind)
            if s:
                out.print(
                    f"    {kind}: n={s['n']} mean {format_ms(s['mean_ms'])} median "
                    f"{format_ms(s['median_ms'])} std {format_ms(s['std_ms'])} min "
                    f"{format_ms(s['min_ms'])} max {format_ms(s['max_ms'])}"
                )
        corr = r.get("correctness")
        if corr:
            out.print(
                f"    correctness: {'passed' if corr['match'] else 'FAILED'} "
                f"(rtol {corr.get('rtol')}, "
                f"atol {corr.get('atol')}, max_abs_error {corr['max_abs_error']:.3g})"
            )
        o = r.get("oracle")
        if o:
            knobs = (
                ", ".join(f"{k['knob_id']}={k['value']}" for k in o["knob_settings"])
                or "engine defaults"
            )
            out.print(
                f"    oracle: plan {escape(str(o['plan_name']))} (rank {o['rank']}); "
                f"knobs {escape(knobs)}; "
                f"{o['candidates_benchmarked']}/{_candidates_seen(o)} candidates benchmarked "
                f"({o['candidates_failed']} failed"
                + (
                    f", {o['candidates_skipped_budget']} skipped by the budget"
                    if o.get("candidates_skipped_budget")
                    else ""
                )
                + f"); tuning {format_ms(o['tuning_wall_ms'])}"
            )
            d = r.get("oracle_delta")
            if d and d.get("same_plan"):
                out.print(
                    f"    tuning kept the heuristic plan ({o.get('decision')}): 1.00x; its two "
                    f"timings {format_ms(d['baseline_median_ms'])} and "
                    f"{format_ms(d['tuned_median_ms'])} differ by the clock's noise only"
                )
            elif d:
                out.print(
                    f"    {format_ms(d['baseline_median_ms'])} warm heuristic -> "
                    f"{format_ms(d['tuned_median_ms'])} tuned = {d['speedup']:.2f}x (basis kernel)"
                )
        for w in r.get("warnings", []):
            out.print(f"    warning: {escape(str(w))}", style="yellow")


app.command("compare")(compare)


def _candidates_seen(oracle: dict[str, Any]) -> int:
    """The candidates a row's oracle search had: those it tried (``candidates_total``) and
    those its budget skipped, so "1/3 candidates benchmarked (0 failed, 2 skipped by the
    budget)" adds up (it read "1/1 ..., 2 skipped")."""
    return int(oracle["candidates_total"]) + int(oracle.get("candidates_skipped_budget") or 0)
