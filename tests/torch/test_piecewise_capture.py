"""CUDA-graph pieces: what is never recorded (it would replay stale state), and the blocks that
are recorded on their own where a whole forward cannot be."""

from __future__ import annotations

import collections
import copy
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._pytree import register_pytree_node, tree_flatten

import dnntune.torch as dtt
from dnntune.torch._buffers import put_back
from dnntune.torch._pieces import blocks
from dnntune.torch._recorded import Slots, opaque_argument, signature
from dnntune.torch.cuda_graphs import DYNAMIC_AFTER, graphs_of

D = 16


class _Block(nn.Module):
    """A residual MLP: two layers with weights, so a piece."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class _Stack(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.blocks = nn.ModuleList(_Block() for _ in range(n))
        self.norm = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


# ---- which blocks (CPU) ----------------------------------------------------------------------
def test_blocks_look_through_containers_and_leave_small_children() -> None:
    model = _Stack()
    found = blocks(model)
    assert found == list(model.blocks)  # embed and norm: one layer with weights each
    outer = nn.Sequential(model, nn.Linear(D, D))  # a model inside a head: the model
    assert blocks(outer) == [model]
    assert blocks(model.blocks[0]) == []  # two leaves: nothing smaller is worth a replay


# ---- what is never recorded (CPU) ------------------------------------------------------------
class _Cache:
    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []


@dataclass
class _Registered:
    """A library's cache whose tensors ``tree_flatten`` sees (a registered pytree node)."""

    keys: list[torch.Tensor]


register_pytree_node(
    _Registered,
    lambda c: (c.keys, None),
    lambda keys, _: _Registered(list(keys)),
)

_Pair = collections.namedtuple("_Pair", "a b")


def _opaque(*args: Any, **kwargs: Any) -> str | None:
    flat, spec = tree_flatten((args, kwargs))
    return opaque_argument(flat, spec)


def test_opaque_arguments_are_named_and_plain_ones_pass() -> None:
    x = torch.zeros(2)
    plain = _opaque(
        x, (x, 3), [x, None], _Pair(x, 1.5), mask=None, size=torch.Size([2]), dtype=torch.half
    )
    assert plain is None
    assert _opaque(x, mode="sum", fn=torch.relu, kind=nn.Linear) is None
    assert _opaque(x, _Cache()) == "_Cache"
    assert _opaque(x, cache=_Registered([x])) == "_Registered"
    assert _opaque(x, [{"c": _Cache()}]) == "_Cache"


class _Grows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.cache = torch.zeros(0, D)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache = torch.cat([self.cache, self.lin(x)])
        self.seen = self.seen + 1  # a buffer given a new tensor
        return self.cache.sum(0, keepdim=True)


def test_slots_name_the_tensors_a_forward_replaces_and_put_them_back() -> None:
    model = _Grows()
    cache, seen, weight = model.cache, model.seen, model.lin.weight
    slots = Slots(model)
    assert slots.replaced() == []
    model(torch.ones(1, D))
    assert sorted(slots.replaced()) == ["cache", "seen"]
    slots.restore()
    assert model.cache is cache and model.seen is seen and model.lin.weight is weight
    assert "seen" in dict(model.named_buffers())  # a buffer again, not a plain attribute


