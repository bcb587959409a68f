"""Issue 8, bullet 6: the timers, the host-overhead check and cold mode on a real GPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from autotune_helpers import Pack, tune

import dnntune as dt
from dnntune import testing
from dnntune.backend.cache_flush import CacheFlusher
from dnntune.backend.timer import CpuTimer, CudaEventTimer
from dnntune.errors import InvalidValueError
from dnntune.measure.clocks import (
    DEVICE_SAMPLE_MIN_MS,
    MAX_LATENCY_CALLS,
    MAX_LAUNCHES_PER_SAMPLE,
    SHORT_KERNEL_MS,
    THROUGHPUT_MIN_LAUNCHES,
    THROUGHPUT_SAMPLE_MIN_MS,
    latency_calls_for,
    launches_for,
    throughput_launches_for,
)
from dnntune.testing import FAKE_ENGINE_C, FakeEngines, FakeTimer

FAST: dict[str, Any] = {"strategy": dt.AutotuneStrategy.FIXED_AVERAGE, "timed_iterations": 3}


def test_launches_only_for_short_kernels() -> None:
    assert SHORT_KERNEL_MS == 0.02 and DEVICE_SAMPLE_MIN_MS == 0.1
    assert launches_for(0.5) == 1
    assert launches_for(0.02) == 1
    assert launches_for(0.01) == 10
    assert launches_for(0.003) == 34
    assert launches_for(1e-6) == MAX_LAUNCHES_PER_SAMPLE
    assert launches_for(0.0) == MAX_LAUNCHES_PER_SAMPLE


@pytest.mark.parametrize(
    ("metric", "kernel_ms", "launches"),
    [
        ("device", 0.005, 20),
        ("device", 0.05, 1),
        ("device", 2.0, 1),
        ("throughput", 0.01, 50),  # back to back, ungated: enough calls for 0.5 ms
        ("throughput", 1.0, 8),  # long calls: still several, so they overlap
    ],
)
def test_metric_records_launches_per_sample(
    graph: dt.Graph,
    handle: dt.Handle,
    pack: Pack,
    fakes: FakeEngines,
    metric: str,
    kernel_ms: float,
    launches: int,
) -> None:
    fakes.timings.set(FAKE_ENGINE_C, kernel_ms)
    graph.add_engines([FAKE_ENGINE_C])
    r = tune(graph, handle, pack, ranking_metric=metric, **FAST)[0]
    assert r.launches_per_sample == launches and r.iterations_run == 3
    assert r.min_time_ms == pytest.approx(kernel_ms)
    assert getattr(r, "throughput_ms" if metric == "throughput" else "device_time_ms") == (
        r.min_time_ms
    )
    assert r.device_time_ms == pytest.approx(kernel_ms)  # the secondary clock after throughput


def test_latency_samples_of_a_short_call_average_several_calls(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    """The RFC's per-iteration timing, one call latency per sample, except that the first
    sample's latency sets how many calls (each on an idle device) later samples average: a
    5 us call gets MAX_LATENCY_CALLS; a 1 ms one stays at one. The device clock is only the
    secondary report."""
    fakes.timings.set(FAKE_ENGINE_C, 0.005)
    graph.add_engines([FAKE_ENGINE_C])
    r = tune(graph, handle, pack, **FAST)[0]
    assert r.launches_per_sample == MAX_LATENCY_CALLS and r.iterations_run == 3
    assert latency_calls_for(1.0) == 1 and latency_calls_for(0.1) == 3
    assert latency_calls_for(0.0) == MAX_LATENCY_CALLS
    assert r.latency_ms == pytest.approx(0.005) and r.device_time_ms == pytest.approx(0.005)


def test_throughput_samples_span_enough_back_to_back_calls() -> None:
    assert THROUGHPUT_MIN_LAUNCHES == 8 and THROUGHPUT_SAMPLE_MIN_MS == 0.5
    assert throughput_launches_for(2.0) == 8
    assert throughput_launches_for(0.05) == 10
    assert throughput_launches_for(0.01) == 50
    assert throughput_launches_for(1e-6) == MAX_LAUNCHES_PER_SAMPLE
    assert throughput_launches_for(0.0) == MAX_LAUNCHES_PER_SAMPLE


def test_throughput_metric_refuses_a_cold_cache() -> None:
    with pytest.raises(InvalidValueError, match="cache_mode='warm'"):
        dt.AutotuneConfig(ranking_metric="throughput", cache_mode="cold").validate()


class _GatedFakeTimer(FakeTimer):
    """A fake timer that says which of its methods timed each sample."""

    def __init__(self, fakes: FakeEngines) -> None:
        super().__init__(fakes.clock, fakes.counters)
        self.device_calls: list[int] = []

    def device_time_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        self.device_calls.append(repeats)
        return self.time_ms(fn, repeats)


def test_device_samples_use_the_timers_device_clock(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    timer = _GatedFakeTimer(fakes)
    handle.set_timer(timer)
    fakes.timings.set(FAKE_ENGINE_C, 0.01)
    graph.add_engines([FAKE_ENGINE_C])
    tune(graph, handle, pack, ranking_metric="device", **FAST)
    assert timer.device_calls == [1, 10, 10, 10]  # calibration, then three samples


def test_the_stall_gate_grows_at_once_and_shrinks_back() -> None:
    from dnntune.backend.timer import _GATE_MAX_US, _GATE_MIN_US, next_gate_us

    assert next_gate_us(_GATE_MIN_US, 10.0) == _GATE_MIN_US  # never below the floor
    assert next_gate_us(_GATE_MIN_US, 400.0) == 800.0  # a slower host: at once
    assert next_gate_us(1e9, 1e9) == _GATE_MAX_US  # never above the ceiling
    gate = next_gate_us(_GATE_MIN_US, 4000.0)  # one slow host call (a JIT compile)
    assert gate == 8000.0
    for _ in range(12):  # then ordinary samples: back to the floor, not stuck at 8 ms
        gate = next_gate_us(gate, 10.0)
    assert gate < 2.0 * _GATE_MIN_US


def test_cpu_timer_uses_perf_counter() -> None:
    timer = CpuTimer()
    assert timer.kind == "perf_counter"
    ms = timer.time_ms(lambda: time.sleep(0.002), 3)
    assert 1.5 < ms < 200.0


def test_cpu_cache_flusher_is_at_least_twice_the_llc() -> None:
    from dnntune.backend.cache_flush import cpu_llc_bytes

    flusher = CacheFlusher(torch.device("cpu"))
    assert flusher.flush_bytes >= 2 * cpu_llc_bytes()
    flusher.flush()


# ---- GPU ---------------------------------------------------------------------------------
def _cuda_graph(make: Callable[[], dt.Graph] = testing.small_pointwise_graph) -> tuple:
    handle = dt.create_handle("cuda")
    g = make()
    g.build_operation_graph(handle)
    return handle, g, testing.make_pack(g, "cuda")


def _tune_tiny_cuda_add(**config: Any) -> tuple[dt.Handle, list[dt.AutotuneResult]]:
    """TORCH_ENGINE's add + relu of a few microseconds on the GPU, tuned with ``config``."""
    handle, g, pack = _cuda_graph()
    g.add_engine("TORCH_ENGINE")
    ws = g.get_estimated_max_workspace_size()
    workspace = torch.empty(ws, dtype=torch.uint8, device="cuda") if ws else None
    return handle, g.autotune(handle, pack, workspace, ws, dt.AutotuneConfig(**config, **FAST))


