"""``--plot FILE.png``: OOTB vs tuned kernel medians per graph (needs the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dnntune.errors import InvalidValueError

__all__ = ["INSTALL_HINT", "plot_bars", "plot_results", "require_matplotlib"]

#: how to get the plot dependency (the ``plot`` extra of the package)
INSTALL_HINT = "pip install 'dnntune[plot]'"


def require_matplotlib() -> None:
    """Check that ``--plot`` can draw, before any benchmark runs.

    Raises:
        InvalidValueError: matplotlib is not installed; the message gives the install command.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidValueError(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT} "
            "(or pip install matplotlib)"
        ) from None


def plot_bars(data: dict[str, Any]) -> tuple[list[str], list[float], list[float]]:
    """The chart's labels and bar heights: one pair of bars per timed row.

    With ``--oracle`` both bars come from the confirming measurement the table shows: the
    warm baseline and the tuned plan (the baseline again when tuning kept the same plan);
    without it the tuned bar is NaN (not drawn).
    """
    labels: list[str] = []
    ootb: list[float] = []
    tuned: list[float] = []
    for g in data.get("graphs", []):
        for r in g.get("results", []):
            if not r.get("kernel"):
                continue
            labels.append(f"{g.get('graph_name')}\n{r['engine']['name']}")
            delta = r.get("oracle_delta")
            if delta:  # the warm baseline the speedup compares with, as the table does
                same = delta.get("same_plan")
                ootb.append(delta["baseline_median_ms"])
                tuned.append(delta["baseline_median_ms"] if same else delta["tuned_median_ms"])
            else:
                ootb.append(r["kernel"]["median_ms"])
                tuned.append(float("nan"))
    return labels, ootb, tuned


def plot_results(data: dict[str, Any], path: str | Path) -> None:
    """Draw a grouped bar chart; raises InvalidValueError when matplotlib is missing."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ootb, tuned = plot_bars(data)
    if not labels:
        raise InvalidValueError("--plot: no timed rows to draw")
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], ootb, width=0.4, label="OOTB (heuristic)")
    ax.bar([x + 0.2 for x in xs], tuned, width=0.4, label="tuned")
    ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("kernel median (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
