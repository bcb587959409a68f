"""TRITON_ENGINE: the Engine and Plan; a build picks a config, then compiles the kernel.

A build (``compile``) runs in this order:

1. match the graph to a kernel (:mod:`.patterns`) and take its solver (:mod:`.solvers`);
2. decide, from ``triton.tuning_policy``, ``DNNTUNE_FORCE_BENCHMARKING`` and
   ``global.benchmarking``, what to do with the perf db (:mod:`.policy`, :mod:`.perf_db`);
3. delete records (DB_CLEAN), search the pruned config list with the handle's timer and store
   the winner, use the record, or use the default config (pins overlaid in every case);
4. compile the chosen config by running it once on scratch buffers (a config that does not
   compile fails the build, not the first ``execute``).

Triton is imported only inside builds; on a machine without it the engine is not applicable
and says "install dnntune[triton]".
"""

from __future__ import annotations

import importlib.util
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dnntune import settings
from dnntune._version import __version__
from dnntune.backend.engine import BoundCall, Engine, Plan, VariantPack
from dnntune.backend.knobs import (
    BENCHMARKING,
    WORKSPACE_SIZE_LIMIT,
    Knob,
    KnobSetting,
    KnobValue,
    benchmarking_knob,
    normalize_settings,
    workspace_limit_knob,
)
from dnntune.errors import DnnTuneError, ExecutionError, InvalidValueError, NotSupportedError
from dnntune.providers.engine_output import captured_engine_output
from dnntune.providers.triton import policy as tuning
from dnntune.providers.triton.launchers import Launcher, build_launcher
from dnntune.providers.triton.patterns import Match, match_graph
from dnntune.providers.triton.perf_db import PerfKey, PerfRecord, default_db
from dnntune.providers.triton.scratch import Scratch as _Scratch
from dnntune.providers.triton.scratch import compile_all
from dnntune.providers.triton.search import run_search
from dnntune.providers.triton.solvers import (
    KNOB_PREFIX,
    Config,
    DeviceLimits,
    Solver,
    all_solver_knobs,
    device_limits,
    solver_for,
)

if TYPE_CHECKING:
    import torch

    from dnntune.backend.handle import Handle
    from dnntune.graph.ir import OpGraph

__all__ = ["TritonEngine", "TritonPlan", "build_launcher"]

_log = logging.getLogger(__name__)

#: threads compiling search candidates ahead of timing
COMPILE_WORKERS = 8


#: (problem key, record key, every knob setting, DNNTUNE_FORCE_BENCHMARKING, perf-db folder)
_MemoKey = tuple[str, str, tuple[KnobSetting, ...], "bool | None", str]


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


