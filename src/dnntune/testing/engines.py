"""Fake engines for tests (RFC 0013 section 10.3's test plugin, plus a wrong one).

Every fake applies to every graph and device and computes REAL outputs through
:func:`dnntune.reference.run`, so autotune() can verify them; only their speed is scripted
(see :mod:`dnntune.testing.timing`). They are registered only inside
:func:`dnntune.testing.fake_engines`.

=============================  ============================================================
engine                         behaviour
=============================  ============================================================
FAKE_ENGINE_A                  knobs ``global.benchmarking`` 0..1 and ``fake.variant`` 0..3
FAKE_ENGINE_B                  string ``fake.algorithm`` direct|winograd|fft (default direct)
FAKE_ENGINE_C                  no knobs
FAKE_ENGINE_FAILS              execute always raises ExecutionError
FAKE_ENGINE_PRIMING_FAILS      has ``global.benchmarking``; fails only when built with it = 1
FAKE_ENGINE_WORKSPACE_GROWS    has ``global.benchmarking``; estimate 1024 bytes, compiled
                               8192 with benchmarking=1, else 1024
FAKE_ENGINE_WRONG              fastest of all, but its output is the reference + 1.0
=============================  ============================================================

Opt-in failure engines (not in :data:`ALL_FAKE_ENGINES`; name them in
``fake_engines(names=[...])``). Each is scripted faster than every other fake, so it would win
if its failure went unnoticed:

=============================  ============================================================
FAKE_ENGINE_HANGS              ``fake.hang_in`` execute|compile (default execute): sleeps for
                               an hour there, or until the ``fake_engines`` block ends
FAKE_ENGINE_OOM                execute raises ``torch.cuda.OutOfMemoryError``, or with
                               ``fake.oom_error=runtime`` a RuntimeError "CUDA out of memory"
FAKE_ENGINE_CRASHES            execute kills its process: ``os.abort()``, or with
                               ``fake.crash_with=segv`` a SIGSEGV. Only inside an isolate
                               worker process; anywhere else it raises ExecutionError instead
FAKE_ENGINE_CLOBBERS           right outputs, then writes into its first input tensor (as
                               cuDNN 9.19's engine 5 did for norms): every later run of any
                               plan on that buffer would be wrong
=============================  ============================================================

Every estimate is 1024 bytes, and every plan needs the workspace it reports.

Priming (EXHAUSTIVE mode) leaves a trace, as cuDNN's search record does: once a plan built
with ``global.benchmarking=1`` has run, later builds of the same engine with the same other
knobs are *primed*, and their timing is looked up with the pseudo-knob :data:`PRIMED_KNOB`
set to 1 (``FakeTimings.set(FAKE_ENGINE_A, 3.0, {PRIMED_KNOB: 1})`` makes a primed build of A
take 3 ms, so its engine's search can be scripted to help or to hurt).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune import reference
from dnntune.backend.engine import Engine, Plan
from dnntune.backend.knobs import (
    BENCHMARKING,
    IntConstraint,
    Knob,
    KnobSetting,
    KnobValue,
    KnobValueType,
    StringConstraint,
    benchmarking_knob,
)
from dnntune.errors import ExecutionError, NotSupportedError
from dnntune.testing.timing import FakeClock, FakeCounters, FakeTimings

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = [
    "ALL_FAKE_ENGINES",
    "PRIMED_KNOB",
    "FAKE_ENGINE_A",
    "FAKE_ENGINE_B",
    "FAKE_ENGINE_C",
    "FAKE_ENGINE_CLOBBERS",
    "FAKE_ENGINE_CRASHES",
    "FAKE_ENGINE_FAILS",
    "FAKE_ENGINE_HANGS",
    "FAKE_ENGINE_OOM",
    "FAKE_ENGINE_PRIMING_FAILS",
    "FAKE_ENGINE_WORKSPACE_GROWS",
    "FAKE_ENGINE_WRONG",
    "FakeEngine",
    "FakePlan",
    "OPT_IN_FAKE_ENGINES",
    "make_fake_engines",
]

FAKE_ENGINE_A = "FAKE_ENGINE_A"
FAKE_ENGINE_B = "FAKE_ENGINE_B"
FAKE_ENGINE_C = "FAKE_ENGINE_C"
FAKE_ENGINE_FAILS = "FAKE_ENGINE_FAILS"
FAKE_ENGINE_PRIMING_FAILS = "FAKE_ENGINE_PRIMING_FAILS"
FAKE_ENGINE_WORKSPACE_GROWS = "FAKE_ENGINE_WORKSPACE_GROWS"
FAKE_ENGINE_WRONG = "FAKE_ENGINE_WRONG"
FAKE_ENGINE_HANGS = "FAKE_ENGINE_HANGS"
FAKE_ENGINE_OOM = "FAKE_ENGINE_OOM"
FAKE_ENGINE_CRASHES = "FAKE_ENGINE_CRASHES"
FAKE_ENGINE_CLOBBERS = "FAKE_ENGINE_CLOBBERS"

ALL_FAKE_ENGINES: tuple[str, ...] = (
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_FAILS,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    FAKE_ENGINE_WRONG,
)

#: registered only when named in ``fake_engines(names=[...])``
OPT_IN_FAKE_ENGINES: tuple[str, ...] = (
    FAKE_ENGINE_HANGS,
    FAKE_ENGINE_OOM,
    FAKE_ENGINE_CRASHES,
    FAKE_ENGINE_CLOBBERS,
)

ESTIMATED_WORKSPACE_BYTES = 1024
GROWN_WORKSPACE_BYTES = 8192

VARIANT_KNOB = "fake.variant"
ALGORITHM_KNOB = "fake.algorithm"
HANG_KNOB = "fake.hang_in"
OOM_KNOB = "fake.oom_error"
CRASH_KNOB = "fake.crash_with"
#: how long FAKE_ENGINE_HANGS sleeps (far past any sensible candidate_timeout_s)
HANG_S = 3600.0
#: the pseudo-knob a primed build's timing is looked up with (never a real knob)
PRIMED_KNOB = "fake.primed"


class FakePlan(Plan):
    """A compiled fake plan: real outputs from the reference, scripted time on the fake clock."""

    def __init__(
        self,
        engine: FakeEngine,
        graph: OpGraph,
        knob_settings: Sequence[KnobSetting],
        workspace_size: int,
        resolved: Mapping[str, KnobValue],
    ) -> None:
        super().__init__(engine, knob_settings, workspace_size)
        self.fake_engine = engine
        self.graph = graph
        self.resolved = dict(resolved)
        self.benchmarking = self.resolved.get(BENCHMARKING, 0) == 1
        #: built after a priming run of the same settings (see the module docstring)
        self.primed = not self.benchmarking and engine.primed_with(resolved)

    def execute(
        self,
        variant_pack: Mapping[int, torch.Tensor],
        workspace: torch.Tensor | None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        if stream is None:
            self.fake_engine.run(self, variant_pack, workspace)
            return
        # on the handle's stream, as a real engine runs: computed on the default stream, the
        # outputs raced a reader on the handle's stream (GPU tests, session 38: NaN read back)
        import torch  # (imported where used: the module loads without PyTorch's import time)

        with torch.cuda.stream(stream):
            self.fake_engine.run(self, variant_pack, workspace)


class FakeEngine(Engine):
    """A fake engine; subclasses below override the failure and output hooks."""

    provider = "dnntune.testing"
    devices = ("cpu", "cuda")

    def __init__(
        self,
        name: str,
        knobs: Sequence[Knob],
        clock: FakeClock,
        timings: FakeTimings,
        counters: FakeCounters,
    ) -> None:
        self.name = name
        self._knobs = list(knobs)
        self.clock = clock
        self.timings = timings
        self.counters = counters
        #: the settings (less global.benchmarking) whose priming plans have run
        self.primed: set[tuple[tuple[str, str], ...]] = set()

    @staticmethod
    def _primed_key(resolved: Mapping[str, KnobValue]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, str(v)) for k, v in resolved.items() if k != BENCHMARKING))

    def primed_with(self, resolved: Mapping[str, KnobValue]) -> bool:
        """Whether a priming plan with these settings has run (a later build is primed)."""
        return self._primed_key(resolved) in self.primed

    # ---- Engine contract ------------------------------------------------------------------
    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        return None

    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        return list(self._knobs)

    def estimate_workspace_size(self, graph: OpGraph, knob_settings: Sequence[KnobSetting]) -> int:
        return ESTIMATED_WORKSPACE_BYTES

    def compiled_workspace_size(self, resolved: Mapping[str, KnobValue]) -> int:
        return ESTIMATED_WORKSPACE_BYTES

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        self.validate_knobs(knob_settings, graph)
        resolved = self.resolve_settings(knob_settings, graph)
        self.counters.compiles[self.name] += 1
        self.clock.advance(self.timings.compile_ms.get(self.name, 0.0))
        if resolved.get(BENCHMARKING, 0) == 1:
            self.counters.priming_compiles[self.name] += 1
        self.check_compile(resolved)
        return FakePlan(
            self, graph, knob_settings, self.compiled_workspace_size(resolved), resolved
        )

    # ---- hooks ----------------------------------------------------------------------------
    def check_compile(self, resolved: Mapping[str, KnobValue]) -> None:
        """Raise to make compilation fail."""

    def check_execute(self, plan: FakePlan) -> None:
        """Raise to make execution fail."""

    def output_offset(self) -> float:
        """Added to every output (0.0: correct)."""
        return 0.0

    # ---- execution ------------------------------------------------------------------------
    def run(
        self, plan: FakePlan, pack: Mapping[int, torch.Tensor], workspace: torch.Tensor | None
    ) -> None:
        self.counters.executes[self.name] += 1
        if plan.benchmarking:
            self.counters.priming_executes[self.name] += 1
            self.primed.add(self._primed_key(plan.resolved))
        self.clock.record("execute", self.name)
        if plan.workspace_size > 0:
            have = 0 if workspace is None else workspace.numel() * workspace.element_size()
            if have < plan.workspace_size:
                raise ExecutionError(
                    f"{self.name}: plan needs a {plan.workspace_size}-byte workspace, got {have}"
                )
        self.check_execute(plan)

        outputs = reference.run(plan.graph, pack)
        offset = self.output_offset()
        for uid, value in outputs.items():
            target = pack.get(uid)
            if target is None:
                continue
            target.copy_(value + offset if offset else value)
        knobs = {**plan.resolved, PRIMED_KNOB: 1} if plan.primed else plan.resolved
        self.clock.advance(self.timings.ms_for(self.name, knobs))


class _ClobbersEngine(FakeEngine):
    def run(
        self, plan: FakePlan, pack: Mapping[int, torch.Tensor], workspace: torch.Tensor | None
    ) -> None:
        super().run(plan, pack, workspace)
        first = next((t for t in plan.graph.input_tensors() if t.uid in pack), None)
        if first is not None and first.uid is not None:
            target = pack[first.uid]
            if target.is_floating_point() and target.numel():
                target[(0,) * target.dim()] += 1.0  # writes the caller's buffer


class _FailsEngine(FakeEngine):
    def check_execute(self, plan: FakePlan) -> None:
        raise ExecutionError(f"{self.name}: execute always fails (test engine)")


class _PrimingFailsEngine(FakeEngine):
    #: "execute" (default) or "compile": which step fails when built with benchmarking=1
    fail_stage = "execute"

    def check_compile(self, resolved: Mapping[str, KnobValue]) -> None:
        if self.fail_stage == "compile" and resolved.get(BENCHMARKING, 0) == 1:
            raise NotSupportedError(f"{self.name}: cannot build with global.benchmarking=1")

    def check_execute(self, plan: FakePlan) -> None:
        if self.fail_stage == "execute" and plan.benchmarking:
            raise ExecutionError(f"{self.name}: execute fails with global.benchmarking=1")


class _WorkspaceGrowsEngine(FakeEngine):
    def compiled_workspace_size(self, resolved: Mapping[str, KnobValue]) -> int:
        if resolved.get(BENCHMARKING, 0) == 1:
            return GROWN_WORKSPACE_BYTES
        return ESTIMATED_WORKSPACE_BYTES


class _WrongEngine(FakeEngine):
    def output_offset(self) -> float:
        return 1.0


class _HangsEngine(FakeEngine):
    """Sleeps for HANG_S in compile or execute, or until ``release`` is set (block exit)."""

    def __init__(self, *args: Any, release: threading.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = release

    def _hang(self, where: str) -> None:
        self.clock.record("hang", self.name)
        self.release.wait(HANG_S)
        raise ExecutionError(f"{self.name}: released after hanging in {where} (test engine)")

    def check_compile(self, resolved: Mapping[str, KnobValue]) -> None:
        if resolved.get(HANG_KNOB) == "compile":
            self._hang("compile")

    def check_execute(self, plan: FakePlan) -> None:
        if plan.resolved.get(HANG_KNOB, "execute") == "execute":
            self._hang("execute")


class _OomEngine(FakeEngine):
    def check_execute(self, plan: FakePlan) -> None:
        import torch

        if plan.resolved.get(OOM_KNOB) == "runtime":
            raise RuntimeError(f"CUDA out of memory ({self.name}, test engine)")
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 64.00 GiB ({self.name}, test engine)"
        )


class _CrashesEngine(FakeEngine):
    def check_execute(self, plan: FakePlan) -> None:
        if multiprocessing.parent_process() is None:
            # a crash here would take the test run (or the user's program) with it
            raise ExecutionError(
                f"{self.name} crashes only inside an isolate worker process "
                "(AutotuneConfig(isolate=True)); in this process it refuses"
            )
        if plan.resolved.get(CRASH_KNOB) == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        os.abort()


def _choice_knob(knob_id: str, description: str, values: Sequence[str]) -> Knob:
    return Knob(
        knob_id,
        description,
        KnobValueType.STRING,
        values[0],
        StringConstraint(frozenset(values)),
    )


def _variant_knob() -> Knob:
    return Knob(VARIANT_KNOB, "fake kernel variant", KnobValueType.INT64, 0, IntConstraint(0, 3))


def _algorithm_knob() -> Knob:
    return Knob(
        ALGORITHM_KNOB,
        "fake algorithm",
        KnobValueType.STRING,
        "direct",
        StringConstraint(frozenset({"direct", "winograd", "fft"})),
    )


def make_fake_engines(
    clock: FakeClock,
    timings: FakeTimings,
    counters: FakeCounters,
    release: threading.Event | None = None,
) -> dict[str, FakeEngine]:
    """Fresh instances of every fake engine (opt-in ones included), sharing one clock, timing
    script and counters; setting ``release`` ends FAKE_ENGINE_HANGS's sleeps."""
    shared: dict[str, Any] = {"clock": clock, "timings": timings, "counters": counters}
    hang = _choice_knob(HANG_KNOB, "where the fake hangs", ("execute", "compile"))
    oom = _choice_knob(OOM_KNOB, "which out-of-memory error", ("torch", "runtime"))
    crash = _choice_knob(CRASH_KNOB, "how the fake crashes", ("abort", "segv"))
    engines: list[FakeEngine] = [
        FakeEngine(FAKE_ENGINE_A, [benchmarking_knob(), _variant_knob()], **shared),
        FakeEngine(FAKE_ENGINE_B, [_algorithm_knob()], **shared),
        FakeEngine(FAKE_ENGINE_C, [], **shared),
        _FailsEngine(FAKE_ENGINE_FAILS, [], **shared),
        _PrimingFailsEngine(FAKE_ENGINE_PRIMING_FAILS, [benchmarking_knob()], **shared),
        _WorkspaceGrowsEngine(FAKE_ENGINE_WORKSPACE_GROWS, [benchmarking_knob()], **shared),
        _WrongEngine(FAKE_ENGINE_WRONG, [], **shared),
        _HangsEngine(FAKE_ENGINE_HANGS, [hang], release=release or threading.Event(), **shared),
        _OomEngine(FAKE_ENGINE_OOM, [oom], **shared),
        _CrashesEngine(FAKE_ENGINE_CRASHES, [crash], **shared),
        _ClobbersEngine(FAKE_ENGINE_CLOBBERS, [], **shared),
    ]
    return {e.name: e for e in engines}
