"""``dnntune tune``: tune a library of graphs into one engine-override file (RFC 0013 App. B).

The work is :func:`dnntune.workflows.tuning.tune_graphs`; this module parses the options, shows a
progress bar over graphs (and the candidate being tried, from the ``autotune:`` log records),
then a table with one row per graph and a summary. Any source of
:class:`~dnntune.workflows.GraphTuneReport` is rendered the same way (:class:`TuneView`): with
``--distributed`` the reports come from :func:`dnntune.distributed.tune_library` (torchrun),
and rank 0 alone prints. The options are checked before any tuning (``tune_checks.py``).

Exit codes: 0 every graph tuned, 1 some graph failed (the others are still in the file), or
the existing file cannot take entries (checked before tuning), 2 usage error (including an
output path that cannot be written, checked before tuning), 130 interrupted (every graph
finished before Ctrl-C is in the file).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import io
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from dnntune.cli._device import handle_for
from dnntune.cli._graphs import (
    DEFAULT_MAX_INPUT_GB,
    GraphArgs,
    GraphOption,
    MaxInputGbOption,
    Parsed,
    collect_graph_args,
    finite,
    load_graph,
    max_input_bytes,
)
from dnntune.cli._output import configure_logging, error, out_console, plural
from dnntune.cli.tune_checks import (
    check_engines_run_here,
    check_output,
    check_same_device,
    check_strategy_options,
    parse_engine_filter,
)
from dnntune.cli.tune_view import ProgressStatus, TuneView, render_reports
from dnntune.distributed import (
    DistContext,
    DistributedTuneError,
    init_distributed,
    launched_by_torchrun,
    tune_library,
)
from dnntune.errors import DnnTuneError, InvalidValueError
from dnntune.frontend import Graph
from dnntune.rfc import AutotuneStrategy, PrimingFailurePolicy, TuneMode
from dnntune.workflows.tuning import TuneOptions, tune_graphs

__all__ = ["ProgressStatus", "TuneView", "parse_engine_filter", "render_reports", "tune"]


class CacheMode(enum.StrEnum):
    warm = "warm"
    cold = "cold"


class RankingMetric(enum.StrEnum):
    latency = "latency"
    device = "device"
    throughput = "throughput"


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


def _load_all(paths: Sequence[Path], parsed: Parsed) -> Iterator[tuple[str, Graph | Exception]]:
    """Load graphs lazily, so the progress bar moves while files are read."""
    for path in paths:
        loaded = load_graph(path, parsed=parsed)
        yield (
            str(path),
            loaded.graph if loaded.graph is not None else InvalidValueError(loaded.error),
        )


_F = TypeVar("_F", bound=Callable[..., Any])


def _launch_rank() -> int:
    """This process's rank in a torchrun job (RANK); 0 when not launched by torchrun."""
    if not launched_by_torchrun():
        return 0
    try:
        return int(os.environ["RANK"])
    except ValueError:  # init_distributed names the bad value (rank 0 says it)
        return 0


