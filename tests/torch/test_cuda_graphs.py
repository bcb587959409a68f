"""optimize(..., cuda_graph=True): whole-forward CUDA graph replay and its fall-backs."""

from __future__ import annotations

import copy
import gc
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch.cuda_graphs import graphs_of


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.head = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        y = F.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.norm(self.head(y)) * scale


def _models(device: str) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = _Net()
    with torch.no_grad():
        ref.stem[1].running_mean.uniform_(-0.5, 0.5)
        ref.stem[1].running_var.uniform_(0.5, 1.5)
    model = copy.deepcopy(ref)
    return ref.to(device).eval(), model.to(device).eval()


def test_cpu_module_runs_uncaptured(tmp_path: Path) -> None:
    ref, model = _models("cpu")
    keys = list(model.state_dict())
    x = torch.randn(2, 4, 6, 6)
    report = dtt.optimize(
        model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True
    )
    # CPU tensors never replay: the report says so, and the forward was refined and timed side
    # by side as an uncaptured one (before session 12 it claimed "CUDA graph replay")
    assert not report.cuda_graph and "CUDA graph replay" not in str(report)
    assert report.refined
    assert list(model.state_dict()) == keys
    assert isinstance(model, _Net)
    with torch.no_grad():
        torch.testing.assert_close(model(x, 2.0), ref(x, 2.0), atol=1e-4, rtol=1e-4)
    assert graphs_of(model).replays == 0  # CPU tensors: never captured
    twin = copy.deepcopy(model)  # the class swap survives a deepcopy
    with torch.no_grad():
        torch.testing.assert_close(twin(x), ref(x), atol=1e-4, rtol=1e-4)
    # and it says why nothing replays (before, a new-user audit found no word of it)
    assert "note: cuda_graph=True: the model and its example inputs are on the CPU" in str(report)


@pytest.mark.parametrize("mode", ["no example inputs", "train mode"])
def test_cpu_module_without_a_recording_is_not_reported_as_replayed(
    tmp_path: Path, mode: str
) -> None:
    """Without an example forward to record (none given, or train mode) a CPU model was
    reported as "CUDA graph replay" (``report.cuda_graph`` True): the CPU has no CUDA graphs."""
    _, model = _models("cpu")
    example = None if mode == "no example inputs" else (torch.randn(2, 4, 6, 6),)
    if mode == "train mode":
        model.train()
    report = dtt.optimize(
        model, example, policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True
    )
    assert not report.cuda_graph and "CUDA graph replay" not in str(report)
    assert report.notes and "which has no CUDA graphs" in report.notes[0]


@pytest.mark.gpu
def test_graph_replay_matches_uncaptured_and_follows_inputs(tmp_path: Path) -> None:
    ref, model = _models("cuda")
    plain = copy.deepcopy(model)
    ov = tmp_path / "ov.json"
    x = torch.randn(2, 4, 6, 6, device="cuda")
    dtt.optimize(plain, (x,), policy="heuristic", overrides=ov)
    dtt.optimize(model, (x,), policy="heuristic", overrides=ov, cuda_graph=True)
    state = graphs_of(model)
    assert state.records == 1
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4, 6, 6, device="cuda")
            out = model(x)
            torch.testing.assert_close(out, plain(x), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out, ref(x), atol=2e-2, rtol=2e-2)  # TF32 engines
        first = model(x)
        model(torch.randn_like(x))
        torch.testing.assert_close(first, plain(x), atol=1e-5, rtol=1e-5)  # outputs are cloned
        assert state.records == 1 and state.replays >= 5
        model(torch.randn(3, 4, 6, 6, device="cuda"))  # a new signature: a second graph
        model(x, 0.5)  # a new non-tensor argument: a third
        assert state.records == 3


