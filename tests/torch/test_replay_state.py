"""A CUDA-graph replay runs no Python: what else than tensors a forward reads (plain attributes,
a submodule's ``training`` flag, lists, forward hooks) must be checked before each replay, a
forward that changes such state is never recorded, an output pytree cannot rebuild is never
handed out as the graph's own object, and replays on two streams never share memory unordered.
(An independent review's findings, session 11.)"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import optimize_to_replay

import dnntune.torch as dtt
from dnntune.backend import native as _native
from dnntune.torch import _tags
from dnntune.torch._baked import Weights
from dnntune.torch._buffers import put_back, snapshot_of
from dnntune.torch._recorded import PlainState, opaque_output
from dnntune.torch.cuda_graphs import graphs_of

D = 16


class _Scaled(nn.Module):
    """Two weighted layers (a piece), a plain scale, a dropout and a list it may append to."""

    def __init__(self, grows: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D)
        self.drop = nn.Dropout(0.5)
        self.scale = 1.0
        self.grows = grows
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grows:
            self.seen.append(x)
        return self.drop(self.down(torch.relu(self.up(x)))) * self.scale


# ---- on the CPU -------------------------------------------------------------------------------
@pytest.fixture(params=["compiled helper", "pytorch's reader", "values only"])
def tags(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every way the checks run: dict version tags read by dnntune's compiled helper or by
    PyTorch's guards, and without tags (an interpreter that has none: values compared)."""
    if request.param == "compiled helper":
        if not _native.can_build():
            pytest.skip("no C compiler or Python headers here: the helper is not built")
        assert _native.reader() is not None, "the helper should build here (gcc, headers)"
    elif request.param == "pytorch's reader":
        assert _tags._DICT_VERSION is not None, "this interpreter should have the tags"
        monkeypatch.setattr(_tags, "tag_reader", lambda: _tags._pytorch_tags)
    else:
        monkeypatch.setattr(_tags, "tag_reader", lambda: None)
    return str(request.param)


def test_plain_state_sees_values_flags_containers_and_hooks(tags: str) -> None:
    m = _Scaled().eval()
    state = PlainState(m)
    assert state.unchanged() and state.changed() == []
    m.scale = 1.0  # the same value again: nothing to record anew
    assert state.unchanged()
    m.scale = 2.0
    assert not state.unchanged() and state.changed() == ["scale"]
    m.scale = 1.0
    m.drop.train()  # a submodule's own flag (MC dropout)
    assert not state.unchanged() and "training" in state.changed()
    m.drop.eval()
    m.seen.append(torch.zeros(1))  # a list that grew
    assert not state.unchanged() and state.changed() == ["seen"]
    m.seen.clear()
    assert state.unchanged()
    m.new_flag = True  # an attribute a forward may read with getattr(self, name, default)
    assert not state.unchanged() and state.changed() == ["an attribute added or deleted"]
    del m.new_flag
    assert state.unchanged()
    # dnntune's own bookkeeping added after the recording (optimize's race of routes) is not
    # read by the forward: no new recording; what a forward does read of it still counts
    m.__dict__["_dnntune_routes"] = object()
    assert state.unchanged() and state.changed() == []
    m.__dict__["_dnntune_fold"] = (None, None, ())
    assert not state.unchanged() and state.changed() == ["an attribute added or deleted"]
    del m.__dict__["_dnntune_fold"]
    m.new_flag = True  # one of the user's added beside dnntune's
    assert not state.unchanged()
    del m.new_flag, m.__dict__["_dnntune_routes"]
    assert state.unchanged()
    handle = m.down.register_forward_hook(lambda mod, args, out: out * 2)
    assert not state.unchanged() and state.changed() == ["forward hooks"]
    handle.remove()
    assert state.unchanged()
    # one hook removed and another added where there was one: the handles differ
    first = m.up.register_forward_pre_hook(lambda mod, args: None)
    hooked = PlainState(m)
    first.remove()
    m.up.register_forward_pre_hook(lambda mod, args: None)
    assert len(m.up._forward_pre_hooks) == 1 and not hooked.unchanged()
    global_hook = nn.modules.module.register_module_forward_hook(lambda mod, args, out: None)
    try:
        with_global = PlainState(m)
        assert with_global.unchanged()
    finally:
        global_hook.remove()
    assert not with_global.unchanged()  # a global forward hook removed


