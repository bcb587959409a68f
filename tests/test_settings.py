"""``dnntune.settings``: a bad ``DNNTUNE_*`` value is warned about, naming the variable, the value
and what to try, never ignored silently (new-user audit, session 20).

Before: ``DNNTUNE_DISABLE_CACHE=maybe`` (and the other yes/no variables but
``DNNTUNE_FORCE_BENCHMARKING``) read as off without a word; ``DNNTUNE_FORCE_BENCHMARKING=maybe``
warned on every build; ``DNNTUNE_HEUR_POLICY_ORDER=","`` fell back to the default order without
a word; ``DNNTUNE_HEUR_CONFIG_PATH`` alone did not expand ``~``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnntune import settings
from dnntune.cli.app import app

REPO = Path(__file__).resolve().parents[1]

YES_NO = {
    "DNNTUNE_DISABLE_CACHE": settings.cache_disabled,
    "DNNTUNE_DISABLE_EXACT_ENGINE_CACHE": settings.exact_engine_cache_disabled,
    "DNNTUNE_DISABLE_NATIVE": settings.native_disabled,
}


@pytest.fixture(autouse=True)
def _fresh_memory() -> Iterator[None]:
    reported = getattr(settings, "_REPORTED", set())  # warn-once memory: each test is a new process
    reported.clear()
    yield
    reported.clear()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("name", sorted(YES_NO))
@pytest.mark.parametrize("value", ["maybe", "2", "-1"])
def test_a_yes_no_value_neither_on_nor_off_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        assert YES_NO[name]() is False
    (message,) = _warnings(caplog)
    assert f"{name}={value!r} is neither on (" in message
    assert "read as off" in message and "Set it to 1 or 0" in message


@pytest.mark.parametrize("name", sorted(YES_NO))
@pytest.mark.parametrize(
    ("value", "on"), [(" TRUE ", True), ("Enabled", True), ("0", False), ("Off", False)]
)
def test_yes_no_words_in_any_case_are_quiet(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    name: str,
    value: str,
    on: bool,
) -> None:
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        assert YES_NO[name]() is on
    assert not caplog.records


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_value_reads_as_unset(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    for name in settings.ENV_VARS:
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        assert settings.heur_config_path() is None
        assert settings.heur_model_path() is None
        assert settings.heur_policy_order() is None
        assert settings.force_benchmarking() is None
        assert settings.log_level() is None
        assert settings.cache_dir() == Path.home() / ".cache" / "dnntune"
        assert not any(f() for f in YES_NO.values())
    assert not caplog.records


def test_force_benchmarking_warns_once_per_value(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Read on every build: a sweep repeated the same warning once per candidate."""
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "maybe")
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        for _ in range(3):
            assert settings.force_benchmarking() is None
    (message,) = _warnings(caplog)
    assert "DNNTUNE_FORCE_BENCHMARKING='maybe' is neither on (" in message
    assert "the global.benchmarking knob decides" in message
    monkeypatch.setenv("DNNTUNE_FORCE_BENCHMARKING", "perhaps")  # another value: warned again
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        assert settings.force_benchmarking() is None
    assert len(_warnings(caplog)) == 1


def test_a_policy_order_of_only_commas_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DNNTUNE_HEUR_POLICY_ORDER", " , ,")
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        assert settings.heur_policy_order() is None
    (message,) = _warnings(caplog)
    assert "DNNTUNE_HEUR_POLICY_ORDER=', ,' names no policy; the default order is used" in message


def test_policy_order_tokens_are_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNNTUNE_HEUR_POLICY_ORDER", " config , ,STATIC ")
    assert settings.heur_policy_order() == ["config", "STATIC"]


def test_every_path_variable_expands_the_home_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path.home()
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", "~/overrides.json")
    monkeypatch.setenv("DNNTUNE_HEUR_MODEL_PATH", "~/model.json")
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", "~/cache")
    assert settings.heur_config_path() == home / "overrides.json"
    assert settings.heur_model_path() == home / "model.json"
    assert settings.cache_dir() == home / "cache"


def test_every_variable_read_is_documented_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    for name in settings.ENV_VARS:
        assert f"| `{name}` |" in readme, name


def test_every_log_level_value_is_documented_in_the_readme() -> None:
    """The README's DNNTUNE_LOG_LEVEL row lists every value it takes: it named five of the seven
    (not ``warning`` nor ``fatal``), while the warning for an unknown value names all seven."""
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `DNNTUNE_LOG_LEVEL` |"))
    listed = set(re.findall(r"`([a-z]+)`", row))
    assert set(settings.LOG_LEVELS) <= listed, sorted(set(settings.LOG_LEVELS) - listed)


def test_the_cli_shows_a_yes_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    graph = str(REPO / "examples" / "graphs" / "llama_rmsnorm.json")
    result = CliRunner().invoke(
        app,
        ["run", "-g", graph, "--device", "cpu", "--warmup", "1", "--iters", "1"],
        env={"DNNTUNE_DISABLE_EXACT_ENGINE_CACHE": "maybe"},
    )
    assert result.exit_code == 0, result.output
    assert "DNNTUNE_DISABLE_EXACT_ENGINE_CACHE='maybe' is neither on" in result.stderr
    assert "Traceback" not in result.output
