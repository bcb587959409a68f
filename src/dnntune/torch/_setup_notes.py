"""What ``optimize`` tells the user before it plans anything, where the call cannot do what
it was asked as asked: a model compiled by ``torch.compile``, an example forward under
``torch.autocast``, ``policy="cached"`` pointed at an override file that does not exist,
lazy modules that have not run yet, and parametrized layers; and, once it has run,
``refine=True`` that could not run. Each is a note in the report, not a warning: the call
goes on, and says what to do."""

from __future__ import annotations

from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils.parametrize import is_parametrized

from dnntune.torch._calls import autocast_on
from dnntune.torch._example import compiled_by_torch
from dnntune.torch.config import TorchConfig
from dnntune.torch.modules import SWAPS

__all__ = ["refine_not_run", "setup_notes"]


def setup_notes(module: nn.Module, has_example: bool, config: TorchConfig) -> list[str]:
    """The notes for ``module`` optimized under ``config`` (with example inputs or not)."""
    notes = []
    if compiled_by_torch(module):
        # the compiled program runs PyTorch's own ops in every dnntune op (a recorded
        # program must be PyTorch's: :func:`dnntune.torch._support.tracing`); before, the
        # report only said that no call ran on dnntune, naming reasons that did not apply
        notes.append(
            "the model is compiled by torch.compile: its forward runs the compiled "
            "program, in which dnntune's ops run PyTorch's own, so none of its calls run "
            "on dnntune; optimize the model itself (model._orig_mod) and call it "
            "uncompiled to run dnntune's plans"
        )
    if has_example and autocast_on():
        # the example forward runs in the caller's autocast, where conv2d, linear and
        # attention take PyTorch's ops: the report listed those layers with the generic
        # reasons only, and nothing was planned or tuned for them (new-user audit)
        notes.append(
            "optimize ran under torch.autocast, where dnntune's conv2d, linear and "
            "attention run PyTorch's ops (autocast picks each op's type), so the example "
            "forward planned and tuned none of those layers; to run dnntune's plans in a "
            "lower precision, cast the model (model.bfloat16()) and its inputs, and "
            "optimize and call it outside torch.autocast"
        )
    path = config.override_path()
    if config.policy == "cached" and path is not None and not path.exists():
        # a mistyped path read as an empty file: every layer quietly took the heuristics'
        # plan (new-user audit, session 55)
        notes.append(
            f"policy='cached' runs the choices a tune stored in {path}, which does not "
            "exist, so every layer takes the heuristics' plan; give the file a tune wrote "
            "(overrides=...), or tune first (policy='tune')"
        )
    lazy = [
        name
        for name, m in module.named_modules()
        if any(map(is_lazy, m.parameters(recurse=False)))  # a lazy module not yet run
    ]
    if lazy:
        # such a module becomes its PyTorch class at its first forward, after the swaps: the
        # report read "0 module(s) on dnntune" and nothing more (new-user audit, session 55)
        named = ", ".join(lazy[:3]) + (f" and {len(lazy) - 3} more" if len(lazy) > 3 else "")
        notes.append(
            f"{len(lazy)} lazy module(s) ({named}) had not run a forward yet, so they run "
            "PyTorch's ops: run one forward first, then optimize, to have them on dnntune"
        )
    parametrized = [
        name
        for name, m in module.named_modules()
        # ``weight_norm``, ``spectral_norm``, ``register_parametrization``: PyTorch gives the
        # module a class of its own (``ParametrizedConv2d``), which is not swapped
        if is_parametrized(m) and type(m).__bases__[0] in SWAPS
    ]
    if parametrized:
        # the report listed the other layers and said nothing of these (new-user audit)
        named = ", ".join(parametrized[:3])
        named += f" and {len(parametrized) - 3} more" if len(parametrized) > 3 else ""
        notes.append(
            f"{len(parametrized)} layer(s) with a parametrized weight ({named}: weight_norm, "
            "spectral_norm, register_parametrization) run PyTorch's ops; for inference, "
            "torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight') makes the "
            "weight a plain parameter, and optimize then runs the layer on dnntune"
        )
    return notes


def refine_not_run(checked: bool, replayed: bool) -> str:
    """The note for ``refine=True`` that did not run: without the speed check's setting, or in
    a forward that replays as a CUDA graph (no per-layer host cost to refine)."""
    if not checked:
        return (
            "refine=True did not run: it times the whole forward, which needs example "
            "inputs, the module in eval mode and check_speed=True"
        )
    assert replayed
    return (
        "refine=True did not run: the forward replays as a CUDA graph, where a layer pays no "
        "host cost to refine away; pass cuda_graph=False to refine an uncaptured forward"
    )