def test_weight_norms_recomputed_weight_is_not_a_replaced_tensor() -> None:
    """``torch.nn.utils.weight_norm`` sets ``weight`` afresh before every call, from g and v:
    the recording records that computation, so the forward may be recorded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old weight_norm is deprecated
        model = nn.utils.weight_norm(nn.Linear(D, D))
    slots = Slots(model)
    model(torch.ones(1, D))
    assert slots.replaced() == []


def _key(*args: Any, **kwargs: Any) -> Any:
    flat, spec = tree_flatten((args, kwargs))
    found = signature(flat, spec, device_type="cpu")
    assert found is not None
    return found[0]


def test_a_signature_holds_the_arguments_structure() -> None:
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert _key(x=a, y=b) == _key(x=b, y=a)  # the same shapes in the same places
    assert _key(x=a, y=b) != _key(y=b, x=a)  # the same leaves in another order
    assert _key(a, mask=b) != _key(a, bias=b)
    assert _key(a, (b,)) != _key((a, b))
    assert _key(a, scale=1.0) != _key(a, scale=2.0)


def test_only_the_buffers_written_are_put_back() -> None:
    """A buffer copied back gets a new version, which re-records every other capture that
    reads it: only the ones the warm-up wrote are copied back."""
    read, written = torch.zeros(3), torch.zeros(3)
    saved = [(t, t.clone(), t._version) for t in (read, written)]
    written.add_(1.0)
    versions = read._version, written._version
    put_back(saved)
    assert read._version == versions[0]  # untouched: not copied
    assert written._version > versions[1] and written.sum() == 0.0  # copied back


# ---- on the GPU ------------------------------------------------------------------------------
def _optimized(ref: nn.Module, tmp_path: Path, *example: torch.Tensor) -> tuple[nn.Module, Any]:
    model = copy.deepcopy(ref)
    report = dtt.optimize(
        model,
        example or None,
        policy="heuristic",
        overrides=tmp_path / "ov.json",
        cuda_graph=True,
        check_speed=False,
    )
    return model, report


class _SyncsInMask(_Stack):
    """A data-dependent mask read on the host in every call, recorded or not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if bool((x > 100).any()):
            h = torch.zeros_like(h)
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


@pytest.mark.gpu
def test_a_forward_that_syncs_in_its_recording_replays_its_blocks(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _SyncsInMask().cuda().eval()
    x = torch.randn(4, D, device="cuda")
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="3 of its blocks recorded on their own"):
        model, report = _optimized(ref, tmp_path, x)
    assert report.pieces == ["blocks.0", "blocks.1", "blocks.2"]
    assert "3 block(s) replay as CUDA graphs on their own" in str(report)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, D, device="cuda")
            torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        x[0, 0] = 1000.0  # the host-read branch, taken
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    assert graphs_of(model).uncapturable
    for block in model.blocks:
        state = graphs_of(block)
        assert state.records == 1 and state.replays >= 4


class _SyncingBlock(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y if bool(y.isfinite().all()) else torch.zeros_like(y)


@pytest.mark.gpu
def test_a_block_whose_recording_fails_leaves_the_next_ones_recording(tmp_path: Path) -> None:
    """A capture that fails leaves its memory pool unusable for the next one: the blocks after
    it record into a new pool."""
    torch.manual_seed(0)
    ref = _SyncsInMask().cuda().eval()
    ref.blocks[1] = _SyncingBlock().cuda().eval()
    x = torch.randn(4, D, device="cuda")
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="3 of its blocks recorded on their own"):
        model, report = _optimized(ref, tmp_path, x)
    assert report.pieces == ["blocks.0", "blocks.2"]
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, D, device="cuda")
            torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    assert graphs_of(model.blocks[1]).uncapturable
    assert graphs_of(model.blocks[2]).replays >= 2


