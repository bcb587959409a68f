"""The ``dnntune bench`` results file: a versioned, strict-JSON schema, written atomically.

Schema (``schema_version`` 1; times in ms; NaN/inf written as null)::

    {schema_version, tool: {name, version},
     run: {started_at, finished_at, complete, argv, config: {...}},
     environment: {device: {...}, python, torch, cuda, cudnn, triton, selection_env: {...}},
     summary: {graphs, rows, passed, unchecked, failed, errors, not_supported, graph_errors,
               no_engine_graphs, [oracle: {rows, geomean_speedup, excluded}]},
     graphs: [{graph_id, graph_name, graph_path, status: ok|error|no_engines, error,
               results: [row, ...]}]}

A row: ``provider`` (dnntune|pytorch), ``engine`` {id ("0x%016X"), name}, ``status``
(success|error|not_supported), ``verdict`` (passed|failed|unchecked|error|not_supported;
not_supported: the engine declined the graph when its default plan was built), ``message``,
``plan_name``, ``knob_settings`` [{knob_id, value}], ``build_ms``, ``timing``, ``kernel`` and
``host`` stats, ``metrics`` {flops, io_bytes, tflops, gbps, workspace_bytes}, ``correctness`` or
null, ``warnings``; with ``--oracle`` only: ``oracle``, ``oracle_delta``, ``oracle_error``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnntune._file_kinds import document_kind
from dnntune._json_keys import DuplicateKeyError, loads
from dnntune.errors import InvalidValueError
from dnntune.overrides.store import atomic_write_text

__all__ = ["SCHEMA_VERSION", "SuiteResult", "kind_of", "strict_json"]

SCHEMA_VERSION = 1

CSV_COLUMNS = (
    "graph_name",
    "graph_id",
    "provider",
    "engine_id",
    "engine_name",
    "status",
    "verdict",
    "kernel_median_ms",
    "kernel_cov",
    "host_median_ms",
    "n",
    "cache_mode",
    "tflops",
    "gbps",
    "workspace_bytes",
    "max_abs_error",
    "oracle_speedup",
    "message",
)


def strict_json(value: Any) -> Any:
    """Replace NaN/inf with None, recursively (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


@dataclass
class SuiteResult:
    run: dict[str, Any]
    environment: dict[str, Any]
    graphs: list[dict[str, Any]] = field(default_factory=list)
    tool: dict[str, Any] = field(default_factory=dict)
    oracle: bool = False

    def rows(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [(g, r) for g in self.graphs for r in g.get("results", [])]

    def summary(self) -> dict[str, Any]:
        rows = [r for _, r in self.rows()]
        verdicts = [r.get("verdict") for r in rows]
        out: dict[str, Any] = {
            "graphs": len(self.graphs),
            "rows": len(rows),
            "passed": verdicts.count("passed"),
            "unchecked": verdicts.count("unchecked"),
            "failed": verdicts.count("failed"),
            "errors": verdicts.count("error"),
            "not_supported": verdicts.count("not_supported"),
            "graph_errors": sum(1 for g in self.graphs if g.get("status") == "error"),
            "no_engine_graphs": sum(1 for g in self.graphs if g.get("status") == "no_engines"),
        }
        if self.oracle:
            # a row whose search had one candidate (no knobs, or the budget skipped every
            # variant) compares the heuristic plan with itself: not a tuned row
            unsearched = [r for r in rows if not _searched(r)]
            searched = [r for r in rows if _searched(r)]
            speedups = [
                r["oracle_delta"]["speedup"]
                for r in searched
                if r.get("oracle_delta") and r["oracle_delta"].get("speedup")
            ]
            geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
            ok = sum(1 for r in searched if r.get("status") == "success")
            out["oracle"] = {
                "rows": len(speedups),
                "geomean_speedup": geo,
                "excluded": ok - len(speedups),
                "not_searched": len(unsearched),
                "not_searched_budget": sum(
                    1 for r in unsearched if r["oracle"].get("candidates_skipped_budget")
                ),
            }
        return out

    def exit_code(self) -> int:
        """3 if a row failed validation, else 1 if a row or graph errored, else 0."""
        s = self.summary()
        if s["failed"]:
            return 3
        if s["errors"] or s["graph_errors"]:
            return 1
        return 0

    def to_dict(self) -> dict[str, Any]:
        return strict_json(
            {
                "schema_version": SCHEMA_VERSION,
                "tool": self.tool,
                "run": self.run,
                "environment": self.environment,
                "summary": self.summary(),
                "graphs": self.graphs,
            }
        )

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for g in self.graphs:  # a graph that never reached an engine: one row saying why
            if not g.get("results") and g.get("status") != "ok":
                writer.writerow(
                    strict_json(
                        {
                            "graph_name": g.get("graph_name") or g.get("graph_path"),
                            "graph_id": g.get("graph_id"),
                            "status": g.get("status"),
                            "verdict": "error",
                            "message": g.get("message"),
                        }
                    )
                )
        for g, r in self.rows():
            kernel = r.get("kernel") or {}
            metrics = r.get("metrics") or {}
            corr = r.get("correctness") or {}
            delta = r.get("oracle_delta") or {}
            writer.writerow(
                strict_json(
                    {
                        "graph_name": g.get("graph_name"),
                        "graph_id": g.get("graph_id"),
                        "provider": r.get("provider"),
                        "engine_id": (r.get("engine") or {}).get("id"),
                        "engine_name": (r.get("engine") or {}).get("name"),
                        "status": r.get("status"),
                        "verdict": r.get("verdict"),
                        "kernel_median_ms": kernel.get("median_ms"),
                        "kernel_cov": kernel.get("cov"),
                        "host_median_ms": (r.get("host") or {}).get("median_ms"),
                        "n": kernel.get("n"),
                        "cache_mode": (r.get("timing") or {}).get("cache_mode"),
                        "tflops": metrics.get("tflops"),
                        "gbps": metrics.get("gbps"),
                        "workspace_bytes": metrics.get("workspace_bytes"),
                        "max_abs_error": corr.get("max_abs_error"),
                        # empty for a row with nothing to search (one candidate, or the
                        # budget skipped the rest): the summary's geomean leaves it out, and a
                        # 1.0 here read as a tuned row that gained nothing (new-user audit)
                        "oracle_speedup": delta.get("speedup") if _searched(r) else None,
                        "message": r.get("message"),
                    }
                )
            )
        return buf.getvalue()

    def write(self, path: str | Path) -> None:
        """Atomically replace ``path`` (.csv -> CSV, else JSON), keeping an existing file's
        permission bits (a new file gets the umask's); raises ConfigFileError."""
        p = Path(path)
        csv = p.suffix.lower() == ".csv"
        text = self.to_csv() if csv else json.dumps(self.to_dict(), indent=1) + "\n"
        atomic_write_text(p, text)

    @staticmethod
    def load(path: str | Path) -> dict[str, Any]:
        """Read a results JSON file; raises InvalidValueError for a wrong schema version."""
        p = Path(path)
        try:
            data = loads(p.read_text(encoding="utf-8"))
        except DuplicateKeyError as exc:  # json kept the last value (a hand edit), silently
            raise InvalidValueError(f"{p}: {exc}") from None
        except OSError as exc:
            raise InvalidValueError(
                f"cannot read results file {p}: {exc.strerror or exc}"
            ) from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            # a CSV written by -o results.csv was "Expecting value: line 1 column 1 (char 0)";
            # JSON nested past the recursion limit raised RecursionError (not a ValueError)
            raise InvalidValueError(
                f"{p}: not a JSON results file ({exc}); compare reads the JSON that "
                "`dnntune bench -o results.json` writes (not its CSV)"
            ) from None
        if not isinstance(data, dict) or "schema_version" not in data:
            kind = kind_of(data)
            raise InvalidValueError(
                f"{p}: not a dnntune bench results file{f' ({kind})' if kind else ''}; "
                "compare the files `dnntune bench -o results.json` writes"
            )
        version = data["schema_version"]
        if version != SCHEMA_VERSION:
            raise InvalidValueError(
                f"{p}: schema_version {version} is not {SCHEMA_VERSION}; "
                "re-run dnntune bench with this version"
            )
        return data


def kind_of(data: Any) -> str:
    """What a JSON document is when it is not the file a message expected ("" when unknown):
    "it is an engine-override file (what `dnntune tune` writes)", in the words every reader
    uses (:func:`dnntune._file_kinds.document_kind`)."""
    kind = document_kind(data)
    return f"it is {kind.what}" if kind is not None else ""


def _searched(row: dict[str, Any]) -> bool:
    """The row's oracle searched more than the heuristic plan (False: one candidate, as an
    engine without knobs, or a budget that skipped every variant)."""
    info = row.get("oracle")
    return not isinstance(info, dict) or info.get("tuning_available", True) is not False
