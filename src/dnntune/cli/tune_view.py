"""How ``dnntune tune`` shows its work: progress, per-graph lines, tables and the summary.

Any source of :class:`~dnntune.workflows.tuning.GraphTuneReport` is rendered the same way, so the
single-process and the ``--distributed`` runs print alike.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
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

from dnntune.cli._output import (
    busy_line,
    err_console,
    error,
    escape,
    fmt_ms,
    fmt_speedup,
    graph_labels,
    out_console,
    quiet,
)
from dnntune.cli.tune_details import candidates_table
from dnntune.cli.tune_outcome import file_state, print_outcome
from dnntune.errors import DnnTuneError
from dnntune.overrides.store import atomic_write_text
from dnntune.workflows.tune_report import plan_label
from dnntune.workflows.tuning import GraphTuneReport

__all__ = ["ProgressStatus", "TuneView", "render_reports"]


class ProgressStatus(logging.Handler):
    """The progress bar's text: the graph being tuned and the latest ``autotune:`` record.

    It is a logging handler (on ``dnntune.autotune``) so that the candidate being compiled or
    timed shows without the library knowing about progress bars; ``graph`` is the
    ``on_start`` callback of :func:`dnntune.workflows.tuning.tune_graphs`.
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
        run_budget_s: float | None = None,
    ) -> None:
        self.total, self.output, self.device = total, output, device
        self.run_budget_s = run_budget_s
        self.details, self.report_path, self.show = details, report_path, show
        self.done: list[GraphTuneReport] = []
        self.interrupted = False
        self._output_before = file_state(output)  # an interrupt's message says if it changed
        #: the job stopped on an error before its end (a distributed run's failed collective,
        #: or ranks given different jobs); the error is the caller's to print
        self.stopped = False
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
            disable=not (show and self._console.is_terminal) or quiet(),
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
        if self.show and not quiet():  # -q: only errors
            line = _one_line(report, len(self.done), self.total)
            self._progress.console.print(line, soft_wrap=True)

    def finish(self) -> int:
        """Print the table, failures and summary (when shown); return the exit code."""
        done = self.done
        report_failed = False  # a report asked for and not written: exit 1
        if self.show:
            elapsed = time.perf_counter() - self._start
            out = out_console()
            if done:
                out.print(_summary_table(done, self.device))
                if self.details:
                    for r in done:
                        out.print(candidates_table(r))
            for r in done:
                if not r.ok:
                    _print_failure(r)
            # interrupted or stopped before any graph finished: an existing report is kept as
            # it was (it was replaced by "[]"; new-user audits, sessions 56 and 57), and none
            # is created
            unwritten = (self.interrupted or self.stopped) and not done
            if self.report_path is not None and unwritten:
                err_console().print(
                    f"--report {escape(str(self.report_path))} was not written: no graph finished"
                    + (" (the file is as it was)" if self.report_path.exists() else ""),
                    soft_wrap=True,
                )
            elif self.report_path is not None:  # checked before tuning (check_output)
                text = json.dumps([r.to_dict() for r in done], indent=2) + "\n"
                try:
                    atomic_write_text(self.report_path, text)
                except DnnTuneError as exc:
                    error(f"--report: {exc}")
                    report_failed = True
            if self.stopped and not done:  # nothing to sum up: the caller's error says why
                return 1
            console = err_console() if self.interrupted else out
            _print_summary(console, done, self.total, self.output, elapsed, self.interrupted)
            where = cost_line(done, self.run_budget_s, elapsed)
            if where:
                console.print(escape(where), soft_wrap=True)
            changed = file_state(self.output) != self._output_before
            print_outcome(console, done, self.output, self.interrupted, changed)
        if self.interrupted:
            return 130
        return 1 if report_failed or any(not r.ok for r in done) else 0


def render_reports(
    reports: Iterable[GraphTuneReport],
    total: int,
    output: Path,
    device: str,
    details: bool = False,
    report_path: Path | None = None,
    status: ProgressStatus | None = None,
    run_budget_s: float | None = None,
) -> int:
    """Consume reports with a progress bar, then print the table and the summary.

    Any iterable of reports works. Returns the exit code: 0 all tuned, 1 some failed,
    130 interrupted (Ctrl-C; every report consumed before it is shown and kept).
    ``run_budget_s``: the run's budget, for the cost line (:func:`cost_line`).
    """
    view = TuneView(total, output, device, details, report_path, status, run_budget_s=run_budget_s)
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
        err.print(f"  {escape(plan_label(c))}: {escape(reason)}", soft_wrap=True)
    if len(failed) > _MAX_CANDIDATE_ERRORS:
        err.print(f"  ... and {len(failed) - _MAX_CANDIDATE_ERRORS} more (--details lists them)")


#: how the table names each confirmation verdict (dnntune.autotune.confirm)
_DECISIONS = {
    "confirmed": "faster",
    "winner_is_default": "heuristic",
    "kept_default_tie": "kept (tie)",
    "kept_default_slower": "kept (slower)",
    "kept_default_unsure": "kept (unsure)",
    "default_failed": "unconfirmed",
    "no_default": "-",
    "not_checked": "-",
}