class TritonPlan(Plan):
    """A compiled config: ``execute`` is one (or, for split-K, two) kernel launches."""

    #: the launchers pass the pack's tensors to the kernels as pointers (sizes and strides are
    #: compiled in), so a tensor at the same address with the graph's layout will do
    takes_pointers = True

    def __init__(
        self,
        engine: Engine,
        knob_settings: Sequence[KnobSetting],
        launcher: Launcher,
        metadata: Mapping[str, Any],
    ) -> None:
        super().__init__(engine, knob_settings, launcher.workspace_bytes, metadata)
        self._launch = launcher

    def execute(
        self,
        variant_pack: VariantPack,
        workspace: torch.Tensor | None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        if stream is None:
            self._launch(variant_pack, workspace)
            return
        import torch

        with torch.cuda.stream(stream):
            self._launch(variant_pack, workspace)

    def bind(self, uids: Sequence[int]) -> BoundCall:
        """A one-launch kernel's bound call launches it directly (``Launch.bind``: no pack,
        no launcher frames); others, and the first call, take the pack's path."""
        generic = super().bind(uids)
        direct = getattr(self._launch, "bind", None)
        return generic if direct is None else direct(uids, generic)


class TritonEngine(Engine):
    """Hand-written Triton kernels with a solver search and a perf db."""

    name = "TRITON_ENGINE"
    compile_cost = 20.0  # Triton JIT of one or more kernels
    #: a norm's or a GEMM's kernels: 1.0-2.1 s in ``optimize``'s tunes (H100, session 44)
    first_compile_s = 1.5
    provider = "triton"
    devices = ("cuda",)

    def __init__(self) -> None:
        # Read-only decisions (no search, no db write) are remembered per problem and per full
        # knob settings, the policy included: plans of different policies never share one.
        self._memo: dict[_MemoKey, tuple[Config, str]] = {}
        self._memo_lock = threading.Lock()

    # ---- applicability ------------------------------------------------------------------
    def check_available(self) -> None:
        if importlib.util.find_spec("triton") is None:
            raise NotSupportedError("triton is not installed: install dnntune[triton]")

    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        if not handle.is_cuda:
            raise NotSupportedError(
                f"needs CUDA: Triton kernels run on NVIDIA GPUs, the handle is on {handle.device}"
            )
        self.check_available()
        match_graph(graph)

    # ---- knobs --------------------------------------------------------------------------
    @staticmethod
    def _common_knobs() -> list[Knob]:
        return [
            benchmarking_knob(),
            workspace_limit_knob(),
            tuning.tuning_policy_knob(settings.force_benchmarking()),
        ]

    @staticmethod
    def _try_match(graph: OpGraph | None) -> Match | None:
        if graph is None:
            return None
        try:
            return match_graph(graph)
        except (NotSupportedError, InvalidValueError):
            return None

    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        """The matched kernel's solver knobs plus benchmarking, workspace limit and policy;
        without a graph (or for a graph no kernel runs) every solver knob."""
        match = self._try_match(graph)
        if match is None:
            solver_knobs = all_solver_knobs()
        else:
            solver_knobs = solver_for(match).knobs(match, device_limits())
        return [*solver_knobs, *self._common_knobs()]

    @staticmethod
    def _pins(solver: Solver, values: Mapping[str, KnobValue]) -> dict[str, int]:
        return {
            name: int(values[KNOB_PREFIX + name])
            for name in solver.values
            if values.get(KNOB_PREFIX + name)
        }

    def validate_knobs(self, settings: Sequence[KnobSetting], graph: OpGraph | None = None) -> None:
        """Knob ids and ranges, then (for a matched graph) whether the pinned solver knobs can
        fit the device: shared memory, registers, split-K work and the workspace limit."""
        super().validate_knobs(settings, graph)
        match = self._try_match(graph)
        if match is None:
            return
        solver = solver_for(match)
        values = self.resolve_settings(settings, graph)
        pins = self._pins(solver, values)
        if not pins:
            return
        limits = device_limits()
        limit = int(values[WORKSPACE_SIZE_LIMIT])
        if solver.candidates(match, limits, pins, limit):
            return
        config = solver.resolve(solver.default(match, limits), pins)
        violation = solver.check(config, match, limits)
        if violation is not None:
            named = tuple(k for k in violation.knobs if k in pins) or violation.knobs
            violation = type(violation)(named, violation.reason)
            raise InvalidValueError(f"engine {self.name}: knob {violation}")
        need = solver.workspace_bytes(config, match)
        raise InvalidValueError(
            f"engine {self.name}: knob {KNOB_PREFIX}split_k={config['split_k']} needs a "
            f"workspace of {need} bytes, more than {WORKSPACE_SIZE_LIMIT}={limit}"
        )

    def policy_decision(
        self, knob_settings: Sequence[KnobSetting], graph: OpGraph | None, record_present: bool
    ) -> tuning.Decision:
        """What a build with these knobs does with the perf db (reads the environment now)."""
        values = self.resolve_settings(knob_settings, graph)
        return tuning.decide(
            int(values[tuning.TUNING_POLICY]),
            record_present,
            int(values[BENCHMARKING]),
            settings.force_benchmarking(),
        )

    # ---- workspace ----------------------------------------------------------------------
    def estimate_workspace_size(self, graph: OpGraph, knob_settings: Sequence[KnobSetting]) -> int:
        """Bytes the plan may need: the worst case over the search list (a search or a perf-db
        record can pick any of it), or the default config's need under DB_CLEAN."""
        match = self._try_match(graph)
        if match is None:
            return 0
        solver = solver_for(match)
        values = self.resolve_settings(knob_settings, graph)
        pins = self._pins(solver, values)
        limits = device_limits()
        limit = int(values[WORKSPACE_SIZE_LIMIT])
        if int(values[tuning.TUNING_POLICY]) == tuning.TuningPolicy.DB_CLEAN:
            return solver.workspace_bytes(self._default(solver, match, limits, pins, limit), match)
        return solver.max_workspace_bytes(match, limits, pins, limit)

    @staticmethod
    def _default(
        solver: Solver, match: Match, limits: DeviceLimits, pins: Mapping[str, int], limit: int
    ) -> Config:
        """The default config under the pins: the heuristic's, or the first that fits."""
        candidates = solver.candidates(match, limits, pins, limit)
        if candidates:
            return candidates[0]
        return solver.resolve(solver.default(match, limits), pins)

    # ---- building -----------------------------------------------------------------------
    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        self.check_support(graph, handle)
        self.validate_knobs(knob_settings, graph)
        match = match_graph(graph)
        solver = solver_for(match)
        values = self.resolve_settings(knob_settings, graph)
        # what Triton prints while it compiles and searches is logged at DEBUG (-vv)
        with captured_engine_output(self.name):
            config, meta, scratch = self._choose_config(graph, match, solver, values, handle)
            launcher = build_launcher(match, config)
            self._warm(launcher, graph, handle, scratch, solver.workspace_bytes(config, match))
        return TritonPlan(self, knob_settings, launcher, meta)

    def precompile(
        self, graph: OpGraph, knob_sets: Sequence[Sequence[KnobSetting]], handle: Handle
    ) -> None:
        """Compile the kernels of autotune's candidates on a thread pool before their
        ``compile`` calls, which then find them in Triton's cache (one Triton JIT of a
        matmul config takes about half a second; an oracle row had 44 candidates, compiled one
        after another, 22 s on the H200 in session 10). Only candidates whose config is read,
        not searched for, and whose build leaves the perf db alone (a tuning policy that
        searches, writes or cleans is left to its own ``compile``, in its turn)."""
        if len(knob_sets) < 2 or not handle.is_cuda:
            return
        try:
            self.check_support(graph, handle)
            match = match_graph(graph)
            solver = solver_for(match)
            configs: dict[tuple[tuple[str, int], ...], Config] = {}
            with captured_engine_output(self.name):
                force = settings.force_benchmarking()
                for knobs in knob_sets:
                    try:
                        self.validate_knobs(knobs, graph)
                        values = self.resolve_settings(knobs, graph)
                        policy = int(values[tuning.TUNING_POLICY])
                        benchmarking = int(values[BENCHMARKING])
                        if not tuning.read_only(policy, benchmarking, force):
                            continue
                        config = self._choose_config(graph, match, solver, values, handle)[0]
                    except DnnTuneError:  # reported by its own compile
                        continue
                    configs.setdefault(tuple(sorted(config.items())), config)
                if len(configs) < 2:
                    return
                ws = max(solver.workspace_bytes(c, match) for c in configs.values())
                self._precompile(match, list(configs.values()), _Scratch(graph, handle, ws))
        except Exception as exc:  # best effort: each compile() builds what is missing
            _log.info("triton: no compile ahead for %d candidates (%s)", len(knob_sets), exc)

    def _choose_config(
        self,
        graph: OpGraph,
        match: Match,
        solver: Solver,
        values: Mapping[str, KnobValue],
        handle: Handle,
    ) -> tuple[Config, dict[str, Any], _Scratch | None]:
        """Steps 2 and 3 of a build: the policy decision, then delete / search / record /
        default. Returns the config, the plan metadata, and the scratch buffers if searched."""
        pins = self._pins(solver, values)
        limit = int(values[WORKSPACE_SIZE_LIMIT])
        limits = device_limits(handle.device.index)
        key = PerfKey(
            kernel=match.kernel,
            problem=match.signature(),
            device=handle.device_signature(),
            versions={
                "triton": _triton_version(),
                "dnntune": __version__,
                "solver": f"{solver.kernel}-r{solver.revision}",
            },
            pins=pins,
        )
        force = settings.force_benchmarking()
        policy_value = int(values[tuning.TUNING_POLICY])
        benchmarking = int(values[BENCHMARKING])
        db = default_db()
        memo_key = (
            key.problem_key,
            key.key,
            normalize_settings([KnobSetting(k, v) for k, v in sorted(values.items())]),
            force,
            str(db.root) if db else "",
        )
        meta: dict[str, Any] = {
            "kernel": match.kernel,
            "policy": tuning.resolve(policy_value, benchmarking, force).name,
            "timed_candidates": 0,
        }
        with self._memo_lock:
            remembered = self._memo.get(memo_key)
        if remembered is not None:
            config, meta["config_source"] = remembered
            meta["config"] = dict(config)
            return config, meta, None
        record = db.lookup(key) if db is not None else None
        if record is not None and not self._usable(record.config, solver, match, limits, limit):
            _log.info("triton perf db record %s no longer fits; ignored", record.config)
            record = None
        decision = tuning.decide(policy_value, record is not None, benchmarking, force)
        meta["decision"] = {
            "search": decision.search,
            "use_record": decision.use_record,
            "write_record": decision.write_record,
            "delete_records": decision.delete_records,
        }
        scratch: _Scratch | None = None
        if decision.delete_records:
            meta["deleted_records"] = db.delete(key) if db is not None else 0
            self._forget(key)
        if decision.search:
            candidates = solver.candidates(match, limits, pins, limit)
            started = time.perf_counter()
            ws = max((solver.workspace_bytes(c, match) for c in candidates), default=0)
            scratch = _Scratch(graph, handle, ws)
            config, best_ms, timed = self._search(match, candidates, handle, scratch)
            meta.update(
                config_source="search",
                search_best_ms=best_ms,
                search_wall_ms=(time.perf_counter() - started) * 1e3,
                timed_candidates=timed,
                searched_candidates=len(candidates),
            )
            if decision.write_record and db is not None:
                stored_ms = best_ms if math.isfinite(best_ms) else 0.0
                db.store(key, PerfRecord(config, stored_ms, len(candidates), time.time()))
                self._forget(key)
        elif decision.use_record and record is not None:
            config, meta["config_source"] = record.config, "perf_db"
        else:
            config = self._default(solver, match, limits, pins, limit)
            meta["config_source"] = "default"
        if not decision.touches_db and not decision.search:
            with self._memo_lock:
                self._memo[memo_key] = (config, meta["config_source"])
        meta["config"] = dict(config)
        return config, meta, scratch

    @staticmethod
    def _usable(
        config: Mapping[str, int], solver: Solver, match: Match, limits: DeviceLimits, limit: int
    ) -> bool:
        if set(config) != set(solver.values):
            return False
        cfg = dict(config)
        return (
            solver.check(cfg, match, limits) is None and solver.workspace_bytes(cfg, match) <= limit
        )

    def _forget(self, key: PerfKey) -> None:
        """Drop remembered decisions of ``key``'s problem (every pin and policy)."""
        with self._memo_lock:
            for k in [k for k in self._memo if k[0] == key.problem_key]:
                del self._memo[k]

    @staticmethod
    def _warm(
        launcher: Launcher, graph: OpGraph, handle: Handle, scratch: _Scratch | None, ws: int
    ) -> None:
        """Run once on scratch buffers so that Triton compiles now (failures fail the build)."""
        scratch = scratch or _Scratch(graph, handle, ws)
        try:
            with handle.stream_context():
                launcher(scratch.pack, scratch.workspace)
            handle.timer.synchronize()
        except DnnTuneError:
            raise
        except Exception as exc:
            raise ExecutionError(
                f"TRITON_ENGINE kernel failed to compile or run: {type(exc).__name__}: {exc}"
            ) from exc

    def _search(
        self, match: Match, candidates: list[Config], handle: Handle, scratch: _Scratch
    ) -> tuple[Config, float, int]:
        """Time the candidates (:func:`.search.run_search`: samples of at least a millisecond
        of back-to-back launches, interleaved rounds, median) and keep the fastest.

        Configs that fail to compile or run (Triton's OutOfResources, ...) score infinity, as
        in Triton's autotuner. A single candidate is taken without timing.
        """
        if len(candidates) == 1:
            return candidates[0], math.nan, 0
        launchers = self._precompile(match, candidates, scratch)

        def runner_for(config: Config) -> Callable[[], None]:
            launcher = launchers.get(id(config)) or build_launcher(match, config)

            def run() -> None:
                launcher(scratch.pack, scratch.workspace)

            return run

        try:
            outcome = run_search(candidates, runner_for, handle.timer, handle.stream_context)
        except RuntimeError as exc:
            raise ExecutionError(f"TRITON_ENGINE {match.kernel}: {exc}") from None
        _log.info(
            "triton search: %s best %s (%.5f ms of %d)",
            match.kernel,
            outcome.config,
            outcome.median_ms,
            len(candidates),
        )
        return outcome.config, outcome.median_ms, outcome.timed

    @staticmethod
    def _precompile(
        match: Match, candidates: list[Config], scratch: _Scratch
    ) -> dict[int, Launcher]:
        """Compile every candidate on a thread pool before timing (:func:`.scratch.compile_all`).

        Best effort: a config that fails here is compiled again, and fails, in the timing loop.
        """
        return compile_all(match, candidates, scratch, build_launcher, COMPILE_WORKERS)
