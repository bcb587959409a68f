"""TORCH_COMPILE_ENGINE: the TORCH_ENGINE interpreter under ``torch.compile`` (Inductor fusion).

The lowered program is compiled with ``fullgraph=True, dynamic=False`` when the plan is built,
by running it once on dummy tensors of the graph's dims, strides and types: a graph the compiler
cannot handle fails the build with NotSupportedError carrying the compiler's message, and
``execute`` never waits for a lazy compile. Each plan gets its own code object, so plans never
share (or evict) each other's compiled-code cache entries.

Knobs:

* ``torch_compile.mode`` (``default`` | ``reduce-overhead`` | ``max-autotune-no-cudagraphs``).
  ``max-autotune-no-cudagraphs`` is Inductor's own search, a ``search_values`` entry: variant
  enumeration leaves it to EXHAUSTIVE mode's priming, which compiles the same mode.
* ``global.benchmarking`` (0 | 1): compile with max-autotune, Inductor's own kernel search (the
  EXHAUSTIVE-mode priming): ``max-autotune`` with ``reduce-overhead``, else
  ``max-autotune-no-cudagraphs``.

Applicability: on the CPU, Inductor needs a C++ compiler; on CUDA, it needs Triton. Without them
the engine is not applicable and says why. Whether torch.compile works on this interpreter is
read from torch 2.13's rule (:func:`_surely_supported`) where it applies, so that the screen of
every graph does not import ``torch._dynamo`` (1.5-2 s); the first compile imports it.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import logging
import os
import re
import shutil
import sys
import sysconfig
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dnntune.backend.engine import Engine, Plan
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import (
    BENCHMARKING,
    Knob,
    KnobSetting,
    KnobValueType,
    StringConstraint,
    benchmarking_knob,
)
from dnntune.backend.timer import CpuTimer
from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.providers._torch import LoweringOptions, Program, dummy_args, lower
from dnntune.providers._torch.call_floor import dynamo_floor_ms
from dnntune.providers._torch.first_call import like_first_call
from dnntune.providers._torch.flags import tf32_flags, with_flags
from dnntune.providers._torch.plan import ProgramPlan
from dnntune.providers._torch.support import check_graph, has_fp32_dot, trial_run
from dnntune.providers.engine_output import captured_engine_output

__all__ = ["TorchCompileEngine", "engines"]

_log = logging.getLogger(__name__)

NAME = "TORCH_COMPILE_ENGINE"
MODE = "torch_compile.mode"
_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
#: torch.compile modes that run the compiled code through CUDA graphs
_CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})

_MODE_KNOB = Knob(
    MODE,
    "torch.compile mode",
    KnobValueType.STRING,
    "default",
    StringConstraint(frozenset(_MODES)),
    # Inductor's own kernel search, the same compile as ``global.benchmarking=1`` (EXHAUSTIVE
    # priming): 10-45 s per graph on the H200, so no STANDARD sweep enumerates it
    search_values=frozenset({"max-autotune-no-cudagraphs"}),
    # Inductor's kernels of the default mode, replayed through a CUDA graph: what it saves is
    # host time (17 of 17 oracle rows on the H200 kept the default on the device clock)
    same_kernel_values=frozenset({"reduce-overhead"}),
)
_plan_numbers = itertools.count()


@functools.cache
def _cpp_compiler() -> str | None:
    """The C++ compiler Inductor would use on the CPU, or None."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


@functools.cache
def _dynamo_problem() -> str | None:
    """Why torch.compile cannot run here, or None; imports ``torch._dynamo`` (1.5-2 s)."""
    try:
        import torch._dynamo
    except Exception as exc:  # pragma: no cover - depends on the torch build
        return f"torch._dynamo cannot be imported: {exc}"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    return None


#: the torch release whose ``is_dynamo_supported`` is known to test the interpreter alone
#: (torch 2.13: Python before 3.15; 3.13.3 or later where the GIL is disabled)
_RULE_KNOWN_FOR = (2, 13)


def _torch_release() -> tuple[int, int] | None:
    """(major, minor) of the torch imported, or None for a version string without them."""
    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(found[1]), int(found[2])) if found else None


@functools.cache
def _surely_supported() -> bool:
    """True where torch.compile is supported by what ``is_dynamo_supported`` tests on this
    torch, asked without importing ``torch._dynamo``: the applicability screen asks for every
    graph, and the import cost 1.5-2 s of every CPU ``dnntune run`` whose plans never compile
    (TORCH_ENGINE's). False means ask torch._dynamo itself (another torch, or an interpreter
    it refuses: its own reason is then given)."""
    return (
        _torch_release() == _RULE_KNOWN_FOR
        and sys.version_info < (3, 15)
        and sysconfig.get_config_var("Py_GIL_DISABLED") != 1
        and importlib.util.find_spec("torch._dynamo") is not None
    )


def torch_compile_mode(mode: str, benchmarking: bool) -> str:
    """The ``torch.compile`` mode for a knob value; benchmarking turns on max-autotune."""
    if not benchmarking:
        return mode
    return "max-autotune" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"


def _has_cast(graph: OpGraph) -> bool:
    """True when a node writes a 16- or 8-bit floating tensor whose type is not the one the
    graph's types give it (a cast, as ``dnntune.reference`` reads it)."""
    for node in graph.nodes:
        for t in node.outputs.values():
            kind = t.data_type if t is not None else None
            if (
                t is not None
                and kind is not None
                and kind.is_floating
                and kind.itemsize < 4
                and kind != graph.default_data_type(t)
            ):
                return True
    return False