@pytest.mark.gpu
def test_weight_update_re_records_and_training_is_recorded_apart(tmp_path: Path) -> None:
    ref, model = _models("cuda")
    x = torch.randn(2, 4, 6, 6, device="cuda")
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    state = graphs_of(model)
    with torch.no_grad():
        for m in (ref, model):
            m.stem[1].running_var.mul_(3.0)  # the folded conv weights must follow
            m.head[0].weight.add_(0.25)
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    assert state.records == 2
    model.train()
    ref.train()
    replays = state.replays
    with warnings.catch_warnings():
        # layer_norm backward runs in PyTorch (a one-time DnnTuneFallbackWarning)
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)
        for m in (ref, model):
            m(x).sum().backward()  # the training step: its own recording, forward and backward
    assert state.records == 3 and state.replays == replays + 1
    assert model.head[0].weight.grad is not None and ref.head[0].weight.grad is not None
    torch.testing.assert_close(
        model.head[0].weight.grad, ref.head[0].weight.grad, atol=2e-2, rtol=2e-2
    )


@pytest.mark.gpu
def test_replays_read_in_place_writes_and_re_record_only_for_a_fold(tmp_path: Path) -> None:
    """A replay reads the parameters where they are: an in-place write to a layer that nothing
    was derived from on the host needs no new recording (the check before each replay costs
    host time on the critical path), while the batch-norm fold's sources re-record it, also
    after a fused optimizer step, which counts no versions."""
    ref, model = _models("cuda")
    x = torch.randn(2, 4, 6, 6, device="cuda")
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    state = graphs_of(model)
    records = state.records
    with torch.no_grad():
        for m in (ref, model):
            m.head[0].weight.add_(0.25)
            m.head[2].bias.copy_(torch.linspace(-1, 1, 4, device="cuda"))
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    assert state.records == records
    for m in (ref, model):
        bn = m.stem[1]
        for p in bn.parameters():
            p.grad = torch.full_like(p, 0.5)
        torch.optim.Adam(bn.parameters(), lr=0.2, fused=True).step()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
    assert state.records == records + 1


class _CachedDecode(nn.Module):
    """Keeps a cache in a buffer and writes it in place every forward (gpt-fast's KV cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        self.cache.mul_(0.5).add_(y)
        return self.cache.sum(0, keepdim=True) + y


@pytest.mark.gpu
def test_a_buffer_the_forward_writes_itself_does_not_re_record(tmp_path: Path) -> None:
    """Only changes made outside the graph re-record it: the forward's own in-place writes
    (recorded into the graph) would otherwise re-record it on every call. The recording's
    warm-up calls must not advance the cache either: each call updates it exactly once."""
    torch.manual_seed(0)
    ref = _CachedDecode().cuda().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 8, device="cuda")
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    with torch.no_grad():
        for m in (ref, model):
            m.cache.zero_()
        for _ in range(4):
            torch.testing.assert_close(model(x), ref(x), atol=2e-3, rtol=2e-3)
    state = graphs_of(model)
    assert state.records == 1 and state.replays >= 3
    torch.testing.assert_close(model.cache, ref.cache, atol=2e-3, rtol=2e-3)
    with torch.no_grad():  # a write from outside is read by the next replay, where it is
        for m in (ref, model):
            m.cache.zero_()
        torch.testing.assert_close(model(x), ref(x), atol=2e-3, rtol=2e-3)
    assert state.records == 1


def test_tuning_for_graph_replay_ranks_by_device_time(tmp_path: Path) -> None:
    from dnntune.errors import InvalidValueError
    from dnntune.torch import config, runtime

    with pytest.raises(InvalidValueError, match="ranking_metric"):
        dtt.configure(ranking_metric="fastest")  # type: ignore[arg-type]
    ref, model = _models("cpu")
    x = torch.randn(2, 4, 6, 6)
    calls = runtime.runtime_stats.autotune_calls
    dtt.optimize(model, (x,), policy="tune", overrides=tmp_path / "ov.json", cuda_graph=True)
    assert model.__dict__["_dnntune_config"].ranking_metric == "device"  # the model's clock
    assert config.current().ranking_metric == "latency"  # the process's, as it was
    assert runtime.runtime_stats.autotune_calls > calls
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    second = copy.deepcopy(ref)
    dtt.optimize(second, policy="tune", overrides=tmp_path / "ov2.json")
    assert second.__dict__["_dnntune_config"].ranking_metric == "latency"
    # an explicit clock wins over the default, and "throughput" tunes end to end
    third = copy.deepcopy(ref)
    runtime.cache().clear()  # forget this process's decisions, so it tunes again
    calls = runtime.runtime_stats.autotune_calls
    dtt.optimize(
        third, (x,), policy="tune", overrides=tmp_path / "ov3.json", ranking_metric="throughput"
    )
    assert third.__dict__["_dnntune_config"].ranking_metric == "throughput"
    assert runtime.runtime_stats.autotune_calls > calls
    with torch.no_grad():
        torch.testing.assert_close(third(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_recorded_under_inference_mode_and_replayed_under_no_grad(tmp_path: Path) -> None:
    ref, model = _models("cuda")
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    x = torch.randn(2, 4, 6, 6, device="cuda")
    with torch.inference_mode():
        first = model(x)
    with torch.no_grad():
        second = model(x * 2)
        torch.testing.assert_close(first, ref(x), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(second, ref(x * 2), atol=2e-2, rtol=2e-2)
    assert graphs_of(model).records == 1


# Run in a child process: a replay that reads freed memory faults ("unspecified launch
# failure"), which poisons the whole CUDA context of the process it happens in.
_WORKSPACE_SCRIPT = """
import sys, torch
from torch import nn
import dnntune.torch as dtt
from dnntune.torch import cuda_graphs

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4096, 4096, bias=False)
        self.w = nn.Parameter(torch.randn(4096, 256) / 64)
    def forward(self, x):
        return self.a(x) @ self.w  # the matmul stays PyTorch's: cuBLAS inside the capture

