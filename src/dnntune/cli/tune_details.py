"""``dnntune tune --details``: one graph's candidates, ranked, with what became of each."""

from __future__ import annotations

from rich.table import Table

from dnntune.autotune.candidates import FILTERED
from dnntune.cli._output import escape, fmt_ms
from dnntune.rfc import AutotuneResult
from dnntune.workflows.tune_report import plan_label
from dnntune.workflows.tuning import GraphTuneReport

__all__ = ["candidates_table"]


def candidates_table(r: GraphTuneReport) -> Table:
    # escaped: Rich took a plan's knobs ("[torch_compile.mode=reduce-overhead]") for markup
    caption = escape(r.confirmation.describe()) if r.confirmation is not None else None
    table = Table(title=escape(f"{r.graph_name}: candidates"), caption=caption)
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
            escape(plan_label(c)),
            fmt_ms(c.min_time_ms if c.succeeded else None),
            fmt_ms(c.median_time_ms if c.succeeded else None),
            str(c.iterations_run),
            verified,
            escape(
                (_default_label(r, c) if c.is_default else "")
                + ("(abandoned early: clearly slower) " if c.abandoned else "")
                + _note(c)
            ),
        )
    return table


#: what the autotune result says of a candidate the engine filter left out (the RFC's field)
_FILTERED_MESSAGE = f"Plan excluded by {FILTERED}."


def _note(c: AutotuneResult) -> str:
    """A candidate's message as the command line says it: ``--engine``, not the RFC's
    ``engineIdFilter`` that the option fills."""
    if c.excluded_by_caller and c.error_message == _FILTERED_MESSAGE:
        return "left out by --engine"
    return c.error_message


def _default_label(r: GraphTuneReport, c: AutotuneResult) -> str:
    """The note of the candidate tuning compared every other with: the heuristic plan, or,
    when an --engine filter left the heuristic plan out, the heuristics' pick of the engines
    tuned (labelled as the heuristic plan, it contradicted the summary's heuristic pick)."""
    if not r.heuristic_plan or plan_label(c) == r.heuristic_plan:
        return "(heuristic plan) "
    return "(baseline: the heuristics' pick of the engines tuned) "
