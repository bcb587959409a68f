"""measure.contention: the run-queue wait of a process's threads, read from a fake /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnntune.measure import contention


def _thread(root: Path, pid: int, tid: int, wait_ns: int) -> None:
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "schedstat").write_text(f"123456 {wait_ns} 7\n")


def _end(root: Path, pid: int, tid: int) -> None:
    task = root / str(pid) / "task" / str(tid)
    (task / "schedstat").unlink()
    task.rmdir()


@pytest.fixture
def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(contention, "_PROC", tmp_path)
    monkeypatch.setattr(contention, "_seen", {})
    return tmp_path


def test_sums_the_threads(proc: Path) -> None:
    _thread(proc, 7, 7, 1_000_000_000)
    _thread(proc, 7, 8, 500_000_000)
    assert contention.run_queue_wait_s(7) == pytest.approx(1.5)
    assert contention.run_queue_wait_s(8) is None  # no such process


def test_a_thread_that_ends_keeps_its_wait_counted(proc: Path) -> None:
    # a helper thread that had waited 2 s in its life ended during a comparison: its wait was
    # subtracted from the process's total, so a busy spell read as a share of 0 (clamped)
    _thread(proc, 7, 7, 1_000_000_000)
    _thread(proc, 7, 9, 2_000_000_000)
    now = [0.0]
    share = contention.wait_share(lambda: contention.run_queue_wait_s(7), lambda: now[0])
    _end(proc, 7, 9)
    _thread(proc, 7, 7, 1_500_000_000)  # the timing thread waited 0.5 s of 1 s
    now[0] = 1.0
    assert share() == pytest.approx(0.5)
    assert contention.run_queue_wait_s(7) == pytest.approx(3.5)  # never goes back


def test_a_reused_thread_id_does_not_lower_the_total(proc: Path) -> None:
    _thread(proc, 7, 9, 2_000_000_000)
    assert contention.run_queue_wait_s(7) == pytest.approx(2.0)
    _thread(proc, 7, 9, 100_000_000)  # a new thread under the old id
    assert contention.run_queue_wait_s(7) == pytest.approx(2.1)


def test_unreadable_fields_are_unmeasured(proc: Path) -> None:
    task = proc / "7" / "task" / "7"
    task.mkdir(parents=True)
    (task / "schedstat").write_text("garbage\n")
    assert contention.run_queue_wait_s(7) is None


def test_back_to_back_spans_read_the_meter_once_each() -> None:
    """A confirmation times sample after sample, each in a span: a span that starts where the
    last one ended takes that end's reading (a read of every thread's schedstat costs about
    0.15 ms with 17 threads), and the sums are what separate reads would give."""
    now, waited, reads = [0.0], [0.0], [0]

    def meter() -> float:
        reads[0] += 1
        return waited[0]

    tally = contention.TimingWait()
    for _ in range(3):  # three samples of 1 s, each waiting 0.25 s, back to back
        with tally.span(meter, lambda: now[0]):
            now[0] += 1.0
            waited[0] += 0.25
    assert reads[0] == 4  # 1 + one per span (separate spans: 6)
    assert tally.wait_s() == pytest.approx(0.75) and tally.wall_s() == pytest.approx(3.0)
    # a compile between two spans (longer than JOIN_S) is left out: the next span reads afresh
    now[0] += 5.0
    waited[0] += 4.0  # the compile's threads waited; not the timing's
    with tally.span(meter, lambda: now[0]):
        now[0] += 1.0
    assert reads[0] == 6
    assert tally.wait_s() == pytest.approx(0.75) and tally.wall_s() == pytest.approx(4.0)


def test_an_unmeasured_start_adds_nothing_and_the_next_span_joins_the_measured_end() -> None:
    now, values = [0.0], iter([None, 1.0, 1.5])
    tally = contention.TimingWait()
    with tally.span(lambda: next(values), lambda: now[0]):
        now[0] += 1.0
    with tally.span(lambda: next(values), lambda: now[0]):
        now[0] += 1.0
    assert tally.wait_s() == pytest.approx(0.5) and tally.wall_s() == pytest.approx(1.0)
