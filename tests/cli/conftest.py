"""CLI test fixtures: graph files in a temp dir, and the real typer app behind a runner."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import bad_uid_document, matmul_bias_relu, pointwise_mul
from typer.testing import CliRunner, Result

from dnntune import testing
from dnntune.cli.app import app


@pytest.fixture
def graph_dir(tmp_path: Path) -> Path:
    """A folder with two small valid graphs."""
    d = tmp_path / "graphs"
    d.mkdir()
    matmul_bias_relu().save(d / "a_mm_bias_relu.json")
    pointwise_mul().save(d / "b_pw_mul.json")
    return d


@pytest.fixture
def bad_graph(tmp_path: Path) -> Path:
    p = tmp_path / "bad_graph.json"
    p.write_text(json.dumps(bad_uid_document(), indent=2))
    return p


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Invoke the real typer app; ``env`` entries are set for the call (None unsets)."""
    runner = CliRunner()
    monkeypatch.setenv("COLUMNS", "200")

    def invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
        return runner.invoke(app, list(args), env=env)

    return invoke


@pytest.fixture
def fakes() -> Iterator[testing.FakeEngines]:
    """Fake engines A, B, C only (C the fastest at 0.2 ms) and the fake clock for timing.

    The static heuristics keep unknown engines in registration order, so the heuristic pick
    is FAKE_ENGINE_A (1.0 ms) and tuning finds FAKE_ENGINE_C: a 5x speedup, deterministically.
    """
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.2}) as f:
        yield f
