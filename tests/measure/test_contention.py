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


def test_back_to_back_samples_read_the_meter_when_the_share_is_asked() -> None:
    """A confirmation times sample after sample: an open span (begin) reads the meter when it
    opens and when the totals are asked, not around each sample (a read of every thread's
    schedstat costs about 0.15 ms with 17 threads, more than a short sample)."""
    now, waited, reads = [0.0], [0.0], [0]

    def meter() -> float:
        reads[0] += 1
        return waited[0]

    def clock() -> float:
        return now[0]

    tally = contention.TimingWait()
    share = contention.wait_share(tally.wait_s, tally.wall_s)
    for _ in range(100):  # samples of 10 ms, each waiting 2.5 ms, back to back
        tally.begin(meter, clock)
        now[0] += 0.01
        waited[0] += 0.0025
    assert reads[0] == 1
    assert share() == pytest.approx(0.25) and reads[0] == 2
    # a compile after the samples (closed first) is left out, and a span reads afresh
    tally.close()
    now[0] += 5.0
    waited[0] += 4.0  # the compile's threads waited; not the timing's
    with tally.span(meter, clock):
        now[0] += 1.0
    assert tally.wait_s() == pytest.approx(0.25) and tally.wall_s() == pytest.approx(2.0)
    # a span closes an open one first: what came between is the open span's
    tally.begin(meter, clock)
    now[0] += 1.0
    waited[0] += 0.5
    with tally.span(meter, clock):
        now[0] += 1.0
    assert tally.wait_s() == pytest.approx(0.75) and tally.wall_s() == pytest.approx(4.0)


def test_an_unmeasured_reading_adds_nothing() -> None:
    now, values = [0.0], iter([None, 1.0, 1.5])
    tally = contention.TimingWait()
    tally.begin(lambda: next(values), lambda: now[0])
    now[0] += 1.0
    assert tally.wait_s() == 0.0 and tally.wall_s() == 0.0  # started unmeasured
    now[0] += 1.0
    assert tally.wait_s() == pytest.approx(0.5) and tally.wall_s() == pytest.approx(1.0)