def test_plain_state_sees_inside_the_dicts_and_lists_a_module_keeps(tags: str) -> None:
    """A dict's contents are read by its version tag where there is a reader (a value written
    again is no change), a list's by identity; a tuple's cannot change."""
    m = _Scaled().eval()
    m.table = {"a": m.up}  # type: ignore[assignment]
    m.sizes = (1, [2])  # type: ignore[assignment]
    state = PlainState(m)
    m.table["a"] = m.up  # the same value again
    assert state.unchanged() and state.unchanged() and state.changed() == []
    m.table["a"] = m.down
    assert not state.unchanged() and state.changed() == ["table"]
    m.table["a"] = m.up
    assert state.unchanged()
    m.table["b"] = 1
    assert not state.unchanged()
    del m.table["b"]
    m.seen.append(1)
    assert not state.unchanged() and state.changed() == ["seen"]
    m.seen.clear()
    assert state.unchanged()
    m.flags = {"a", "b"}  # type: ignore[assignment]
    state = PlainState(m)
    m.flags.add("c")
    assert not state.unchanged() and state.changed() == ["flags"]
    m.flags.discard("c")
    assert state.unchanged()
    m.flags = {"b", "a"}  # another set, the same members: a replaced attribute all the same
    assert not state.unchanged() and state.changed() == ["flags"]
    m.factors = {2}  # type: ignore[assignment]
    state = PlainState(m)
    m.factors.discard(2)
    m.factors.add(2.0)  # an equal member of another type (int64 -> float32 downstream)
    assert not state.unchanged() and state.changed() == ["factors"]


def test_plain_state_restores_what_warm_up_calls_changed() -> None:
    m = _Scaled(grows=True)
    kept = m.seen
    snapshot = PlainState(m, keep_copies=True)
    for _ in range(3):  # a recording's warm-up calls
        m(torch.randn(2, D))
        m.scale += 1.0
    assert len(m.seen) == 3 and m.scale == 4.0
    snapshot.restore()
    assert m.seen is kept and m.seen == [] and m.scale == 1.0
    assert snapshot.unchanged()


def test_weights_see_the_plain_state_too(tags: str) -> None:
    m = _Scaled().eval()
    weights = Weights(m)
    assert weights.unchanged()
    m.down.eval()  # already eval: the same flag
    assert weights.unchanged()
    m.down.train()
    assert not weights.unchanged()
    m.down.eval()
    assert weights.unchanged()
    m.scale = 0.5
    assert not weights.unchanged() and not weights.unchanged(written_ok=True)


def test_the_checks_before_a_replay_skip_nothing_that_changed(tags: str) -> None:
    """The short paths (version tags, the hook counter) never hide a change, and what only
    looks like one (a value written again, a hook on a module outside) changes nothing."""
    m = _Scaled().eval()
    weights = Weights(m)
    m.up.weight = m.up.weight  # the same parameter again
    m.up.in_features = D  # the same value again
    assert weights.unchanged() and weights.unchanged()
    elsewhere = nn.Linear(2, 2).register_forward_hook(lambda mod, args, out: None)
    assert weights.unchanged()
    elsewhere.remove()
    m.up.weight = nn.Parameter(m.up.weight.detach().clone())
    assert not weights.unchanged()
    weights = Weights(m)
    m.down._parameters["extra"] = nn.Parameter(torch.zeros(1))  # straight into its dict
    assert not weights.unchanged()
    del m.down._parameters["extra"]
    assert weights.unchanged()
    m.seen.append(torch.zeros(1))  # a container's contents, in place
    assert not weights.unchanged()
    m.seen.clear()
    handle = m.drop.register_forward_pre_hook(lambda mod, args: None)
    assert not weights.unchanged()
    hooked = Weights(m)
    handle.remove()
    assert not hooked.unchanged()  # a hook removed: the counter did not move