@pytest.mark.gpu
def test_gpu_event_timing_launches_a_tiny_kernel_back_to_back() -> None:
    handle, results = _tune_tiny_cuda_add(ranking_metric="device")
    r = results[0]
    assert r.succeeded and r.verified and r.timer_kind == "cuda_event"
    assert r.launches_per_sample > 1  # a few-microsecond add + relu
    assert r.launches_per_sample * r.min_time_ms >= 0.5 * DEVICE_SAMPLE_MIN_MS
    # device time excludes the host's submit cost that the latency includes
    assert 0 < r.device_time_ms < r.latency_ms
    assert isinstance(handle.timer, CudaEventTimer) and handle.timer.last_gate_held is True


@pytest.mark.gpu
def test_gpu_throughput_lies_between_kernel_time_and_call_latency() -> None:
    # back-to-back calls cannot beat the kernels, and overlap hides most of one call's latency.
    # The two tunes are minutes-apart readings of a few-microsecond call, and the GPU tests run
    # in two processes side by side (h200_verify.sh): the other's kernels can land inside an
    # ungated throughput sample (session 22: 22 us against a 5.4 us latency, once in six
    # runs). So three attempts, each pair taken back to back; the bounds hold in one.
    seen = []
    for _ in range(3):
        r = _tune_tiny_cuda_add(ranking_metric="throughput")[1][0]
        assert r.succeeded and r.launches_per_sample >= THROUGHPUT_MIN_LAUNCHES
        lat = _tune_tiny_cuda_add()[1][0].latency_ms
        seen.append((r.device_time_ms, r.throughput_ms, lat))
        if 0.9 * r.device_time_ms <= r.throughput_ms <= 1.1 * lat:
            return
    pytest.fail(f"(device, throughput, latency) ms per attempt: {seen}")


