"""What is recorded instead of a forward that cannot be recorded whole as a CUDA graph.

Where the whole forward cannot be recorded (a host sync in its mask building, data-dependent
shapes, a cache that grows), its blocks are recorded instead (:func:`blocks`), each on its own,
and the code between them runs as it is (``cuda_graphs``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["MIN_PIECE_LAYERS", "blocks"]


def _is_container(module: nn.Module) -> bool:
    """ModuleList, ModuleDict and the like: no forward of their own."""
    return type(module).forward is nn.Module.forward


def _weighted_layers(module: nn.Module, enough: int) -> int:
    """How many of ``module``'s layers hold parameters (counted up to ``enough``)."""
    count = 0
    for m in module.modules():
        if any(p is not None for p in m._parameters.values()):
            count += 1
            if count >= enough:
                break
    return count


#: a piece holds at least this many layers with weights: smaller children (one linear, a norm,
#: an embedding) gain less from a replay than its input copy and output clone cost
MIN_PIECE_LAYERS = 2


def blocks(module: nn.Module) -> list[nn.Module]:
    """What ``module`` is recorded as when it cannot be recorded whole: each child that holds
    at least :data:`MIN_PIECE_LAYERS` layers with weights (a transformer block, a ResNet stage,
    the model inside a ``*ForCausalLM``), in order, containers (ModuleList, ModuleDict) looked
    through. The other children, and the forward's own code between them, run as they are."""
    found: list[nn.Module] = []
    stack = list(module.children())[::-1]
    while stack:
        child = stack.pop()
        if _is_container(child):
            stack.extend(list(child.children())[::-1])
        elif _weighted_layers(child, MIN_PIECE_LAYERS) >= MIN_PIECE_LAYERS:
            found.append(child)
    return found
