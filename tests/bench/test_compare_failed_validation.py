"""``dnntune bench compare``: a row that failed validation in B is "failed in B" (docs/bench.md),
not a timing to compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dnntune import testing
from dnntune.cli.app import app

FAST = ["--warmup", "1", "--iters", "3"]


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_a_row_that_failed_validation_in_b_fails_the_comparison(tmp_path: Path) -> None:
    graph = tmp_path / "mm.json"
    testing.small_matmul_graph().save(graph)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        args = ["bench", "-g", str(graph), *FAST, "--validate", "reference", "-o", str(a)]
        assert _invoke(args).exit_code == 0
    doc = json.loads(a.read_text())
    row = doc["graphs"][0]["results"][0]
    assert row["verdict"] == "passed"
    # B: the same engine, as fast, but its answer is wrong (as bench writes such a row)
    row["verdict"] = "failed"
    row["correctness"].update(match=False, mismatches=5, message="5 mismatches")
    b.write_text(json.dumps(doc))
    result = _invoke(["bench", "compare", str(a), str(b)])
    assert result.exit_code == 1, result.output
    assert "0 within noise, 1 failed in B" in result.output
    as_json = _invoke(["bench", "compare", str(a), str(b), "--json"])
    assert [r["verdict"] for r in json.loads(as_json.output)] == ["failed in B"]
