"""Rank 0's override-file writer: the one process of the job that writes the file."""

from __future__ import annotations

import logging
from pathlib import Path

from dnntune.errors import DnnTuneError
from dnntune.frontend import Graph
from dnntune.overrides.writer import write_autotune_winner
from dnntune.rfc import AutotuneStorageConfig
from dnntune.workflows.tuning import GraphTuneReport, TuneOptions

__all__ = ["Writer"]

_log = logging.getLogger(__name__)


class Writer:
    """Rank 0's override-file writer: clears the file once (overwrite), then appends."""

    def __init__(self, output: str | Path | None, overwrite: bool) -> None:
        self.output = output
        self.clear_pending = overwrite

    def write(
        self,
        graph: Graph,
        report: GraphTuneReport,
        options: TuneOptions,
        device_name: str | None = None,
    ) -> None:
        """Write ``report``'s winner for ``graph``; ``device_name``: the device of the rank
        that tuned it (default: the one ``graph`` was built for). A failure is the graph's
        ``error``, never an exception (the other ranks wait for rank 0's next collective)."""
        if self.output is None or not report.ok or not report.write_winner:
            return
        storage = AutotuneStorageConfig(str(self.output), self.clear_pending)
        try:
            if not graph.is_validated:
                graph.validate()
            write_autotune_winner(
                graph, report.results, storage, options.autotune_config(), device=device_name
            )
        except DnnTuneError as exc:
            report.error = f"writing {self.output}: {exc}"
            return
        except Exception as exc:  # a bug in one graph's write must not stop the job
            _log.debug("distributed: writing %s raised", report.graph_name, exc_info=True)
            report.error = f"writing {self.output}: internal error: {type(exc).__name__}: {exc}"
            return
        self.clear_pending = False
        report.written_to = str(self.output)
