"""The lowering's result types (``result_dtype``) without ``torch._dynamo``.

The torch engines' lowering asks what type an activation or pointwise op gives its operands.
It asked the meta device, whose Python references import ``torch._dynamo`` on their first call
(torch 2.13: 1.5-2 s), so every TORCH_ENGINE plan paid for the compiler it never runs. Empty
CPU tensors answer now, and the meta device where the CPU kernel refuses the types; the answer
must stay the meta device's for everything the lowering asks.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

import dnntune as dt
from dnntune.graph.node import Node
from dnntune.providers._torch.compute_type import EXACT_POINTWISE
from dnntune.providers._torch.elementwise import activation_forms, result_dtype

PW = dt.PointwiseMode
REPO = Path(__file__).resolve().parents[2]

#: the modes whose Python-number operand keeps its own type (int, bool); the others read it as
#: a float (``lower_pointwise``)
_INTEGER_NUMBERS = EXACT_POINTWISE | {PW.ADD, PW.SUB, PW.MUL, PW.DIV}
#: node parameters that give a mode another function (clipped or leaky ReLU, swish with beta)
_PARAMS: dict[PW, list[dict[str, float]]] = {
    PW.RELU_FWD: [
        {},
        {"relu_upper_clip": 6.0},
        {"relu_lower_clip": 1.0},
        {"relu_lower_clip_slope": 0.1},
        {"relu_lower_clip": 1.0, "relu_lower_clip_slope": 0.1, "relu_upper_clip": 5.0},
    ],
    PW.SWISH_FWD: [{}, {"swish_beta": 2.0}],
    PW.ELU_FWD: [{"elu_alpha": 0.5}],
    PW.SOFTPLUS_FWD: [{"softplus_beta": 2.0}],
}


def _meta_answer(fn: Any, operands: list[Any]) -> torch.dtype | str:
    metas = [
        torch.empty(1, dtype=o, device="meta") if isinstance(o, torch.dtype) else o
        for o in operands
    ]
    try:
        return fn(*metas).dtype  # type: ignore[no-any-return]
    except Exception as exc:
        return type(exc).__name__


def _answer(fn: Any, operands: list[Any]) -> torch.dtype | str:
    try:
        return result_dtype(fn, operands)
    except Exception as exc:
        return type(exc).__name__


def test_result_dtype_is_the_meta_devices_for_every_mode_and_type() -> None:
    types = [d.to_torch() for d in dt.DataType]
    disagree: list[str] = []
    for mode in PW:
        numbers: list[Any] = [2.0, -1.5]
        if mode in _INTEGER_NUMBERS:
            numbers += [2, True]
        for params in _PARAMS.get(mode, [{}]):
            node: Node = SimpleNamespace(params=params)  # type: ignore[assignment]
            fn, _ = activation_forms(node, mode)
            domains = [types] + [types + numbers] * (mode.arity - 1)
            for operands in itertools.product(*domains):
                got, meta = _answer(fn, list(operands)), _meta_answer(fn, list(operands))
                if got != meta:
                    disagree.append(f"{mode.name} {params} {operands}: {got} (meta: {meta})")
    assert disagree == []


def test_torch_engine_plans_leave_torch_dynamo_unimported() -> None:
    """Every example graph checked, built and run on TORCH_ENGINE; the relu after a matmul's
    bias, any pointwise op, made the meta device import ``torch._dynamo``."""
    code = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        import torch
        import dnntune as dt
        from dnntune import reference

        handle = dt.create_handle("cpu")
        for path in sorted(Path(sys.argv[1]).glob("*.json")):
            g = dt.Graph.load(path)
            g.build_operation_graph(handle)
            g.create_execution_plan_ext("TORCH_ENGINE")
            g.check_support()
            g.build_plans()
            g.execute(handle, reference.make_inputs(g, handle.device))
        print("torch._dynamo" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "examples" / "graphs")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert done.stdout.strip() == "False"
