"""How close an engine's output must be to the reference: per-dtype tolerances and comparison.

An element passes when ``|actual - expected| <= atol + rtol * |expected|`` (NumPy's
``allclose`` rule, expected side only). The defaults are set per output data type:

=============  ============  ============  ==========================================
data type      rtol          atol          notes
=============  ============  ============  ==========================================
double         1e-7          1e-9
float          1e-4          1e-5          conv / matmul / sdpa: rtol 1e-3, atol 1e-4
half           2e-3          2e-3          conv / matmul / sdpa: 5e-3 / 5e-3
bfloat16       2e-2          2e-2          conv / matmul / sdpa: 3e-2 / 3e-2
fp8_e4m3       1.25e-1       1.25e-1       3 mantissa bits
fp8_e5m2       2.5e-1        2.5e-1        2 mantissa bits
integers/bool  0             0             exact
=============  ============  ============  ==========================================

Float32 stays tight: engines may use TF32 only when a knob allows it (``Knob.tf32``), and such
plans are checked with ``tf32=True``: float32 outputs of conv / matmul / sdpa then get half's
tolerance (TF32 keeps the same 10 mantissa bits as half).

Half and bfloat16 cover the rounding of the output and of intermediates to the storage type
(the reference reads the same 16-bit inputs exactly and keeps everything else in float32/float64),
and of a computation in a half or bfloat16 compute type that the graph or a node declares: a
float32 output of such a graph gets that type's tolerance (see :func:`tolerance_for`).

Long reductions: the base ``atol`` covers sums of up to 1024 terms. Beyond that it grows with
``sqrt(K / 1024)`` for a reduction of K terms, because the rounding errors of a long sum add up
like a random walk (about ``sqrt(K)`` units of the accumulator's precision), while the outputs of
well-scaled inputs (see :func:`dnntune.reference.make_inputs`) stay of order one. Not for an
average, max, min or amax reduction, nor a max-pool: an average's error is its sum's divided by
K, and an extremum is one of its inputs.

Whole-output bound: that growth is of the output type's base atol, so for 16-bit and fp8
outputs it soon exceeds what a systematic error needs to hide (an attention's output shrinks as
its keys grow, while its atol grows). Such outputs must also match as a whole: the RMS of the
error at most ``rtol`` times the RMS of the reference (``Tolerance.rms_rtol``).

Inputs larger than well-scaled ones (a model's own activations) round to larger absolute
errors: autotune's verification multiplies the absolute parts by
:func:`dnntune.reference.data_scale` of the caller's inputs (1 for well-scaled ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dnntune.graph.node import Node, OpKind
from dnntune.graph.types import DataType, ReductionMode, ResampleMode

if TYPE_CHECKING:
    from dnntune.graph.ir import OpGraph
    from dnntune.graph.tensor import TensorAttributes

__all__ = [
    "Comparison",
    "Tolerance",
    "compare",
    "default_tolerance",
    "reduction_length",
    "tolerance_for",
]

#: reductions up to this many terms need no extra absolute tolerance
REDUCTION_BASE = 1024


@dataclass(frozen=True)
class Tolerance:
    """Element-wise tolerance: pass when ``|actual - expected| <= atol + rtol * |expected|``;
    and, where ``rms_rtol`` is finite, as a whole: the RMS of the error at most ``rms_rtol``
    times the RMS of the reference (see :func:`compare`)."""

    rtol: float
    atol: float
    #: the whole-output bound (inf: none): set for 16-bit and fp8 outputs, whose element-wise
    #: atol grows with long reductions past what a wrong scale or shift needs to hide
    rms_rtol: float = math.inf
    #: the whole-output bound's absolute floor: a tenth of the type's atol before any long
    #: reduction grew it. An output that cancels to values far below that atol (a batch norm
    #: of inputs close to their mean) keeps the absolute rounding of its O(1) inputs, which a
    #: relative bound alone reads as a 10 % error; a wrong scale of an O(1) output is far above
    rms_atol: float = 0.0

    def loosest(self, other: Tolerance) -> Tolerance:
        """The tolerance that accepts whatever either of the two accepts (a whole-output bound
        that only one sets is kept: the other side does not relax it)."""
        bounds = [b for b in (self.rms_rtol, other.rms_rtol) if math.isfinite(b)]
        return Tolerance(
            max(self.rtol, other.rtol),
            max(self.atol, other.atol),
            max(bounds) if bounds else math.inf,
            max(self.rms_atol, other.rms_atol),
        )


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare`.

    ``max_abs_error`` is over finite pairs and is ``inf`` when a non-finite value mismatches;
    ``max_rel_error`` is over elements whose expected magnitude exceeds ``atol``.
    """

    ok: bool
    max_abs_error: float
    max_rel_error: float
    mismatches: int
    message: str
    total: int = 0