if sys.argv[2] == "unprotected":  # show the fault this guards against (a diagnostic run)
    import contextlib
    from dnntune.torch import _capture
    _capture.own_cublas_workspace = contextlib.nullcontext
torch.manual_seed(0)
model = Net().cuda().to(torch.bfloat16).eval()
x = torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    want = model(x).float()
    # the capture itself is under test: no side-by-side revert to eager on a noisy timing
    dtt.optimize(
        model, (x,), policy="heuristic", overrides=sys.argv[1], cuda_graph=True,
        revert_if_slower=False, refine=False,
    )
    for _ in range(3):
        model(x)
        # what torch.compile's CUDA graphs do around each recording, then torch.cuda.graph's
        # empty_cache: cuBLAS's workspaces are dropped and their memory given back
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        got = model(x).float()
        torch.cuda.synchronize()
        torch.testing.assert_close(got, want, atol=0.5, rtol=5e-2)
assert cuda_graphs.graphs_of(model).replays >= 6
print("replays ok")
"""


@pytest.mark.gpu
def test_replay_survives_cublas_workspaces_being_cleared(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _WORKSPACE_SCRIPT, str(tmp_path / "ov.json"), "protected"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0 and "replays ok" in result.stdout, result.stderr[-3000:]


def test_cublas_workspaces_are_cleared_around_the_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dnntune.torch._capture import own_cublas_workspace

    events: list[str] = []
    monkeypatch.setattr(
        torch._C, "_cuda_clearCublasWorkspaces", lambda: events.append("clear"), raising=False
    )
    with own_cublas_workspace():
        events.append("capture")
    assert events == ["clear", "capture", "clear"]
    events.clear()
    with pytest.raises(RuntimeError), own_cublas_workspace():
        events.append("capture")
        raise RuntimeError("capture failed")
    assert events == ["clear", "capture", "clear"]  # cleared even when the capture fails


@pytest.mark.parametrize("tags", [True, False], ids=["version tags", "no tags"])
def test_graph_mode_follows_training_and_gradients(
    tags: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.torch import _tags
    from dnntune.torch._capture import graph_mode as _graph_mode

    if not tags:  # an interpreter without dict version tags: the parameters walked every call
        monkeypatch.setattr(_tags, "tag_reader", lambda: None)
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    state = graphs_of(net)
    x = torch.randn(1, 2)
    net.eval()
    with torch.no_grad():
        assert _graph_mode(net, [x], state) == "inference"
    assert _graph_mode(net, [x], state) == "training"  # eval mode, parameters want gradients
    net.requires_grad_(False)
    assert _graph_mode(net, [x], state) == "inference"
    assert _graph_mode(net, [x.requires_grad_(True)], state) == "training"  # input gradients
    x.requires_grad_(False)
    net[1].bias.requires_grad_(True)  # one flag, in place: read on every call
    assert _graph_mode(net, [x], state) == "training"
    net[1].bias.requires_grad_(False)
    net[1].weight = nn.Parameter(torch.ones(2, 2))  # a parameter that wants gradients, swapped in
    assert _graph_mode(net, [x], state) == "training"
    net[1].weight.requires_grad_(False)
    net.append(nn.Linear(2, 2))  # a child added: its parameters count too
    assert _graph_mode(net, [x], state) == "training"
    net.requires_grad_(False)
    assert _graph_mode(net, [x], state) == "inference"
    net.train()
    with torch.no_grad():
        assert _graph_mode(net, [x], state) is None  # train mode without autograd: uncaptured


def _train_models() -> tuple[nn.Module, nn.Module]:
    ref, model = _models("cuda")
    ref.train()
    model.train()
    return ref, model


def _step(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = model(x).float().square().mean()
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.gpu
def test_training_steps_replay_and_match_uncaptured_training(tmp_path: Path) -> None:
    ref, model = _train_models()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, model)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)  # layer_norm backward
        for _ in range(4):
            x = torch.randn(2, 4, 6, 6, device="cuda")
            want, got = (_step(m, x, o) for m, o in zip((ref, model), opts, strict=True))
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)
    state = graphs_of(model)
    assert state.records == 1 and state.replays == 4  # optimizer steps need no new recording
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-3, rtol=2e-2, msg=name)
    for (name, b), c in zip(model.named_buffers(), ref.buffers(), strict=True):
        # the warm-up calls before recording did not move the running statistics
        torch.testing.assert_close(b, c, atol=2e-3, rtol=2e-2, msg=name)


@pytest.mark.gpu
def test_training_replay_keeps_each_backward_correct(tmp_path: Path) -> None:
    ref, model = _train_models()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    state = graphs_of(model)
    x1, x2 = (torch.randn(2, 4, 6, 6, device="cuda") for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dtt.DnnTuneFallbackWarning)
        # two forwards before one backward (gradient accumulation): the second runs
        # uncaptured, since the first replay's activations are still needed
        for m in (ref, model):
            (m(x1).square().sum() + m(x2).square().sum()).backward()
        assert state.replays == 1
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad, atol=2e-2, rtol=2e-2, msg=name)
        model(x1)  # outputs dropped without a backward: the capture is free again
        model(x2).sum().backward()
        assert state.replays == 3
        kept = model(x1)
        kept.sum().backward(retain_graph=True)
        model(x2).sum().backward()  # a later replay overwrites the activations ``kept`` used
        with pytest.raises(RuntimeError, match="overwritten by a later call"):
            kept.sum().backward()
    assert state.records == 1


class _Syncing(nn.Module):
    """A forward that reads a value on the host: cannot be recorded as a CUDA graph (always,
    or only while it is being recorded: then the recording itself fails)."""

    def __init__(self, only_when_recorded: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.only_when_recorded = only_when_recorded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.only_when_recorded and not torch.cuda.is_current_stream_capturing():
            return y * 2
        return y * 2 if float(y.detach().abs().max()) > 0 else y


@pytest.mark.gpu
@pytest.mark.parametrize("only_when_recorded", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_unrecordable_forward_warns_once_and_runs_uncaptured(
    tmp_path: Path, training: bool, only_when_recorded: bool
) -> None:
    torch.manual_seed(0)
    ref = _Syncing(only_when_recorded).cuda().train(training)
    model = copy.deepcopy(ref)
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    x = torch.randn(4, 8, device="cuda")
    with torch.set_grad_enabled(training):
        with pytest.warns(dtt.DnnTuneFallbackWarning, match="cannot be recorded as a CUDA graph"):
            got = model(x)
        again = model(x)  # no second attempt, no second warning
    torch.testing.assert_close(got, ref(x), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(again, got)
    state = graphs_of(model)
    assert state.uncapturable and state.replays == 0
    if training:
        got.sum().backward()
        assert model.lin.weight.grad is not None
    torch.cuda.synchronize()  # the failed recording left the device usable
    assert torch.randn(4, device="cuda").isfinite().all()  # and random ops working


class _SyncsUnlessRecorded(nn.Module):
    """Hugging Face's mask building: a host read (``(mask == 0).all()``) that the forward skips
    while it is recorded (``is_tracing()`` is true under CUDA-graph capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x > -10).to(x.dtype)
        if not torch.cuda.is_current_stream_capturing() and bool((mask == 1).all()):
            return self.lin(x)  # the shortcut: no mask needed
        return self.lin(x * mask)


