"""``dnntune bench compare A B``: two results files, row by row, as ratios either way; exit 1
where B regressed (mounted on ``dnntune bench`` by :mod:`dnntune.cli.bench_cmd`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from dnntune.bench.compare import REGRESSIONS, compare_results
from dnntune.bench.report import format_ms
from dnntune.bench.results import SuiteResult, strict_json
from dnntune.cli._output import error, escape, out_console
from dnntune.errors import DnnTuneError

__all__ = ["compare"]


def compare(
    a: Annotated[Path, typer.Argument(help="Baseline results.json", metavar="A")],
    b: Annotated[Path, typer.Argument(help="New results.json", metavar="B")],
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            help="Minimum change in percent, as a ratio either way (5: x1.05 slower or faster).",
        ),
    ] = 5.0,
    metric: Annotated[str, typer.Option("--metric", help="kernel | host")] = "kernel",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """Compare two results files: speedup = A median / B median; exit 1 if B regressed (a
    row slower, or failed or missing in B), 2 on bad input.

    Changes are judged as ratios, the same either way: B is "slower" when B/A exceeds the
    noise factor (at least 1 + threshold, more for rows with a wide IQR), "faster" when A/B
    does, else "within noise".
    """
    try:
        rows = compare_results(SuiteResult.load(a), SuiteResult.load(b), threshold, metric)
    except DnnTuneError as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    out = out_console()
    if as_json:
        # strict JSON, as the results files: a side without a time is null (Python's NaN
        # token is no JSON; jq and JSON.parse refuse it)
        out.print_json(json.dumps(strict_json([r.__dict__ for r in rows]), allow_nan=False))
    else:
        from rich.table import Table

        table = Table(show_edge=False)
        for col in ("graph", "engine", "A median", "B median", "speedup", "noise", "verdict"):
            table.add_column(col)
        for r in rows:
            timed = math.isfinite(r.speedup)
            table.add_row(
                escape(r.graph),
                escape(r.engine),
                format_ms(r.a_median_ms) if math.isfinite(r.a_median_ms) else "-",
                format_ms(r.b_median_ms) if math.isfinite(r.b_median_ms) else "-",
                f"{r.speedup:.3f}x" if timed else "-",
                f"{1 + r.noise_pct / 100:.2f}x" if timed else "-",
                escape(r.verdict),
                style="red" if r.verdict in REGRESSIONS else None,
            )
        out.print(table)
        counts = {
            v: sum(r.verdict == v for r in rows)
            for v in ("faster", "slower", "within noise", "failed in B", "missing in B", "new in B")
        }
        out.print(
            f"{len(rows)} row(s): {counts['faster']} faster, {counts['slower']} slower, "
            f"{counts['within noise']} within noise, {counts['failed in B']} failed in B, "
            f"{counts['missing in B']} missing in B, {counts['new in B']} new in B"
        )
    raise typer.Exit(1 if any(r.verdict in REGRESSIONS for r in rows) else 0)
