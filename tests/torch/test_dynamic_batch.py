"""Dynamic shapes: a generalised (-1 batch) override entry serves a new batch size untuned."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import dnntune.torch as dtt
from dnntune import testing
from dnntune.overrides.merge import merge_files
from dnntune.torch import runtime


def test_wildcard_batch_entry_is_reused_for_a_new_batch(tmp_path: Path) -> None:
    path = tmp_path / "ov.json"
    w = torch.randn(4, 3, 3, 3)
    # FAKE_ENGINE_C is scripted fastest; the static order alone would pick FAKE_ENGINE_A.
    with testing.fake_engines(timings={testing.FAKE_ENGINE_C: 0.5}):
        runtime._handles.clear()
        dtt.configure(policy="tune", overrides=path)
        x2 = torch.randn(2, 3, 8, 8)
        torch.testing.assert_close(dtt.conv2d(x2, w, padding=1), F.conv2d(x2, w, padding=1))
        tuned = set(runtime.runtime_stats.decisions.values())
        assert tuned == {testing.FAKE_ENGINE_C}

        report = merge_files([path], path, wildcard_batch=True)
        assert report is not None
        runtime.cache().clear()
        runtime.runtime_stats.decisions.clear()
        calls = runtime.runtime_stats.autotune_calls
        dtt.configure(policy="cached", overrides=path)
        x5 = torch.randn(5, 3, 8, 8)
        torch.testing.assert_close(dtt.conv2d(x5, w, padding=1), F.conv2d(x5, w, padding=1))
        assert runtime.runtime_stats.autotune_calls == calls
        assert set(runtime.runtime_stats.decisions.values()) == {testing.FAKE_ENGINE_C}
        runtime._handles.clear()