@pytest.mark.gpu
def test_a_forward_that_syncs_only_when_not_recorded_is_recorded(tmp_path: Path) -> None:
    """Session 9: the LLaMA prefill was refused by the sync-debug warm-up while a plain
    torch.cuda.graph capture recorded it; such a forward is now recorded and replays."""
    torch.manual_seed(0)
    ref = _SyncsUnlessRecorded().cuda().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 8, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DnnTuneFallbackWarning: it records
        dtt.optimize(
            model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True
        )
        with torch.no_grad():
            got = model(x)
            x2 = torch.randn(4, 8, device="cuda")
            got2 = model(x2)
    state = graphs_of(model)
    assert state.records == 1 and not state.uncapturable and state.replays >= 2
    with torch.no_grad():
        torch.testing.assert_close(got, ref(x), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got2, ref(x2), atol=2e-2, rtol=2e-2)


class _Counting(nn.Module):
    """A forward that writes its module's state: a call counter kept in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x)


@pytest.mark.gpu
def test_a_pure_forward_launches_before_its_check_and_a_change_is_still_seen(
    tmp_path: Path,
) -> None:
    """Issue 23: a forward that writes none of its module's tensors replays before the check
    that its weights are unchanged (the check then runs while the GPU computes). A change made
    between calls is still seen: that call's output is the new weights', never the replay's
    that read the old ones, and the graph is recorded again. A forward that writes its state
    (a counter) keeps the check first, and counts once per call."""
    ref, model = _models("cuda")
    x = torch.randn(2, 4, 6, 6, device="cuda")
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    state = graphs_of(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        (capture,) = state.captures.values()
        assert capture.pure
        records = state.records
        for step in range(3):
            new = torch.randn_like(ref.head[2].weight)
            for m in (ref, model):  # a new Parameter object, the old one dropped by the model
                m.head[2].weight = nn.Parameter(new.clone())
            out = model(x)
            torch.testing.assert_close(out, ref(x), atol=2e-2, rtol=2e-2)
            assert state.records == records + step + 1
        replays = state.replays
        torch.testing.assert_close(model(x), ref(x), atol=2e-2, rtol=2e-2)
        assert state.replays == replays + 1 and state.records == records + 3

    counting = _Counting().cuda().eval()
    y = torch.randn(4, 8, device="cuda")
    dtt.optimize(
        counting, (y,), policy="heuristic", overrides=tmp_path / "ov2.json", cuda_graph=True
    )
    with torch.no_grad():
        start = int(counting.calls)
        for _ in range(4):
            counting(y)
        torch.cuda.synchronize()
        (capture,) = graphs_of(counting).captures.values()
        assert not capture.pure
        assert graphs_of(counting).replays >= 4
    assert int(counting.calls) == start + 4


#: the only reference to a reference cycle that holds an earlier CUDA graph
_GARBAGE: list[object] = []


class _DropsAGraphWhileRecorded(nn.Module):
    """Drops the last reference to a cycle holding a CUDA graph while it is recorded, then
    allocates: a collection then frees that graph inside the capture, unless none runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing() and _GARBAGE:
            _GARBAGE.clear()
            for _ in range(8):
                [[] for _ in range(100)]  # allocations: the collector's chance to run
        return self.lin(x)


