"""measure.interleaved_rounds: ``keep`` may reorder the live candidates (autotune's re-check puts
the race's leader first), and the rotation follows that order."""

from __future__ import annotations

from collections.abc import Callable

from dnntune.measure import Rounds, interleaved_rounds


def _logging(log: list[str], name: str) -> Callable[[], float]:
    def sample() -> float:
        log.append(name)
        return 1.0

    return sample


def test_keep_order_is_the_next_rounds_order_and_rotation_follows_it() -> None:
    log: list[str] = []

    def leader_first(r: Rounds[str]) -> list[str]:
        return ["c", *[k for k in r.live if k != "c"]] if r.rounds >= 1 else r.live

    interleaved_rounds({k: _logging(log, k) for k in "abc"}, 3, rotate=True, keep=leader_first)
    # round 1: a b c; then the order is c a b, rotated by one (a b c), then by two (b c a)
    assert log == [*"abc", *"abc", *"bca"]


def test_keep_ignores_keys_not_live_and_duplicates() -> None:
    log: list[str] = []
    r = interleaved_rounds(
        {k: _logging(log, k) for k in "ab"}, 2, keep=lambda r: ["b", "zz", "b", "a"]
    )
    assert r.live == ["b", "a"] and log == ["a", "b", "b", "a"]
