"""dnntune's fx traces leave other threads alone: while a trace runs, fx replaces
``nn.Module.__call__`` and ``__getattr__`` for the whole process, and before a new-user audit
every forward another thread ran meanwhile (a model served while ``optimize`` traced another)
raised "module is not installed as a submodule"."""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch._tracing import OwnThreadTracer


def _in_another_thread(fn: Any) -> Any:
    """``fn()`` run in a thread of its own: its result, or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # handed back to the test
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def test_a_forward_in_another_thread_runs_as_pytorchs_while_a_trace_runs() -> None:
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    other = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), shared)  # holds the root's own layer
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = other(x)
    seen: list[Any] = []

    class Root(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = shared

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            # runs while the trace holds fx's patches: another thread's forward, now
            seen.append(_in_another_thread(lambda: other(x).detach()))
            return self.fc(h)

    graph = OwnThreadTracer().trace(Root())
    got = seen[0]
    assert isinstance(got, torch.Tensor), got  # NameError before, or a proxy of `shared`
    torch.testing.assert_close(got, want)
    # the trace holds the root's forward only: nothing of the other thread's calls
    ops = [(n.op, str(n.target)) for n in graph.nodes]
    assert ops == [("placeholder", "h"), ("call_module", "fc"), ("output", "output")]


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_model_served_in_another_thread_while_optimize_runs() -> None:
    torch.manual_seed(0)
    served = _Net().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = served(x)
    errors: list[str] = []
    forwards = [0]
    stop = threading.Event()

    def serve() -> None:
        with torch.no_grad():
            while not stop.is_set():
                try:
                    if not torch.equal(served(x), want):
                        errors.append("other values")
                except Exception as e:  # the test's finding
                    errors.append(f"{type(e).__name__}: {e}")
                forwards[0] += 1

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        for _ in range(3):
            model = _Net().eval()
            dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    finally:
        stop.set()
        thread.join()
    assert forwards[0] > 0
    assert not errors, sorted(set(errors))[:3]


def test_two_traces_in_two_threads_never_overlap() -> None:
    """fx puts back what it patched as it found it: a trace that started inside another's and
    ended after it put the first one's wrapper back as ``nn.Module.__call__``, for good (two
    ``optimize`` calls in two threads: one raised, and the process kept fx's wrapper)."""
    original_call, original_getattr = nn.Module.__call__, nn.Module.__getattr__
    b_tracing, a_done = threading.Event(), threading.Event()
    graphs: dict[str, Any] = {}

    class B(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            b_tracing.set()
            a_done.wait(5)  # ends after A, if it could start inside A
            return self.fc(h)

    def trace_b() -> None:
        graphs["b"] = OwnThreadTracer().trace(B())

    thread = threading.Thread(target=trace_b)

    class A(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            thread.start()
            graphs["overlapped"] = b_tracing.wait(0.5)  # B waits for this trace to end
            return self.fc(h)

    try:
        graphs["a"] = OwnThreadTracer().trace(A())
    finally:
        a_done.set()
        thread.join()
    assert graphs["overlapped"] is False
    assert nn.Module.__call__ is original_call
    assert nn.Module.__getattr__ is original_getattr
    for name in ("a", "b"):
        ops = [(n.op, str(n.target)) for n in graphs[name].nodes]
        assert ops == [("placeholder", "h"), ("call_module", "fc"), ("output", "output")]
