"""``DNNTUNE_LOG_LEVEL`` with a value it does not know warns, naming the allowed values, as
``DNNTUNE_FORCE_BENCHMARKING`` does (it was ignored silently)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from dnntune import settings


def test_an_unknown_value_warns_and_is_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DNNTUNE_LOG_LEVEL", "verbose")
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        assert settings.log_level() is None
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "DNNTUNE_LOG_LEVEL='verbose'" in message
    assert "debug, info, warn, warning, error, fatal, off" in message


@pytest.mark.parametrize(("value", "level"), [("DEBUG", logging.DEBUG), ("off", 60), (None, None)])
def test_known_values_and_unset_are_quiet(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    value: str | None,
    level: int | None,
) -> None:
    if value is None:
        monkeypatch.delenv("DNNTUNE_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("DNNTUNE_LOG_LEVEL", value)
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        assert settings.log_level() == level
    assert not caplog.records


def test_the_cli_shows_the_warning(cli: Callable[..., Result], graph_dir: Path) -> None:
    graph = str(next(graph_dir.iterdir()))
    result = cli("validate", "-g", graph, env={"DNNTUNE_LOG_LEVEL": "verbose"})
    assert result.exit_code == 0, result.output
    text = result.stdout + result.stderr
    assert "DNNTUNE_LOG_LEVEL='verbose' is not one of" in text
    quiet = cli("validate", "-g", graph, env={"DNNTUNE_LOG_LEVEL": "warn"})
    assert "DNNTUNE_LOG_LEVEL" not in quiet.stdout + quiet.stderr