@pytest.mark.gpu
def test_gpu_stall_gate_hides_host_overhead() -> None:
    timer = CudaEventTimer(torch.device("cuda"))
    x = torch.zeros(16, device="cuda")

    def slow_host_tiny_kernel() -> None:
        time.sleep(0.0002)  # 200 us of host work per launch
        x.add_(1.0)

    timer.synchronize()
    gated = min(timer.device_time_ms(slow_host_tiny_kernel, 20) for _ in range(5))
    ungated = min(timer.time_ms(slow_host_tiny_kernel, 20) for _ in range(5))
    assert timer.last_gate_held is True
    assert ungated > 0.15  # the host gaps are inside the plain event span
    assert gated < 0.05  # behind the gate, only the kernels


@pytest.mark.gpu
def test_gpu_cold_mode_flushes_the_l2() -> None:
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    flusher = CacheFlusher(device)
    assert flusher.flush_bytes >= 2 * l2
    if l2 < 16 << 20:
        pytest.skip("L2 too small to see a warm read")
    data = torch.ones((l2 // 2) // 4, device=device)
    out = torch.empty((), device=device)
    timer = CudaEventTimer(device)

    def read() -> None:
        torch.sum(data, dim=0, out=out)

    def sample(cold: bool) -> float:
        read()  # the data is in L2 now
        if cold:
            flusher.flush()
        timer.synchronize()
        return timer.device_time_ms(read, 1)

    warm = statistics.median(sample(False) for _ in range(30))
    cold = statistics.median(sample(True) for _ in range(30))
    assert cold > warm


@pytest.mark.gpu
def test_gpu_cold_autotune_records_the_cache_mode() -> None:
    handle, g, pack = _cuda_graph(testing.small_conv_graph)
    g.add_engine("TORCH_ENGINE")
    ws = g.get_estimated_max_workspace_size()
    workspace = torch.empty(ws, dtype=torch.uint8, device="cuda") if ws else None
    config = dt.AutotuneConfig(cache_mode="cold", **FAST)
    r = g.autotune(handle, pack, workspace, ws, config)[0]
    assert r.succeeded and r.cache_mode == "cold" and r.min_time_ms > 0
    assert g.last_autotune_summary.cache_mode == "cold"


def test_close_contenders_are_rechecked_on_the_throughput_clock(
    graph: dt.Graph, handle: dt.Handle, pack: Pack, fakes: FakeEngines
) -> None:
    from dnntune.testing import FAKE_ENGINE_A

    fakes.timings.set(FAKE_ENGINE_A, 0.010)
    fakes.timings.set(FAKE_ENGINE_C, 0.0101)  # 1 % apart: re-timed interleaved
    graph.add_engines([FAKE_ENGINE_C, FAKE_ENGINE_A])
    results = tune(graph, handle, pack, ranking_metric="throughput", **FAST)
    assert [r.engine_name for r in results] == [FAKE_ENGINE_A, FAKE_ENGINE_C]
    assert all(r.recheck_rounds > 0 and r.launches_per_sample == 50 for r in results)
    assert all(r.throughput_ms == r.min_time_ms for r in results)
