"""``optimize(module)``: run a model's convs, linears, norms and attention on dnntune, in place.

Modules keep their parameters, buffers and state_dict keys: only their class is swapped for a
dnntune-backed subclass. In eval mode, Conv2d + BatchNorm2d (+ activation) and Conv2d/Linear +
activation inside an ``nn.Sequential`` run as one fused dnntune graph (the batch norm is
folded into the conv's weights at call time); in training mode every module behaves exactly as
PyTorch's. Calls of ``torch.nn.functional.scaled_dot_product_attention``, ``max_pool2d`` and
``avg_pool2d`` made while the module runs are routed to dnntune (calls through a name imported
before ``optimize`` are not). With ``cuda_graph=True`` the inference forward replays as a CUDA
graph (:mod:`dnntune.torch.cuda_graphs`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from dnntune.backend import native as _native
from dnntune.errors import InvalidValueError
from dnntune.measure import contention
from dnntune.torch import _changing_shapes as changing_shapes
from dnntune.torch._example import Example, example_of, named_example, on_cuda_of
from dnntune.torch._optimize_layers import (
    UserState,
    drop_refined_fusions,
    finish_report,
    run_example,
    swap_layers,
)
from dnntune.torch._route_race import ROUTES, Routes
from dnntune.torch._setup_notes import refine_not_run, setup_notes
from dnntune.torch._undo import Undo
from dnntune.torch.config import (
    Policy,
    RankingMetric,
    changed,
    current,
    enter_scope,
    exit_scope,
    process_settings,
)
from dnntune.torch.cuda_graphs import install as install_cuda_graphs
from dnntune.torch.cuda_graphs import recorded_pieces
from dnntune.torch.graph_choice import (
    AUTO,
    GraphTimes,
    apply_choice,
    can_choose,
    doubt_to_pytorch,
    eager_replay_ms,
    graph_setting,
    readings,
    recorded,
    side_by_side_times,
)
from dnntune.torch.optimize_report import (
    OptimizeReport,
    SwapRecord,
    within,
)
from dnntune.torch.refine import refine_groups
from dnntune.torch.speed import forward_ms, interleaved_forward_ms, is_slower, warn_if_slower

__all__ = ["OptimizeReport", "SwapRecord", "optimize"]  # the report's types, re-exported

_log = logging.getLogger(__name__)


def _refuse_torchscript(module: nn.Module) -> None:
    """A TorchScript model (``torch.jit.script``, ``trace``, ``load``, ``freeze``) runs its
    compiled code, not its submodules' classes: there is nothing to swap in it. Before a
    new-user audit ``optimize`` of one raised ``AttributeError: '_CachedForward' object has no
    attribute '__getattr__'`` from inside dnntune's traces (TorchScript's classes give no
    ``forward``). A TorchScript submodule of an eager model is left as it is, and the rest of
    the model optimized (the traces skip it)."""
    if isinstance(module, torch.jit.ScriptModule):
        raise InvalidValueError(
            "optimize() cannot change a TorchScript module (made by torch.jit.script, "
            "torch.jit.trace or torch.jit.load), which runs its compiled code, not PyTorch's "
            "layer classes; optimize the eager model it was made from instead (an optimized "
            "model can be recorded with torch.jit.trace, torch.export or torch.compile)"
        )


def _check_switches(**switches: object) -> None:
    """optimize's on/off options are True or False (``refine`` also None): any other value
    was taken by its truth, so ``check_speed="no"`` turned the check on (new-user audit).
    InvalidValueError naming the option, as ``cuda_graph`` and ``policy`` are checked."""
    for name, given in switches.items():
        if isinstance(given, bool) or (name == "refine" and given is None):
            continue
        allowed = "True, False or None (the default)" if name == "refine" else "True or False"
        raise InvalidValueError(
            f"optimize({name}={given!r}): expected {allowed}, got a {type(given).__name__}"
        )


def optimize(
    module: nn.Module,
    example_inputs: Sequence[Any] | None = None,
    policy: Policy = "tune",
    overrides: str | Path | None = "dnntune_overrides.json",
    cuda_graph: bool | Literal["auto"] = "auto",
    fuse: bool = True,
    ranking_metric: RankingMetric | None = None,
    check_speed: bool = True,
    revert_if_slower: bool = True,
    refine: bool | None = None,
    time_budget_s: float | None = None,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
) -> OptimizeReport:
    """Swap ``module``'s supported layers for dnntune-backed ones, in place.

    Args:
        module: the model (modified in place and returned through the report's names).
        example_inputs: if given, ``module(*example_inputs)`` runs once under ``no_grad`` so
            every layer is planned (and, with policy "tune", tuned) up front (a tuple of the
            forward's arguments; a single tensor is taken as ``(tensor,)``).
        example_kwargs: (keyword-only, so that every other parameter keeps its position)
            the example forward's keyword arguments, by name: every forward ``optimize`` runs
            (the example, the timings, ``refine``, CUDA-graph recording) is
            ``module(*example_inputs, **example_kwargs)``, for a forward that takes keyword
            arguments (a Hugging Face model's ``input_ids=``/``attention_mask=``, a
            keyword-only ``mask``). Given alone, the example call has no positional arguments.
            Its tensors count as the example inputs' do (on CUDA or not, put back if the
            forward writes them). E.g. ``optimize(model, (x,), example_kwargs={"mask": m})``
            or ``optimize(bert, example_kwargs={"input_ids": ids, "attention_mask": am})``.
        policy: "tune", "heuristic" or "cached" (see :func:`dnntune.torch.configure`).
        overrides: the override file tuned winners are written to and read from.
        cuda_graph: True: replay the whole inference forward as a CUDA graph, recorded once per
            input signature (see :mod:`dnntune.torch.cuda_graphs` for the rules; training
            and CPU calls run uncaptured). It removes the per-layer host cost, which decides
            the speed of small batches. With ``example_inputs`` on CUDA the graph is recorded
            up front. "auto" (the default): with ``example_inputs`` on CUDA in eval mode (and
            ``check_speed``), time PyTorch's forward uncaptured and replayed, and dnntune's
            forward replayed (uncaptured when it cannot be recorded), and keep dnntune's unless
            a PyTorch option is faster beyond noise (``report.choice``;
            :mod:`dnntune.torch.graph_choice`); without them, as False. False: uncaptured.
        fuse: trace each module's own forward (``torch.fx``) and fuse what eager code writes
            as separate ops: a conv branch + shortcut add (+ ReLU) into the last conv, and a
            Linear/Conv2d child + activation into one graph (eval mode;
            :mod:`dnntune.torch.fusion`); also an ``nn.Sequential``'s conv + batch norm
            (+ activation) and Linear/Conv2d + activation children. False: no fusion at all,
            each layer runs alone.
        ranking_metric: the clock "tune" ranks on (see :func:`dnntune.torch.configure`);
            None: "device" with ``cuda_graph`` (a replay pays kernel time only), else
            "latency" (an uncaptured call also pays its host submit). "throughput" ranks on
            calls issued back to back, host and device overlapping, as in an uncaptured
            forward pass.
        check_speed: with ``example_inputs`` and the module in eval mode, time the forward
            before changing anything and again at the end (``report.eager_forward_ms``,
            ``report.forward_ms``, ``report.speedup``) and warn (``DnnTuneSlowerWarning``)
            if the optimized forward is slower. Costs a few dozen forwards. Later forwards
            given other input shapes than the example's (uncaptured: a decode step, another
            batch size) then race too: the first forwards of each set of input shapes
            alternate between dnntune's route and PyTorch's own forward, four each, timed,
            and dnntune's runs the rest only where it is faster beyond 2 % (a tie goes to
            PyTorch's; ``torch/_route_race.py``). False: every forward
            runs on dnntune, untimed.
        revert_if_slower: the last resort (on by default): when that check, after ``refine``,
            still finds the optimized forward slower (beyond 2 %), put the model back exactly
            as it was (classes and attributes: PyTorch's own forward) and set
            ``report.reverted`` (a result in the report, not a warning); the tuned winners
            stay in the override file. Needs the check (``example_inputs``, eval mode);
            otherwise nothing is reverted. False: keep the model and warn instead.
        refine: per-layer winners are chosen on per-layer clocks; in an uncaptured forward a
            layer's host work may cost more than its kernel saves. With the check's setting
            (``example_inputs``, eval mode) and without ``cuda_graph``, try the swapped modules
            on PyTorch's own ops in the whole forward, one group of same-signature modules at
            a time (:mod:`dnntune.torch.refine`), timed side by side, and keep each group
            where the forward is faster so beyond 2 % (``SwapRecord.pytorch``,
            ``report.refined``). None (the default): on whenever it can run; kept in the
            module, not in the file.
        time_budget_s: with policy "tune" and ``example_inputs``, the most seconds the tuning
            pass spends: searches take its first 70 %; layers reached after that take the
            override file's plan, else PyTorch's own op unless, while the budget lasts, the
            heuristic plan beats it in a short race (at most 60 ms of rounds a signature),
            and keep it in this process
            (``report.budget_skipped``); a new process tunes them, reading the layers tuned
            now from the file. None: no limit.

    Raises:
        InvalidValueError: for a ``time_budget_s`` that is not a positive number, an
            ``example_inputs`` that is not a tuple, list or tensor, an ``example_kwargs``
            that is not a mapping with str keys, ``fuse``, ``check_speed``,
            ``revert_if_slower`` or ``refine`` other than True or False (``refine`` also
            None), or a TorchScript model (``torch.jit.script``,
            ``trace``, ``load``; a TorchScript submodule is left as it is).

    Returns:
        An OptimizeReport: swapped modules, fused neighbours, plans used, tuning time.
    """
    _check_switches(
        fuse=fuse, check_speed=check_speed, revert_if_slower=revert_if_slower, refine=refine
    )
    number = isinstance(time_budget_s, int | float) and not isinstance(time_budget_s, bool)
    if time_budget_s is not None and not (
        number and math.isfinite(time_budget_s) and time_budget_s > 0
    ):
        raise InvalidValueError(
            f"time_budget_s must be a positive number of seconds or None, got {time_budget_s!r}"
        )
    if not isinstance(module, torch.nn.Module):
        raise InvalidValueError(
            f"optimize() takes a torch.nn.Module, got {type(module).__name__}; wrap a function "
            "in a module, or call dnntune.torch's functional ops from it"
        )
    _refuse_torchscript(module)
    # the example call, positional and keyword arguments: every forward optimize runs is it
    example = example_of(example_inputs, example_kwargs)
    setting = graph_setting(cuda_graph)
    # eval mode only: a training-mode forward changes batch-norm statistics each time it runs
    check = check_speed and example is not None and not module.training
    auto = setting == AUTO and can_choose(module, example, check)
    replay = setting is True or auto  # the forward is installed to replay CUDA graphs
    # a CUDA-graph replay pays kernel time only; an uncaptured forward also the host submit
    chosen_clock = ranking_metric is None
    if ranking_metric is None:
        ranking_metric = "device" if replay else "latency"
    # the settings are the model's (bound to it below), in force in this thread only while
    # optimize runs: a call outside any optimized module does not tune into this model's file
    # (new-user audit), and an optimize of another model in another thread meanwhile keeps its
    # own (they configured the process and put it back: two at once swapped settings, one
    # model bound the other's policy and override file; concurrency audit)
    settings = changed(
        process_settings(), policy=policy, overrides=overrides, ranking_metric=ranking_metric
    )
    undo = Undo(module)  # before anything changes: what revert_if_slower restores
    given = [] if example is None else example.tensors()
    on_cuda = on_cuda_of(module, given)
    if on_cuda:
        # the compiled helpers that recordings and CUDA kernel calls read pointers with:
        # built in the background while the layers trace and tune (seconds on a fresh cache)
        _native.prefetch()
    # what optimize's own forwards may write: put back by value when it returns or raises
    kept = UserState(module, given)
    scope = enter_scope(settings)
    try:
        # the module keeps these settings: a later optimize() or configure() for another model
        # does not change which kernels this one runs
        module.__dict__["_dnntune_config"] = current()
        if replay and chosen_clock:
            # forwards that cannot be replayed (CPU, train mode without gradients, a signature
            # that cannot be recorded) run uncaptured and pay their host cost: rank on latency
            module.__dict__["_dnntune_config_uncaptured"] = replace(
                current(), ranking_metric="latency"
            )
        if auto:
            # an uncapturable forward is one of "auto"'s expected outcomes: logged, not warned
            module.__dict__["_dnntune_graph_auto"] = True
        report = OptimizeReport(
            # the policy the layers run under (None leaves the process's as it was)
            policy=current().policy,
            overrides=None if overrides is None else str(overrides),
        )
        report.time_budget_s = time_budget_s
        report.notes.extend(setup_notes(module, example is not None, current()))
        if check:
            assert example is not None
            with named_example(example):
                report.eager_forward_ms = forward_ms(module, example)
            if auto:
                report.eager_graph_ms = eager_replay_ms(
                    module, example, lambda m, i: forward_ms(m, i)
                )
        layers = swap_layers(module, example, fuse, report)
        if example is not None:
            run_example(module, example, time_budget_s, report, kept)
        finish_report(module, layers, report, example_ran=example is not None)
        if replay:
            install_cuda_graphs(module)
            report.cuda_graph = True
            if example is not None and not module.training:
                with torch.no_grad():
                    example(module)
                if not recorded(module):
                    # it runs uncaptured (CPU inputs, a forward that cannot be recorded whole):
                    # refine it, time it side by side and report it as such
                    report.cuda_graph = False
            if not on_cuda:
                # the CPU has no CUDA graphs: nothing replays, whatever was asked (before, a CPU
                # model optimized without example inputs, or in train mode, was reported as
                # "CUDA graph replay", and with example inputs the report said nothing)
                report.cuda_graph = False
                if setting is True:
                    report.notes.append(
                        "cuda_graph=True: the model and its example inputs are on the CPU, "
                        "which has no CUDA graphs; the forward runs uncaptured (once moved to "
                        "a GPU, its forwards are recorded as cuda_graph=True describes)"
                    )
            report.pieces = recorded_pieces(module)
        # how long this process waited for a core while the forwards below were timed: on a
        # busy CPU (other processes on the cores) they time the scheduler as much as the
        # forward, and the keep-or-revert choices made on them are noise (new-user audit)
        cpu_wait = contention.wait_share(contention.run_queue_wait_s, time.perf_counter)
        if refine is not False and check and not report.cuda_graph:
            assert example is not None
            # through this module's name, so a test can put a scripted clock in its place
            # a layer inside a block that replays as a CUDA graph on its own runs no Python per
            # call: nothing to decide for it here (and a switch would not reach its recording)
            # and a layer whose example calls all ran PyTorch's op (float64, an option dnntune
            # does not model) or that was not called has no dnntune call to decide: timing it
            # cost four forwards of noise, and a noisy "faster on PyTorch's ops" then replaced
            # the report's true line, that none of its calls ran on dnntune (new-user audit)
            outside = [r for r in report.swapped if r.plans and not within(r.name, report.pieces)]
            groups = refine_groups(module, example, outside, lambda m, i: forward_ms(m, i))
            report.refined = [g.describe() for g in groups]
            drop_refined_fusions(layers, report)
        elif refine:
            # asked for and not run: said, not ignored (new-user audit, session 55)
            report.notes.append(refine_not_run(check, bool(report.cuda_graph)))
        if check:
            assert example is not None and report.eager_forward_ms is not None
            three = None
            if auto:
                report.forward_ms = forward_ms(module, example)
                # "auto" decides on its three options re-timed side by side, so that the choice
                # reads the same conditions for all (timed minutes apart they moved by 10 %)
                three = side_by_side_forward_ms(module, example, undo)
            if three is not None:
                assert report.forward_ms is not None  # ("auto" timed it above)
                before = GraphTimes(
                    report.eager_forward_ms,
                    report.eager_graph_ms,
                    report.forward_ms,
                    report.cuda_graph,
                )
                times = doubt_to_pytorch(before, three)
                report.auto_readings_ms = readings(before, three)
                report.eager_forward_ms, report.eager_graph_ms = (
                    times.pytorch_ms,
                    times.pytorch_graph_ms,
                )
                report.forward_ms = times.dnntune_ms
                report.side_by_side = True
            elif not report.cuda_graph:
                # uncaptured, the forward pays every layer's host cost: re-time it side by side
                # with PyTorch's, so that the decision below reads the same conditions for both
                paired = paired_forward_ms(module, example, undo)
                if paired is not None:
                    report.eager_forward_ms, report.forward_ms = paired
                    report.side_by_side = True
            if not report.side_by_side and not auto:
                # timed on its own only where no side-by-side figure replaces it: before, this
                # re-time ran first and the pair overwrote it, a full check thrown away
                report.forward_ms = forward_ms(module, example)
            assert report.forward_ms is not None
            if auto:
                apply_choice(module, example, report, undo, revert_if_slower)
            elif revert_if_slower and is_slower(report.eager_forward_ms, report.forward_ms):
                undo.revert()
                # PyTorch's own forward runs: no piece replays and no fusion runs (the rows
                # still say what was tried; a new-user audit read "fused:" lines here)
                report.reverted, report.pieces, report.fusions = True, [], []
                # an expected outcome of the default (never slower than eager): a result in the
                # report, not a warning
                _log.info(
                    "dnntune.torch.optimize: reverted: %.3f ms against PyTorch's %.3f ms",
                    report.forward_ms,
                    report.eager_forward_ms,
                )
            else:
                warn_if_slower(
                    report.eager_forward_ms,
                    report.forward_ms,
                    report.cuda_graph,
                    on_cuda=example.is_cuda,
                )
        if check or report.refined:
            report.cpu_wait_share = cpu_wait()
        kept.put_back()
        undo.compact()
        changing_shapes.forget(module)  # the user's forwards are counted afresh
        module.__dict__.pop(ROUTES, None)
        if check and not report.reverted and example is not None:
            # other inputs than the example's race dnntune's route against PyTorch's forward
            module.__dict__[ROUTES] = routes = Routes()
            routes.decided(module, example.args, example.kwargs, recheck=not report.cuda_graph)
            report.races = True
        return report
    except BaseException:
        # the example forward raised (or an interrupt came): the model is left as it was,
        # not half optimized (a swapped module that raised leaves no attribution in force: its
        # ``with`` block ended; a post hook never ran and left it set for the thread, so every
        # later dnntune call bypassed the call memo, new-user audit)
        kept.unhook_lazy()
        undo.restore()
        kept.put_back()
        raise
    finally:
        exit_scope(scope)


def _paired(module: nn.Module, example: Example, undo: Undo) -> tuple[float, float] | None:
    """(PyTorch's, the optimized) per-forward ms, timed side by side at the end of
    ``optimize`` (:func:`dnntune.torch.speed.interleaved_forward_ms`); None: not timed. Tests
    that script ``forward_ms`` pin this to None (tests/torch/conftest.py)."""
    to_pytorch, to_optimized = undo.switcher()
    return interleaved_forward_ms(module, example, to_pytorch, to_optimized)


#: what ``optimize`` calls (a module-level name, so that tests can pin it)
paired_forward_ms = _paired
#: "auto"'s three options re-timed side by side (a module-level name, so that tests can pin
#: it: tests/torch/conftest.py pins it to None where a test scripts ``forward_ms``)
side_by_side_forward_ms = side_by_side_times
