"""``dnntune run``: run graphs on their heuristic plan, check them against the reference, time them.

With ``DNNTUNE_HEUR_CONFIG_PATH=overrides.json`` the heuristics read the file ``dnntune tune``
wrote, so this is also how a later run reuses the tuning: the "chosen by" column then says
``config`` for the graphs the file matched.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import CONFIG_POLICY
from dnntune.cli._config_devices import other_device_note
from dnntune.cli._device import handle_for
from dnntune.cli._graphs import (
    DEFAULT_MAX_INPUT_GB,
    GraphArgs,
    GraphOption,
    MaxInputGbOption,
    Parsed,
    check_output_option,
    collect_graph_args,
    load_graph,
    max_input_bytes,
    resolved,
)
from dnntune.cli._output import (
    busy_line,
    err_console,
    error,
    escape,
    fmt_ms,
    graph_labels,
    out_console,
    plural,
    refuse_other_kind,
)
from dnntune.errors import DnnTuneError
from dnntune.graph.json_numbers import strict_json_numbers
from dnntune.overrides.store import atomic_write_text
from dnntune.settings import heur_config_path
from dnntune.workflows.heuristic_run import CONFIG_FALLBACK_POLICY, GraphRunReport, run_graph

#: Ctrl-C, as every command exits on it (the graphs finished so far are shown first)
EXIT_INTERRUPTED = 130

__all__ = ["run"]

_log = logging.getLogger(__name__)


def _policy_label(policy: str) -> str:
    """``SelectionHeuristic::Config`` -> ``config``; ``...::StaticOrdering`` -> ``static``;
    ``...::ConfigFallback`` (the file's plan could not be built here) -> ``fallback``."""
    short = policy.rsplit("::", 1)[-1]
    labels = {"StaticOrdering": "static", "Config": "config", "ConfigFallback": "fallback"}
    return labels.get(short, short.lower() or "-")


def run(
    graphs: GraphOption = None,
    more: GraphArgs = None,
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu or cuda (default: cuda when available, else cpu)."),
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 3,
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed runs per graph.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random inputs.")] = 0,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Compare outputs with the reference.")
    ] = True,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the results to this JSON file.")
    ] = None,
    max_input_gb: MaxInputGbOption = DEFAULT_MAX_INPUT_GB,
) -> None:
    """Run each graph on the engine the heuristics choose; check it against the reference.

    Prints one row per graph: the plan, the policy that chose it (`config` when an override
    file set by DNNTUNE_HEUR_CONFIG_PATH matched), the time per call and the verdict.
    Exit code 0 when every graph ran and matched, 1 otherwise, 2 for a usage error.
    """
    parsed: Parsed = {}
    paths = collect_graph_args(graphs, more, parsed)
    if json_out is not None:  # before any graph runs: a write that fails at the end loses it
        check_output_option(json_out, paths, "'--json'", "the results", example="run_results.json")
        _check_json_out(json_out)
    handle = handle_for(device)

    reports: list[GraphRunReport] = []
    failed_write = interrupted = False
    err = err_console()
    try:
        _run_graphs(paths, parsed, handle, reports, warmup, iters, seed, verify, max_input_gb)
    except KeyboardInterrupt:
        # as tune and bench: the graphs finished so far are shown (and written), exit 130
        interrupted = True
    if interrupted and not reports:
        err.print(
            "interrupted before any graph finished"
            + ("" if json_out is None else f"; {json_out} was not written")
        )
        raise typer.Exit(EXIT_INTERRUPTED)

    _print_table(reports, str(handle.device), verify)
    for r in reports:
        if r.error:
            error(f"{r.source or r.graph_name}: {r.error}")
    if json_out is not None:
        try:
            # strict JSON: a non-finite error (an output that is inf) as the string "inf", as
            # graph files write it; a bare Infinity token failed strict parsers (new-user audit)
            doc = strict_json_numbers([r.to_dict() for r in reports])
            atomic_write_text(json_out, json.dumps(doc, indent=2, allow_nan=False) + "\n")
        except DnnTuneError as exc:
            error(f"--json: {exc}")
            failed_write = True
    failed = sum(1 for r in reports if not r.ok)
    ran = f"{len(reports) - failed} of {plural(len(reports), 'graph')} ran"
    summary = f"{ran} and matched the reference" if verify else f"{ran} (not verified)"
    (err if failed else out_console()).print(summary)
    shares = [r.cpu_wait_share for r in reports if r.timed_while_busy]
    line = busy_line(shares, "times marked '*'", "run")
    if line:
        out_console().print(escape(line), soft_wrap=True)
    note = _config_note(reports, handle)
    if note:
        out_console().print(escape(note), soft_wrap=True)
    if interrupted:
        kept = "" if json_out is None or failed_write else f" (and in {json_out})"
        err.print(
            f"interrupted after {plural(len(reports), 'graph')} of {len(paths)}: the graphs "
            f"finished so far are shown above{kept}"
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if failed or failed_write:  # a results file asked for and not written is a failure too
        raise typer.Exit(1)


def _run_graphs(
    paths: list[Path],
    parsed: Parsed,
    handle: Handle,
    reports: list[GraphRunReport],
    warmup: int,
    iters: int,
    seed: int,
    verify: bool,
    max_input_gb: float,
) -> None:
    """Run each graph and append its report to ``reports`` as it finishes (so an interrupt
    keeps those done)."""
    with err_console().status("running graphs") as status:
        for i, path in enumerate(paths, 1):
            status.update(f"[{i}/{len(paths)}] {escape(str(path))}")
            loaded = load_graph(path, parsed=parsed)
            if loaded.graph is None:
                reports.append(
                    GraphRunReport(graph_name=path.stem, source=str(path), error=loaded.error)
                )
                continue
            try:
                report = run_graph(
                    loaded.graph,
                    handle,
                    warmup_iterations=warmup,
                    timed_iterations=iters,
                    seed=seed,
                    verify=verify,
                    source=str(path),
                    max_input_bytes=max_input_bytes(max_input_gb),
                )
            except Exception as exc:
                # Not one of dnntune's errors (a CUDA out-of-memory RuntimeError, an engine's
                # bug): this graph failed, the others still run, as in `tune`.
                _log.debug("run: %s raised", path, exc_info=True)
                report = GraphRunReport(
                    graph_name=loaded.graph.name or path.stem,
                    source=str(path),
                    device=str(handle.device),
                    error=f"{type(exc).__name__}: {exc}",
                )
            reports.append(report)


def _config_note(reports: list[GraphRunReport], handle: Handle) -> str:
    """The line that says the override file was tuned on another device ("" when none is to
    be said): only when the heuristics were asked and no graph took its plan from the file
    (every row ``static``), since a file that chose plans here is this device's too."""
    asked = [r.policy for r in reports if r.policy]
    if not asked or any(p in (CONFIG_POLICY, CONFIG_FALLBACK_POLICY) for p in asked):
        return ""
    return other_device_note(handle)


def _is_run_results(doc: Any) -> bool:
    """A ``run --json`` file: a list of one object per graph, each naming its graph and plan."""
    return isinstance(doc, list) and all(
        isinstance(r, dict) and {"graph", "plan", "policy"} <= r.keys() for r in doc
    )


def _check_json_out(json_out: Path) -> None:
    """``--json`` is not the override file this run reads, and replaces only run results (an
    override file given to it lost all its entries, exit 0: audit, session 18). An empty file
    may be replaced.

    Raises:
        typer.BadParameter: naming the path and what to do instead (exit 2).
    """
    config = heur_config_path()
    if config is not None and resolved(config) == resolved(json_out):
        raise typer.BadParameter(
            f"{json_out} is the override file this run reads (DNNTUNE_HEUR_CONFIG_PATH); "
            "give the results another name",
            param_hint="'--json'",
        )
    refuse_other_kind(
        json_out, _is_run_results, "--json", "a dnntune run results file", "run_results.json"
    )


def _verdict(report: GraphRunReport) -> str:
    if report.error and report.passed is False:
        return "[red]MISMATCH[/]"
    if report.error:
        return "[red]FAILED[/]"
    if report.passed is None:
        return "[yellow]ran[/]"
    return "[green]PASS[/]"


def _print_table(reports: list[GraphRunReport], device: str, verified: bool) -> None:
    # with --no-verify nothing was compared with the reference: the title says so
    what = "heuristic plan vs reference" if verified else "heuristic plan (not verified)"
    table = Table(title=f"dnntune run on {device}: {what}")
    table.add_column("graph", overflow="fold")
    table.add_column("engine (plan)", overflow="fold")
    table.add_column("chosen by", no_wrap=True)
    table.add_column("time (min)", justify="right", no_wrap=True)
    table.add_column("median", justify="right", no_wrap=True)
    table.add_column("max abs err", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    labels = graph_labels([(r.graph_name, r.source) for r in reports])
    for r, label in zip(reports, labels, strict=True):
        mark = "*" if r.timed_while_busy else ""  # a line under the table says why
        table.add_row(
            escape(label),
            escape(r.plan or "-"),
            _policy_label(r.policy) if r.policy else "-",
            fmt_ms(r.time_ms) + mark,
            fmt_ms(None if r.timing is None else r.timing.median_ms) + mark,
            "-" if r.max_abs_error is None else f"{r.max_abs_error:.2e}",
            _verdict(r),
        )
    out_console().print(table)
