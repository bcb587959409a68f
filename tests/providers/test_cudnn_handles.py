"""cuDNN handles per device and stream (``providers/cudnn/_runtime.cudnn_handle``): a stream
first seen while it records a CUDA graph gets a handle made ahead, never a new one (creating a
handle allocates device memory, which invalidates the recording). CPU, with a scripted cuDNN."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from dnntune.providers.cudnn import _runtime


class _Cudnn:
    def __init__(self) -> None:
        self.created = 0
        self.streams: dict[int, int] = {}

    def create_handle(self) -> int:
        self.created += 1
        return 1000 + self.created

    def set_stream(self, handle: int, stream: int) -> None:
        self.streams[handle] = stream


@pytest.fixture
def cudnn(monkeypatch: pytest.MonkeyPatch) -> tuple[_Cudnn, list[bool]]:
    fake, capturing = _Cudnn(), [False]
    monkeypatch.setattr(_runtime, "load_cudnn", lambda: fake)
    monkeypatch.setattr(_runtime, "_handles", {})
    monkeypatch.setattr(_runtime, "_spares", {})
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    return fake, capturing


def test_a_handle_per_stream_and_spares_made_beside_it(cudnn: Any) -> None:
    fake, _ = cudnn
    first = _runtime.cudnn_handle(0, 11)
    assert _runtime.cudnn_handle(0, 11) == first  # kept
    assert fake.streams[first] == 11
    assert fake.created == 1 + _runtime._SPARES


def test_a_stream_first_seen_while_recording_takes_a_spare(cudnn: Any) -> None:
    fake, capturing = cudnn
    _runtime.cudnn_handle(0, 11)  # outside any recording: spares made
    made = fake.created
    capturing[0] = True
    recorded = _runtime.cudnn_handle(0, 22)
    assert fake.created == made  # nothing created while recording
    assert fake.streams[recorded] == 22 and recorded != _runtime.cudnn_handle(0, 11)
    capturing[0] = False
    _runtime.cudnn_handle(0, 33)  # outside again: the spares are made up
    assert len(_runtime._spares[0]) == _runtime._SPARES
