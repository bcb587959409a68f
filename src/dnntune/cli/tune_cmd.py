"""``dnntune tune``: tune a library of graphs into one engine-override file (RFC 0013 App. B).

The work is :func:`dnntune.tuning.tune_graphs`; this module parses the options, shows a
progress bar over graphs (and the candidate being tried, from the ``autotune:`` log records),
then a table with one row per graph and a summary. Any source of
:class:`~dnntune.tuning.GraphTuneReport` is rendered the same way (:class:`TuneView`): with
``--distributed`` the reports come from :func:`dnntune.distributed.tune_library` (torchrun),
and rank 0 alone prints.

Exit codes: 0 every graph tuned, 1 some graph failed (the others are still in the file),
2 usage error, 130 interrupted (every graph finished before Ctrl-C is in the file).
"""

from __future__ import annotations

import enum
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from dnntune.autotune.types import AutotuneStrategy, PrimingFailurePolicy, TuneMode
from dnntune.backend.handle import create_handle
from dnntune.backend.registry import get_registry
from dnntune.cli._graphs import GRAPH_ARGS_HELP, GRAPH_OPTION_HELP, collect_graph_args, load_graph
from dnntune.cli._output import err_console, error, fmt_ms, fmt_speedup, out_console
from dnntune.errors import DnnTuneError, InvalidValueError
from dnntune.frontend import Graph
from dnntune.tuning import GraphTuneReport, TuneOptions, tune_graphs

__all__ = ["ProgressStatus", "TuneView", "parse_engine_filter", "render_reports", "tune"]


class CacheMode(enum.StrEnum):
    warm = "warm"
    cold = "cold"


class Shard(enum.StrEnum):
    graphs = "graphs"
    candidates = "candidates"


class PrimingFailure(enum.StrEnum):
    abort = "abort"
    unprimed = "unprimed"


_PRIMING = {
    PrimingFailure.abort: PrimingFailurePolicy.ABORT_ON_PRIMING_FAILURE,
    PrimingFailure.unprimed: PrimingFailurePolicy.BENCHMARK_UNPRIMED,
}


def parse_engine_filter(values: Sequence[str] | None) -> list[str]:
    """``--engine A,B --engine C`` -> ``["A", "B", "C"]``, each a known engine name or id.

    Raises:
        typer.BadParameter: for an engine no provider registers (exit code 2).
    """
    tokens = [t.strip() for v in values or [] for t in v.split(",") if t.strip()]
    registry = get_registry()
    for token in tokens:
        if registry.find(token) is None:
            known = ", ".join(e.name for e in registry.engines()) or "none"
            raise typer.BadParameter(
                f"unknown engine {token!r}; known engines: {known}", param_hint="'--engine'"
            )
    return tokens


def _load_all(paths: Sequence[Path]) -> Iterator[tuple[str, Graph | Exception]]:
    """Load graphs lazily, so the progress bar moves while files are read."""
    for path in paths:
        loaded = load_graph(path)
        yield (
            str(path),
            loaded.graph if loaded.graph is not None else InvalidValueError(loaded.error),
        )