def _errors_said_by_rank_0(fn: _F) -> _F:
    """``--distributed``: usage and expected errors that end the command (a bad ``-o``, an
    engine that cannot run here) are rank 0's to say; every other rank exits with the same
    code (2 usage, 1 other) and prints nothing. Errors of one rank during the tuning are
    printed by that rank (``_tune_distributed``) and never reach this."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("distributed") or _launch_rank() == 0:
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except typer.BadParameter as exc:
            raise typer.Exit(exc.exit_code) from None
        except DnnTuneError:
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


@_errors_said_by_rank_0
def tune(
    graphs: GraphOption = None,
    more: GraphArgs = None,
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
        int | None,
        typer.Option(
            "--iters",
            min=1,
            show_default=False,
            help="Timed runs per candidate (fixed_average) [default: 10].",
        ),
    ] = None,
    max_iters: Annotated[
        int | None,
        typer.Option(
            "--max-iters",
            min=2,
            show_default=False,
            help="Cap on timed runs (run_until_stable) [default: 100].",
        ),
    ] = None,
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
    ranking_metric: Annotated[
        RankingMetric,
        typer.Option(
            "--ranking-metric",
            help="Clock to rank on: latency (one call on an idle device, host included), "
            "device (kernel time), throughput (calls back to back: max of host and device).",
        ),
    ] = RankingMetric.latency,
    sweep_knobs: Annotated[
        bool,
        typer.Option(
            "--sweep-knobs",
            help="Also try each engine's small knob spaces one knob at a time "
            "(e.g. TORCH_ENGINE with CUDA-graph replay).",
        ),
    ] = False,
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
        PrimingFailure | None,
        typer.Option(
            "--priming-failure",
            show_default=False,
            help="exhaustive mode: abort the graph, or benchmark the engine unprimed "
            "[default: abort].",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random inputs.")] = 0,
    budget_s: Annotated[
        float | None,
        typer.Option(
            "--budget-s",
            help="Wall-time budget of each graph's tuning in seconds: cheap, likely candidates "
            "first; the rest are skipped (and reported) once it is spent.",
            show_default=False,
        ),
    ] = None,
    run_budget_s: Annotated[
        float | None,
        typer.Option(
            "--run-budget-s",
            help="Wall-time budget of the whole run in seconds, split over the graphs "
            "left (each at most --budget-s).",
            show_default=False,
        ),
    ] = None,
    max_input_gb: MaxInputGbOption = DEFAULT_MAX_INPUT_GB,
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
        Shard | None,
        typer.Option(
            "--shard",
            help="With --distributed: split the graphs (the default), or each graph's "
            "candidates, across ranks.",
            show_default=False,
        ),
    ] = None,
    dist_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--dist-timeout-s",
            min=1.0,
            callback=finite,
            help="With --distributed: limit for every "
            "collective, so a dead rank fails the others instead of hanging [default: 600].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Tune graphs and write each winner to an engine-override file.

    For each graph: every applicable engine is compiled, verified against the reference and
    timed; the winner goes to the file (written as each graph finishes) and is compared with
    the plan the heuristics would pick. A later run reuses the file with
    `DNNTUNE_HEUR_CONFIG_PATH=FILE`. Bad graphs are reported and skipped (exit code 1).
    """
    parsed: Parsed = {}
    paths = collect_graph_args(graphs, more, parsed)
    engines = parse_engine_filter(engine)
    check_strategy_options(strategy, iters, max_iters, mode, priming_failure)
    options = TuneOptions(
        mode=mode,
        strategy=strategy,
        warmup_iterations=warmup,
        timed_iterations=10 if iters is None else iters,
        max_iterations=100 if max_iters is None else max_iters,
        engines=engines,
        cache_mode=cache_mode.value,
        verify=verify,
        ranking_metric=ranking_metric.value,
        priming_failure_policy=_PRIMING[priming_failure or PrimingFailure.abort],
        seed=seed,
        sweep_knobs=sweep_knobs,
        max_input_bytes=max_input_bytes(max_input_gb),
        time_budget_s=budget_s,
        run_budget_s=run_budget_s,
    )
    if ranking_metric.value == "throughput" and cache_mode.value == "cold":
        # said in the options' words, not AutotuneConfig's (ranking_metric=..., cache_mode=...)
        raise typer.BadParameter(
            "--ranking-metric throughput times calls back to back, so the cache cannot be "
            "flushed between them: give --cache-mode warm, or rank on --ranking-metric latency "
            "or device for cold-cache timing",
            param_hint="'--ranking-metric'",
        )
    try:
        options.autotune_config()
    except DnnTuneError as exc:
        hint = "'--run-budget-s'" if "run_budget_s" in str(exc) else None
        if "time_budget_s" in str(exc):
            hint = "'--budget-s'"
        # the config's field names are the library's; a user of the CLI typed the options
        message = str(exc).replace("run_budget_s", "--run-budget-s")
        message = message.replace("time_budget_s", "--budget-s")
        raise typer.BadParameter(message, param_hint=hint) from None
    for given, name in ((shard, "--shard"), (dist_timeout_s, "--dist-timeout-s")):
        if given is not None and not distributed:  # it would do nothing, silently
            raise typer.BadParameter(
                f"{name} applies to a distributed run only; add --distributed (under torchrun) "
                f"or leave {name} out",
                param_hint=f"'{name}'",
            )
    if distributed and run_budget_s is not None:
        raise typer.BadParameter(
            "--run-budget-s splits one process's run over its graphs; with --distributed give "
            "each graph a --budget-s",
            param_hint="'--run-budget-s'",
        )
    check_output(output, overwrite, report, paths)
    if distributed:
        code = _tune_distributed(
            paths,
            parsed,
            options,
            output,
            overwrite,
            device,
            shard or Shard.graphs,
            600.0 if dist_timeout_s is None else dist_timeout_s,
            details,
            report,
        )
    else:
        handle = handle_for(device)
        check_engines_run_here(engines, handle)
        check_same_device(output, overwrite, handle)
        status = ProgressStatus()
        reports = tune_graphs(
            _load_all(paths, parsed),
            handle,
            options,
            output,
            overwrite=overwrite,
            on_start=status.graph,
            total=len(paths),
        )
        code = render_reports(
            reports,
            total=len(paths),
            output=output,
            device=str(handle.device),
            details=details,
            report_path=report,
            status=status,
            run_budget_s=run_budget_s,
        )
    if code:
        raise typer.Exit(code)