_EXACT = Tolerance(0.0, 0.0)
_BASE: dict[DataType, Tolerance] = {
    DataType.DOUBLE: Tolerance(1e-7, 1e-9),
    DataType.FLOAT: Tolerance(1e-4, 1e-5),
    DataType.HALF: Tolerance(2e-3, 2e-3),
    DataType.BFLOAT16: Tolerance(2e-2, 2e-2),
    DataType.FP8_E4M3: Tolerance(1.25e-1, 1.25e-1),
    DataType.FP8_E5M2: Tolerance(2.5e-1, 2.5e-1),
    # exponent only: a value is rounded to a power of two (up to 41 % off)
    DataType.FP8_E8M0: Tolerance(5e-1, 5e-1),
}
#: types whose outputs also get the whole-output bound (``Tolerance.rms_rtol``)
_RMS_CHECKED = frozenset(
    {
        DataType.HALF,
        DataType.BFLOAT16,
        DataType.FP8_E4M3,
        DataType.FP8_E5M2,
        DataType.FP8_E8M0,
    }
)
#: ops that accumulate long dot products, where engines legitimately reorder the sums
_ACCUMULATING = frozenset(
    {OpKind.CONV_FPROP, OpKind.CONV_DGRAD, OpKind.CONV_WGRAD, OpKind.MATMUL, OpKind.SDPA}
)
_ACCUMULATING_BASE: dict[DataType, Tolerance] = {
    DataType.FLOAT: Tolerance(1e-3, 1e-4),
    DataType.HALF: Tolerance(5e-3, 5e-3),
    DataType.BFLOAT16: Tolerance(3e-2, 3e-2),
}


def default_tolerance(
    data_type: DataType,
    op_kind: OpKind | None = None,
    *,
    reduction_length: int | None = None,
    tf32: bool = False,
) -> Tolerance:
    """The default tolerance for an output of ``data_type`` produced by ``op_kind``.

    Args:
        data_type: the output tensor's data type.
        op_kind: the operation that produced it; conv, matmul and sdpa get a looser rtol.
        reduction_length: terms summed per output element (K); above 1024 the atol grows with
            ``sqrt(K / 1024)``.
        tf32: the plan may compute float32 dot products in TF32 (a ``Knob.tf32`` knob is set):
            a float32 conv / matmul / sdpa output gets half's tolerance.

    Returns:
        The tolerance; integer and boolean types are exact.
    """
    if not data_type.is_floating:
        return _EXACT
    tol = _BASE[data_type]
    if op_kind in _ACCUMULATING:
        reads_as = DataType.HALF if tf32 and data_type is DataType.FLOAT else data_type
        tol = _ACCUMULATING_BASE.get(reads_as, tol)
    base_atol = tol.atol
    if reduction_length is not None and reduction_length > REDUCTION_BASE:
        tol = Tolerance(tol.rtol, tol.atol * math.sqrt(reduction_length / REDUCTION_BASE))
    if data_type in _RMS_CHECKED:
        tol = Tolerance(tol.rtol, tol.atol, tol.rtol, 0.1 * base_atol)
    return tol


def _prod(values: list[int]) -> int:
    return math.prod(values) if values else 1


def _dims(node: Node, field_name: str) -> list[int]:
    t = node.inputs.get(field_name) or node.outputs.get(field_name)
    return list(t.dims) if t is not None else []