def test_in_place_writes_are_read_where_they_are_except_a_folds_sources(tags: str) -> None:
    """A replay reads tensors where they are: an in-place write needs no new recording,
    unless dnntune derived a value from that tensor on the host (a batch-norm fold), or an
    optimizer stepped (a fused one counts no versions) while a fold is held."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten())
    model.append(nn.Linear(4 * 4 * 4, 2)).eval()
    x = torch.randn(1, 3, 6, 6)
    dtt.optimize(model, policy="heuristic", overrides=None, check_speed=False)
    with torch.no_grad():
        model(x)  # makes the fold
    assert "_dnntune_fold" in model[0].__dict__
    weights = Weights(model)
    with torch.no_grad():
        model[3].weight.add_(1.0)
    assert weights.unchanged()
    with torch.no_grad():
        model[1].running_var.mul_(2.0)
    assert not weights.unchanged()
    weights = Weights(model)
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1).step()  # any optimizer step
    assert not weights.unchanged()
    plain = nn.Sequential(nn.Linear(2, 2))
    unfolded = Weights(plain)
    torch.optim.SGD(plain.parameters(), lr=0.1).step()
    assert unfolded.unchanged()  # nothing derived on the host: steps are read where they are


@dataclass
class _Out:
    logits: torch.Tensor


def test_an_output_pytree_cannot_rebuild_is_named() -> None:
    t = torch.zeros(2)
    assert opaque_output(t) is None
    assert opaque_output((t, {"a": [t, 3, None]})) is None
    assert opaque_output(_Out(t)) == "_Out"
    assert opaque_output([t, _Out(t)]) == "_Out"


def test_dnntunes_own_bookkeeping_is_not_forward_state() -> None:
    m = _Scaled()
    m.__dict__["_dnntune_graph_auto"] = False  # set by optimize, read by no forward
    m.__dict__["_dnntune_config"] = object()
    state = PlainState(m)
    m.__dict__["_dnntune_graph_auto"] = True
    m.__dict__["_dnntune_config"] = object()
    assert state.unchanged()
    m.__dict__["_dnntune_fold"] = (torch.zeros(1), 1e-5)  # a fold a forward reads
    assert not state.unchanged()
    folded = PlainState(m)
    m.__dict__["_dnntune_fold"] = (torch.zeros(1), 1e-5)  # rebuilt: other tensors
    assert not folded.unchanged() and folded.changed() == ["_dnntune_fold"]


def test_marking_blocks_as_pieces_leaves_the_whole_forwards_state_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signature that cannot be recorded whole makes its blocks pieces; another signature's
    whole-forward recording, which checks the Python state on every replay, must not see that
    as a change (it would record again)."""
    from dnntune.torch import cuda_graphs
    from dnntune.torch._graph_state import GraphedForward, forget, recorded_pieces

    model = nn.Sequential(_Scaled(), nn.ReLU(), _Scaled()).eval()
    before = PlainState(model)
    state = GraphedForward()
    monkeypatch.setattr(GraphedForward, "recording_stream", lambda self, device: None)
    pieces = cuda_graphs._expand(model, state, torch.device("cpu"))
    try:
        assert pieces == [model[0], model[2]]
        assert all(graphs_of(p).piece for p in pieces) and not graphs_of(model[1]).piece
        assert before.unchanged(), before.changed()
        graphs_of(model[0]).records = 1
        assert recorded_pieces(model) == ["0"]
    finally:
        state.clear()
        forget(model)


def test_a_small_buffer_beside_a_large_cache_is_still_put_back() -> None:
    """The snapshot leaves out only the buffers past the limit, the largest first: a counter
    next to a preallocated KV cache is still put back after the warm-up calls."""
    counter, cache = torch.zeros(1), torch.zeros(1024)
    taken = snapshot_of([cache, counter], limit=64)
    assert [b for b, _, _ in taken] == [counter]
    counter += 3  # three warm-up calls
    cache += 1
    put_back(taken)
    assert counter.item() == 0 and cache[0].item() == 1  # the cache is the replay's to write