def tune(
    graphs: Annotated[
        list[str] | None, typer.Option("-g", "--graph", help=GRAPH_OPTION_HELP, show_default=False)
    ] = None,
    more: Annotated[
        list[str] | None,
        typer.Argument(help=GRAPH_ARGS_HELP, show_default=False, metavar="PATH"),
    ] = None,
    output: Annotated[
        Path,
        typer.Option("-o", "--output", help="Engine-override file (v2) to write the winners to."),
    ] = Path("overrides.json"),
    mode: Annotated[
        TuneMode, typer.Option("--mode", help="exhaustive: prime engine-internal searches first.")
    ] = TuneMode.STANDARD,
    strategy: Annotated[
        AutotuneStrategy, typer.Option("--strategy", help="How many timed runs per candidate.")
    ] = AutotuneStrategy.RUN_UNTIL_STABLE,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs per candidate.")] = 1,
    iters: Annotated[
        int, typer.Option("--iters", min=1, help="Timed runs per candidate (fixed_average).")
    ] = 10,
    max_iters: Annotated[
        int, typer.Option("--max-iters", min=2, help="Cap on timed runs (run_until_stable).")
    ] = 100,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            help="Only these engines (names or ids, comma list; repeatable).",
            show_default=False,
        ),
    ] = None,
    cache_mode: Annotated[
        CacheMode, typer.Option("--cache-mode", help="cold: flush the cache before each sample.")
    ] = CacheMode.warm,
    verify: Annotated[
        bool,
        typer.Option("--verify/--no-verify", help="Check every candidate against the reference."),
    ] = True,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite/--append",
            help="Replace the file's content, or add to it (same problems are replaced).",
        ),
    ] = False,
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu or cuda (default: cuda when available, else cpu)."),
    ] = None,
    priming_failure: Annotated[
        PrimingFailure,
        typer.Option(
            "--priming-failure",
            help="exhaustive mode: abort the graph, or benchmark the engine unprimed.",
        ),
    ] = PrimingFailure.abort,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random inputs.")] = 0,
    details: Annotated[
        bool, typer.Option("--details", help="Also print every candidate of every graph.")
    ] = False,
    report: Annotated[
        Path | None, typer.Option("--report", help="Also write the per-graph reports as JSON.")
    ] = None,
    distributed: Annotated[
        bool,
        typer.Option(
            "--distributed",
            help="Join the torchrun job: ranks share the work, rank 0 writes the file "
            "(`torchrun --nproc-per-node N -m dnntune tune ... --distributed`).",
        ),
    ] = False,
    shard: Annotated[
        Shard,
        typer.Option(
            "--shard",
            help="With --distributed: split the graphs, or each graph's candidates, across ranks.",
        ),
    ] = Shard.graphs,
    dist_timeout_s: Annotated[
        float,
        typer.Option(
            "--dist-timeout-s",
            min=1.0,
            help="With --distributed: limit for every "
            "collective, so a dead rank fails the others instead of hanging.",
        ),
    ] = 600.0,
) -> None:
    """Tune graphs and write each winner to an engine-override file.

    For each graph: every applicable engine is compiled, verified against the reference and
    timed; the winner goes to the file (written as each graph finishes) and is compared with
    the plan the heuristics would pick. A later run reuses the file with
    `DNNTUNE_HEUR_CONFIG_PATH=FILE`. Bad graphs are reported and skipped (exit code 1).
    """
    paths = collect_graph_args(graphs, more)
    engines = parse_engine_filter(engine)
    options = TuneOptions(
        mode=mode,
        strategy=strategy,
        warmup_iterations=warmup,
        timed_iterations=iters,
        max_iterations=max_iters,
        engines=engines,
        cache_mode=cache_mode.value,
        verify=verify,
        priming_failure_policy=_PRIMING[priming_failure],
        seed=seed,
    )
    try:
        options.autotune_config()
    except DnnTuneError as exc:
        raise typer.BadParameter(str(exc)) from None
    if distributed:
        code = _tune_distributed(
            paths, options, output, overwrite, device, shard, dist_timeout_s, details, report
        )
    else:
        try:
            handle = create_handle(device)
        except DnnTuneError as exc:
            raise typer.BadParameter(str(exc), param_hint="'--device'") from None
        status = ProgressStatus()
        reports = tune_graphs(
            _load_all(paths), handle, options, output, overwrite=overwrite, on_start=status.graph
        )
        code = render_reports(
            reports,
            total=len(paths),
            output=output,
            device=str(handle.device),
            details=details,
            report_path=report,
            status=status,
        )
    if code:
        raise typer.Exit(code)


def _tune_distributed(
    paths: Sequence[Path],
    options: TuneOptions,
    output: Path,
    overwrite: bool,
    device: str | None,
    shard: Shard,
    timeout_s: float,
    details: bool,
    report_path: Path | None,
) -> int:
    """``--distributed``: :func:`dnntune.distributed.tune_library`; only rank 0 prints."""
    from dnntune.distributed import DistributedTuneError, init_distributed, tune_library

    try:
        ctx = init_distributed(device, timeout_s)
    except DnnTuneError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--distributed'") from None
    where = f"{ctx.device}, rank 0 of {ctx.world_size}" if ctx.world_size > 1 else ctx.device
    view = TuneView(
        total=len(paths),
        output=output,
        device=where,
        details=details,
        report_path=report_path,
        show=ctx.is_main,
    )
    failure = ""
    try:
        with view:
            result = tune_library(
                list(_load_all(paths)),
                output,
                options,
                overwrite=overwrite,
                shard=shard.value,
                ctx=ctx,
                on_report=view.add,
            )
        view.done = list(result.reports)  # every rank's, in input order
    except KeyboardInterrupt:
        view.interrupted = True
    except DistributedTuneError as exc:
        failure = str(exc)
    finally:
        ctx.close()
    code = view.finish()
    if failure:
        if ctx.is_main:
            error(failure)
        code = code or 1
    return code


