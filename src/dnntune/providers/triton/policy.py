"""The ``triton.tuning_policy`` knob (seed 001): which tuning policy a build runs under.

MIOpen's tuning policies, carried as a provider knob. Pure Python, so the whole decision table
is testable without a GPU:

==  ================  ========================================================================
0   FOLLOW            follow ``global.benchmarking`` (``DNNTUNE_FORCE_BENCHMARKING`` wins over
                      it): 1 searches when the perf db has no record and writes the result;
                      0 uses the record if present, else the default config
1   NONE              use the record if present, else the default config; never search
2   DB_UPDATE         if benchmarking is asked for, search even over a record and overwrite it;
                      otherwise as NONE
3   SEARCH            search when there is no record (benchmarking asked for or not), write it
4   SEARCH_DB_UPDATE  search on every build and overwrite the record
5   DB_CLEAN          delete this problem's records and use the default config; never search
==  ================  ========================================================================

Precedence: an explicit policy (1-5) > ``DNNTUNE_FORCE_BENCHMARKING`` > ``global.benchmarking``.
The environment variable and the benchmarking knob only say whether benchmarking is *asked
for*; only policies 0 and 2 consult that.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType

__all__ = [
    "TUNING_POLICY",
    "Decision",
    "TuningPolicy",
    "benchmarking_requested",
    "decide",
    "may_search",
    "read_only",
    "resolve",
    "tuning_policy_knob",
]

TUNING_POLICY = "triton.tuning_policy"


class TuningPolicy(enum.IntEnum):
    """Values of ``triton.tuning_policy``; 1-5 equal MIOpen's ``miopenTuningPolicy_t``."""

    FOLLOW = 0
    NONE = 1
    DB_UPDATE = 2
    SEARCH = 3
    SEARCH_DB_UPDATE = 4
    DB_CLEAN = 5


def tuning_policy_knob(force_benchmarking: bool | None = None) -> Knob:
    """The knob as advertised on every Triton kernel that has a solver space.

    Its value sets, read off the decision table for an unprimed build (``global.benchmarking``
    0; ``force_benchmarking``: ``DNNTUNE_FORCE_BENCHMARKING``): ``search_values``, the
    policies that may run the solver search (3, 4); ``persistent_values``, those that may
    write or delete perf-db records (3, 4, 5); ``default_plan_values``, those that decide as
    the default (0) does, without searching or touching the db (1, 2; none when
    benchmarking is forced, since the default then searches). Variant sweeps leave all three
    out (:func:`dnntune.autotune.variants.knob_variants`)."""
    policies = [int(p) for p in TuningPolicy]
    default = int(TuningPolicy.FOLLOW)
    searching = {p for p in policies if may_search(p, 0, force_benchmarking)}
    persistent = {
        p
        for p in policies
        if any(decide(p, present, 0, force_benchmarking).touches_db for present in (False, True))
    }
    same = {
        p
        for p in policies
        if p != default
        and read_only(p, 0, force_benchmarking)
        and read_only(default, 0, force_benchmarking)
        and all(
            decide(p, present, 0, force_benchmarking)
            == decide(default, present, 0, force_benchmarking)
            for present in (False, True)
        )
    }
    return Knob(
        TUNING_POLICY,
        "perf-db tuning policy: 0 follow global.benchmarking, 1 NONE (record or default, never "
        "search), 2 DB_UPDATE (search if benchmarking is asked for, overwrite), 3 SEARCH "
        "(search if no record), 4 SEARCH_DB_UPDATE (search every build, overwrite), "
        "5 DB_CLEAN (delete this problem's records, never search)",
        KnobValueType.INT64,
        default,
        IntConstraint(0, 5),
        search_values=frozenset(searching - {default}),
        persistent_values=frozenset(persistent - {default}),
        default_plan_values=frozenset(same),
    )


@dataclass(frozen=True)
class Decision:
    """What one build does with the solver space and the perf db."""

    search: bool
    use_record: bool
    write_record: bool
    delete_records: bool

    @property
    def touches_db(self) -> bool:
        """True when the build writes or deletes perf-db records."""
        return self.write_record or self.delete_records


def benchmarking_requested(benchmarking: int | bool, force_benchmarking: bool | None) -> bool:
    """``DNNTUNE_FORCE_BENCHMARKING`` (True/False) wins over the ``global.benchmarking`` knob."""
    if force_benchmarking is not None:
        return force_benchmarking
    return bool(benchmarking)


def resolve(policy: int, benchmarking: int | bool, force_benchmarking: bool | None) -> TuningPolicy:
    """The effective policy of a build: an explicit 1-5 as given; 0 becomes SEARCH or NONE.

    ``FOLLOW`` with benchmarking asked for behaves as MIOpen's default policy with an
    exhaustive search requested: search only when no record exists, and store the result.
    """
    chosen = TuningPolicy(int(policy))
    if chosen is not TuningPolicy.FOLLOW:
        return chosen
    if benchmarking_requested(benchmarking, force_benchmarking):
        return TuningPolicy.SEARCH
    return TuningPolicy.NONE


def decide(
    policy: int,
    record_present: bool,
    benchmarking: int | bool,
    force_benchmarking: bool | None = None,
) -> Decision:
    """The decision table: (search?, use the record?, write the record?, delete records?)."""
    effective = resolve(policy, benchmarking, force_benchmarking)
    asked = benchmarking_requested(benchmarking, force_benchmarking)
    if effective is TuningPolicy.DB_CLEAN:
        return Decision(search=False, use_record=False, write_record=False, delete_records=True)
    if effective is TuningPolicy.SEARCH_DB_UPDATE or (
        effective is TuningPolicy.DB_UPDATE and asked
    ):
        return Decision(search=True, use_record=False, write_record=True, delete_records=False)
    if effective is TuningPolicy.SEARCH and not record_present:
        return Decision(search=True, use_record=False, write_record=True, delete_records=False)
    # NONE, DB_UPDATE without benchmarking, SEARCH with a record: read-only.
    return Decision(
        search=False, use_record=record_present, write_record=False, delete_records=False
    )


def read_only(policy: int, benchmarking: int | bool, force_benchmarking: bool | None) -> bool:
    """True when a build neither searches nor writes nor cleans the perf db, whatever records
    it finds (it reads a record or takes the default)."""
    return not any(
        decide(policy, present, benchmarking, force_benchmarking).touches_db
        or decide(policy, present, benchmarking, force_benchmarking).search
        for present in (False, True)
    )


def may_search(policy: int, benchmarking: int | bool, force_benchmarking: bool | None) -> bool:
    """True when some perf-db state would make this build search (workspace sizing)."""
    return any(
        decide(policy, present, benchmarking, force_benchmarking).search
        for present in (False, True)
    )
