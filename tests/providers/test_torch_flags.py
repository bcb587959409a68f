"""Process-wide torch flags a plan sets around its run: the caller's values always come back,
from any number of threads, with ``warn_only`` too (an audit's findings)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import dnntune as dt
from dnntune import testing
from dnntune.providers._torch.flags import Flag, deterministic_flags, with_flags


@pytest.fixture(autouse=True)
def _deterministic_mode_restored() -> Iterator[None]:
    """Whatever a test does, the next one starts with torch's own defaults."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _switch(owner: SimpleNamespace) -> Flag:
    return Flag("test.switch", lambda: owner.on, lambda v: setattr(owner, "on", v), True)


def test_two_threads_cannot_leave_a_plan_s_flag_behind() -> None:
    """Without a lock, B saved A's value as the caller's and put it back after A restored: the
    switch stayed on. The runs are ordered by events so that this interleaving is forced when
    nothing prevents it; with the lock, B's run starts only after A restored."""
    owner = SimpleNamespace(on=False)
    a_running, b_running, a_done = threading.Event(), threading.Event(), threading.Event()

    def run_a(args: Sequence[torch.Tensor]) -> None:
        a_running.set()
        b_running.wait(timeout=0.5)  # without the lock B is running now; with it, never

    def run_b(args: Sequence[torch.Tensor]) -> None:
        b_running.set()
        a_done.wait(timeout=5)

    plan_a, plan_b = with_flags(run_a, [_switch(owner)]), with_flags(run_b, [_switch(owner)])

    def thread_a() -> None:
        plan_a([])
        a_done.set()

    a = threading.Thread(target=thread_a)
    a.start()
    assert a_running.wait(timeout=5) and owner.on  # A has set the switch and is running
    b = threading.Thread(target=plan_b, args=([],))
    b.start()
    a.join(10)
    b.join(10)
    assert owner.on is False


def test_threads_executing_a_deterministic_plan_restore_the_caller_s_mode() -> None:
    """The audit's case: 4 threads x 300 executes of a ``global.deterministic`` plan left
    ``are_deterministic_algorithms_enabled()`` True (2 runs of 3)."""
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    g.create_execution_plan_ext("TORCH_ENGINE", {"global.deterministic": 1})
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    pack = testing.make_pack(g)
    assert not torch.are_deterministic_algorithms_enabled()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(300):
                g.execute(handle, dict(pack))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert torch.are_deterministic_algorithms_enabled() is False


def test_a_plan_with_flags_may_run_one_with_flags() -> None:
    """The lock is re-entrant: a plan whose run runs another plan with flags does not hang."""
    owner = SimpleNamespace(on=False)
    inner = with_flags(lambda args: owner.on, [_switch(owner)])
    outer = with_flags(lambda args: inner(args), [_switch(owner)])
    assert outer([]) is True
    assert owner.on is False


def test_a_plan_without_flags_is_its_run_function() -> None:
    def run(args: Sequence[torch.Tensor]) -> Any:
        return None

    assert with_flags(run, []) is run


def test_the_callers_warn_only_comes_back() -> None:
    """The getter read only ``are_deterministic_algorithms_enabled()`` and the restore called
    ``use_deterministic_algorithms(v)``: a caller's warn_only=True came back False."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    seen: list[tuple[bool, bool]] = []

    def run(args: Sequence[torch.Tensor]) -> None:
        seen.append(
            (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
        )

    with_flags(run, deterministic_flags())([])
    assert seen == [(True, False)]  # the plan's own setting: errors, not warnings
    assert torch.are_deterministic_algorithms_enabled() is True
    assert torch.is_deterministic_algorithms_warn_only_enabled() is True


def test_a_deterministic_plan_keeps_the_callers_warn_only() -> None:
    handle = dt.create_handle("cpu")
    g = testing.small_pointwise_graph()
    g.build_operation_graph(handle)
    g.create_execution_plan_ext("TORCH_ENGINE", {"global.deterministic": 1})
    g.check_support()
    g.build_plans(dt.BuildPlanPolicy.ALL)
    torch.use_deterministic_algorithms(True, warn_only=True)
    g.execute(handle, testing.make_pack(g))
    assert torch.are_deterministic_algorithms_enabled() is True
    assert torch.is_deterministic_algorithms_warn_only_enabled() is True


def test_flags_come_back_when_the_run_raises() -> None:
    owner = SimpleNamespace(on=False)

    def run(args: Sequence[torch.Tensor]) -> None:
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        with_flags(run, [_switch(owner)])([])
    assert owner.on is False