_WHY_KEPT = {
    "kept_default_tie": "a tie",
    "kept_default_slower": "slower",
    "kept_default_unsure": "not faster beyond noise",
}


def _decision(r: GraphTuneReport) -> str:
    """The decision in a few words: a confirmed win, or the heuristic plan kept and why."""
    if r.kept_heuristic and r.confirmation is not None and r.confirmation.cpu_busy:
        return "kept (CPU busy)"
    decision = _DECISIONS.get(r.decision, r.decision or "-")
    if r.timed_while_busy:  # the time shown was measured on an oversubscribed CPU
        return "CPU busy" if decision == "-" else f"{decision} (CPU busy)"
    return decision


def _one_line(r: GraphTuneReport, index: int, total: int) -> str:
    head = f"[{index}/{total}] {escape(r.graph_name)}"
    if not r.ok:
        return f"{head}: [red]failed[/]"
    line = (
        f"{head}: {escape(r.chosen_plan)} {fmt_ms(r.chosen_time_ms)}"
        f" (heuristic {escape(r.heuristic_plan or '-')}, speedup {fmt_speedup(r.speedup)}"
    )
    c = r.confirmation
    if r.kept_heuristic and c is not None:
        why = c.busy_reason() if c.cpu_busy else _WHY_KEPT.get(c.verdict, c.verdict)
        line += (
            f"; kept the heuristic plan: {escape(c.winner)} ran at {fmt_speedup(c.speedup)} "
            f"the heuristic plan's speed (its time / {escape(c.winner)}'s) in {c.rounds} "
            f"interleaved rounds, {why}; clock noise "
            f"{100.0 * c.clock_noise:.0f}% per sample"
        )
    elif not r.write_winner:
        line += "; not written: the winner did not beat the heuristic plan"
    if r.timed_while_busy and not (c is not None and r.kept_heuristic and c.cpu_busy):
        line += (
            f"; timed while the CPU was busy (its threads waited for a core "
            f"{100.0 * (r.cpu_wait_share or 0.0):.0f}% of the time): not to be trusted"
        )
    return line + ")"


def _break_even(r: GraphTuneReport) -> str:
    if not r.ok or not r.heuristic_plan:
        return "-"
    calls = r.break_even_calls
    return "never" if calls is None else f"{calls:,}"


def _tuning_time(r: GraphTuneReport) -> str:
    """E.g. "1.23 s" or "1.23 s (3 skipped)" when the budget skipped candidates."""
    skipped = int(r.cost.get("skipped_budget") or 0)
    return f"{r.tuning_time_ms / 1000:.2f} s" + (f" ({skipped} skipped)" if skipped else "")


#: the parts of an autotune() call's wall time that ``cost`` names (the rest is "other")
_COST_PARTS = ("compile_ms", "priming_ms", "timing_ms", "recheck_ms", "confirm_ms")


def cost_line(
    reports: list[GraphTuneReport],
    run_budget_s: float | None = None,
    run_elapsed_s: float | None = None,
) -> str:
    """Where the tuning time went over all graphs, and what budgets skipped ("" if unknown).

    "other" is the rest of the autotune() calls' wall time (``total_ms``): the reference
    outputs that verification compares with, building the heuristic pick, an isolated run's
    worker start. ``run_budget_s``: the run's budget (``--run-budget-s``), said as given; each
    graph's share of it grows as earlier graphs underspend, so the shares do not add up to it.
    The run budget is spent on the run's wall clock (``run_elapsed_s``: loading the graphs,
    making inputs, the heuristic plans and writing the file count too), which is said beside
    what the graphs' tuning used."""
    costs = [r.cost for r in reports if r.cost]
    if not costs:
        return ""

    def total(key: str) -> float:
        return sum(float(c.get(key) or 0.0) for c in costs) / 1000.0

    parts = {key: total(key) for key in _COST_PARTS}
    other = sum(
        max(0.0, float(c.get("total_ms") or 0.0) - sum(float(c.get(k) or 0.0) for k in _COST_PARTS))
        for c in costs
    )
    line = (
        f"tuning time went to: compile {parts['compile_ms']:.2f} s, priming "
        f"{parts['priming_ms']:.2f} s, timing {parts['timing_ms']:.2f} s, re-check "
        f"{parts['recheck_ms']:.2f} s, confirmation {parts['confirm_ms']:.2f} s, other "
        f"{other / 1000.0:.2f} s (reference outputs, the heuristic pick, worker start)"
    )
    budgeted = [c for c in costs if c.get("time_budget_s") is not None]
    if budgeted:
        used = sum(float(c.get("budget_used_s") or 0.0) for c in budgeted)
        shares = {float(c["time_budget_s"]) for c in budgeted}
        skipped = sum(int(c.get("skipped_budget") or 0) for c in budgeted)
        if run_budget_s is not None:
            given = f"run budget {_budget_s(run_budget_s)} s"
        elif len(shares) == 1:
            given = f"budget {_budget_s(shares.pop())} s per graph"
        else:
            given = f"budgets of {_budget_s(min(shares))} to {_budget_s(max(shares))} s"
        line += f"; {given} over {len(budgeted)} graph(s), {used:.2f} s used"
        if run_budget_s is not None and run_elapsed_s is not None:
            # the shares are what is left on the run's wall clock, not of the graphs' tuning
            line += (
                f" by their tuning, {run_elapsed_s:.2f} s by the run (on whose clock the run "
                "budget is spent: loading, inputs, heuristic plans and writing count too)"
            )
        line += f", {skipped} candidate(s) skipped"
    abandoned = sum(int(c.get("abandoned") or 0) for c in costs)
    if abandoned:
        line += f"; {abandoned} candidate(s) abandoned early as clearly slower"
    return line


