"""Policies (heuristic never benchmarks, tune persists, a second process reuses) and optimize()."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import randomize_batch_norms

import dnntune as dt
import dnntune.torch as dtt
from dnntune import testing
from dnntune.torch import _budget, runtime


def test_heuristic_policy_never_benchmarks(tmp_path: Path) -> None:
    dtt.configure(policy="heuristic", overrides=tmp_path / "none.json")
    before = runtime.runtime_stats.autotune_calls
    dtt.linear(torch.randn(3, 8), torch.randn(4, 8))
    dtt.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    assert runtime.runtime_stats.autotune_calls == before
    assert not (tmp_path / "none.json").exists()


def test_tune_policy_persists_winner(tmp_path: Path) -> None:
    path = tmp_path / "ov.json"
    dtt.configure(policy="tune", overrides=path)
    before = runtime.runtime_stats.autotune_calls
    x, w = torch.randn(6, 8), torch.randn(4, 8)
    torch.testing.assert_close(dtt.linear(x, w, activation="relu"), F.relu(F.linear(x, w)))
    dtt.linear(x, w, activation="relu")  # cached: no second tuning
    assert runtime.runtime_stats.autotune_calls == before + 1
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    assert [e["op"] for e in doc["engine_overrides"]] == ["matmul"]


def test_another_clock_tunes_again_in_the_same_process(tmp_path: Path) -> None:
    """A decision made on one ranking clock is not reused for another (same overrides file,
    same shapes): switching to ranking_metric="throughput" tunes once more, switching back
    reuses the first decision."""
    path = tmp_path / "ov.json"
    x, w = torch.randn(6, 8), torch.randn(4, 8)
    dtt.configure(policy="tune", overrides=path, ranking_metric="latency")
    before = runtime.runtime_stats.autotune_calls
    dtt.linear(x, w, activation="relu")
    dtt.configure(ranking_metric="throughput")
    dtt.linear(x, w, activation="relu")
    assert runtime.runtime_stats.autotune_calls == before + 2
    dtt.configure(ranking_metric="latency")
    dtt.linear(x, w, activation="relu")
    assert runtime.runtime_stats.autotune_calls == before + 2


@pytest.mark.parametrize("sweep", [False, True])
def test_tune_sweeps_knob_variants(tmp_path: Path, sweep: bool) -> None:
    """FAKE_ENGINE_A at its default knobs (1.0 ms) loses to C (0.8 ms); its variant 1 (0.7 ms)
    takes part only with ``sweep``, and then wins with its knob stored."""
    path = tmp_path / "ov.json"
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names, timings={testing.FAKE_ENGINE_C: 0.8}):
        runtime._handles.clear()
        dtt.configure(policy="tune", overrides=path, sweep=sweep)
        x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
        torch.testing.assert_close(dtt.conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
        runtime._handles.clear()
    (entry,) = json.loads(path.read_text())["engine_overrides"]
    knobs = {k["knob_id"]: k["value"] for k in entry["autotune_metadata"].get("knobs", [])}
    if sweep:
        assert entry["engine_name"] == testing.FAKE_ENGINE_A
        assert knobs == {"fake.variant": 1}
    else:
        assert entry["engine_name"] == testing.FAKE_ENGINE_C


@pytest.mark.parametrize("mode", ["standard", "exhaustive"])
def test_exhaustive_mode_primes_engine_searches(tmp_path: Path, mode: str) -> None:
    """configure(mode="exhaustive") runs each engine's own search once as a priming plan
    (RFC 0013 section 6.4) before the timed plans; standard mode never does."""
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]) as fakes:
        runtime._handles.clear()
        dtt.configure(policy="tune", overrides=tmp_path / "ov.json", mode=mode)  # type: ignore[arg-type]
        x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
        torch.testing.assert_close(dtt.conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
        runtime._handles.clear()
        primed = fakes.counters.priming_executes[testing.FAKE_ENGINE_A]
    assert (primed > 0) is (mode == "exhaustive")
    with pytest.raises(dt.InvalidValueError, match="mode"):
        dtt.configure(mode="thorough")  # type: ignore[arg-type]


_SECOND = """
import json, sys, torch, dnntune.torch as dtt
from dnntune.torch import runtime
dtt.configure(policy=sys.argv[2], overrides=sys.argv[1])
torch.manual_seed(0)
x, w = torch.randn(6, 8), torch.randn(4, 8)
dtt.linear(x, w, activation="relu")
dtt.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), padding=1)
print(json.dumps({"autotune_calls": runtime.runtime_stats.autotune_calls,
                  "plans": sorted(runtime.runtime_stats.decisions.values())}))