# ---- on the GPU -------------------------------------------------------------------------------
def _optimized(ref: nn.Module, tmp_path: Path) -> nn.Module:
    model = copy.deepcopy(ref)
    optimize_to_replay(model, tmp_path / "ov.json")
    return model


def _on_cuda(tmp_path: Path) -> tuple[_Scaled, nn.Module, torch.Tensor]:
    """The reference module on CUDA, its optimized copy (replayed) and an input."""
    torch.manual_seed(0)
    ref = _Scaled().cuda().eval()
    return ref, _optimized(ref, tmp_path), torch.randn(4, D, device="cuda")


@pytest.mark.gpu
def test_a_replay_follows_plain_attributes_flags_and_hooks(tmp_path: Path) -> None:
    ref, model, x = _on_cuda(tmp_path)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        assert graphs_of(model).records == 1 and graphs_of(model).replays >= 1
        for m in (ref, model):
            m.scale = 3.0
        torch.testing.assert_close(model(x), ref(x), atol=6e-2, rtol=2e-2)
        assert graphs_of(model).records == 2
        for m in (ref, model):
            m.down.register_forward_hook(lambda mod, args, out: out + 1.0)
        torch.testing.assert_close(model(x), ref(x), atol=6e-2, rtol=2e-2)
        assert graphs_of(model).records == 3
        model.drop.train()  # MC dropout: about half the values zeroed, not a replay of eval
        out = model(x)
        assert graphs_of(model).records == 4
        assert (out == 0).float().mean() > 0.2


@pytest.mark.gpu
@pytest.mark.parametrize("helper", ["compiled pointer helper", "python", "helper built later"])
def test_a_weight_given_new_storage_is_read_by_the_next_call(
    tmp_path: Path, helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``p.data = t`` gives a parameter new storage without a new version: the graph baked in
    the old address, so the next call records again (every way the pointers are read: the
    compiled helper, Python, and Python until the helper's build ends mid-way)."""
    if helper == "python":
        monkeypatch.setattr(_native, "built_pointer_reader", lambda: None)
        monkeypatch.setattr(_native, "pointer_reader_pending", lambda: False)
    elif not _native.can_build(cxx=True):
        pytest.skip("no C++ compiler here: the pointer helper is not built")
    elif helper == "helper built later":
        monkeypatch.setattr(_native, "_state", {})
        monkeypatch.setattr(_native, "prefetch", lambda: None)
    else:
        assert _native.pointer_reader() is not None
    ref, model, x = _on_cuda(tmp_path)
    with torch.no_grad():
        for _ in range(2):
            model(x)
        if helper == "helper built later":
            assert _native.pointer_reader() is not None  # the build ends; the next check
            model(x)  # takes it
        records = graphs_of(model).records
        fresh = torch.randn_like(ref.up.weight)
        for m in (ref, model):
            m.up.weight.data = fresh.clone()
        torch.cuda.empty_cache()  # the old storage may be given to anyone now
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        assert graphs_of(model).records == records + 1
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        assert graphs_of(model).records == records + 1


@pytest.mark.gpu
def test_a_forward_that_changes_its_python_state_is_never_recorded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _Scaled(grows=True).cuda().eval()
    model = _optimized(ref, tmp_path)
    with torch.no_grad(), pytest.warns(dtt.DnnTuneFallbackWarning, match="changes seen"):
        model(torch.randn(4, D, device="cuda"))
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, D, device="cuda"))
    assert len(model.seen) == 4  # once per call: the warm-up calls' appends were put back
    assert graphs_of(model).records == 0


class _ReturnsObject(_Scaled):
    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        return _Out(super().forward(x))


class _Holder:
    """An output object that holds a module: no copy of it can be handed out afresh."""

    def __init__(self, logits: torch.Tensor, module: nn.Module) -> None:
        self.logits, self.module = logits, module


class _ReturnsHolder(_Scaled):
    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        return _Holder(super().forward(x), self)


