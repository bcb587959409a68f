"""A ``cat`` of one tensor and PyTorch's legacy empty tensors (transformers' ``DynamicCache``
starting a layer) is recorded as a contiguous clone: the values, shape, strides and type of
``cat``'s answer, memory of its own; every other ``cat`` runs as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import optimize_to_replay

from dnntune.torch import cuda_graphs
from dnntune.torch._lone_cat import LoneCatCopies, contiguous_copy, lone_input


def _view(device: str = "cpu") -> torch.Tensor:
    """A key as GPT-2's attention makes it: a transposed view of a third of its projection."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 5, 3 * 4 * 3, device=device)
    return qkv.split(4 * 3, dim=2)[1].view(2, 5, 4, 3).transpose(1, 2)


def _same_as_cat(got: torch.Tensor, parts: list[torch.Tensor], dim: int) -> None:
    want = torch.cat(parts, dim=dim)
    assert torch.equal(got, want)
    assert got.dtype is want.dtype and got.shape == want.shape and got.stride() == want.stride()


def test_a_lone_cat_is_a_contiguous_copy_of_its_one_input() -> None:
    k = _view()
    empty = torch.tensor([])
    for parts, dim in (([empty, k], -2), ([k, empty], 1), ([empty, k, empty], 0)):
        with LoneCatCopies() as mode:
            got = torch.cat(parts, dim=dim)
        assert mode.copies == 1
        _same_as_cat(got, parts, dim)
        assert got.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
    contiguous = torch.randn(3, 4)
    with LoneCatCopies() as mode:
        got = torch.concat([empty, contiguous])  # contiguous already: still memory of its own
        also = torch.concatenate([contiguous, empty], axis=1)  # type: ignore[call-arg]
    assert mode.copies == 2
    _same_as_cat(got, [empty, contiguous], 0)
    assert got.data_ptr() != contiguous.data_ptr() and torch.equal(also, contiguous)
    got.fill_(0.0)
    assert contiguous.abs().sum() > 0  # writing the answer never writes the input


def test_every_other_cat_runs_as_written() -> None:
    k, empty = _view(), torch.tensor([])
    out = torch.empty(0)
    cases: list[tuple[list[Any], dict[str, Any]]] = [
        ([[k, k], -2], {}),  # two inputs with elements
        ([[empty, k.double()], -2], {}),  # cat promotes the types
        ([[empty, k]], {"dim": -2, "out": out}),  # an out= tensor
        ([[torch.empty(2, 0, 5, 3), k]], {"dim": 1}),  # an empty tensor that is not 1-D
        ([[k]], {"dim": 0}),  # one input alone
        ([[empty, empty]], {}),  # nothing but empty ones
    ]
    with LoneCatCopies() as mode, pytest.raises(TypeError):
        torch.cat([empty, k], -2, dim=-2)  # type: ignore[misc]  # given twice: cat raises
    assert mode.copies == 0
    for args, kwargs in cases:
        with LoneCatCopies() as mode:
            got = torch.cat(*args, **kwargs)
        assert mode.copies == 0
        assert torch.equal(got, torch.cat(*args, **kwargs))
    # a cat that PyTorch refuses is refused with its own error
    for bad in ([empty, torch.tensor(1.0)], [empty, k]):
        dim = 0 if bad[1].dim() == 0 else 7
        with pytest.raises((RuntimeError, IndexError)) as theirs:
            torch.cat(bad, dim=dim)
        with LoneCatCopies(), pytest.raises(type(theirs.value)):
            torch.cat(bad, dim=dim)


def test_the_copy_moves_the_same_bytes_in_the_layout_clone_gives() -> None:
    torch.manual_seed(0)
    wide = torch.randn(2, 5, 3 * 4 * 8).to(torch.bfloat16)
    nan = wide.view(torch.int16).clone()
    nan[0, 0, :4] = torch.tensor([0x7FC1, -1, 0x7F81, 0x0001], dtype=torch.int16)  # odd payloads
    cases = [
        wide.split(32, dim=2)[1].view(2, 5, 4, 8).transpose(1, 2),  # moved as int64
        nan.view(torch.bfloat16)[:, :, :32].view(2, 5, 4, 8).transpose(1, 2),
        torch.randn(3, 6).half()[:, 1:4],  # a row of 3 half values: not whole words
        torch.randn(4, 8)[:, :4].t(),  # its rows not contiguous
        torch.arange(24).view(2, 12)[:, ::2],  # 8-byte values: copied as they are
        (torch.randn(2, 16) > 0)[:, :8],
        torch.randn(1, 4, 1, 8)[:, :, :, :4].expand(3, 4, 2, 4),  # strides of 0
        torch.empty(0, 8),
    ]
    for x in cases:
        got, want = contiguous_copy(x), x.clone(memory_format=torch.contiguous_format)
        assert got.dtype is want.dtype and got.shape == want.shape
        assert got.stride() == want.stride()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) if got.numel() else True
        if x.numel():
            assert got.data_ptr() != x.data_ptr()