"""


def _run(path: Path, policy: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DNNTUNE_HEUR")}
    out = subprocess.run(
        [sys.executable, "-c", _SECOND, str(path), policy],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_second_process_reuses_file_with_zero_benchmarking(tmp_path: Path) -> None:
    path = tmp_path / "ov.json"
    first = _run(path, "tune")
    assert first["autotune_calls"] == 2
    # "tune" too: the winners tuned earlier on this device, clock and mode are not tuned again
    # (the three processes at once: each only reads the file)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        seconds = list(pool.map(lambda policy: _run(path, policy), ("heuristic", "cached", "tune")))
    for second in seconds:
        assert second["autotune_calls"] == 0
        assert second["plans"] == first["plans"]


def test_tune_reuses_an_earlier_winner_only_for_the_same_device_clock_and_mode(
    tmp_path: Path,
) -> None:
    """A new process is played by clearing the in-memory decisions and kernels. The file's
    winner is reused under the clock and mode it was tuned with, on the device it names; an
    entry of another device, clock or mode is tuned over."""
    path = tmp_path / "ov.json"
    x, w = torch.randn(6, 8), torch.randn(4, 8)

    def tune_calls(**settings: Any) -> int:
        runtime.cache().clear()
        runtime.cache().decisions.clear()
        dtt.configure(policy="tune", overrides=path, **settings)
        before = runtime.runtime_stats.autotune_calls
        dtt.linear(x, w, activation="relu")
        return runtime.runtime_stats.autotune_calls - before

    assert tune_calls(ranking_metric="latency") == 1
    assert tune_calls() == 0  # tuned earlier: read from the file
    assert tune_calls(ranking_metric="throughput") == 1  # another clock
    doc = json.loads(path.read_text())
    for entry in doc["engine_overrides"]:
        entry["autotune_metadata"]["device"] = "another machine"
    path.write_text(json.dumps(doc))
    assert tune_calls(ranking_metric="latency") == 1


def test_a_decision_kept_in_memory_is_not_reused_on_another_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A winner this process tuned is its device's: the same layer on another device (another
    GPU model, or the CPU and a GPU) is tuned there, its candidates checked there, not built
    from the other device's decision unchecked. Two devices are played by the handles' device
    key; each phase writes its own override file, so only the in-memory decisions connect
    them."""
    x, w = torch.randn(6, 8), torch.randn(4, 8)
    device = ["gpu-a"]
    monkeypatch.setattr(dt.Handle, "device_key", lambda self: device[0])

    def tune_calls(name: str) -> int:
        runtime.cache()._items.clear()  # the kernels evicted, the decisions kept
        dtt.configure(policy="tune", overrides=tmp_path / f"{name}.json")
        before = runtime.runtime_stats.autotune_calls
        torch.testing.assert_close(dtt.linear(x, w), F.linear(x, w))
        return runtime.runtime_stats.autotune_calls - before

    assert tune_calls("first") == 1
    assert tune_calls("again") == 0  # the same device: the decision kept in memory
    device[0] = "gpu-b"
    assert tune_calls("other") == 1


