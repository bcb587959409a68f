"""dnntune.providers.engine_output: what engines print while they compile is captured per
thread and logged at DEBUG on ``dnntune.engine_output`` (the CLI's ``-vv``)."""

from __future__ import annotations

import logging
import sys
import threading

import pytest

from dnntune.providers.engine_output import OUTPUT_LOGGER, captured_engine_output


def test_prints_and_engine_records_become_debug_records(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=OUTPUT_LOGGER), captured_engine_output("ENGINE_X"):
        print("AUTOTUNE table")
        sys.stderr.write("compiler note\n")
        logging.getLogger("triton.runtime").warning("slow config")
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    texts = [r.getMessage() for r in caplog.records if r.name == OUTPUT_LOGGER]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == OUTPUT_LOGGER)
    assert any("ENGINE_X (stdout):\nAUTOTUNE table" in t for t in texts)
    assert any("ENGINE_X (stderr):\ncompiler note" in t for t in texts)
    assert any("triton.runtime, WARNING): slow config" in t for t in texts)
    # everything is put back
    assert sys.stdout is not None and type(sys.stdout).__name__ != "_Router"


def test_other_threads_and_dnntune_records_are_not_captured(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    def other() -> None:
        print("progress from another thread")

    import torch._logging  # noqa: F401  (its handlers, the structured trace's among them)

    with caplog.at_level(logging.DEBUG), captured_engine_output("ENGINE_X"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        logging.getLogger("dnntune.autotune").warning("dnntune's own warning")
        logging.getLogger("torch.__trace").debug("structured trace")
    out, _ = capsys.readouterr()
    assert "progress from another thread" in out
    own = [r for r in caplog.records if r.name == "dnntune.autotune"]
    assert [r.levelno for r in own] == [logging.WARNING]
    captured = " ".join(r.getMessage() for r in caplog.records if r.name == OUTPUT_LOGGER)
    assert "structured trace" not in captured


def test_nested_captures_restore_the_streams() -> None:
    stdout, stderr = sys.stdout, sys.stderr
    with captured_engine_output("A"), captured_engine_output("B"):
        assert sys.stdout is not stdout
    assert sys.stdout is stdout and sys.stderr is stderr
