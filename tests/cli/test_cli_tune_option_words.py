"""``dnntune tune``'s usage errors name the options the user typed, not ``AutotuneConfig``'s
fields (``ranking_metric='throughput'``, ``time_budget_s``): audit, session 27."""

from __future__ import annotations

from pathlib import Path

import pytest


def _message(output: str) -> str:
    """The error box's text on one line (rich wraps it and draws a border)."""
    return " ".join(output.replace("│", " ").split())


def test_throughput_with_a_cold_cache_names_the_options(
    cli, graph_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.json"
    result = cli(
        "tune", "-g", str(graph_dir), "-o", str(out),
        "--ranking-metric", "throughput", "--cache-mode", "cold",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    message = _message(result.output)
    assert "Invalid value for '--ranking-metric'" in message
    assert "--ranking-metric throughput" in message and "--cache-mode warm" in message
    assert "ranking_metric" not in message and "cache_mode" not in message
    assert "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--budget-s", "-1"), ("--budget-s", "nan"), ("--run-budget-s", "0")],
)
def test_bad_budgets_name_the_option(
    cli, graph_dir: Path, tmp_path: Path, option: str, value: str
) -> None:
    out = tmp_path / "o.json"
    result = cli("tune", "-g", str(graph_dir), "-o", str(out), option, value)
    assert result.exit_code == 2, result.output
    message = _message(result.output)
    assert f"Invalid value for '{option}': {option} must be a finite number of seconds" in message
    assert "budget_s" not in message
    assert not out.exists()