class _Block(nn.Module):
    """A small ResNet-style block: conv-bn-relu, conv-bn, residual, relu, pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.head = nn.Sequential(nn.Linear(8, 10), nn.GELU(), nn.Linear(10, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.relu(self.body(y) + y)
        y = F.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.head(y)


class _Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.rms = nn.RMSNorm(dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (
            t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2).contiguous()
            for t in (q, k, v)
        )
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.rms(x + self.out(o.transpose(1, 2).reshape(b, s, d)))


@pytest.mark.parametrize("make", [_Block, _Attention])
def test_optimize_keeps_outputs_and_state_dict(make: type[nn.Module], tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = make()
    randomize_batch_norms(ref)
    model = make()
    model.load_state_dict(ref.state_dict())
    ref.eval()
    model.eval()
    x = torch.randn(2, 3, 8, 8) if make is _Block else torch.randn(2, 5, 16)
    keys = list(model.state_dict())
    report = dtt.optimize(
        model, example_inputs=(x,), policy="heuristic", overrides=tmp_path / "ov.json"
    )
    assert list(model.state_dict()) == keys
    assert report.swapped
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    assert all(r.plans for r in report.swapped if "Norm2d" not in r.kind)
    if make is _Block:
        fused = {r.name: r.fused for r in report.swapped}
        assert any("batchnorm" in f for f in fused["stem.0"])
        assert any("relu" in f for f in fused["stem.0"])
    assert "dnntune.torch.optimize" in str(report)


def _eval_blocks() -> tuple[nn.Module, nn.Module]:
    """Two eval-mode blocks with the same (randomized batch-norm) state."""
    torch.manual_seed(0)
    ref, model = _Block(), _Block()
    randomize_batch_norms(ref)
    model.load_state_dict(ref.state_dict())
    return ref.eval(), model.eval()


def test_folded_batch_norm_follows_parameter_updates(tmp_path: Path) -> None:
    """The folded conv+BN weights are cached, but an in-place update or a load_state_dict
    of the BN statistics or the conv weight changes the next output."""
    ref, model = _eval_blocks()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
        for m in (ref, model):
            m.stem[1].running_var.mul_(2.0)  # in place: same tensor, new version
            m.body[0].weight.add_(0.1)
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
        state = {
            k: v.clone() * 0.5 if v.is_floating_point() else v for k, v in ref.state_dict().items()
        }
        ref.load_state_dict(state)
        model.load_state_dict(state)
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


def test_optimize_training_step_gradients_match(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _Block()
    model = _Block()
    model.load_state_dict(ref.state_dict())
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    model.train()
    ref.train()
    x = torch.randn(2, 3, 8, 8)
    model(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3, msg=name)


def test_eval_mode_gradients_flow_through_folded_batch_norms(tmp_path: Path) -> None:
    """Fine-tuning under frozen statistics (eval mode, gradients on): the folded conv+BN
    layers give the conv's and the batch norm's parameters, and the input, their gradients."""
    ref, model = _eval_blocks()
    report = dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        model(x)  # the inference fold (cached) must not leak into the gradient run
    assert report.fusions
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    model(xs[0]).square().sum().backward()
    ref(xs[1]).square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3, msg=name)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, atol=1e-4, rtol=1e-4)


def test_optimize_routes_sdpa_calls_only_inside_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.torch import functional as dtf

    calls: list[tuple[int, ...]] = []
    original = dtf.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(tuple(args[0].shape))  # type: ignore[attr-defined]
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dtf, "scaled_dot_product_attention", spy)
    model = _Attention().eval()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        model(x)
    assert calls == [(1, 2, 3, 8)]
    q = torch.randn(1, 2, 3, 8)
    F.scaled_dot_product_attention(q, q, q)  # outside the model: PyTorch's own op
    assert len(calls) == 1


class _Pools(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.pool(x), 2) + F.max_pool2d(x, 4, 4)


def test_optimize_routes_pooling_calls_inside_the_model(tmp_path: Path) -> None:
    model = _Pools().eval()
    dtt.optimize(model, policy="heuristic", overrides=tmp_path / "ov.json")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        got = model(x)
    expected = F.avg_pool2d(F.max_pool2d(x, 3, 2, 1), 2) + F.max_pool2d(x, 4, 4)
    torch.testing.assert_close(got, expected)
    built = runtime.runtime_stats.plans_built
    assert len(runtime.cache()) == 3  # three pooling graphs, all on dnntune
    F.max_pool2d(torch.randn(1, 1, 4, 4), 2)  # outside the model: PyTorch's own op
    assert runtime.runtime_stats.plans_built == built


def test_each_optimized_model_keeps_its_own_settings(tmp_path: Path) -> None:
    """optimize() binds its settings to the module: optimizing a second model with another
    policy and file does not change what the first one does on a new shape (it still tunes,
    into its own file), and a forward that raises leaves the process-wide settings in force."""
    first, second = nn.Sequential(nn.Linear(8, 4)), nn.Sequential(nn.Linear(8, 4))
    file_a, file_b = tmp_path / "a.json", tmp_path / "b.json"
    dtt.optimize(first, (torch.randn(2, 8),), policy="tune", overrides=file_a)
    dtt.optimize(second, (torch.randn(2, 8),), policy="heuristic", overrides=file_b)
    assert dtt.config.current().policy == "heuristic"  # the process-wide settings
    before = runtime.runtime_stats.autotune_calls
    with torch.no_grad():
        first(torch.randn(5, 8))  # a new batch size: tuned under the first model's settings
        second(torch.randn(5, 8))  # heuristic: never benchmarks
    assert runtime.runtime_stats.autotune_calls == before + 1
    assert len(json.loads(file_a.read_text())["engine_overrides"]) == 2
    assert not file_b.exists()
    with pytest.raises(RuntimeError):  # PyTorch's error, no fallback warning
        first(torch.randn(5, 7))  # wrong feature size: the forward raises
    assert dtt.config.current().policy == "heuristic"


def test_optimize_leaves_the_process_settings_as_they_were(tmp_path: Path) -> None:
    """The settings optimize() runs with are the model's: after it, a call outside any
    optimized module runs under the process's settings again. It left its policy and file in
    force for the whole process, so a bare ``dtt.linear`` elsewhere tuned into the model's
    override file (new-user audit)."""
    dtt.configure(policy="heuristic", ranking_metric="latency")
    before = dtt.config.process_settings()
    model_file = tmp_path / "model.json"
    model = nn.Sequential(nn.Linear(8, 4))
    dtt.optimize(model, (torch.randn(2, 8),), policy="tune", overrides=model_file)
    assert dtt.config.process_settings() == before
    assert model.__dict__["_dnntune_config"].policy == "tune"  # the model keeps its own
    entries = len(json.loads(model_file.read_text())["engine_overrides"])
    calls = runtime.runtime_stats.autotune_calls
    with torch.no_grad():
        dtt.linear(torch.randn(3, 16), torch.randn(5, 16))  # elsewhere, another shape
    assert runtime.runtime_stats.autotune_calls == calls  # heuristic: nothing tuned
    assert len(json.loads(model_file.read_text())["engine_overrides"]) == entries
    # an example forward that raises (a wrong feature size): put back as well
    with pytest.raises(RuntimeError):
        dtt.optimize(nn.Linear(8, 4), (torch.randn(2, 7),), policy="tune", overrides=model_file)
    assert dtt.config.process_settings() == before


def test_two_optimize_calls_at_once_keep_their_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models optimized at the same time in two threads, with another policy and override
    file each: each model binds its own settings, and the process's (what a third thread's
    bare call runs under) stay as they were meanwhile and after. ``optimize`` put its settings
    in force for the whole process and restored them after, so the second to configure gave
    its policy and file to the first model too (concurrency audit). The threads are lined up
    where the settings are in force and no model has bound them yet."""
    import threading

    dtt.configure(policy="heuristic")
    before = dtt.config.process_settings()
    optimize_module = sys.modules["dnntune.torch.optimize"]
    lined_up, go = threading.Barrier(3, timeout=60), threading.Barrier(3, timeout=60)
    real_undo = optimize_module.Undo

    def undo_after_the_other(module: nn.Module) -> Any:
        lined_up.wait()
        go.wait()
        return real_undo(module)

    monkeypatch.setattr(optimize_module, "Undo", undo_after_the_other)
    asked = {
        "a": {"policy": "tune", "overrides": tmp_path / "a.json"},
        "b": {"policy": "cached", "overrides": tmp_path / "b.json"},
    }
    models = {k: nn.Sequential(nn.Linear(8, 4)).eval() for k in asked}
    errors: list[BaseException] = []

    def work(key: str) -> None:
        try:
            dtt.optimize(models[key], (torch.randn(2, 8),), **asked[key])  # type: ignore[arg-type]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            lined_up.abort()

    threads = [threading.Thread(target=work, args=(k,)) for k in asked]
    for t in threads:
        t.start()
    lined_up.wait()
    during = dtt.config.current()  # this thread's: the process's
    go.wait()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert during == before
    assert dtt.config.process_settings() == before
    for key, settings in asked.items():
        bound = models[key].__dict__["_dnntune_config"]
        assert (bound.policy, bound.overrides) == (settings["policy"], str(settings["overrides"]))
    assert (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


@pytest.mark.filterwarnings("ignore::dnntune.torch.DnnTuneFallbackWarning")
def test_two_optimize_calls_at_once_report_their_own_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each report of two ``optimize`` calls at once, on models whose layers have the same
    names, lists its own model's plans and counts its own tuning. The reports were read off
    process-wide tables: the plans per layer name and the difference of ``runtime_stats``
    over the example forward, so a float64 model (every call on PyTorch's op) optimized while
    another model tuned listed that model's plans and counted its autotune call (concurrency
    audit). Lined up: both examples begin, the float64 one runs after the other has tuned."""
    import threading

    layers_module = sys.modules["dnntune.torch._optimize_layers"]
    real_time_example = layers_module.time_example
    both_begin = threading.Barrier(2, timeout=60)
    tuned = threading.Event()

    def lined_up(run: Any, *args: Any) -> Any:
        both_begin.wait()
        if threading.current_thread().name == "float64":
            assert tuned.wait(timeout=120)
            return real_time_example(run, *args)
        try:
            return real_time_example(run, *args)
        finally:
            tuned.set()

    monkeypatch.setattr(layers_module, "time_example", lined_up)
    models = {
        "float64": nn.Sequential(nn.Linear(8, 8)).eval().double(),
        "float32": nn.Sequential(nn.Linear(8, 8)).eval(),
    }
    inputs = {"float64": torch.randn(2, 8, dtype=torch.float64), "float32": torch.randn(2, 8)}
    policies = {"float64": "heuristic", "float32": "tune"}
    reports: dict[str, dtt.OptimizeReport] = {}
    errors: list[BaseException] = []

    def work(key: str) -> None:
        try:
            reports[key] = dtt.optimize(
                models[key],
                (inputs[key],),
                policy=policies[key],  # type: ignore[arg-type]
                overrides=tmp_path / f"{key}.json",
            )
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            both_begin.abort()
            tuned.set()

    threads = [threading.Thread(target=work, args=(k,), name=k) for k in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors[0]
    tuned_report, pytorch_report = reports["float32"], reports["float64"]
    assert tuned_report.autotune_calls == 1 and tuned_report.swapped[0].plans
    assert pytorch_report.autotune_calls == 0 and pytorch_report.tuning_time_ms == 0
    assert [r.plans for r in pytorch_report.swapped] == [[]]  # its Linear ran PyTorch's op
    assert not runtime.module_plans  # nothing left behind


def test_optimized_model_runs_in_several_threads_at_once(tmp_path: Path) -> None:
    """The settings scope of an optimized model is per thread: concurrent forwards of one
    model neither fail nor leave another thread's settings in force."""
    import threading

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    dtt.optimize(model, (torch.randn(3, 8),), policy="tune", overrides=tmp_path / "ov.json")
    dtt.configure(policy="heuristic")
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with torch.no_grad():
                for _ in range(50):
                    torch.testing.assert_close(model(x), expected)
                    assert dtt.config.current().policy == "heuristic"
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("make", [_Block, _Attention])
@pytest.mark.parametrize("slower", [True, False])
def test_revert_if_slower_puts_the_model_back(
    make: type[nn.Module], slower: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """revert_if_slower: when the end-to-end check finds the optimized forward slower, every
    class, attribute and hook optimize() set is undone (swaps, batch-norm folding, fusion, the
    routing hooks); the winners stay in the override file. A faster forward keeps dnntune."""
    torch.manual_seed(0)
    model = make().eval()
    randomize_batch_norms(model)
    x = torch.randn(2, 3, 8, 8) if make is _Block else torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = model(x)
    classes = [type(m) for m in model.modules()]
    attributes = [list(m.__dict__) for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    times = iter([1.0, 2.0] if slower else [2.0, 1.0])  # eager, then optimized
    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "forward_ms", lambda module, inputs: next(times))
    path = tmp_path / "ov.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = dtt.optimize(model, (x,), policy="tune", overrides=path, refine=False)
    assert report.reverted is slower
    assert path.exists()  # tuned winners are kept for later runs either way
    changed = [type(m) for m in model.modules()] != classes
    assert changed is not slower
    if slower:
        assert not any(k.startswith("_dnntune") for m in model.modules() for k in m.__dict__)
        # the same attributes in the same order, in dicts rebuilt after all the switching
        assert [list(m.__dict__) for m in model.modules()] == attributes
        assert all(
            sys.getsizeof(m.__dict__) <= sys.getsizeof(dict(m.__dict__)) for m in model.modules()
        )
        assert not model._forward_hooks and not model._forward_pre_hooks
        assert "reverted" in str(report)
    # reverting is the default's expected outcome: a result in the report, never a warning
    assert not any(issubclass(w.category, dtt.DnnTuneSlowerWarning) for w in caught)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)
    assert model.state_dict().keys() == state.keys()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k])


