"""``dnntune tune``'s checks of its options before any tuning: the ``--engine`` filter, the
output paths (``-o``, ``--report``) and whether the engines named can run on this device.

A bad option raises :class:`typer.BadParameter` naming it (exit code 2), so it costs no tuning
time; an override file that cannot take entries raises InvalidValueError (exit code 1).
``tune_cmd.py`` calls them in a one-process run and on every rank of a ``--distributed`` one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import typer

from dnntune.backend.handle import Handle
from dnntune.backend.registry import get_registry
from dnntune.cli._config_devices import device_file_name
from dnntune.cli._graphs import check_output_option, resolved
from dnntune.cli._output import plural, refuse_other_kind, warn
from dnntune.errors import ConfigFileError, InvalidValueError, NotSupportedError
from dnntune.overrides.format import load_file
from dnntune.overrides.store import check_writable, write_target
from dnntune.overrides.writer import check_appendable
from dnntune.rfc import AutotuneStrategy, TuneMode

__all__ = [
    "check_engines_run_here",
    "check_output",
    "check_same_device",
    "check_strategy_options",
    "parse_engine_filter",
]


def parse_engine_filter(values: Sequence[str] | None) -> list[str]:
    """``--engine A,B --engine C`` -> ``["A", "B", "C"]``, each a known engine name or id.

    Raises:
        typer.BadParameter: for an engine no provider registers (exit code 2).
    """
    tokens = [t.strip() for v in values or [] for t in v.split(",") if t.strip()]
    if values and not tokens:  # `--engine ''` (an unset variable) is no filter: say so
        raise typer.BadParameter(
            f"no engine named in {', '.join(repr(v) for v in values)}; name one or more "
            "engines (e.g. --engine CUDNN_ENGINE,TRITON_ENGINE), or leave --engine out for all",
            param_hint="'--engine'",
        )
    registry = get_registry()
    for token in tokens:
        if registry.find(token) is None:
            known = ", ".join(e.name for e in registry.engines()) or "none"
            raise typer.BadParameter(
                f"unknown engine {token!r}; known engines: {known}", param_hint="'--engine'"
            )
    return tokens


def check_strategy_options(
    strategy: AutotuneStrategy,
    iters: int | None,
    max_iters: int | None,
    mode: TuneMode,
    priming_failure: object | None,
) -> None:
    """An option that the other options make do nothing is a usage error, as ``--shard``
    without ``--distributed`` is: ``--iters 50`` under the default run_until_stable strategy
    timed each candidate 3 to 100 times, silently.

    Raises:
        typer.BadParameter: ``--iters`` without fixed_average, ``--max-iters`` with it, or
            ``--priming-failure`` without ``--mode exhaustive`` (exit code 2).
    """
    if iters is not None and strategy is not AutotuneStrategy.FIXED_AVERAGE:
        raise typer.BadParameter(
            f"--iters sets the timed runs of --strategy fixed_average; {strategy.value} (the "
            "default) times each candidate until its times are stable, at most --max-iters "
            "runs: add --strategy fixed_average, or give --max-iters",
            param_hint="'--iters'",
        )
    if max_iters is not None and strategy is AutotuneStrategy.FIXED_AVERAGE:
        raise typer.BadParameter(
            "--max-iters caps --strategy run_until_stable; fixed_average times each candidate "
            "--iters times: give --iters, or leave --strategy out",
            param_hint="'--max-iters'",
        )
    if priming_failure is not None and mode is not TuneMode.EXHAUSTIVE:
        raise typer.BadParameter(
            "--priming-failure says what to do when priming an engine's own search fails, "
            "which only --mode exhaustive does: add --mode exhaustive, or leave it out",
            param_hint="'--priming-failure'",
        )


def check_output(
    output: Path, overwrite: bool, report: Path | None = None, graphs: Sequence[Path] = ()
) -> None:
    """Before any tuning: the file can be written (else exit 2) and, when appending, the file
    that is there can take entries (else exit 1, naming the bad entry; the file is untouched).
    ``--report`` must be writable too, and neither may be the other or a graph being tuned
    (the report replaced the override file it names, exit 0).

    Raises:
        typer.BadParameter: the path cannot be written (a directory, an unwritable folder...).
        InvalidValueError: appending into a file the writer would refuse.
    """
    inputs = {resolved(p) for p in graphs}
    if resolved(output) in inputs:
        raise typer.BadParameter(
            f"{output} is one of the graphs to tune; write the winners elsewhere",
            param_hint="'-o' / '--output'",
        )
    if report is not None:
        if resolved(report) == resolved(output):
            raise typer.BadParameter(
                f"{report} is also the override file (-o); give the report another name",
                param_hint="'--report'",
            )
        check_output_option(report, graphs, "'--report'", "the report", example="tune_report.json")
        # as run --json and bench -o: an override file or bench results named here by mistake
        # was replaced, exit 0
        refuse_other_kind(
            report, _is_tune_report, "--report", "a dnntune tune report", "tune_report.json"
        )
    try:
        check_writable(output)
        if not overwrite:
            check_appendable(
                output, replace_hint="pass --overwrite to replace it", refuse_not_json=True
            )
    except ConfigFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="'-o' / '--output'") from None


def check_same_device(output: Path, overwrite: bool, handle: Handle) -> None:
    """Before tuning, when appending: the entries already in ``output`` were tuned on this
    device (their ``autotune_metadata.device``; entries that name none pass).

    A match key does not name the device, so an entry tuned here replaced another device's
    entry for the same problem (an H200's tuned cuDNN plan gone after one CPU run), and a run on
    either device would read the other's choices.

    Raises:
        InvalidValueError: the file holds entries tuned on another device (exit code 1).
    """
    if overwrite:
        return
    here = handle.device_signature().get("name")
    target = write_target(Path(output).expanduser())
    if not here or not target.is_file():
        return
    try:
        config = load_file(target)
    except ConfigFileError:  # check_output has judged the file; nothing more to say here
        return
    others = Counter({d: n for d, n in config.devices().items() if d != here})
    if not others:
        return
    named = ", ".join(f"{plural(n, 'entry', 'entries')} on {d}" for d, n in others.most_common())
    raise InvalidValueError(
        f"refusing to add to {output}: it holds entries tuned on another device ({named}); "
        f"this run is on {here}. A new entry would replace that device's entry for the same "
        f"problem, and each device would read the other's choices: write to a file of this "
        f"device (-o {device_file_name(target, str(here))}), or pass --overwrite to replace it"
    )


def check_engines_run_here(engines: Sequence[str], handle: Handle) -> None:
    """``--engine`` names engines that cannot run on this device (or lack their dependency):
    a usage error when none of them can, a warning for each that cannot when some can."""
    registry = get_registry()
    unusable: list[str] = []
    for token in engines:
        engine = registry.get(token)
        if handle.device.type not in engine.devices:
            needs = " or ".join(engine.devices)
            unusable.append(f"{engine.name} needs {needs}, and this run is on {handle.device.type}")
            continue
        try:
            engine.check_available()
        except NotSupportedError as exc:
            unusable.append(f"{engine.name} is not available: {exc}")
    if not unusable:
        return
    if len(unusable) == len(engines):
        raise typer.BadParameter(
            "; ".join(unusable) + " (pick another engine, or a --device it runs on)",
            param_hint="'--engine'",
        )
    for reason in unusable:
        warn(f"--engine: {reason}; left out")


def _is_tune_report(doc: object) -> bool:
    """A JSON list of per-graph tune reports (what ``--report`` writes)."""
    return isinstance(doc, list) and all(
        isinstance(r, dict) and "graph" in r and "winner" in r for r in doc
    )