def _budget_s(seconds: float) -> str:
    """A budget as given, in seconds: two decimals, or three significant digits below 0.01 s.
    ``--budget-s 0.001`` read "budget 0.00 s per graph", a budget the option refuses (new-user
    audit, session 61)."""
    return f"{seconds:.2f}" if seconds >= 0.01 else f"{seconds:.3g}"


def _summary_table(reports: list[GraphTuneReport], device: str) -> Table:
    # Names may wrap (fold); numbers never do, so a narrow terminal never truncates a time.
    table = Table(title=escape(f"dnntune tune on {device}"))
    table.add_column("graph", overflow="fold", min_width=20)
    table.add_column("winner", overflow="fold")
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("ok", justify="right", no_wrap=True)
    table.add_column("runner-up", overflow="fold")
    table.add_column("margin", justify="right", no_wrap=True)
    table.add_column("heuristic\npick", overflow="fold")
    table.add_column("speedup", justify="right", no_wrap=True)
    table.add_column("decision")  # wraps at its spaces: "heuristic (CPU busy)" is wide
    table.add_column("tuning\ntime", justify="right")  # "(2 skipped)" may go below
    table.add_column("break-even\ncalls", justify="right", no_wrap=True)
    labels = graph_labels([(r.graph_name, r.source) for r in reports])
    for r, label in zip(reports, labels, strict=True):
        # variants the engine cannot run here are not counted: not applicable, not failed
        tried = r.tried
        cands = f"{sum(1 for c in tried if c.succeeded)}/{len(tried)}"
        if not r.ok:
            table.add_row(escape(label), "[red]failed[/]", "-", cands, *["-"] * 7)
            continue
        # the plan in force: the heuristic plan where it was kept, and the challenger that
        # lost as the runner-up (an --engine filter may have left the heuristic plan out)
        chosen = r.chosen_plan
        ru = r.winner if chosen != r.winner_plan else r.runner_up
        margin = r.margin
        same = r.same_as_heuristic or (bool(chosen) and chosen == r.heuristic_plan)
        heuristic = "(same)" if same else escape(r.heuristic_plan or "-")
        table.add_row(
            escape(label),
            escape(chosen),
            fmt_ms(r.chosen_time_ms),
            cands,
            escape(ru.plan_name or ru.engine_name) if ru else "-",
            _margin(margin, r.kept_heuristic),
            heuristic,
            fmt_speedup(r.speedup),
            _decision(r),
            _tuning_time(r),
            _break_even(r),
        )
    return table


def _margin(margin: float | None, kept_heuristic: bool) -> str:
    """The margin column: how much slower the runner-up is than the plan in force; ``tie``
    where it was not slower (the ranking kept the winner on its decision time, or the cheaper
    build among equals, within noise of a runner-up the paired rounds read faster: a
    negative percentage read as nonsense, new-user audit, session 55)."""
    if margin is None or kept_heuristic:
        return "-"
    return "tie" if margin <= 0.0 else f"{margin * 100:.1f}%"


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
    faster = [
        r
        for r in tuned
        if r.decision == "confirmed"
        or (not r.decision and (r.speedup or 0) > 1.0 and not r.same_as_heuristic)
    ]
    kept = [r for r in tuned if r.kept_heuristic or not r.write_winner]
    speedups = [r.speedup for r in tuned if r.speedup]
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    written = [r for r in tuned if r.written_to]
    parts = [f"tuned {len(tuned)} of {total} graph{'s' * (total != 1)}"]
    if written:
        parts.append(f"into {output}")
    parts.append(f"in {elapsed_s:.1f} s")
    line = " ".join(parts)
    if failed:
        line += f"; {failed} failed"
    if tuned and len(written) < len(tuned) and not interrupted:
        # an --engine winner that did not beat the heuristic pick: the file is left alone
        line += (
            f"; {len(tuned) - len(written)} not written (no faster plan than the heuristic "
            "pick among the engines tried)"
        )
    if speedups:
        line += (
            f"; {len(faster)} faster than the heuristic pick (confirmed beyond noise), geomean "
            f"speedup {fmt_speedup(geomean)}"
        )
    if kept:
        line += f"; {len(kept)} kept the heuristic pick (no faster plan beyond noise)"
    console.print(escape(line), soft_wrap=True)
    shares = [r.cpu_wait_share for r in tuned if r.timed_while_busy]
    line = busy_line(shares, "marked 'CPU busy'", "tune")
    if line:
        console.print(escape(line), soft_wrap=True)
