"""The autotune runtime (RFC 0013 sections 6.1 to 6.4), one concept per module.

In the order one autotune() call uses them:

- ``types``: the RFC's structs (AutotuneConfig, AutotuneResult, PlanSpec, ...).
- ``plan_specs`` and ``sweep``: engine discovery and the add_engine_*() plan-spec collection.
- ``session``: run_autotune / run_exhaustive_sweep, the upfront checks and the flow.
- ``candidates``: one candidate (and one result) per plan spec or compiled plan, dispositions.
- ``priming``: EXHAUSTIVE mode's temporary global.benchmarking=1 plans.
- ``compilation``: compiling plan specs, the post-compile workspace checks.
- ``verification``: every candidate's output against ``dnntune.reference``.
- ``benchmark``, ``strategies``, ``statistics``: warmup, sync, the timed loop, the numbers.
- ``recheck``: interleaved re-timing of close contenders.
- ``ranking``: default and caller-supplied ranking with its reorder-only contract.

The Graph facade (``dnntune.frontend``) only delegates here.
"""