class _GrowingAttention(nn.Module):
    """Keeps its keys in a plain attribute that each call grows by ``torch.cat``."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(D, D)
        self.cache = torch.zeros(0, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache = torch.cat([self.cache, self.k(x)])
        weights = torch.softmax(self.cache @ x.T, dim=0)
        return (weights * self.cache).sum(0, keepdim=True)


class _DecoderBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _GrowingAttention()
        self.mlp = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x + self.attn(x))


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_DecoderBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.gpu
def test_a_cache_that_grows_is_never_replayed_stale(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _Decoder().cuda().eval()
    for layer in ref.layers:
        layer.attn.cache = layer.attn.cache.cuda()
    model, _ = _optimized(ref, tmp_path)
    with torch.no_grad(), pytest.warns(dtt.DnnTuneFallbackWarning, match="new tensor"):
        x = torch.randn(1, D, device="cuda")
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    with torch.no_grad():
        for _ in range(5):  # decode steps: the same input shape each time
            x = torch.randn(1, D, device="cuda")
            torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    for mine, theirs in zip(model.layers, ref.layers, strict=True):
        assert mine.attn.cache.shape == theirs.attn.cache.shape == (6, D)  # one row per call
        torch.testing.assert_close(mine.attn.cache, theirs.attn.cache, atol=2e-2, rtol=2e-2)
        assert graphs_of(mine).uncapturable and graphs_of(mine.attn).records == 0
        assert graphs_of(mine.mlp).records == 1 and graphs_of(mine.mlp).replays >= 5


class _TakesCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(2))

    def forward(self, x: torch.Tensor, cache: _Cache) -> torch.Tensor:
        cache.items.append(x)
        for block in self.blocks:
            x = block(x)
        return x * len(cache.items)


@pytest.mark.gpu
def test_an_object_argument_is_never_recorded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _TakesCache().cuda().eval()
    model, _ = _optimized(ref, tmp_path)
    mine, theirs = _Cache(), _Cache()
    with torch.no_grad(), pytest.warns(dtt.DnnTuneFallbackWarning, match="_Cache"):
        x = torch.randn(2, D, device="cuda")
        torch.testing.assert_close(model(x, mine), ref(x, theirs), atol=2e-2, rtol=2e-2)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, D, device="cuda")
            torch.testing.assert_close(model(x, mine), ref(x, theirs), atol=2e-2, rtol=2e-2)
    assert len(mine.items) == len(theirs.items) == 4  # the object was updated once per call
    assert graphs_of(model).records == 0
    # a refused signature keeps the object's type, not the object (a cache and its tensors)
    assert "_Cache object" not in repr(graphs_of(model).uncapturable)
    assert all(graphs_of(b).replays >= 3 for b in model.blocks)


@pytest.mark.gpu
def test_shapes_that_keep_changing_stop_recording_and_replay_again(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _Stack(2).cuda().eval()
    model, _ = _optimized(ref, tmp_path)
    with torch.no_grad():
        for rows in range(1, 9):  # a new shape every call
            x = torch.randn(rows, D, device="cuda")
            torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        state = graphs_of(model)
        assert state.records == DYNAMIC_AFTER and not state.uncapturable
        assert state.pieces == list(model.blocks)
        replays = state.replays
        x = torch.randn(2, D, device="cuda")  # a shape recorded before: replayed
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        assert state.replays == replays + 1 and state.new_in_a_row == 0


@pytest.mark.gpu
def test_a_users_own_capture_of_an_optimized_model_records_its_forward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _Stack().cuda().eval()
    static = torch.randn(4, D, device="cuda")
    model, _ = _optimized(ref, tmp_path, static)
    records = graphs_of(model).records
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        for _ in range(2):
            static.copy_(torch.randn(4, D, device="cuda"))
            graph.replay()
            torch.testing.assert_close(out, ref(static), atol=2e-2, rtol=2e-2)
    assert graphs_of(model).records == records  # no recording of ours inside the user's


class _WritesInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return self.lin(x)


@pytest.mark.gpu
def test_a_forward_that_writes_its_input_in_place_is_never_recorded(tmp_path: Path) -> None:
    """A replay would write the recording's copy of the input, not the caller's tensor."""
    torch.manual_seed(0)
    ref = _WritesInput().cuda().eval()
    model, _ = _optimized(ref, tmp_path)
    x = torch.randn(2, D, device="cuda")
    x_ref = x.clone()
    with torch.no_grad(), pytest.warns(dtt.DnnTuneFallbackWarning, match="in place"):
        got = model(x)
    with torch.no_grad():
        want = ref(x_ref)
    torch.testing.assert_close(x, x_ref)  # written once, as eager writes it
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert graphs_of(model).records == 0
