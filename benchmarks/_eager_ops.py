"""Pieces of the eager translator: Python literals for parameters and pointwise expressions.

``pointwise_expr`` maps a dnntune pointwise node to the torch expression a user writes for it
(``F.relu``, ``F.gelu``, ``F.silu``, ``x + y``, ...), with the node's parameters as literals.
"""

from __future__ import annotations

import math
from typing import Any

from dnntune.graph import Node, PointwiseMode

__all__ = ["NotTranslatable", "lit", "pointwise_expr"]


class NotTranslatable(Exception):
    """The graph has something the eager translator does not express (reported, not fatal)."""


def lit(value: Any) -> str:
    """A Python literal for a parameter (floats keep full precision, inf spelled out)."""
    if isinstance(value, float):
        if math.isinf(value):
            return "math.inf" if value > 0 else "-math.inf"
        return repr(value)
    if isinstance(value, list | tuple):
        return "(" + ", ".join(lit(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def pointwise_expr(node: Node, mode: PointwiseMode, a: list[str], scalar: list[bool]) -> str:
    p = node.params
    binary = {
        PointwiseMode.ADD: "({0} + {1})",
        PointwiseMode.SUB: "({0} - {1})",
        PointwiseMode.MUL: "({0} * {1})",
        PointwiseMode.DIV: "({0} / {1})",
        PointwiseMode.MAX: "torch.maximum({0}, {1})",
        PointwiseMode.MIN: "torch.minimum({0}, {1})",
        PointwiseMode.POW: "torch.pow({0}, {1})",
        PointwiseMode.CMP_EQ: "torch.eq({0}, {1})",
        PointwiseMode.CMP_NEQ: "torch.ne({0}, {1})",
        PointwiseMode.CMP_GT: "torch.gt({0}, {1})",
        PointwiseMode.CMP_GE: "torch.ge({0}, {1})",
        PointwiseMode.CMP_LT: "torch.lt({0}, {1})",
        PointwiseMode.CMP_LE: "torch.le({0}, {1})",
    }
    if mode in binary:
        if scalar[0] and scalar[1]:
            raise NotTranslatable("pointwise on two scalars")
        if mode not in (
            PointwiseMode.ADD,
            PointwiseMode.SUB,
            PointwiseMode.MUL,
            PointwiseMode.DIV,
        ) and any(scalar):
            # torch.maximum & co. take tensors only: a user writes the constant as one
            i = scalar.index(True)
            a = [f"torch.full_like({a[1 - i]}, {x})" if j == i else x for j, x in enumerate(a)]
        expr = binary[mode].format(*a)
        if mode.name.startswith("CMP_"):
            expr = f"{expr}.to({a[0]}.dtype)"
        return expr
    x = a[0]
    if mode is PointwiseMode.RELU_FWD:
        lower, upper, slope = (
            p.get("relu_lower_clip"),
            p.get("relu_upper_clip"),
            p.get("relu_lower_clip_slope"),
        )
        if not lower and not slope and upper is None:
            return f"F.relu({x})"
        if not lower and not slope and upper is not None:
            return f"F.hardtanh({x}, 0.0, {lit(float(upper))})"
        if not lower and upper is None:
            return f"F.leaky_relu({x}, {lit(float(slope or 0.0))})"
        lo, sl = float(lower or 0.0), float(slope or 0.0)
        expr = f"torch.where({x} > {lo!r}, {x}, {lo!r} + {sl!r} * ({x} - {lo!r}))"
        return expr if upper is None else f"torch.clamp({expr}, max={lit(float(upper))})"
    if mode is PointwiseMode.GELU_FWD:
        return f"F.gelu({x})"
    if mode is PointwiseMode.GELU_APPROX_TANH_FWD:
        return f"F.gelu({x}, approximate='tanh')"
    if mode is PointwiseMode.SWISH_FWD:
        beta = float(p.get("swish_beta") or 1.0)
        return f"F.silu({x})" if beta == 1.0 else f"({x} * torch.sigmoid({beta!r} * {x}))"
    if mode is PointwiseMode.ELU_FWD:
        return f"F.elu({x}, {float(p.get('elu_alpha') or 1.0)!r})"
    if mode is PointwiseMode.SOFTPLUS_FWD:
        return f"F.softplus({x}, {float(p.get('softplus_beta') or 1.0)!r})"
    if mode is PointwiseMode.BINARY_SELECT:
        return f"torch.where({a[2]} != 0, {a[0]}, {a[1]})"
    unary = {
        PointwiseMode.TANH_FWD: "torch.tanh",
        PointwiseMode.SIGMOID_FWD: "torch.sigmoid",
        PointwiseMode.EXP: "torch.exp",
        PointwiseMode.LOG: "torch.log",
        PointwiseMode.NEG: "torch.neg",
        PointwiseMode.ABS: "torch.abs",
        PointwiseMode.SQRT: "torch.sqrt",
        PointwiseMode.RSQRT: "torch.rsqrt",
        PointwiseMode.RECIPROCAL: "torch.reciprocal",
        PointwiseMode.SIN: "torch.sin",
        PointwiseMode.COS: "torch.cos",
        PointwiseMode.CEIL: "torch.ceil",
        PointwiseMode.FLOOR: "torch.floor",
        PointwiseMode.ERF: "torch.erf",
    }
    if mode is PointwiseMode.IDENTITY:
        return x
    if mode in unary:
        return f"{unary[mode]}({x})"
    raise NotTranslatable(f"pointwise mode {mode.name}")