def test_refine_keeps_the_modules_whose_pytorch_ops_make_the_forward_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """refine: each swapped module is tried on PyTorch's own ops, timing the whole forward;
    it stays there only when the forward got faster beyond noise. Here the forward's (fake)
    time drops 30 % with the first Linear on PyTorch and rises with the last one."""
    from dnntune.torch import functional as dtf

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)

    def fake_forward_ms(module: nn.Module, inputs: Any) -> float:
        flagged = {n for n, m in module.named_modules() if m.__dict__.get("_dnntune_pytorch")}
        return 1.0 - 0.3 * ("0" in flagged) + 0.3 * ("2" in flagged)

    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "forward_ms", fake_forward_ms)
    report = dtt.optimize(model, (x,), policy="tune", overrides=tmp_path / "o.json", refine=True)
    by_name = {r.name: r for r in report.swapped}
    assert by_name["0"].pytorch and not by_name["2"].pytorch
    assert "refine" in str(report)
    assert model[0].__dict__.get("_dnntune_pytorch") and "_dnntune_pytorch" not in model[2].__dict__

    # the flagged module never asks dnntune for a kernel; the other still does
    asked: list[str] = []
    real = dtf.linear_kernel

    def spy(x2d: torch.Tensor, w: torch.Tensor, *args: Any) -> Any:
        asked.append(str(tuple(w.shape)))
        return real(x2d, w, *args)

    monkeypatch.setattr(dtf, "linear_kernel", spy)
    runtime.native_memo.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    assert asked == [str((4, 16))]


