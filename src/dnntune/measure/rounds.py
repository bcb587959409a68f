"""Interleaved rounds: every candidate sampled once per round, round after round.

Timing candidates one after another lets a drift between them (clocks ramping, thermals,
other load) pass for a speed difference. Sampling them round-robin (A B C, A B C, ...) spreads
that drift over all of them alike, so their samples can be compared round by round.

:func:`interleaved_rounds` knows nothing of plans or clocks: a candidate is a key and a
zero-argument sampler returning milliseconds. After each round the caller may drop or reorder
candidates (``keep``: a cut-off of clearly slower ones, a race decided beyond noise with the
leader first) or end the rounds (``done``: every candidate stable).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Rounds", "interleaved_rounds"]

K = TypeVar("K", bound=Hashable)


@dataclass
class Rounds(Generic[K]):
    """The samples of interleaved rounds, per candidate key, in the order taken."""

    samples_ms: dict[K, list[float]]
    #: the candidates still sampled, in sampling order
    live: list[K]
    #: candidates whose sampler raised (with ``catch=True``); they left the rounds
    errors: dict[K, Exception] = field(default_factory=dict)
    #: rounds completed
    rounds: int = 0


def interleaved_rounds(
    samplers: Mapping[K, Callable[[], float]],
    max_rounds: int,
    *,
    rotate: bool = False,
    catch: bool = False,
    keep: Callable[[Rounds[K]], Iterable[K]] | None = None,
    done: Callable[[Rounds[K]], bool] | None = None,
) -> Rounds[K]:
    """Sample every live candidate once per round, for at most ``max_rounds`` rounds.

    Args:
        samplers: candidate key -> a call that takes one sample (ms); the mapping's order is
            the sampling order.
        max_rounds: the most rounds.
        rotate: start each round one candidate later (A B C, B C A, ...), so no candidate is
            always sampled right after the same other one.
        catch: a sampler that raises leaves the rounds (its exception in ``errors``, its
            samples kept) while the others go on; without it the exception propagates.
        keep: after each round, the live candidates to keep sampling, in the order they are
            sampled from the next round on (a key not live is ignored).
        done: after each round (and ``keep``), True ends the rounds.

    Returns:
        The samples per candidate (every key of ``samplers``), what is live, what failed and
        how many rounds ran. The rounds also end when no candidate is live.
    """
    out: Rounds[K] = Rounds({key: [] for key in samplers}, list(samplers))
    while out.rounds < max_rounds and out.live:
        shift = out.rounds % len(out.live) if rotate else 0
        for key in out.live[shift:] + out.live[:shift]:
            try:
                out.samples_ms[key].append(samplers[key]())
            except Exception as exc:
                if not catch:
                    raise
                out.errors[key] = exc
        out.live = [key for key in out.live if key not in out.errors]
        out.rounds += 1
        if keep is not None and out.live:
            live = set(out.live)
            out.live = [key for key in dict.fromkeys(keep(out)) if key in live]
        if done is not None and done(out):
            break
    return out
