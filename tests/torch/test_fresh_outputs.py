"""A replay hands out its outputs afresh: tensors cloned, and an object of tensors and plain
values (a transformers cache) copied whole around clones of its tensors; an object holding
anything else is named, and its forward is not recorded."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from dnntune.torch._fresh_outputs import FreshOutput, clones, unfresh_output


class _Layer:
    """A cache layer in transformers' DynamicLayer form: tensors and plain values."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values
        self.is_initialized = True
        self.dtype, self.device = keys.dtype, keys.device


class _Cache:
    """A cache in transformers' DynamicCache form: its layers, the class it makes them of."""

    def __init__(self, layers: list[_Layer]) -> None:
        self.layers = layers
        self.layer_class_to_replicate = _Layer
        self.offloading = False


@dataclass
class _Output:
    last_hidden_state: torch.Tensor
    past_key_values: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class _Slotted:
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _OwnCopy:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __deepcopy__(self, memo: dict[int, Any]) -> _OwnCopy:
        return self  # a copy hook of its own: the walk cannot tell what it shares


def _cache() -> tuple[torch.Tensor, _Cache]:
    hidden = torch.randn(2, 3)
    k, v = torch.randn(2, 4, 3, 5), torch.randn(2, 4, 3, 5)
    return hidden, _Cache([_Layer(k, v), _Layer(k[:, :2], v.transpose(1, 2))])


def test_plain_outputs_and_objects_of_tensors_can_be_handed_out_afresh() -> None:
    t = torch.zeros(2)
    _hidden, cache = _cache()
    assert unfresh_output(t) is None
    assert unfresh_output((t, {"a": [t, 3, None]})) is None
    assert unfresh_output(cache) is None
    assert unfresh_output([t, _Slotted(t)]) is None
    cyclic = _Layer(t, t)
    cyclic.parent = cyclic  # type: ignore[attr-defined]
    assert unfresh_output(cyclic) is None


def test_an_object_holding_more_than_data_is_named() -> None:
    t = torch.zeros(2)
    holds_module = _Layer(t, t)
    holds_module.owner = nn.Linear(2, 2)  # type: ignore[attr-defined]
    assert unfresh_output([t, holds_module]) == "_Layer"
    locked = _Layer(t, t)
    locked.lock = threading.Lock()  # type: ignore[attr-defined]
    assert unfresh_output(locked) == "_Layer"
    assert unfresh_output(_OwnCopy(t)) == "_OwnCopy"
    assert unfresh_output(torch.Generator()) == "Generator"
    deep: Any = t
    for _ in range(12):  # deeper than the walk goes
        deep = _Slotted(deep)
    assert unfresh_output(deep) == "_Slotted"


def test_each_call_gets_an_object_of_its_own_around_clones() -> None:
    hidden, cache = _cache()
    static = _Output(hidden, cache, {"n": 3})
    fresh = FreshOutput(static)
    a, b = fresh.make(), fresh.make()
    assert a.past_key_values is not b.past_key_values is not cache
    for out in (a, b):
        torch.testing.assert_close(out.last_hidden_state, hidden)
        for mine, theirs in zip(out.past_key_values.layers, cache.layers, strict=True):
            assert mine is not theirs
            torch.testing.assert_close(mine.keys, theirs.keys)
            torch.testing.assert_close(mine.values, theirs.values)
            assert mine.keys.data_ptr() != theirs.keys.data_ptr()
        assert out.past_key_values.layer_class_to_replicate is _Layer
        assert out.extra == {"n": 3}
    # the caller fills its cache (a generation loop appends a layer, writes a tensor): neither
    # the recording's nor the next call's changes
    a.past_key_values.layers.append(_Layer(hidden, hidden))
    a.past_key_values.layers[0].keys.fill_(7.0)
    c = fresh.make()
    assert len(c.past_key_values.layers) == 2 and len(cache.layers) == 2
    torch.testing.assert_close(c.past_key_values.layers[0].keys, cache.layers[0].keys)
    # the next replay overwrites the graph's tensors: a copy made before keeps its values
    before = c.past_key_values.layers[1].values.clone()
    cache.layers[1].values.add_(1.0)
    torch.testing.assert_close(c.past_key_values.layers[1].values, before)


def test_a_tensor_held_twice_is_one_clone_held_twice() -> None:
    hidden, cache = _cache()
    cache.layers[0].keys = hidden  # the output and the cache hold one tensor, as eager may
    out = FreshOutput((hidden, cache)).make()
    assert out[1].layers[0].keys is out[0]
    assert out[0] is not hidden


def test_a_tensor_alone_or_plain_values_are_cloned_as_before() -> None:
    t = torch.randn(3)
    one = FreshOutput(t).make()
    assert one is not t and torch.equal(one, t)
    pair = FreshOutput((t, 2, "x")).make()
    assert pair[0] is not t and pair[1:] == (2, "x")


def test_a_tensor_given_twice_is_one_clone_given_twice() -> None:
    t = torch.randn(3)
    out = FreshOutput((t, [t, 1])).make()
    assert out[0] is out[1][0] and out[0] is not t and torch.equal(out[0], t)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clones_are_made_in_one_batch_and_laid_out_as_clone_lays_them_out() -> None:
    """``clones`` copies CUDA tensors by one batched kernel: the values, dtypes and strides of
    ``Tensor.clone`` (a transposed tensor stays transposed, a sliced one comes out contiguous),
    each in memory of its own."""
    torch.manual_seed(0)
    base = torch.randn(4, 6, 8, device="cuda", dtype=torch.bfloat16)
    given = [
        base,
        base.transpose(1, 2),  # dense, not contiguous: kept as it is
        base[:, :3],  # not dense: contiguous, as clone makes it
        torch.arange(10, device="cuda"),  # another dtype
        torch.randn(5, device="cuda", dtype=torch.float32),
    ]
    got = clones(given)
    for mine, theirs in zip(got, given, strict=True):
        want = theirs.clone()
        assert mine.dtype is want.dtype and mine.stride() == want.stride()
        assert torch.equal(mine, theirs)
        assert mine.untyped_storage().data_ptr() != theirs.untyped_storage().data_ptr()
    assert len({t.untyped_storage().data_ptr() for t in got}) == len(got)