def test_refine_needs_the_check_and_skips_cuda_graphs(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 4)).train()
    report = dtt.optimize(model, (torch.randn(2, 8),), overrides=tmp_path / "o.json", refine=True)
    assert not any(r.pytorch for r in report.swapped)  # training mode: no check, no refine
    # asked for and not run: the report says so and what it needs (it was silent)
    assert any("refine=True did not run" in n and "eval mode" in n for n in report.notes)
    unasked = dtt.optimize(
        nn.Sequential(nn.Linear(8, 4)).train(), (torch.randn(2, 8),), overrides=tmp_path / "u.json"
    )
    assert not any("refine" in n for n in unasked.notes)


def test_refine_without_example_inputs_says_it_did_not_run(tmp_path: Path) -> None:
    report = dtt.optimize(nn.Sequential(nn.Linear(8, 4)).eval(), overrides=None, refine=True)
    assert any("refine=True did not run" in n and "example inputs" in n for n in report.notes)


class _ThreeShapes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 24), nn.Linear(24, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _clock(monkeypatch: pytest.MonkeyPatch, *readings: float) -> None:
    """Script the tuning budget's clock: these readings, then far past any deadline. With
    ``time_budget_s=10`` set at 0, the search ends at 7 s and the races at 10 s; a search
    reads the clock once more (its own budget, what is left of the search share)."""
    it = iter(readings)
    monkeypatch.setattr(_budget, "_now", lambda: next(it, 1e9))


def _optimize_three(tmp_path: Path) -> tuple[nn.Module, torch.Tensor, torch.Tensor, Any]:
    """``_ThreeShapes`` optimized under a 10 s tuning budget: (model, input, eager output,
    report)."""
    torch.manual_seed(0)
    model, x = _ThreeShapes().eval(), torch.randn(4, 8)
    expected = model(x)
    report = dtt.optimize(
        model, (x,), policy="tune", overrides=tmp_path / "o.json", time_budget_s=10
    )
    return model, x, expected, report


def _race_verdict(monkeypatch: pytest.MonkeyPatch, verdict: str) -> list[tuple[str, str]]:
    """Script the short race of budget-skipped signatures: every race ends in ``verdict``
    (the heuristic plan is the race's winner, PyTorch's op its default). Returns the
    (winner, default) names raced."""
    from dnntune.autotune.confirm import Confirmation

    raced: list[tuple[str, str]] = []

    def race(
        sample_winner: Any, sample_default: Any, config: Any, *, winner: str, default: str
    ) -> Confirmation:
        sample_winner(), sample_default()  # both plans run on the call's tensors
        raced.append((winner, default))
        return Confirmation(verdict, winner, default, rounds=4, speedup=1.5)

    monkeypatch.setattr(_budget, "confirm_winner", race)
    return raced


#: the stand-in for the heuristic plan: another plan than PyTorch's op at its defaults (the
#: knob changes nothing on the CPU, so results stay eager's)
_OTHER = "TORCH_ENGINE[torch.allow_tf32=1]"


def _heuristic_is_not_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the heuristic plan of a linear layer is PyTorch's op itself (then there is
    nothing to race): make it another plan, :data:`_OTHER`."""

    def heuristic(graph: Any, handle: Any) -> Any:
        knobs = {"torch.allow_tf32": 1}
        return runtime.choose_plan(graph, handle, engine="TORCH_ENGINE", knobs=knobs).plan

    monkeypatch.setattr(runtime, "_heuristic", heuristic)


def test_a_tuning_budget_stops_tuning_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scripted clock: a budget of 10 s searches for the first layer only (its search share
    ends at 7 s); the other two, reached at 8 and 9 s, run PyTorch's own op (TORCH_ENGINE at
    its defaults) in this process, as the heuristic plan did not win their short race, and
    the report says so. A new process
    (played by clearing the kernels) without a budget tunes those two only: the first is read
    from the file."""
    from dnntune.autotune.verdicts import KEPT_TIE

    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 9.0)
    _heuristic_is_not_pytorch(monkeypatch)
    raced = _race_verdict(monkeypatch, KEPT_TIE)
    budgets: list[float | None] = []
    real_config = runtime.AutotuneConfig

    def config(**kwargs: Any) -> Any:
        budgets.append(kwargs.get("time_budget_s"))
        return real_config(**kwargs)

    monkeypatch.setattr(runtime, "AutotuneConfig", config)
    torch.manual_seed(0)
    model, x = _ThreeShapes().eval(), torch.randn(4, 8)
    expected = model(x)
    path = tmp_path / "ov.json"
    before = runtime.runtime_stats.autotune_calls
    report = dtt.optimize(model, (x,), policy="tune", overrides=path, time_budget_s=10)
    assert report.autotune_calls == runtime.runtime_stats.autotune_calls - before == 1
    assert report.budget_skipped == 2 and report.budget_heuristic == 0
    assert raced == [(_OTHER, "TORCH_ENGINE")] * 2
    assert budgets == [2.5]  # the search had half of what was left of the share: (7 - 2) / 2
    assert (
        "tuning budget of 10 s: 2 layer signature(s) reached after its search share (7 s) "
        "untuned in this process: they kept "
        "PyTorch's own op" in str(report)
    )
    kernels = list(runtime.cache()._items.values())
    skipped = [k for k in kernels if k.source == "PyTorch's op (tuning budget spent)"]
    assert len(skipped) == 2 and all(k.native and k.engine_name == "TORCH_ENGINE" for k in skipped)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    runtime.cache().clear()
    runtime.cache().decisions.clear()
    again = dtt.optimize(_ThreeShapes().eval(), (x,), policy="tune", overrides=path)
    assert again.autotune_calls == 2 and again.budget_skipped == 0
    assert "tuning budget" not in str(again)


