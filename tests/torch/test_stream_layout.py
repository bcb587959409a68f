"""A residual stream with its last dimension strided is made row-major once (``_stream_layout``):
Whisper's encoder permutes its convolution's output and every later add keeps that layout."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch._stream_layout import MARKER, find, strided_last
from dnntune.torch._support import pytorch_route


class Block(nn.Module):
    """A pre-norm residual block: its output is laid out as its input (the residual add
    keeps the first operand's layout)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class Encoder(nn.Module):
    """Whisper's shape: a convolution over [batch, channels, time], permuted to [batch, time,
    channels] (not copied), plus positions, then blocks and a final norm (or none)."""

    def __init__(self, d: int = 16, layers: int = 3, final_norm: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, d, 3, padding=1)
        self.positions = nn.Parameter(torch.randn(12, d))
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d) if final_norm else nn.Identity()

    def forward(self, x: torch.Tensor, hidden_states: bool = False) -> Any:
        h = self.conv(x).permute(0, 2, 1) + self.positions
        states = [h]
        for layer in self.layers:
            h = layer(h)
            states.append(h)
        # transformers' output_hidden_states=True: the stream itself, as each layer gave it
        return (self.norm(h), states) if hidden_states else self.norm(h)


def _inputs_of(block: nn.Module, model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    handle = block.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen


def test_what_counts_as_a_strided_last_dimension() -> None:
    t = torch.randn(2, 16, 12)
    assert strided_last(t.permute(0, 2, 1))
    assert not strided_last(t)
    assert not strided_last(t.permute(0, 2, 1).contiguous())
    assert not strided_last(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last))
    assert not strided_last(torch.randn(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d))
    assert not strided_last(torch.randint(0, 5, (4, 3)).t())  # not floating point
    assert not strided_last(torch.randn(4, 1).expand(4, 1))  # a last dimension of one
    assert not strided_last(torch.randn(5))  # one dimension
    assert not strided_last("not a tensor")


def test_a_permuted_stream_runs_row_major_and_gives_eagers_answer_and_layout() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 4, 12)
    opt = copy.deepcopy(model)
    report = dtt.optimize(opt, (x,), policy="heuristic", revert_if_slower=False)
    assert any("layers.0: its input made row-major" in f for f in report.fusions), report
    assert getattr(type(opt.layers[0]), MARKER, False)
    assert not getattr(type(opt.layers[1]), MARKER, False)  # once, at the first block
    with torch.no_grad():
        want, got = model(x), opt(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()
    # eager's stream is strided from its first block to its last; the optimized one row-major
    assert all(strided_last(h) for h in _inputs_of(model.layers[2], model, x))
    assert not any(strided_last(h) for h in _inputs_of(opt.layers[2], opt, x))
    # PyTorch's route runs the block's own forward, its input as given
    pytorch_route.on = True
    try:
        assert all(strided_last(h) for h in _inputs_of(opt.layers[2], opt, x))
    finally:
        pytorch_route.on = False


def test_a_model_whose_output_would_change_layout_is_left_as_it_is() -> None:
    """Without a final norm the stream is the output: eager's is laid out strided, so making
    it row-major would change what the caller gets."""
    torch.manual_seed(0)
    model = Encoder(final_norm=False).eval()
    x = torch.randn(2, 4, 12)
    with torch.no_grad():
        assert strided_last(model(x))
    assert find(model, lambda m: m(x)) == []
    opt = copy.deepcopy(model)
    report = dtt.optimize(opt, (x,), policy="heuristic", revert_if_slower=False)
    assert not any("row-major" in f for f in report.fusions)
    assert not getattr(type(opt.layers[0]), MARKER, False)
    with torch.no_grad():
        assert opt(x).stride() == model(x).stride()


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: Encoder(layers=1), id="a single block"),
        pytest.param(
            lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)).to(
                memory_format=torch.channels_last
            ),
            id="channels-last convolutions",
        ),
    ],
)
def test_no_run_of_blocks_or_a_chosen_layout_is_left_as_it_is(model: Any) -> None:
    m = model().eval()
    x = torch.randn(2, 4, 12) if isinstance(m, Encoder) else torch.randn(2, 3, 8, 8)
    if not isinstance(m, Encoder):
        x = x.to(memory_format=torch.channels_last)
    assert find(m, lambda mod: mod(x)) == []


def test_a_forward_that_raises_finds_nothing() -> None:
    model = Encoder().eval()
    assert find(model, lambda m: m(torch.randn(2, 5, 12))) == []  # 5 channels, not 4


def test_the_optimized_model_pickles_and_reverts_to_pytorchs_classes() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 4, 12)
    dtt.optimize(model, (x,), policy="heuristic", revert_if_slower=False)
    loaded = pickle.loads(pickle.dumps(model))
    assert type(loaded.layers[0]) is Block
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)


class AddsInPlace(Block):
    """``x += ...``: writes into its input and returns it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.fc(self.norm(x))
        return x


class WritesASlice(Block):
    """Writes into its input (its first position) and returns a new tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 0] = 0.0
        return x + self.fc(self.norm(x))


