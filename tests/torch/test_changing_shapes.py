"""An optimized model whose shapes keep changing (a generation loop, its keys one token longer
each step) stops tuning its new signatures after ``CHANGING_AFTER`` forwards in a row that met
one, runs PyTorch's op for them, and tunes again once ``SETTLED_AFTER`` forwards in a row bring
none (``torch/_changing_shapes.py``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import _changing_shapes, runtime


class _Attention(nn.Module):
    """Self-attention over the tokens given: a new key length whenever the length changes."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, c))


def _optimized(tmp_path: Path, model: nn.Module, x: torch.Tensor) -> nn.Module:
    optimized = copy.deepcopy(model)
    dtt.optimize(
        optimized,
        (x,),
        policy="tune",
        overrides=tmp_path / "ov.json",
        cuda_graph=False,
        check_speed=False,
        revert_if_slower=False,
    )
    return optimized


def _tunes(model: nn.Module, x: torch.Tensor, ref: nn.Module) -> int:
    """The autotune calls one forward ran; its output checked against eager's."""
    before = runtime.runtime_stats.autotune_calls
    with torch.no_grad():
        got, want = model(x), ref(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return runtime.runtime_stats.autotune_calls - before


def test_a_length_that_grows_each_call_stops_being_tuned_until_it_settles(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    ref = _Attention().eval()
    model = _optimized(tmp_path, ref, torch.randn(1, 8, 32))
    after = _changing_shapes.CHANGING_AFTER
    untuned = runtime.runtime_stats.changing_untuned
    tuned = [_tunes(model, torch.randn(1, 8 + n, 32), ref) for n in range(1, after + 3)]
    assert all(t > 0 for t in tuned[:after])  # each new length tuned, while it may be a one-off
    assert tuned[after:] == [0, 0]  # then its new lengths run PyTorch's op, untuned
    assert runtime.runtime_stats.changing_untuned > untuned
    # a length seen before, then a new one: not settled yet (a generation loop's next prompt)
    assert _tunes(model, torch.randn(1, 8, 32), ref) == 0
    assert _tunes(model, torch.randn(1, 41, 32), ref) == 0
    settled = _changing_shapes.SETTLED_AFTER
    assert [_tunes(model, torch.randn(1, 8, 32), ref) for _ in range(settled)] == [0] * settled
    assert _tunes(model, torch.randn(1, 40, 32), ref) > 0  # settled: a new one is tuned again


def test_a_new_batch_size_now_and_then_is_tuned(tmp_path: Path) -> None:
    """A static model meeting a new batch size once (a forward of new signatures, then
    forwards of known ones) tunes it, every time."""
    torch.manual_seed(0)
    ref = _Attention().eval()
    model = _optimized(tmp_path, ref, torch.randn(1, 8, 32))
    for batch in (2, 3, 4, 5):
        assert _tunes(model, torch.randn(batch, 8, 32), ref) > 0
        assert _tunes(model, torch.randn(batch, 8, 32), ref) == 0


def test_calls_outside_an_optimized_model_always_tune() -> None:
    """A bare functional call has no model whose shapes could settle: tuned on first sight."""
    assert _changing_shapes.new_signature()
    for _ in range(_changing_shapes.CHANGING_AFTER + 2):
        assert _changing_shapes.new_signature()


@pytest.mark.parametrize("raises", [False, True])
def test_a_forward_that_raises_still_ends_its_count(raises: bool) -> None:
    """The count is kept per optimized model and per thread; a forward that raises ends."""
    model = nn.Identity()
    for _ in range(_changing_shapes.CHANGING_AFTER):
        _changing_shapes.forward_begins(model)
        _changing_shapes.new_signature()
        _changing_shapes.forward_ends()
    _changing_shapes.forward_begins(model)
    try:
        assert not _changing_shapes.new_signature()  # changing: not tuned
        if raises:
            raise RuntimeError("the forward failed")
    except RuntimeError:
        pass
    finally:
        _changing_shapes.forward_ends()
    assert _changing_shapes.new_signature()  # outside any optimized forward again
    for _ in range(_changing_shapes.SETTLED_AFTER):  # forwards with nothing new: settled
        _changing_shapes.forward_begins(model)
        _changing_shapes.forward_ends()
    _changing_shapes.forward_begins(model)
    assert _changing_shapes.new_signature()
    _changing_shapes.forward_ends()


class _Unhashable(nn.Module):
    __hash__ = None  # type: ignore[assignment]  # a class that defines __eq__ alone

    def __eq__(self, other: object) -> bool:
        return other is self


def test_a_module_that_cannot_be_hashed_tunes_as_before() -> None:
    model = _Unhashable()
    for _ in range(_changing_shapes.CHANGING_AFTER + 2):
        _changing_shapes.forward_begins(model)
        assert _changing_shapes.new_signature()
        _changing_shapes.forward_ends()
    _changing_shapes.forget(model)  # what optimize calls at its end: no error either