def test_a_budget_skipped_layer_takes_the_heuristic_plan_that_wins_its_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the heuristic plan beats PyTorch's op beyond noise in the short race (cuDNN's
    plan fusing the epilogue PyTorch runs as its own kernels), the skipped layer runs it; the
    kernel and the report say so, and the forward still gives eager's result."""
    from dnntune.autotune.verdicts import CONFIRMED

    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 9.0)
    _heuristic_is_not_pytorch(monkeypatch)
    _race_verdict(monkeypatch, CONFIRMED)
    model, x, expected, report = _optimize_three(tmp_path)
    assert report.budget_skipped == 2 and report.budget_heuristic == 2
    assert "(7 s) untuned in this process: all on the heuristic plan (it beat " in str(report)
    raced = [k for k in runtime.cache()._items.values() if "short race" in k.source]
    assert len(raced) == 2 and all(k.plan.name == _OTHER for k in raced)
    assert raced[0].source == (
        "heuristic, 1.50x PyTorch's op in a short race (tuning budget spent)"
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_a_race_winner_that_fails_verification_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every winner is verified (seed 004): a heuristic plan that wins its race but whose
    output does not match the reference leaves the layer on PyTorch's op, and says so."""
    from dnntune.autotune.verdicts import CONFIRMED
    from dnntune.autotune.verification import Verdict

    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 9.0)
    _heuristic_is_not_pytorch(monkeypatch)
    _race_verdict(monkeypatch, CONFIRMED)
    checked: list[str] = []

    def wrong(graph: Any, pack: Any, run_with: Any, handle: Any) -> Verdict:
        checked.append(graph.name)
        return Verdict(False, 3.0, "output y: max abs error 3.0")

    monkeypatch.setattr(runtime, "verify", wrong)
    model, x, expected, report = _optimize_three(tmp_path)
    assert len(checked) == 2 and report.budget_skipped == 2 and report.budget_heuristic == 0
    sources = [k.source for k in runtime.cache()._items.values() if "budget" in k.source]
    assert (
        sources
        == ["PyTorch's op (the heuristic plan failed verification; tuning budget spent)"] * 2
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_the_short_race_runs_for_real_and_keeps_eagers_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unscripted: the race times both plans on the CPU and keeps one of them; either way
    the forward gives eager's result and the race stays within its wall-time bound."""
    import time as _time

    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 9.0)
    _heuristic_is_not_pytorch(monkeypatch)
    torch.manual_seed(0)
    model, x = _ThreeShapes().eval(), torch.randn(4, 8)
    expected = model(x)
    start = _time.perf_counter()
    report = dtt.optimize(
        model, (x,), policy="tune", overrides=tmp_path / "o.json", time_budget_s=10
    )
    assert report.budget_skipped == 2
    plans = {k.plan.name for k in runtime.cache()._items.values() if "budget" in k.source}
    assert plans <= {"TORCH_ENGINE", _OTHER} and plans
    assert _time.perf_counter() - start < 60.0
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_the_report_says_where_the_example_forward_s_seconds_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tuning pass's wall time, split: the search (the first layer), the two short races,
    the plans' choosing, building and checking, and the rest; the parts add up to at most the
    whole, and the report prints the split for policy "tune"."""
    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 9.0)
    _heuristic_is_not_pytorch(monkeypatch)
    torch.manual_seed(0)
    model, x = _ThreeShapes().eval(), torch.randn(4, 8)
    report = dtt.optimize(
        model, (x,), policy="tune", overrides=tmp_path / "o.json", time_budget_s=10
    )
    spent = report.example_time
    assert spent is not None and report.budget_skipped == 2
    assert spent.searches_s == pytest.approx(report.tuning_time_ms / 1e3)
    assert spent.searches_s > 0 and spent.races_s > 0 and spent.plans_s >= 0
    assert spent.searches_s + spent.races_s + spent.plans_s <= spent.total_s + 1e-6
    assert spent.rest_s == pytest.approx(
        spent.total_s - spent.searches_s - spent.races_s - spent.plans_s, abs=1e-9
    )
    assert f"  the example forward took {spent.total_s:.2f} s: searches " in str(report)
    plain = dtt.optimize(
        _ThreeShapes().eval(), (x,), policy="heuristic", overrides=tmp_path / "h.json"
    )
    assert plain.example_time is not None and plain.example_time.searches_s == 0
    assert plain.example_time.races_s == 0
    assert "the example forward took" not in str(plain)


def test_a_signature_reached_after_the_whole_budget_is_not_raced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The races have the budget's last 30 %: a signature reached after the budget is spent
    runs PyTorch's op without one, so the pass keeps to the budget."""
    from dnntune.autotune.verdicts import CONFIRMED

    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 11.0)
    _heuristic_is_not_pytorch(monkeypatch)
    raced = _race_verdict(monkeypatch, CONFIRMED)
    report = dtt.optimize(
        _ThreeShapes().eval(),
        (torch.randn(4, 8),),
        overrides=tmp_path / "o.json",
        time_budget_s=10,
    )
    assert report.budget_skipped == 2 and report.budget_heuristic == 1 and len(raced) == 1
    sources = sorted(k.source for k in runtime.cache()._items.values())
    assert sources.count("PyTorch's op (tuning budget spent)") == 1