def _conv_dgrad_length(node: Node) -> int:
    w, dx = _dims(node, "w_tensor_uid"), _dims(node, "dx_tensor_uid")
    groups = max(1, dx[1] // w[1]) if dx and w and w[1] else 1
    return max(1, w[0] // groups) * _prod(w[2:]) if w else 1


def _conv_wgrad_length(node: Node) -> int:
    dy = _dims(node, "dy_tensor_uid")
    return dy[0] * _prod(dy[2:]) if dy else 1


#: reductions whose rounding does not grow with their length: an average's error is its sum's
#: divided by the length (and the average is small where the sum is of order one: growing its
#: atol let an all-zero mean of 4M float32 terms pass), and a max or min is one of its inputs
_FLAT_REDUCTIONS = frozenset(
    {ReductionMode.AVG, ReductionMode.MAX, ReductionMode.MIN, ReductionMode.AMAX}
)


def _reduction_length(node: Node) -> int:
    if node.params.get("mode") in _FLAT_REDUCTIONS:
        return 1
    return _prod(_dims(node, "x_tensor_uid")) // max(1, _prod(_dims(node, "y_tensor_uid")))


def _stat_length(node: Node) -> int:
    x = _dims(node, "x_tensor_uid")
    return _prod(x) // max(1, x[1]) if len(x) > 1 else 1


def _norm_length(node: Node) -> int:
    x = _dims(node, "x_tensor_uid")
    count = node.params.get("normalized_dim_count") or (len(x) - 1)
    return _prod(x[len(x) - int(count) :])


_LENGTH: dict[OpKind, Callable[[Node], int]] = {
    OpKind.CONV_FPROP: lambda n: _prod(_dims(n, "w_tensor_uid")[1:]),
    OpKind.CONV_DGRAD: _conv_dgrad_length,
    OpKind.CONV_WGRAD: _conv_wgrad_length,
    OpKind.MATMUL: lambda n: (_dims(n, "a_tensor_uid") or [1])[-1],
    OpKind.SDPA: lambda n: max(_dims(n, "q_tensor_uid")[-1], _dims(n, "k_tensor_uid")[2]),
    OpKind.REDUCTION: _reduction_length,
    OpKind.LAYERNORM: _norm_length,
    OpKind.RMSNORM: _norm_length,
    OpKind.BATCHNORM: _stat_length,
    OpKind.BATCHNORM_BACKWARD: _stat_length,
    OpKind.RESAMPLE: lambda n: (
        1
        if n.params.get("mode") is ResampleMode.MAXPOOL
        else _prod(list(n.params.get("window") or [1]))
    ),
}


def reduction_length(node: Node) -> int:
    """How many terms one output element of ``node`` sums (1 for elementwise operations)."""
    fn = _LENGTH.get(node.kind)
    return max(1, fn(node)) if fn is not None else 1


def _narrow_compute_types(graph: OpGraph) -> set[DataType]:
    """The floating compute types narrower than float32 that ``graph`` or its nodes declare.

    TORCH_ENGINE and CUDNN_ENGINE compute a node in its declared half or bfloat16 compute type
    (the reference in float64): a half SQRT into a float32 output is rounded to half, 2e-4
    off, which float32's tolerance failed in every engine that honours the declaration.
    """
    declared = [graph.compute_data_type, *(node.compute_data_type for node in graph.nodes)]
    return {d for d in declared if d is not None and d.is_floating and d.itemsize < 4}


def tolerance_for(graph: OpGraph, tensor: TensorAttributes, *, tf32: bool = False) -> Tolerance:
    """The default tolerance for one output of a (possibly multi-node) graph.

    Errors of earlier nodes flow into later ones (conv -> bias -> relu), so this takes the
    loosest default over every node of the graph, for the output's data type, for the data
    type of every virtual intermediate (an engine may round intermediates to it) and for a
    compute type narrower than float32 that the graph or a node declares (half, bfloat16: an
    engine computes in it, as cuDNN does). ``tf32``: see :func:`default_tolerance`.
    """
    if tensor.data_type is not None and not tensor.data_type.is_floating:
        return _EXACT
    dtypes = {tensor.data_type or DataType.FLOAT}
    dtypes |= {
        t.data_type
        for t in graph.tensors
        if t.is_virtual and t.data_type is not None and t.data_type.is_floating
    }
    dtypes |= _narrow_compute_types(graph)
    tol = _EXACT
    for node in graph.nodes:
        for dtype in dtypes:
            tol = tol.loosest(
                default_tolerance(
                    dtype, node.kind, reduction_length=reduction_length(node), tf32=tf32
                )
            )
    return tol


def _rms_excess(
    diff: torch.Tensor, expected: torch.Tensor, finite: torch.Tensor, tolerance: Tolerance
) -> str | None:
    """Why the output fails as a whole (:attr:`Tolerance.rms_rtol`), or None when it passes."""
    count = int(finite.sum())
    if count == 0:
        return None
    zero = torch.zeros((), dtype=diff.dtype, device=diff.device)
    err = math.sqrt(float(torch.where(finite, diff, zero).square().sum()) / count)
    ref = math.sqrt(float(torch.where(finite, expected, zero).square().sum()) / count)
    # the RMS of a few elements is a noisy estimate of the rounding's spread: honest rounding of
    # a 2-element output read 0.45 % where a large one reads 0.1 %; so the bound widens by
    # three standard errors of such an estimate (about 1/sqrt(n) relative), nothing for large
    # outputs, while a wrong scale (10 % and more) still fails at any size. A floor far below
    # any element-wise atol: an all-zero reference still compares.
    allowed = tolerance.rms_rtol * ref * (1.0 + 3.0 / math.sqrt(count))
    if err <= allowed + max(tolerance.rms_atol, 1e-3 * tolerance.atol):
        return None
    return (
        f"every element is within atol + rtol * |expected| (rtol {tolerance.rtol:g}, atol "
        f"{tolerance.atol:g}), but the output as a whole is off: the RMS of the error is "
        f"{err:.3g}, {100.0 * err / ref if ref else math.inf:.2f} % of the reference's RMS "
        f"{ref:.3g} (at most {100.0 * allowed / ref if ref else 0.0:.2g} % allowed over "
        f"{count} element(s)); a systematic error (a "
        "wrong scale, shift or formula) that the long-reduction atol hides"
    )


def compare(
    actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance | None = None
) -> Comparison:
    """Compare an engine's output with the reference, element by element, in float64.

    NaN matches only NaN, and an infinity only the same infinity: NaN (or inf) where the
    reference is finite is a mismatch. With a finite ``tolerance.rms_rtol`` (16-bit and fp8
    outputs) the output must also match as a whole: the RMS of the error over the finite
    elements at most ``rms_rtol`` times the reference's RMS. Element by element, the atol of a
    long reduction grows past what a wrong softmax scale or a 10 % gain needs to hide (bf16 at
    K = 14336); honest rounding stays far inside this bound (bfloat16: about 0.3 % of 3 %).

    Args:
        actual: the engine's output (any dtype and device; moved to ``expected``'s device).
        expected: the reference output.
        tolerance: the tolerance; defaults to :func:`default_tolerance` of ``actual``'s dtype.

    Returns:
        A :class:`Comparison`; its message names the worst element when it fails.
    """
    if tolerance is None:
        try:
            tolerance = default_tolerance(DataType.from_torch(actual.dtype))
        except ValueError:
            tolerance = default_tolerance(DataType.FLOAT)
    rtol, atol = tolerance.rtol, tolerance.atol
    total = expected.numel()
    if tuple(actual.shape) != tuple(expected.shape):
        return Comparison(
            False,
            math.inf,
            math.inf,
            total,
            f"shape {list(actual.shape)} differs from the reference's {list(expected.shape)}; "
            "the output buffer does not have the tensor's dims",
            total,
        )
    if total == 0:
        return Comparison(True, 0.0, 0.0, 0, "match: no elements to compare", 0)
    e = expected.detach().to(torch.float64)
    a = actual.detach().to(device=e.device, dtype=torch.float64)
    diff = (a - e).abs()
    finite = torch.isfinite(a) & torch.isfinite(e)
    same_special = (torch.isnan(a) & torch.isnan(e)) | (torch.isinf(a) & (a == e))
    bad = ~same_special & ~(finite & (diff <= atol + rtol * e.abs()))
    mismatches = int(bad.sum())
    nonfinite_bad = int((bad & ~finite).sum())

    zero = torch.zeros((), dtype=torch.float64, device=e.device)
    max_abs = float(torch.where(finite, diff, zero).max())
    rel_mask = finite & (e.abs() > max(atol, 0.0))
    max_rel = float(torch.where(rel_mask, diff / e.abs().clamp_min(1e-300), zero).max())
    if nonfinite_bad:
        max_abs = math.inf
    where = f"rtol {rtol:g}, atol {atol:g}"
    if not mismatches and math.isfinite(tolerance.rms_rtol):
        off = _rms_excess(diff, e, finite, tolerance)
        if off is not None:
            return Comparison(False, max_abs, max_rel, 0, off, total)  # no element fails alone
    if not mismatches:
        # the errors are over the finite elements: say how many were NaN or inf in both, so
        # that "max abs error 0" over an output of NaNs reads as what it is (new-user audit)
        special = int(same_special.sum())
        also = f"; {special} of them NaN or inf in both, compared by kind" if special else ""
        return Comparison(
            True,
            max_abs,
            max_rel,
            0,
            f"match: max abs error {max_abs:.3g}, max rel error {max_rel:.3g} over {total} "
            f"elements ({where}){also}",
            total,
        )
    excess = torch.where(finite, diff - (atol + rtol * e.abs()), torch.full_like(e, math.inf))
    excess = torch.where(bad, excess, torch.full_like(e, -math.inf))
    flat = int(excess.argmax())
    index = _unravel(flat, tuple(e.shape))
    message = (
        f"{mismatches} of {total} elements differ by more than atol + rtol * |expected| "
        f"({where}); worst at index {list(index)}: got {float(a[index]):.6g}, expected "
        f"{float(e[index]):.6g}"
    )
    if nonfinite_bad:
        message += f"; {nonfinite_bad} non-finite value(s) (NaN/inf) where the reference differs"
    message += (
        "; the output is wrong for this tolerance: check the engine, or loosen the "
        "tolerance if the data type or a knob (TF32) warrants it"
    )
    return Comparison(False, max_abs, max_rel, mismatches, message, total)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index of element ``flat`` of a contiguous ``shape`` (``torch.unravel_index`` imports
    sympy on first use: half a second, inside a candidate's verification deadline)."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size) if size else (flat, 0)
        index.append(i)
    return tuple(reversed(index))
