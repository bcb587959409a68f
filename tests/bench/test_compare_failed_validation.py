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


def test_compare_names_a_csv_or_binary_file_as_not_json_results(tmp_path: Path) -> None:
    """A CSV was 'Expecting value: line 1 column 1 (char 0)'; a file that is not UTF-8 was an
    internal error (UnicodeDecodeError)."""
    graph = tmp_path / "mm.json"
    testing.small_matmul_graph().save(graph)
    good, csv = tmp_path / "a.json", tmp_path / "a.csv"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        for path in (good, csv):
            assert _invoke(["bench", "-g", str(graph), *FAST, "-o", str(path)]).exit_code == 0
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00")
    for bad in (csv, binary):
        result = _invoke(["bench", "compare", str(bad), str(good)])
        assert result.exit_code == 2, result.output
        output = result.output.replace("\n", "")
        assert f"{bad}: not a JSON results file" in output and "-o results.json" in output
        assert "internal error" not in output