@pytest.mark.gpu
def test_a_garbage_collection_during_a_recording_cannot_spoil_it(tmp_path: Path) -> None:
    """Python's collector, run by an allocation while a forward is recorded, once freed an
    earlier recording left in a reference cycle; CUDA refuses to destroy a graph while a
    stream is capturing ("operation not permitted when stream is capturing"), and the
    recording in progress was lost: the forward ran uncaptured, with a fallback warning (H100,
    session 36). No collection runs while dnntune records."""
    torch.manual_seed(0)
    model = _DropsAGraphWhileRecorded().cuda().eval()
    ref = copy.deepcopy(model)
    x = torch.randn(4, 8, device="cuda")
    overrides = tmp_path / "ov.json"  # its forward as written (no fusion trace of the branch)
    dtt.optimize(model, (x,), policy="heuristic", overrides=overrides, cuda_graph=True, fuse=False)
    static = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    earlier = torch.cuda.CUDAGraph()
    with torch.cuda.graph(earlier):
        static.add_(1)
    cycle: list[object] = [earlier]
    cycle.append(cycle)
    _GARBAGE.append(cycle)
    del earlier, cycle
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # a full collection at (almost) every allocation
    try:
        y = torch.randn(6, 8, device="cuda")  # a new signature: recorded now
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", dtt.DnnTuneFallbackWarning)
            out = model(y)
    finally:
        gc.set_threshold(*threshold)
        _GARBAGE.clear()
        gc.collect()
    with torch.no_grad():
        torch.testing.assert_close(out, ref(y), atol=2e-2, rtol=2e-2)
        replays = graphs_of(model).replays
        torch.testing.assert_close(model(y), ref(y), atol=2e-2, rtol=2e-2)
    assert graphs_of(model).replays == replays + 1


def test_what_tells_a_forward_that_writes_its_state_sees_every_tensor_it_keeps() -> None:
    """A replay launches before its weights check only for a forward that wrote none of its
    module's tensors while recorded (``Capture.pure``): that is judged by the versions of every
    tensor the module's state holds, a KV cache kept as a plain attribute or in a list too,
    since a replay on changed weights would write such a cache at the old position."""
    from dnntune.torch.cuda_graphs import _versions

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.cache = torch.zeros(8, 4)  # a plain attribute, not a buffer
            self.layers_cache = [torch.zeros(8, 4), {"k": torch.zeros(8, 4)}]
            self.loop: list[object] = []
            self.loop.append(self.loop)  # a list that holds itself: walked once

    for write in (
        lambda d: d.cache.add_(1),
        lambda d: d.layers_cache[0].add_(1),
        lambda d: d.layers_cache[1]["k"].add_(1),
        lambda d: d.lin.weight.add_(1),
    ):
        d = Decoder()
        before = _versions(d)
        assert before is not None and _versions(d) == before  # reading writes nothing
        with torch.no_grad():
            write(d)
        assert _versions(d) != before
    with torch.inference_mode():
        frozen = Decoder()
    assert _versions(frozen) is None  # no versions kept: never judged pure
