"""The code in README.md and docs/*.md works as written (docs audit, session 61).

Every ```python block compiles; the ones that need no GPU and no stand-in names (the README's
quick start with its HeuristicMode.B line, measurement.md's ``winner_margin`` summary,
conformance.md's generator) run as written; every ``dnntune`` command line in a ```bash block
names only options its command has; every option of every command is documented on that
command's page; and every ``dnntune.*``/``dt.*``/``dtt.*`` name the docs quote exists. The rest
(torch.md's ``MyModel``, measurement.md's isolate fragment with its ``...``) only compile: they
stand for the reader's own code.
"""

from __future__ import annotations

import importlib
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer

import dnntune as dt
from dnntune.cli.app import app

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def _blocks(path: Path, lang: str) -> list[tuple[int, str]]:
    """(first line number, dedented code) of each fenced block of ``lang`` in ``path``."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while not lines[j].strip().startswith("```"):
            j += 1
        if m.group(2) == lang:
            out.append((i + 2, textwrap.dedent("\n".join(lines[i + 1 : j]))))
        i = j + 1
    return out


def _block(name: str, containing: str) -> str:
    """The one ```python block of ``name`` holding ``containing`` (a change that moves it fails)."""
    found = [code for _, code in _blocks(REPO / name, "python") if containing in code]
    assert len(found) == 1, f"{name}: {len(found)} python blocks hold {containing!r}"
    return found[0]


PYTHON_BLOCKS = [
    pytest.param(code, id=f"{path.relative_to(REPO)}:{line}")
    for path in DOCS
    for line, code in _blocks(path, "python")
]


@pytest.mark.parametrize("code", PYTHON_BLOCKS)
def test_every_python_block_compiles(code: str) -> None:
    compile(code, "<doc block>", "exec")


@pytest.mark.slow  # the quick start's autotune compiles TORCH_COMPILE_ENGINE: seconds
def test_readme_quick_start_and_the_snippets_that_build_on_it_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the quick start writes overrides.json where it runs
    scope: dict[str, Any] = {"__name__": "__doc__"}
    exec(_block("README.md", "import dnntune as dt"), scope)
    out = capsys.readouterr().out
    assert out.startswith("heuristic plan: ") and (tmp_path / "overrides.json").is_file()
    # the README's learned-ranking line and measurement.md's summary run on its graph and results
    exec(_block("README.md", "HeuristicMode.B"), scope)
    exec(_block("docs/measurement.md", "winner_margin"), scope)
    assert scope["m"].winner is scope["results"][0]


def test_conformance_generator_block_runs() -> None:
    scope: dict[str, Any] = {}
    exec(_block("docs/conformance.md", "generate_case"), scope)
    assert isinstance(scope["graph"], dt.Graph)  # "a fresh, validated dnntune.Graph"


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``dnntune``) of every dnntune command line in a ```bash block."""
    out = []
    for path in DOCS:
        for line, code in _blocks(path, "bash"):
            # a line ended by a backslash, or one indented under it (a synopsis), goes on
            for raw in re.sub(r"\\?\n[ \t]+", " ", code).splitlines():
                m = re.search(r"(?:^|[\s/])dnntune\s+(\S.*)", raw.split("#")[0])
                if m:
                    out.append((f"{path.relative_to(REPO)}:{line}", m.group(1).split()))
    return out


def _command_tree() -> dict[tuple[str, ...], set[str]]:
    """Option names of every command and subcommand, keyed by its path under ``dnntune``."""
    tree: dict[tuple[str, ...], set[str]] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        tree[path] = {n for p in command.params for n in (*p.opts, *p.secondary_opts) if "-" in n}
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return tree


def test_every_documented_command_line_uses_options_its_command_has() -> None:
    tree = _command_tree()
    commands = _commands()
    assert len(commands) >= 20  # the extraction still finds the docs' command lines
    for where, argv in commands:
        path = ()
        for word in argv:
            if (*path, word) not in tree:
                break
            path = (*path, word)
        known = tree[path] | tree[()] | {"-h", "--help", "-vv"}
        for token in argv:
            for name in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", token.strip("[]|")):
                assert name in known, f"{where}: dnntune {' '.join(path)} has no option {name}"


#: the page that documents each command's options
PAGES = {"bench": "bench.md", "heuristics": "heuristics.md"}


def test_every_option_of_every_command_is_documented_on_its_page() -> None:
    for path, names in _command_tree().items():
        page = (REPO / "docs" / PAGES.get(path[0] if path else "", "cli.md")).read_text()
        for name in names - {"-h", "--help"}:
            pattern = rf"(?<![\w-]){re.escape(name)}(?![\w-])"
            assert re.search(pattern, page), f"dnntune {' '.join(path)} {name}: not in its page"


#: quoted names that are no Python attribute: a logger's name
NOT_ATTRIBUTES = {"dnntune.engine_output"}


def test_every_quoted_dnntune_name_exists() -> None:
    roots = {"dt": "dnntune", "dtt": "dnntune.torch", "dnntune": "dnntune"}
    names = set()
    for path in DOCS:
        names |= set(re.findall(r"`((?:dtt|dt|dnntune)(?:\.\w+)+)", path.read_text()))
    assert len(names) >= 30  # the extraction still finds the docs' names
    for quoted in sorted(names - NOT_ATTRIBUTES):
        head, *rest = quoted.split(".")
        parts = [*roots[head].split("."), *rest]
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attribute in parts[cut:]:
                assert hasattr(obj, attribute), f"{quoted}: no {attribute!r} in {obj!r}"
                obj = getattr(obj, attribute)
            break
