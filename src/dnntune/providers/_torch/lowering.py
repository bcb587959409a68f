"""``lower``: a validated graph becomes a :class:`Program`, once.

It sits above the op lowerers (``ops.py``, ``fused.py``), which sit above the program
types in ``program.py``, so the three import in one direction only.
"""

from __future__ import annotations

import torch

from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind
from dnntune.graph.tensor import TensorAttributes
from dnntune.providers._torch.fused import consumers, lower_conv_bias, lower_matmul_bias
from dnntune.providers._torch.ops import LOWERERS
from dnntune.providers._torch.program import LowerContext, LoweringOptions, Program, Step

__all__ = ["lower"]


def _result_uid(t: TensorAttributes) -> int:
    assert t.uid is not None, "validate() assigns every uid"
    return t.uid


def lower(
    graph: OpGraph,
    device: torch.device,
    options: LoweringOptions = LoweringOptions(),
) -> Program:
    """Lower a validated graph into a :class:`Program` for ``device``.

    Raises:
        NotSupportedError: naming the node this lowering cannot run.
    """
    if not graph.is_validated:
        graph.validate()
    ctx = LowerContext(graph, device, options)
    steps: list[Step] = []
    kinds: list[OpKind] = []
    users = consumers(graph)
    absorbed: set[int] = set()
    for node in graph.topological_nodes():
        if id(node) in absorbed:
            continue
        ctx.begin(node)
        fused = None
        if options.fuse:
            fused = lower_matmul_bias(ctx, node, users) or lower_conv_bias(ctx, node, users)
        if fused is not None:
            step, taken, ran = fused
            absorbed.update(id(n) for n in taken)
            steps.append(step)
            kinds.extend(ran)
            continue
        lowerer = LOWERERS.get(node.kind)
        if lowerer is None:
            raise NotSupportedError(f"node {node.name!r}: no ATen lowering for {node.kind.value}")
        steps.append(lowerer(ctx, node))
        kinds.append(node.kind)
    if options.return_outputs:
        result_slots = [ctx.slot(t) for t in ctx.outputs]
        result_uids = [_result_uid(t) for t in ctx.outputs]
    else:
        result_slots, result_uids = [], []
    return Program(ctx.arg_uids, result_slots, result_uids, ctx.n_scratch, steps, kinds)
