"""Test helpers shipped with dnntune: fake engines, a fake clock and timer, small graphs.

Use them to test code built on dnntune without a GPU and without real engines::

    import torch
    import dnntune as dt
    from dnntune import testing

    with testing.fake_engines(timings={testing.FAKE_ENGINE_C: 0.2}) as fakes:
        handle = dt.create_handle("cpu")              # times with the fake clock
        g = testing.small_pointwise_graph()
        g.build_operation_graph(handle)
        g.add_all_engines()
        pack = testing.make_pack(g)
        ws = g.get_estimated_max_workspace_size()       # 1024 bytes for every fake
        workspace = torch.empty(ws, dtype=torch.uint8)
        results = g.autotune(handle, pack, workspace, ws)
        assert results[0].engine_name == testing.FAKE_ENGINE_C

The fake engines compute real outputs (through ``dnntune.reference``), so verification works;
their speed comes from a :class:`FakeTimings` script. They exist only inside the block.

Failure engines for measurement tests (``FAKE_ENGINE_HANGS``, ``FAKE_ENGINE_OOM``,
``FAKE_ENGINE_CRASHES``) are opt-in: name them in ``fake_engines(names=[...])``. For
``AutotuneConfig(isolate=True)``, pass ``**fakes.worker_config()`` so the worker process
registers the same fakes.
"""

from dnntune.testing.context import (
    WORKER_SETUP,
    FakeEngines,
    fake_engines,
    install_fake_engines,
)
from dnntune.testing.engines import (
    ALL_FAKE_ENGINES,
    ESTIMATED_WORKSPACE_BYTES,
    FAKE_ENGINE_A,
    FAKE_ENGINE_B,
    FAKE_ENGINE_C,
    FAKE_ENGINE_CLOBBERS,
    FAKE_ENGINE_CRASHES,
    FAKE_ENGINE_FAILS,
    FAKE_ENGINE_HANGS,
    FAKE_ENGINE_OOM,
    FAKE_ENGINE_PRIMING_FAILS,
    FAKE_ENGINE_WORKSPACE_GROWS,
    FAKE_ENGINE_WRONG,
    GROWN_WORKSPACE_BYTES,
    OPT_IN_FAKE_ENGINES,
    PRIMED_KNOB,
    FakeEngine,
    FakePlan,
)
from dnntune.testing.graphs import (
    make_pack,
    small_conv_graph,
    small_matmul_graph,
    small_pointwise_graph,
)
from dnntune.testing.plans import check_plan
from dnntune.testing.timing import (
    DEFAULT_TIMINGS_MS,
    FakeClock,
    FakeCounters,
    FakeTimer,
    FakeTimings,
)

__all__ = [
    "ALL_FAKE_ENGINES",
    "PRIMED_KNOB",
    "DEFAULT_TIMINGS_MS",
    "ESTIMATED_WORKSPACE_BYTES",
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
    "GROWN_WORKSPACE_BYTES",
    "OPT_IN_FAKE_ENGINES",
    "WORKER_SETUP",
    "FakeClock",
    "FakeCounters",
    "FakeEngine",
    "FakeEngines",
    "FakePlan",
    "FakeTimer",
    "FakeTimings",
    "check_plan",
    "fake_engines",
    "install_fake_engines",
    "make_pack",
    "small_conv_graph",
    "small_matmul_graph",
    "small_pointwise_graph",
]