class KeepsTheStream(Encoder):
    """Returns the stream as it entered the first block too: eager's blocks wrote into it."""

    def __init__(self, block: type[Block]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(block(16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h = first = self.conv(x).permute(0, 2, 1) + self.positions
        for layer in self.layers:
            h = layer(h)
        return self.norm(h), first


def _left_alone(model: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    """An optimized copy of ``model`` and its input, where ``find`` finds no block."""
    x = torch.randn(2, 4, 12)
    assert find(model, lambda m: m(x)) == []
    opt = copy.deepcopy(model)
    dtt.optimize(opt, (x,), policy="heuristic", revert_if_slower=False)
    return opt, x


@pytest.mark.parametrize("block", [AddsInPlace, WritesASlice])
def test_a_block_that_writes_into_its_input_is_left_as_it_is(block: type[Block]) -> None:
    """A copy of its input would leave the caller's tensor unwritten: the model's second
    output (the stream the blocks wrote into) came out with other values."""
    torch.manual_seed(0)
    model = KeepsTheStream(block).eval()
    opt, x = _left_alone(model)
    with torch.no_grad():
        for got, want in zip(opt(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@dataclasses.dataclass
class Hidden:
    """A user's output class (no dict, no tuple)."""

    state: torch.Tensor


class Opaque:
    """An object of the user's with the stream as an attribute."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state


class ReturnsAnObject(Encoder):
    """Returns the stream (laid out strided by eager) inside ``wrapper``."""

    def __init__(self, wrapper: type) -> None:
        super().__init__(final_norm=False)
        self.wrapper = wrapper

    def forward(self, x: torch.Tensor) -> Any:
        return self.wrapper(super().forward(x))


@pytest.mark.parametrize("wrapper", [Hidden, Opaque])
def test_a_stream_returned_inside_an_object_keeps_eagers_layout(wrapper: type) -> None:
    """Only the object's type was compared before: the stream it holds came out row-major."""
    torch.manual_seed(0)
    model = ReturnsAnObject(wrapper).eval()
    opt, x = _left_alone(model)
    with torch.no_grad():
        got, want = opt(x).state, model(x).state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()


class DropsOut(Block):
    """Dropout on the stream: its mask is drawn in the order of its input's memory."""

    def __init__(self, d: int) -> None:
        super().__init__(d)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(self.drop(x)))


def test_a_model_trained_after_optimize_draws_eagers_dropout_masks() -> None:
    """Optimized in eval mode, then trained: a seeded forward and its gradients are eager's."""
    torch.manual_seed(0)
    model = Encoder().eval()
    model.layers = nn.ModuleList(DropsOut(16) for _ in range(3))
    x = torch.randn(2, 4, 12)
    opt = copy.deepcopy(model)
    dtt.optimize(opt, (x,), policy="heuristic", revert_if_slower=False)
    assert getattr(type(opt.layers[0]), MARKER, False)
    for m in (model, opt):
        m.train()
        torch.manual_seed(1)
        m(x).sum().backward()
    torch.manual_seed(1)
    want = model(x)
    torch.manual_seed(1)
    torch.testing.assert_close(opt(x), want, rtol=1e-5, atol=1e-5)
    for got, grad in zip(opt.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad, grad.grad, rtol=1e-5, atol=1e-5)


class TakesSparse(Block):
    """Takes its input dense or sparse."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to_dense() if x.layout != torch.strided else x)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_a_sparse_input_is_passed_on_as_given(layout: torch.layout) -> None:
    """A sparse COO tensor's strides read (0, 0), and ``contiguous()`` of one raised; a CSR
    tensor's ``stride()`` raised."""
    torch.manual_seed(0)
    model = Encoder().eval()
    model.layers = nn.ModuleList(TakesSparse(16) for _ in range(3))
    x = torch.randn(2, 4, 12)
    dtt.optimize(model, (x,), policy="heuristic", revert_if_slower=False)
    assert getattr(type(model.layers[0]), MARKER, False)
    dense = torch.randn(12, 16)
    sparse = dense.to_sparse(layout=layout)
    assert not strided_last(sparse)
    with torch.no_grad():
        torch.testing.assert_close(model.layers[0](sparse), model.layers[0](dense))


def test_a_second_optimize_lists_the_row_major_block_again() -> None:
    """Its eager forwards ran the first optimize's wrapper, and found nothing to list."""
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 4, 12)
    dtt.optimize(model, (x,), policy="heuristic", revert_if_slower=False)
    report = dtt.optimize(model, (x,), policy="heuristic", revert_if_slower=False)
    assert any("layers.0: its input made row-major" in f for f in report.fusions), report
    assert not pytorch_route.on


def test_a_call_with_other_options_than_the_examples_keeps_eagers_layouts() -> None:
    """The layouts were checked for the example's call: another (``output_hidden_states=True``
    in transformers) may return the stream itself, which eager returns strided; it came out
    row-major, or strided and row-major in turns while the routes raced (new-user audit)."""
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 4, 12)
    opt = copy.deepcopy(model)
    report = dtt.optimize(opt, (x,), policy="heuristic", revert_if_slower=False)
    assert any("row-major" in f for f in report.fusions)
    with torch.no_grad():
        want = model(x, hidden_states=True)
        for _ in range(12):  # through the races of the new options' routes
            got = opt(x, hidden_states=True)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert [h.stride() for h in got[1]] == [h.stride() for h in want[1]]
    # the example's kind of call still runs the stream row-major
    assert not any(strided_last(h) for h in _inputs_of(opt.layers[2], opt, x))
