"""``dnntune engines``: every registered engine, its id, devices and knobs; with ``-g``, whether
it applies to that graph on the device and, if not, why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dnntune.backend.engine import engine_id_hex
from dnntune.backend.registry import get_registry
from dnntune.cli._device import handle_for
from dnntune.cli._graphs import Parsed, expand_graph_paths, load_graph
from dnntune.cli._output import err_console, error, escape, out_console
from dnntune.errors import NotSupportedError

if TYPE_CHECKING:
    from dnntune.backend.engine import Engine
    from dnntune.backend.handle import Handle
    from dnntune.backend.knobs import Knob
    from dnntune.graph.ir import OpGraph

__all__ = ["engines"]


def _knobs(engine: Engine, graph: OpGraph | None) -> list[Knob]:
    try:
        return list(engine.knobs(graph))
    except Exception:  # an engine that cannot list knobs for this graph still gets a row
        return list(engine.knobs(None))


def _status(engine: Engine, graph: OpGraph | None, handle: Handle | None) -> str | None:
    """None when usable (on the device, for the graph, as far as given); else the reason."""
    if graph is not None and handle is not None:
        return get_registry().why_not(engine, graph, handle)
    if handle is not None and handle.device.type not in engine.devices:
        return f"runs on {'/'.join(engine.devices)}, not {handle.device.type}"
    try:
        engine.check_available()
    except NotSupportedError as exc:
        return str(exc)
    except Exception as exc:
        return f"check_available raised {type(exc).__name__}: {exc}"
    return None


def _engine_record(engine: Engine, graph: OpGraph | None, handle: Handle | None) -> dict[str, Any]:
    knobs = _knobs(engine, graph)
    reason = _status(engine, graph, handle)
    return {
        "name": engine.name,
        "id": engine.id,
        "id_hex": engine_id_hex(engine.id),
        "provider": engine.provider,
        "devices": list(engine.devices),
        "supports_exhaustive": any(k.knob_id == "global.benchmarking" for k in knobs),
        "applies": reason is None,
        "reason": reason or "",
        "knobs": [
            {
                "id": k.knob_id,
                "type": k.value_type.value,
                "range": k.constraint.describe(),
                "default": k.default_value,
                "description": k.description,
            }
            for k in knobs
        ],
    }


def engines(
    graph: Annotated[
        list[Path] | None,
        typer.Option(
            "-g",
            "--graph",
            metavar="<path>",
            help="Also say whether each engine applies to this graph (one graph file).",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu or cuda (default: cuda when available, else cpu)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the list as JSON instead of a table.")
    ] = False,
) -> None:
    """List engines: name, id (decimal and hex), provider, devices, knobs (type, range, default).

    With -g GRAPH, each engine's row says whether it applies to the graph on the device and,
    if not, why (and a line on stderr says when none does). Exit code 1 when the graph is
    invalid, 2 for a bad option or device, or for more than one graph.
    """
    registry = get_registry()
    handle: Handle | None = None
    if device is not None or graph:
        handle = handle_for(device)
    op_graph: OpGraph | None = None
    if graph:
        hint = "'-g' / '--graph'"
        parsed: Parsed = {}
        try:
            paths = expand_graph_paths(graph, parsed)
        except FileNotFoundError as exc:
            raise typer.BadParameter(str(exc), param_hint=hint) from None
        if len(paths) != 1:
            given = ", ".join(str(g) for g in graph)
            raise typer.BadParameter(
                f"{given}: names {len(paths)} graphs; give one graph file", param_hint=hint
            )
        path = paths[0]
        loaded = load_graph(path, parsed=parsed)
        if loaded.graph is None:  # another dnntune file (an override file) is said so there
            error(loaded.describe_error())
            raise typer.Exit(1)
        assert handle is not None
        loaded.graph.build_operation_graph(handle)
        op_graph = loaded.graph

    records = [_engine_record(e, op_graph, handle) for e in registry.engines()]
    if as_json:
        out_console().print_json(json.dumps(records))
    else:
        _print_table(records, op_graph, handle)
    if op_graph is not None and records and not any(rec["applies"] for rec in records):
        err_console().print(
            f"no engine applies to graph {op_graph.name!r} on {handle.device if handle else '?'}"
            " (each engine's reason is listed); `dnntune run` and `tune` cannot run it there",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _print_table(
    records: list[dict[str, Any]], graph: OpGraph | None, handle: Handle | None
) -> None:
    out = out_console()
    if not records:
        err_console().print("no engines registered")
        return
    title = "engines"
    if graph is not None and handle is not None:
        title = f"engines for graph {graph.name!r} on {handle.device}"
    elif handle is not None:
        title = f"engines on {handle.device}"
    table = Table(title=escape(title), show_lines=True)
    table.add_column("engine", style="bold", no_wrap=True)
    table.add_column("id", no_wrap=True)
    table.add_column("provider", no_wrap=True)
    table.add_column("devices", no_wrap=True)
    table.add_column("knobs (type, range, default)", overflow="fold")
    status_header = "applies" if graph is not None else "available"
    table.add_column(status_header, overflow="fold")
    for rec in records:
        knobs = "\n".join(
            f"{k['id']}: {k['type']}, {k['range']}, default {k['default']}" for k in rec["knobs"]
        )
        status = "[green]yes[/]" if rec["applies"] else f"[red]no[/]: {escape(rec['reason'])}"
        table.add_row(
            escape(rec["name"]),
            f"{rec['id']}\n{rec['id_hex']}",
            escape(rec["provider"]),
            ", ".join(rec["devices"]),
            escape(knobs) or "-",
            status,
        )
    out.print(table)
