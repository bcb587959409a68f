"""dnntune: run operation graphs on the measurably fastest verified engine, and remember it.

Quick start::

    import dnntune as dt
    handle = dt.create_handle()
    g = dt.Graph.load("examples/graphs/resnet50_conv3x3_bias_relu_nchw.json")
    g.build_operation_graph(handle)
    g.add_all_engines()
    results = g.autotune(handle, pack, workspace_size=g.get_estimated_max_workspace_size())

The public API is what this module exports, plus the exports of its documented subpackages
(``dnntune.graph``, ``dnntune.measure``, ``dnntune.autotune``, ``dnntune.workflows``,
``dnntune.bench``, ``dnntune.testing``, ``dnntune.torch``) and the modules ``dnntune.reference``
and ``dnntune.errors``. Anything else imported by its module path (``dnntune.autotune.benchmark``,
``dnntune.backend.plans``) is internal and may change; docs/architecture.md says so.
"""

from __future__ import annotations

import logging as _logging

from dnntune import _startup  # noqa: F401  (first: `python -m dnntune` guards its startup)
from dnntune._version import __version__
from dnntune.backend.engine import Engine, Plan, engine_id, engine_name_or_id
from dnntune.backend.handle import Handle, create_handle
from dnntune.backend.heuristics import HeuristicMode
from dnntune.backend.knobs import (
    FloatConstraint,
    IntConstraint,
    Knob,
    KnobSetting,
    KnobValueType,
    StringConstraint,
)
from dnntune.backend.plan_choice import PlanChoice, choose_plan
from dnntune.backend.plans import BuildPlanPolicy, allocate_workspace
from dnntune.backend.registry import get_registry
from dnntune.backend.variant_pack import normalize_variant_pack
from dnntune.errors import (
    AutotuneError,
    BadStateError,
    ConfigFileError,
    DnnTuneError,
    ExecutionError,
    GraphFormatError,
    InvalidTypeError,
    InvalidValueError,
    NotSupportedError,
    Status,
)
from dnntune.frontend import Graph
from dnntune.graph import (
    ConvMode,
    DataType,
    NormFwdPhase,
    PointwiseMode,
    ReductionMode,
    ResampleMode,
    TensorAttributes,
)
from dnntune.graph.json_unknown import UnknownFieldWarning
from dnntune.overrides import policy as _config_policy
from dnntune.reference import make_inputs
from dnntune.rfc import (
    AutotuneConfig,
    AutotuneRankingFn,
    AutotuneResult,
    AutotuneStorageConfig,
    AutotuneStrategy,
    CacheWriteOutcome,
    EngineConfigInfo,
    EngineSweepSpec,
    EngineVariant,
    KnobSweepAxis,
    PlanSpec,
    PrimingFailurePolicy,
    TuneMode,
)
from dnntune.workflows import (
    GraphRunReport,
    GraphTuneReport,
    TuneOptions,
    run_graph,
    time_interleaved,
    tune_graph,
    tune_graphs,
)

_logging.getLogger(__name__).addHandler(_logging.NullHandler())


# plug the Config heuristic policy (override file, exact cache) into the backend's chain
_config_policy.install()

__all__ = [
    "AutotuneConfig",
    "AutotuneError",
    "AutotuneRankingFn",
    "AutotuneResult",
    "AutotuneStorageConfig",
    "AutotuneStrategy",
    "BadStateError",
    "BuildPlanPolicy",
    "CacheWriteOutcome",
    "ConfigFileError",
    "ConvMode",
    "DataType",
    "DnnTuneError",
    "Engine",
    "EngineConfigInfo",
    "EngineSweepSpec",
    "EngineVariant",
    "ExecutionError",
    "FloatConstraint",
    "Graph",
    "GraphFormatError",
    "GraphRunReport",
    "GraphTuneReport",
    "Handle",
    "HeuristicMode",
    "IntConstraint",
    "InvalidTypeError",
    "InvalidValueError",
    "Knob",
    "KnobSetting",
    "KnobSweepAxis",
    "KnobValueType",
    "NormFwdPhase",
    "NotSupportedError",
    "Plan",
    "PlanChoice",
    "PlanSpec",
    "PointwiseMode",
    "PrimingFailurePolicy",
    "ReductionMode",
    "ResampleMode",
    "Status",
    "StringConstraint",
    "TensorAttributes",
    "TuneMode",
    "UnknownFieldWarning",
    "TuneOptions",
    "__version__",
    "allocate_workspace",
    "choose_plan",
    "create_handle",
    "engine_id",
    "engine_name_or_id",
    "get_registry",
    "make_inputs",
    "normalize_variant_pack",
    "run_graph",
    "time_interleaved",
    "tune_graph",
    "tune_graphs",
]