# ---- rendering ---------------------------------------------------------------------------------
class ProgressStatus(logging.Handler):
    """The progress bar's text: the graph being tuned and the latest ``autotune:`` record.

    It is a logging handler (on ``dnntune.autotune``) so that the candidate being compiled or
    timed shows without the library knowing about progress bars; ``graph`` is the
    ``on_start`` callback of :func:`dnntune.tuning.tune_graphs`.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.current_graph = ""
        self.current_step = ""
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def attach(self, progress: Progress, task: TaskID) -> None:
        self._progress, self._task = progress, task

    def graph(self, source: str) -> None:
        self.current_graph, self.current_step = Path(source).stem, ""
        self._refresh()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.current_step = record.getMessage().removeprefix("autotune:").strip()
        except Exception:  # a bad log call must never break tuning
            return
        self._refresh()

    def _refresh(self) -> None:
        if self._progress is None or self._task is None:
            return
        text = self.current_graph
        if self.current_step:
            text = f"{text}: {self.current_step}" if text else self.current_step
        self._progress.update(self._task, description=escape(text[:90]))


class TuneView:
    """What ``dnntune tune`` shows: a live progress bar, one line per finished graph, then the
    table and the summary. ``add`` takes reports as they finish (a loop or a callback);
    ``finish`` prints the rest and returns the exit code. ``show=False`` (ranks other than 0
    of a distributed run) prints nothing and still computes the exit code.
    """

    def __init__(
        self,
        total: int,
        output: Path,
        device: str,
        details: bool = False,
        report_path: Path | None = None,
        status: ProgressStatus | None = None,
        show: bool = True,
    ) -> None:
        self.total, self.output, self.device = total, output, device
        self.details, self.report_path, self.show = details, report_path, show
        self.done: list[GraphTuneReport] = []
        self.interrupted = False
        self._start = time.perf_counter()
        self._console = err_console()
        self._progress = Progress(
            SpinnerColumn(),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self._console,
            transient=True,
            disable=not (show and self._console.is_terminal),
        )
        self._task = self._progress.add_task("tuning", total=total)
        self.status = status or ProgressStatus()
        self.status.attach(self._progress, self._task)
        self._log = logging.getLogger("dnntune.autotune")

    def __enter__(self) -> TuneView:
        self._log.addHandler(self.status)
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()
        self._log.removeHandler(self.status)

    def add(self, report: GraphTuneReport) -> None:
        self.done.append(report)
        self._progress.advance(self._task)
        if self.show:
            line = _one_line(report, len(self.done), self.total)
            self._progress.console.print(line, soft_wrap=True)

    def finish(self) -> int:
        """Print the table, failures and summary (when shown); return the exit code."""
        done = self.done
        if self.show:
            elapsed = time.perf_counter() - self._start
            out = out_console()
            if done:
                out.print(_summary_table(done, self.device))
                if self.details:
                    for r in done:
                        out.print(_candidates_table(r))
            for r in done:
                if not r.ok:
                    _print_failure(r)
            if self.report_path is not None:
                text = json.dumps([r.to_dict() for r in done], indent=2) + "\n"
                self.report_path.write_text(text)
            console = err_console() if self.interrupted else out
            _print_summary(console, done, self.total, self.output, elapsed, self.interrupted)
        if self.interrupted:
            return 130
        return 1 if any(not r.ok for r in done) else 0


def render_reports(
    reports: Iterable[GraphTuneReport],
    total: int,
    output: Path,
    device: str,
    details: bool = False,
    report_path: Path | None = None,
    status: ProgressStatus | None = None,
) -> int:
    """Consume reports with a progress bar, then print the table and the summary.

    Any iterable of reports works. Returns the exit code: 0 all tuned, 1 some failed,
    130 interrupted (Ctrl-C; every report consumed before it is shown and kept).
    """
    view = TuneView(total, output, device, details, report_path, status)
    try:
        with view:
            for r in reports:
                view.add(r)
    except KeyboardInterrupt:
        view.interrupted = True
    return view.finish()


#: at most this many candidates' errors are listed under a failed graph (--details: all)
_MAX_CANDIDATE_ERRORS = 4


def _print_failure(r: GraphTuneReport) -> None:
    """One error line for the graph, then why each tried candidate failed (indented)."""
    error(f"{r.source or r.graph_name}: {r.error}")
    failed = [c for c in r.results if not c.succeeded and not c.excluded_by_caller]
    err = err_console()
    for c in failed[:_MAX_CANDIDATE_ERRORS]:
        reason = c.error_message or "failed"
        err.print(f"  {escape(c.plan_name or c.engine_name)}: {escape(reason)}", soft_wrap=True)
    if len(failed) > _MAX_CANDIDATE_ERRORS:
        err.print(f"  ... and {len(failed) - _MAX_CANDIDATE_ERRORS} more (--details lists them)")


def _one_line(r: GraphTuneReport, index: int, total: int) -> str:
    head = f"[{index}/{total}] {escape(r.graph_name)}"
    if not r.ok:
        return f"{head}: [red]failed[/]"
    return (
        f"{head}: {escape(r.winner_plan)} {fmt_ms(r.winner.min_time_ms if r.winner else None)}"
        f" (heuristic {escape(r.heuristic_plan or '-')}, speedup {fmt_speedup(r.speedup)})"
    )


def _break_even(r: GraphTuneReport) -> str:
    if not r.ok or not r.heuristic_plan:
        return "-"
    calls = r.break_even_calls
    return "never" if calls is None else f"{calls:,}"


def _summary_table(reports: list[GraphTuneReport], device: str) -> Table:
    # Names may wrap (fold); numbers never do, so a narrow terminal never truncates a time.
    table = Table(title=f"dnntune tune on {device}")
    table.add_column("graph", overflow="fold", min_width=20)
    table.add_column("winner", overflow="fold")
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("ok", justify="right", no_wrap=True)
    table.add_column("runner-up", overflow="fold")
    table.add_column("margin", justify="right", no_wrap=True)
    table.add_column("heuristic\npick", overflow="fold")
    table.add_column("speedup", justify="right", no_wrap=True)
    table.add_column("tuning\ntime", justify="right", no_wrap=True)
    table.add_column("break-even\ncalls", justify="right", no_wrap=True)
    for r in reports:
        tried = [c for c in r.results if not c.excluded_by_caller]
        cands = f"{sum(1 for c in tried if c.succeeded)}/{len(tried)}"
        if not r.ok:
            table.add_row(escape(r.graph_name), "[red]failed[/]", "-", cands, *["-"] * 6)
            continue
        w, ru = r.winner, r.runner_up
        margin = r.margin
        heuristic = "(same)" if r.same_as_heuristic else escape(r.heuristic_plan or "-")
        table.add_row(
            escape(r.graph_name),
            escape(r.winner_plan),
            fmt_ms(w.min_time_ms if w else None),
            cands,
            escape(ru.plan_name or ru.engine_name) if ru else "-",
            "-" if margin is None else f"{margin * 100:.1f}%",
            heuristic,
            fmt_speedup(r.speedup),
            f"{r.tuning_time_ms / 1000:.2f} s",
            _break_even(r),
        )
    return table


def _candidates_table(r: GraphTuneReport) -> Table:
    table = Table(title=f"{r.graph_name}: candidates")
    table.add_column("rank", justify="right")
    table.add_column("plan", overflow="fold")
    table.add_column("min", justify="right", no_wrap=True)
    table.add_column("median", justify="right", no_wrap=True)
    table.add_column("iters", justify="right", no_wrap=True)
    table.add_column("verified", no_wrap=True)
    table.add_column("note", overflow="fold")
    for c in sorted(r.results, key=lambda c: (c.rank < 0, c.rank)):
        verified = {True: "yes", False: "[red]no[/]", None: "-"}[c.verified]
        table.add_row(
            str(c.rank) if c.rank >= 0 else "-",
            escape(c.plan_name or c.engine_name),
            fmt_ms(c.min_time_ms if c.succeeded else None),
            fmt_ms(c.median_time_ms if c.succeeded else None),
            str(c.iterations_run),
            verified,
            escape(c.error_message),
        )
    return table


def _print_summary(
    console: Console,
    reports: list[GraphTuneReport],
    total: int,
    output: Path,
    elapsed_s: float,
    interrupted: bool,
) -> None:
    tuned = [r for r in reports if r.ok]
    failed = len(reports) - len(tuned)
    faster = [r for r in tuned if (r.speedup or 0) > 1.0 and not r.same_as_heuristic]
    speedups = [r.speedup for r in tuned if r.speedup]
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    parts = [f"tuned {len(tuned)} of {total} graph{'s' * (total != 1)}"]
    if tuned:
        parts.append(f"into {output}")
    parts.append(f"in {elapsed_s:.1f} s")
    line = " ".join(parts)
    if failed:
        line += f"; {failed} failed"
    if speedups:
        line += (
            f"; {len(faster)} faster than the heuristic pick, geomean speedup "
            f"{fmt_speedup(geomean)}"
        )
    console.print(escape(line), soft_wrap=True)
    if interrupted:
        console.print(
            escape(f"interrupted: the {len(tuned)} graph(s) tuned so far are in {output}"),
            soft_wrap=True,
        )
    elif tuned:
        console.print(
            escape(f"reuse it: DNNTUNE_HEUR_CONFIG_PATH={output} dnntune run -g <graphs>"),
            soft_wrap=True,
        )