def test_a_budget_skipped_layer_pytorch_cannot_run_takes_the_heuristic_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where TORCH_ENGINE refuses a layer the budget skipped, the heuristic plan runs it (the
    forward still gives eager's result)."""
    from dnntune.errors import NotSupportedError

    _clock(monkeypatch, 0.0, 1.0, 2.0, 8.0, 11.0)  # one signature raced, one after the budget
    real = runtime.choose_plan

    def refuse_torch(graph: Any, handle: Any, **kwargs: Any) -> Any:
        if kwargs.get("engine") == "TORCH_ENGINE":
            raise NotSupportedError("TORCH_ENGINE: refused by the test")
        return real(graph, handle, **kwargs)

    monkeypatch.setattr(runtime, "choose_plan", refuse_torch)
    model, x, expected, report = _optimize_three(tmp_path)
    assert report.budget_skipped == 2
    sources = sorted(k.source for k in runtime.cache()._items.values())
    assert sources.count("heuristic (tuning budget spent)") == 2
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "10"])
def test_a_bad_tuning_budget_is_refused(bad: object, tmp_path: Path) -> None:
    with pytest.raises(dt.InvalidValueError, match="time_budget_s"):
        dtt.optimize(_ThreeShapes().eval(), (torch.randn(2, 8),), time_budget_s=bad)  # type: ignore[arg-type]


def test_the_budget_line_splits_the_untuned_signatures_as_they_ran() -> None:
    from dnntune.torch.optimize_report import OptimizeReport

    line = {
        (3, 0): "they kept PyTorch's own op (or the override file's plan)",
        (3, 3): "all on the heuristic plan (it beat PyTorch's op in a short race)",
        (3, 1): "1 on the heuristic plan (it beat PyTorch's op in a short race), the others on "
        "PyTorch's own op",
    }
    for (skipped, heuristic), words in line.items():
        report = OptimizeReport(time_budget_s=2.0, budget_skipped=skipped)
        report.budget_heuristic = heuristic
        assert (
            f"tuning budget of 2 s: {skipped} layer signature(s) reached after its search share "
            "(1.4 s) untuned in this process: "
        ) in str(report)
        assert words in str(report)
