"""dnntune.torch's tuning keeps the heuristic plan unless the winner is confirmed (issue 21)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import dnntune.torch as dtt
from dnntune import testing
from dnntune.torch import runtime


def _conv(path: Path, timings: dict[str, object]) -> tuple[set[str], int]:
    w = torch.randn(4, 3, 3, 3)
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings=timings):  # type: ignore[arg-type]
        runtime._handles.clear()
        runtime.cache().clear()
        runtime.runtime_stats.decisions.clear()
        kept = runtime.runtime_stats.kept_heuristic
        try:
            dtt.configure(policy="tune", overrides=path)
            x = torch.randn(2, 3, 8, 8)
            torch.testing.assert_close(dtt.conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
            return set(runtime.runtime_stats.decisions.values()), (
                runtime.runtime_stats.kept_heuristic - kept
            )
        finally:
            runtime._handles.clear()
            runtime.cache().clear()


def test_a_lucky_winner_is_not_used(tmp_path: Path) -> None:
    # C reads 0.5 ms in the tuning pass, then runs at 2.0 ms; the heuristic pick A is 1.0 ms
    decided, kept = _conv(
        tmp_path / "ov.json", {testing.FAKE_ENGINE_C: [0.5] * 12 + [2.0] * 10_000}
    )
    assert decided == {testing.FAKE_ENGINE_A} and kept == 1


def test_a_confirmed_winner_is_used(tmp_path: Path) -> None:
    decided, kept = _conv(tmp_path / "ov.json", {testing.FAKE_ENGINE_C: 0.5})
    assert decided == {testing.FAKE_ENGINE_C} and kept == 0
