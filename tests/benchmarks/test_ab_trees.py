"""benchmarks/ab_trees.sh through its real entry point, with a stand-in for models.py's Python:
which override file each run reads (one shared file, or one per tree with ``AB_FILES=own``),
the order of the runs, the tree check and a bad ``AB_FILES``. The stand-in writes the
``models.json`` each run would; the script's own helpers run on the real Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "ab_trees.sh"

# models.py's stand-in: records its arguments, writes models.json as the run would (the
# package it imported: the first PYTHONPATH entry's dnntune, or $LIE_ABOUT_TREE)
_STUB = """#!{python}
import json, os, sys
if sys.argv[1] == "-":  # the script's own helpers (medians, the tree check)
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
args = sys.argv[2:]
out = args[args.index("--out") + 1]
os.makedirs(out, exist_ok=True)
tree = os.environ.get("LIE_ABOUT_TREE") or os.environ["PYTHONPATH"].split(os.pathsep)[0]
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps({{"out": out, "overrides": args[args.index("--overrides") + 1]}}) + "\\n")
doc = {{
    "versions": {{"dnntune_path": os.path.join(tree, "dnntune")}},
    "models": [{{"variants": {{
        "eager_graph": {{"median_ms": 2.0}}, "dnntune_auto": {{"median_ms": 1.0}}
    }}}}],
}}
json.dump(doc, open(os.path.join(out, "models.json"), "w"))
"""


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for tree in (a, b):
        (tree / "dnntune").mkdir(parents=True)
    return a, b


def _run(
    tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]]]:
    stub = tmp_path / "python"
    stub.write_text(_STUB.format(python=sys.executable))
    stub.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    a, b = _trees(tmp_path)
    done = subprocess.run(
        ["bash", str(SCRIPT), str(a), str(b), str(tmp_path / "out"), "m"],
        env={**os.environ, "PYTHON": str(stub), "CALLS": str(calls), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return done, [json.loads(line) for line in lines]


def _runs(calls: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(Path(c["out"]).name, Path(c["overrides"]).name) for c in calls]


def test_one_shared_override_file_by_default(tmp_path: Path) -> None:
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _runs(calls) == [(tag, "m.json") for tag in ("warm_a", "warm_b", "a1", "b1", "a2", "b2")]
    summary = (tmp_path / "out" / "m" / "summary.txt").read_text().splitlines()
    assert summary[1:] == [f"{t} 2.0000 1.0000" for t in ("a1", "b1", "a2", "b2")]


def test_each_tree_its_own_override_file(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, AB_FILES="own")
    assert done.returncode == 0, done.stderr
    assert _runs(calls) == [
        ("warm_a", "m.a.json"),
        ("warm_b", "m.b.json"),
        ("a1", "m.a.json"),
        ("b1", "m.b.json"),
        ("a2", "m.a.json"),
        ("b2", "m.b.json"),
    ]


def test_a_run_that_imported_another_tree_fails_the_ab(tmp_path: Path) -> None:
    done, _ = _run(tmp_path, LIE_ABOUT_TREE=str(tmp_path / "elsewhere"))
    assert done.returncode != 0
    assert "ran the dnntune in" in done.stderr


@pytest.mark.parametrize("value", ["separate", ""])
def test_a_bad_files_setting_is_refused(tmp_path: Path, value: str) -> None:
    done, calls = _run(tmp_path, AB_FILES=value)
    if value == "":  # empty: the default
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2 and calls == []
    assert "AB_FILES must be shared or own, got 'separate'" in done.stderr
