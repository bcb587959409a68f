"""A batch norm folded into its conv, inside a user's own CUDA-graph capture of an optimized
model: the fold is recorded with the user's graph, so every replay folds the weights as they
are then (as a replay of PyTorch's forward reads them), and the cached fold is neither read
nor replaced (a graph holding it would read it as of the capture, and, once the next call
after a weight change had made it again, memory that may have been freed)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch_models import SequentialBottleneck, eval_pair, randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch import _bn_fold, _support
from dnntune.torch._bn_fold import folded


def _pair() -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(4, 6, 3, bias=False).eval(), nn.BatchNorm2d(6).eval()
    randomize_batch_norms(bn)
    return conv, bn


def test_a_foreign_capture_folds_afresh_and_leaves_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conv, bn = _pair()
    with torch.no_grad():
        cached = folded(conv, bn)
        assert cached is not None
        assert folded(conv, bn)[0] is cached[0]  # type: ignore[index]  # the cached fold
        entry = conv.__dict__["_dnntune_fold"]
        monkeypatch.setattr(_bn_fold, "foreign_capture", lambda t: True)
        fresh = folded(conv, bn)
        assert fresh is not None and fresh[0] is not cached[0] and fresh[1] is not cached[1]
        torch.testing.assert_close(fresh[0], cached[0], rtol=0, atol=0)
        torch.testing.assert_close(fresh[1], cached[1], rtol=0, atol=0)
        assert conv.__dict__["_dnntune_fold"] is entry  # not replaced by the capture's fold
        conv.weight.mul_(2.0)  # the weights as they are at the (replayed) call
        torch.testing.assert_close(folded(conv, bn)[0], 2.0 * cached[0])  # type: ignore[index]


def test_only_a_capture_of_cuda_tensors_outside_dnntunes_own_recordings_is_foreign() -> None:
    assert not _support.foreign_capture(torch.zeros(1))  # a CPU tensor: no CUDA graph
    token = _support.own_recording.set(True)
    try:
        assert not _support.foreign_capture(torch.zeros(1))
    finally:
        _support.own_recording.reset(token)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_users_capture_reads_the_weights_as_they_are_at_each_replay(tmp_path: Path) -> None:
    """The user records the optimized model's forward, loads new weights in place, replays:
    the new weights' output, as with PyTorch's own forward recorded; then one uncaptured call
    (which folds and caches the new weights) and another replay, still right."""
    ref, _ = eval_pair(lambda: SequentialBottleneck(16))
    ref = ref.cuda()
    model = copy.deepcopy(ref)
    static = torch.randn(2, 16, 12, 12, device="cuda")
    dtt.optimize(
        model, (static,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=False
    )
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        graph.replay()
        torch.testing.assert_close(out, ref(static), atol=2e-3, rtol=2e-3)
        new = copy.deepcopy(ref)
        randomize_batch_norms(new)
        for p in new.parameters():
            p.mul_(1.5)
        model.load_state_dict(new.state_dict())  # in place: the same tensors, new values
        ref.load_state_dict(new.state_dict())
        graph.replay()
        torch.testing.assert_close(out, ref(static), atol=2e-3, rtol=2e-3)
        model(static)  # uncaptured: folds the new weights and caches them
        torch.cuda.synchronize()
        graph.replay()
        torch.testing.assert_close(out, ref(static), atol=2e-3, rtol=2e-3)