def test_what_counts_as_a_lone_input() -> None:
    k, empty = _view(), torch.tensor([])
    assert lone_input([empty, k]) is k
    assert lone_input((k, empty)) is k
    assert lone_input([k]) is None
    assert lone_input([empty, k, k]) is None
    assert lone_input([empty, nn.Parameter(k.contiguous())]) is None  # a subclass: as written
    assert lone_input(k) is None  # a tensor is not a list of them
    assert lone_input([empty.half(), k]) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events:UserWarning")
def test_a_recorded_cache_start_copies_instead_of_cat_and_replays_the_same(tmp_path: Path) -> None:
    """A forward in DynamicCache's form, recorded: the recording holds no cat kernel, and its
    replays give eager's values, strides and a cache of their own each call."""

    class Start(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(24, 3 * 24)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
            q, k, v = self.proj(x).split(24, dim=2)
            k = k.view(2, 16, 4, 6).transpose(1, 2)
            v = v.view(2, 16, 4, 6).transpose(1, 2)
            empty = torch.tensor([], device=x.device, dtype=x.dtype)
            keys, values = torch.cat([empty, k], dim=-2), torch.cat([empty, v], dim=-2)
            return q.sum(-1), [keys, values]

    torch.manual_seed(0)
    model = Start().cuda().eval()
    x = torch.randn(2, 16, 24, device="cuda")
    with torch.no_grad():
        want = model(x)
    optimize_to_replay(model, tmp_path / "ov.json")
    with torch.no_grad():
        model(x)  # records
        state = cuda_graphs.graphs_of(model)
        assert state.records == 1
        replays = state.replays
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = model(x)
            again = model(x)
            torch.cuda.synchronize()
        assert state.replays == replays + 2
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not any("CatArray" in n for n in names), names
    for out in (got, again):
        torch.testing.assert_close(out[0], want[0])
        for mine, theirs in zip(out[1], want[1], strict=True):
            torch.testing.assert_close(mine, theirs)
            assert mine.stride() == theirs.stride()
    assert got[1][0].data_ptr() != again[1][0].data_ptr()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_a_compiled_part_of_a_recorded_forward_is_still_recorded(tmp_path: Path) -> None:
    """``torch.compile`` guards on the mode stack, so the recording's mode makes a compiled
    function inside the forward compile again there; the forward is recorded all the same (the
    capture made again without the mode where that compile fails in it) and replays right."""

    class Part(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x * 2.0, dim=-1) + x.sum(-1, keepdim=True)

    class Whole(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)
            self.part = torch.compile(Part())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.part(self.proj(x))

    torch.manual_seed(0)
    model = Whole().cuda().eval()
    x = torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        want, want_next = model(x), model(x + 1.0)
    optimize_to_replay(model, tmp_path / "ov.json")
    with torch.no_grad():
        first = model(x)
        state = cuda_graphs.graphs_of(model)
        assert state.records == 1 and not state.uncapturable
        replays = state.replays
        following = model(x + 1.0)
        assert state.replays == replays + 1
    torch.testing.assert_close(first, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(following, want_next, atol=2e-2, rtol=2e-2)


def test_a_causal_lm_under_the_mode_gives_its_own_answer_and_cache() -> None:
    """GPT-2 and LLaMA with their default ``DynamicCache``: every layer's first append is a
    lone cat (two a layer), and the forward under the mode returns eager's hidden states and a
    cache of the same values and strides. transformers is not installed in CI."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    models = [
        transformers.GPT2Model(
            transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=50, n_positions=32)
        ),
        transformers.LlamaModel(
            transformers.LlamaConfig(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=50,
            )
        ),
    ]
    ids = torch.randint(1, 50, (2, 7))
    for model in models:
        model.eval()
        with torch.no_grad():
            want = model(ids, use_cache=True)
            with LoneCatCopies() as mode:
                got = model(ids, use_cache=True)
        layers = model.config.num_hidden_layers
        assert mode.copies == 2 * layers, type(model).__name__
        assert torch.equal(got.last_hidden_state, want.last_hidden_state)
        for i in range(layers):
            for name in ("keys", "values"):
                mine = getattr(got.past_key_values.layers[i], name)
                theirs = getattr(want.past_key_values.layers[i], name)
                assert torch.equal(mine, theirs) and mine.stride() == theirs.stride()