@pytest.mark.gpu
def test_an_output_object_is_never_the_graphs_own(tmp_path: Path) -> None:
    """An object of tensors is recorded and handed out as a copy of its own on each replay
    (session 39: a transformers cache, returned with use_cache=True, kept GPT-2 uncaptured);
    one that holds a module is not recorded."""
    torch.manual_seed(0)
    model = _optimized(_ReturnsObject().cuda().eval(), tmp_path)
    ref = _ReturnsObject().cuda().eval()
    ref.load_state_dict(model.state_dict())
    x1, x2 = (torch.randn(4, D, device="cuda") for _ in range(2))
    with torch.no_grad():
        first = model(x1)
        second = model(x2)
        third = model(x1)
        assert graphs_of(model).records == 1
        assert first is not second and not torch.equal(first.logits, second.logits)
        torch.testing.assert_close(first.logits, third.logits)
        torch.testing.assert_close(second.logits, ref(x2).logits, atol=1e-5, rtol=1e-5)
    holder = _optimized(_ReturnsHolder().cuda().eval(), tmp_path)
    with torch.no_grad(), pytest.warns(dtt.DnnTuneFallbackWarning, match="_Holder"):
        out = holder(x1)
    assert out.module is holder


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


@pytest.mark.gpu
def test_two_training_signatures_keep_each_others_activations(tmp_path: Path) -> None:
    """Each training recording has its own memory pool: the second signature's replay cannot
    be given the first one's saved activations before the backward reads them."""
    torch.manual_seed(0)
    ref = _Twice().cuda().train()
    model = _optimized(ref, tmp_path)
    xa, xb = torch.randn(8, D, device="cuda"), torch.randn(16, D, device="cuda")
    for _ in range(3):  # record, then replay both signatures
        for m in (ref, model):
            m.zero_grad()
            (m(xa).square().sum() + m(xb).square().sum()).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad, atol=2e-2, rtol=2e-2, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [(4096, 4096), (4096, 2048)], ids=["one_graph", "two_graphs"])
def test_replays_from_two_streams_never_share_memory_unordered(
    sizes: tuple[int, int], tmp_path: Path
) -> None:
    """Two threads, each on its own stream: with one input shape they replay one graph; with
    two, two graphs of the module's one memory pool, whose intermediates share memory. Each
    replay waits for the pool's last stream (before session 51, only for its own graph's)."""
    torch.manual_seed(0)
    ref = _Twice().cuda().eval()
    model = _optimized(ref, tmp_path)
    inputs = [torch.randn(sizes[i % 2], D, device="cuda") for i in range(8)]
    with torch.no_grad():
        for x in inputs[:2]:
            model(x)
            model(x)  # each shape recorded and replayed once
        want = [ref(x) for x in inputs]
    torch.cuda.synchronize()  # the inputs and the reference, before other streams read them
    got: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def work(ids: range) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream), torch.no_grad():
                for i in ids:
                    got[i] = model(inputs[i])
            stream.synchronize()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(range(k, 8, 2),)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, expected in enumerate(want):
        torch.testing.assert_close(got[i], expected, atol=2e-2, rtol=2e-2)


class _CountsSteps(_Twice):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return super().forward(x)


@pytest.mark.gpu
def test_a_training_forward_that_changes_its_python_state_is_never_recorded(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = _optimized(_CountsSteps().cuda().train(), tmp_path)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match="changes steps"):
        model(torch.randn(8, D, device="cuda")).sum().backward()
    for _ in range(2):
        model(torch.randn(8, D, device="cuda")).sum().backward()
    assert model.steps == 3  # once per call: the warm-up calls' increments were put back
    assert graphs_of(model).records == 0


def test_what_must_hold_before_a_launch_first_replay(tags: str) -> None:
    """``Weights.storage_unchanged``: the part of the check a replay that launches before the
    rest (``Capture.pure``) still passes first: a slot given another object fails it (the old
    tensor's memory may be reused once dropped), while Python state (a scale, a hook) is left
    to the full check after the launch."""
    m = _Scaled().eval()
    weights = Weights(m)
    assert weights.storage_unchanged() and weights.unchanged()
    m.scale = 0.5
    assert weights.storage_unchanged() and not weights.unchanged()
    m = _Scaled().eval()
    weights = Weights(m)
    m.up.weight = nn.Parameter(m.up.weight.detach().clone())
    assert not weights.storage_unchanged() and not weights.unchanged()
