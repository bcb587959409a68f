"""One table of issue 23's models from several ``benchmarks/models.py`` runs, with its targets.

A device call has ten minutes, and max-autotune's compile of one model takes up to seven
(Swin-T: 421 s on an H100), so the table of eight or more models with every variant is made of
several runs. Each row comes whole from one run (its variants were timed side by side in that
process; a variant is never taken from another run), the later file winning where a model is in
two; the targets (``_models_report.summary``) are computed over the merged rows, and the
sources (file, device, torch, dnntune commit) are listed under the table. Runs on different
devices are refused unless ``--allow-mixed-devices``, and ``--device`` names the one every run
must be on::

    python benchmarks/models_table.py --device H200 --out table run1/ run2/models.json ...

Writes ``<out>/models.md`` and ``<out>/models.json``; exit 2 on an unreadable, foreign or
mismatched input, with the file and what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _src_path import use_checkout_src

    use_checkout_src(__file__)  # PYTHONPATH's dnntune, where it gives one, wins

from _models_report import render, summary, write_json

__all__ = ["TableError", "load_run", "merge"]


class TableError(Exception):
    """An input that cannot go into the table: the message names the file and what to do."""


def load_run(path: Path) -> dict[str, Any]:
    """The ``models.json`` at ``path`` (or in the folder ``path``)."""
    file = path / "models.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
    except FileNotFoundError:
        raise TableError(f"{file}: no such file (give a models.json or its folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TableError(f"{file}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("benchmark") != "models":
        raise TableError(f'{file}: not benchmarks/models.py\'s output (no "benchmark": "models")')
    if not isinstance(doc.get("models"), list):
        raise TableError(f"{file}: has no list of models")
    doc["_file"] = str(file)
    return doc


def _device(doc: dict[str, Any]) -> str:
    return str((doc.get("versions") or {}).get("device") or "unknown")


def merge(
    docs: list[dict[str, Any]], device: str | None = None, allow_mixed: bool = False
) -> dict[str, Any]:
    """The merged table's document: each model's row from the last run that has it, the
    sources, and the targets over the merged rows."""
    if not docs:
        raise TableError("no runs given")
    devices = {_device(d) for d in docs}
    if device is not None:
        off = [d["_file"] for d in docs if device.lower() not in _device(d).lower()]
        if off:
            raise TableError(
                f"not on a {device}: {', '.join(off)} ({', '.join(sorted(devices))}); "
                "leave them out or drop --device"
            )
    if len(devices) > 1 and not allow_mixed:
        listed = "; ".join(f"{d['_file']}: {_device(d)}" for d in docs)
        raise TableError(
            f"runs on different devices ({listed}): a table compares one machine's times; "
            "give runs of one device, or --allow-mixed-devices to list them anyway"
        )
    rows: dict[str, dict[str, Any]] = {}
    for index, doc in enumerate(docs):
        for row in doc["models"]:
            rows.pop(row["model"], None)  # the later run's row, in its place in the order
            rows[row["model"]] = {**row, "source": index}
    merged = list(rows.values())
    variants = ("dnntune_auto", "dnntune_graph", "dnntune")
    return {
        "benchmark": "models_table",
        "sources": [
            {
                "file": d["_file"],
                "device": _device(d),
                "torch": (d.get("versions") or {}).get("torch"),
                "dnntune_commit": (d.get("versions") or {}).get("dnntune_commit"),
                "models": [r["model"] for r in d["models"]],
            }
            for d in docs
        ],
        "models": merged,
        "summary": [summary(merged, v) for v in variants],
    }


def _markdown(doc: dict[str, Any]) -> str:
    lines = [render(doc["models"]), "", "Sources (each row comes whole from one run):"]
    for index, source in enumerate(doc["sources"]):
        mine = [r["model"] for r in doc["models"] if r["source"] == index]
        lines.append(
            f"- [{index}] {source['file']}: {source['device']}, torch {source['torch']}, "
            f"dnntune {source['dnntune_commit']}; rows: {', '.join(mine) or 'none (superseded)'}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="models.json files or their folders")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--device", default=None, help="every run must be on this (e.g. H200)")
    p.add_argument("--allow-mixed-devices", action="store_true")
    args = p.parse_args(argv)
    try:
        doc = merge([load_run(r) for r in args.runs], args.device, args.allow_mixed_devices)
    except TableError as exc:
        print(f"models_table: {exc}", file=sys.stderr)
        return 2
    text = _markdown(doc)
    write_json(args.out, doc)
    (args.out / "models.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