def _entry_function(program: Program) -> Callable[..., Any]:
    """``program.run`` behind a function with a code object of its own.

    Dynamo keeps compiled code per code object, with a small limit of entries each; a fresh
    code object per plan keeps plans from evicting each other.
    """
    run = program.run

    def entry(*args: torch.Tensor) -> Any:
        return run(args)

    name = f"dnntune_plan_{next(_plan_numbers)}"
    code = entry.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, entry.__globals__, name, None, entry.__closure__)


class TorchCompileEngine(Engine):
    """The interpreter of TORCH_ENGINE compiled by ``torch.compile``."""

    name = NAME
    compile_cost = 50.0  # an Inductor compile, relative to the others (search order)
    #: the first Inductor compile in a process: 3.8-8.0 s for one norm or convolution in
    #: ``optimize``'s tunes (H100, session 44, fresh caches), 1.7 s for the next
    first_compile_s = 6.0
    provider = "torch_compile"
    devices = ("cpu", "cuda")

    def check_available(self) -> None:
        problem = None if _surely_supported() else _dynamo_problem()
        if problem:
            raise NotSupportedError(f"{self.name}: {problem}")

    def has_call_floor(self, handle: Handle) -> bool:
        """On the CPU, where every ranking clock is the wall clock around the call. Not on
        CUDA (the device clock overlaps the host's part; not measured there), nor where the
        handle's timer is not the wall clock (a test's fake timer)."""
        return handle.device.type == "cpu" and isinstance(handle.timer, CpuTimer)

    def call_floor_ms(self, handle: Handle) -> float | None:
        """What Dynamo alone adds to any compiled call (:func:`dynamo_floor_ms`), measured once
        per process, where :meth:`has_call_floor`."""
        return dynamo_floor_ms("cpu") if self.has_call_floor(handle) else None

    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        check_graph(self.name, graph, handle.device)
        if handle.device.type == "cpu" and _cpp_compiler() is None:
            raise NotSupportedError(
                f"{self.name}: torch.compile on the CPU needs a C++ compiler (g++ or clang++) "
                "on PATH, or CXX set; none was found"
            )
        if handle.device.type == "cuda" and importlib.util.find_spec("triton") is None:
            raise NotSupportedError(
                f"{self.name}: torch.compile on CUDA needs Triton; install it (pip install triton)"
            )
        lower(graph, torch.device("meta"), LoweringOptions(out_variants=False, traceable=True))

    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        return [_MODE_KNOB, benchmarking_knob()]

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        self.validate_knobs(knob_settings, graph)
        # torch._dynamo itself, imported here where it is needed: a torch build whose
        # torch._dynamo cannot be imported fails here with its reason
        problem = _dynamo_problem()
        if problem:
            raise NotSupportedError(f"{self.name}: {problem}")
        self.check_support(graph, handle)
        values = self.resolve_settings(knob_settings, graph)
        device = handle.device
        mode = torch_compile_mode(str(values[MODE]), bool(values[BENCHMARKING]))
        # CUDA-graph modes skip graphs that write their inputs: return outputs and copy them
        return_outputs = device.type == "cuda" and mode in _CUDAGRAPH_MODES
        options = LoweringOptions(out_variants=False, return_outputs=return_outputs, traceable=True)
        program = lower(graph, device, options)
        from torch._inductor import list_mode_options

        # the mode's own options (torch.compile takes a mode or options, not both), plus
        # eager's rounding where the graph casts: Inductor keeps a fused chain in float32 and
        # dropped a cast (an identity node's bfloat16 output), where TORCH_ENGINE and cuDNN
        # round
        inductor = dict(list_mode_options(mode, False))
        if _has_cast(graph):
            inductor["emulate_precision_casts"] = True
        compiled = torch.compile(
            _entry_function(program),
            options=inductor or None,
            fullgraph=True,
            dynamic=False,
        )

        def call(args: Sequence[torch.Tensor]) -> Any:
            return compiled(*args)

        run: Callable[[Sequence[torch.Tensor]], Any] = call
        if device.type == "cuda" and has_fp32_dot(graph):
            # float32 means float32: TF32 stays off while compiling (Inductor bakes the flag
            # into its kernels) and while running, as on TORCH_ENGINE by default
            run = with_flags(run, tf32_flags(False))
        # requires_grad as on the first real call: a guard on it compiled the plan again there
        args = like_first_call(program.arg_uids, dummy_args(graph, program.arg_uids, device))
        start = time.perf_counter()
        # CUDA-graph trees warm up, then record, then replay: get past all three now. What
        # Inductor prints meanwhile (max-autotune's tables, its warnings) is logged at DEBUG.
        with captured_engine_output(self.name):
            for _ in range(3 if return_outputs else 1):
                trial_run(self.name, graph, run, args)
        compile_s = time.perf_counter() - start
        _log.debug(
            "%s: compiled graph %r (mode %s) in %.2f s", self.name, graph.name, mode, compile_s
        )
        metadata = {
            "torch_compile_mode": mode,
            "compile_s": compile_s,
            "ops": [k.value for k in program.kinds],
        }
        return ProgramPlan(
            self, knob_settings, program.arg_uids, run, program.result_uids, metadata=metadata
        )


def engines() -> list[Engine]:
    """The engines of the ``torch_compile`` provider (loaded lazily by the registry)."""
    return [TorchCompileEngine()]
