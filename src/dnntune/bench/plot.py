"""``--plot FILE.png``: OOTB vs tuned kernel medians per graph (needs the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dnntune.errors import InvalidValueError

__all__ = ["INSTALL_HINT", "plot_results", "require_matplotlib"]

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


def plot_results(data: dict[str, Any], path: str | Path) -> None:
    """Draw a grouped bar chart; raises InvalidValueError when matplotlib is missing."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ootb, tuned = [], [], []
    for g in data.get("graphs", []):
        for r in g.get("results", []):
            if not r.get("kernel"):
                continue
            labels.append(f"{g.get('graph_name')}\n{r['engine']['name']}")
            ootb.append(r["kernel"]["median_ms"])
            delta = r.get("oracle_delta")
            tuned.append(delta["tuned_median_ms"] if delta else float("nan"))
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