def _tune_distributed(
    paths: Sequence[Path],
    parsed: Parsed,
    options: TuneOptions,
    output: Path,
    overwrite: bool,
    device: str | None,
    shard: Shard,
    timeout_s: float,
    details: bool,
    report_path: Path | None,
) -> int:
    """``--distributed``: :func:`dnntune.distributed.tune_library`; only rank 0 prints the
    results. A rank whose collective failed says so itself (rank 0 may be gone)."""
    try:
        ctx = init_distributed(device, timeout_s)
    except DnnTuneError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--distributed'") from None
    _check_rank_can_run(ctx, [str(e) for e in options.engines], output, overwrite)
    _quiet_other_rank(ctx)
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
    finished = False  # every collective answered: safe to wait for the peers before leaving
    try:
        with view:
            result = tune_library(
                list(_load_all(paths, parsed)),
                output,
                options,
                overwrite=overwrite,
                shard=shard.value,
                ctx=ctx,
                on_report=view.add,
            )
        view.done = list(result.reports)  # every rank's, in input order
        finished = True
    except KeyboardInterrupt:
        view.interrupted = True
    except DistributedTuneError as exc:  # names this rank and the round
        failure = str(exc)
    except DnnTuneError as exc:  # this rank alone: the others stop at their next collective
        failure = f"rank {ctx.rank}: {exc}"
    finally:
        ctx.close(wait_for_peers=finished)
    view.stopped = bool(failure)
    code = view.finish()
    if failure:
        error(failure)  # on every rank that failed: rank 0 may be the one that is gone
        code = code or 1
    elif shard is Shard.candidates and ctx.is_main and not view.interrupted:
        code = _report_agreement(result.decisions, ctx.world_size) or code
    return code


def _check_rank_can_run(
    ctx: DistContext, engines: Sequence[str], output: Path, overwrite: bool
) -> None:
    """Before tuning, as a one-process run checks: this rank's device exists, ``--engine``
    names an engine that runs on it (a usage error on every rank alike; rank 0 alone says it
    and warns about the engines left out) and the file appended to was tuned on it (exit 1 on
    every rank; rank 0 says why)."""
    try:
        handle = handle_for(ctx.device)
        said = (
            contextlib.nullcontext() if ctx.is_main else contextlib.redirect_stderr(io.StringIO())
        )
        with said:
            check_engines_run_here(engines, handle)
        check_same_device(output, overwrite, handle)
    except typer.BadParameter:
        ctx.close()  # every rank stops here: leave the job together
        raise
    except InvalidValueError:
        ctx.close()
        if ctx.is_main:
            raise
        raise typer.Exit(1) from None


def _quiet_other_rank(ctx: DistContext) -> None:
    """Ranks other than 0 log errors only (unless ``-v`` asked for more): what they met is in
    rank 0's table, and an expected outcome (an engine failing on one rank) is no warning."""
    if ctx.is_main:
        return
    levels = [
        h.level
        for h in logging.getLogger("dnntune").handlers
        if getattr(h, "_dnntune_cli_handler", False)
    ]
    if levels and min(levels) == logging.WARNING:
        configure_logging(logging.ERROR)


def _report_agreement(decisions: Sequence[Sequence[str]], world_size: int) -> int:
    """Candidate mode: say whether every rank built the same winner (1 when they did not).
    A graph no rank built a plan for (it failed, or had no winner), or one some rank could
    not build (a failure of that graph, reported with it), is not counted."""
    split = [i for i, names in enumerate(decisions) if len(set(names) - {""}) > 1]
    if split:
        error(
            f"ranks built different winners for {len(split)} of {plural(len(decisions), 'graph')} "
            f"(graph indices {split}); this is a bug, please report it with --details output"
        )
        return 1
    agreed = sum(1 for names in decisions if names and all(names))
    if not agreed:
        return 0
    if agreed == len(decisions):
        graphs = f"all {agreed} graphs" if agreed > 1 else "the graph"
        line = f"{world_size} ranks built the same winner for {graphs}"
    else:
        others = "the other" if len(decisions) - agreed == 1 else "the others"
        line = (
            f"{world_size} ranks built the same winner for every graph tuned ({agreed} of "
            f"{len(decisions)}; {others} failed or had no winner, see above)"
        )
    out_console().print(line)
    return 0
