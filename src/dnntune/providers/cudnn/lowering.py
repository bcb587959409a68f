"""Lowering a dnntune OpGraph to a cuDNN frontend graph (``cudnn.pygraph``).

Every non-virtual tensor keeps its dnntune uid as its cuDNN uid, so an execute needs no
remapping: the variant pack is ``{uid: data_ptr}``. Pass-by-value scalars (epsilon, a constant
operand) become cuDNN pass-by-value tensors whose value lives in a small host tensor that the
lowered graph keeps alive.

cuDNN wants operands of one operation to have the same rank; dnntune broadcasts NumPy-style,
so lower-rank operands get leading size-1 dims (the same memory, the same meaning). Row-wise
norms are lowered as cuDNN's ``[rows, features, 1, 1]`` layout, which needs row-major tensors.

The static part of support checking (op kinds, modes, layouts) lives in ``support``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dnntune.graph.node import Node, OpKind
from dnntune.graph.ops.conv import ConvMode
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import DataType, NormFwdPhase, PointwiseMode, ReductionMode
from dnntune.providers.cudnn._runtime import cudnn_data_type
from dnntune.providers.cudnn.alignment import byte_spans
from dnntune.providers.cudnn.support import POINTWISE_METHODS, unsupported_reason

if TYPE_CHECKING:
    import torch

    from dnntune.graph.ir import OpGraph

__all__ = ["LoweredGraph", "LoweringError", "lower_graph", "uid_signature"]

#: the fewest dims a tensor is lowered with (leading size-1 dims are added). cuDNN's matmul
#: needs a batch dim; and on cuDNN 9.19 (H200) a pointwise-only graph of 2-D tensors built and
#: ran but gave wrong answers, while the same graph at 3-D was exact (and at 4-D declined)
MIN_RANK = 3

_REDUCTION_NAMES: dict[ReductionMode, str] = {
    ReductionMode.ADD: "ADD",
    ReductionMode.MUL: "MUL",
    ReductionMode.MAX: "MAX",
    ReductionMode.MIN: "MIN",
    ReductionMode.AVG: "AVG",
    ReductionMode.NORM1: "NORM1",
    ReductionMode.NORM2: "NORM2",
    ReductionMode.AMAX: "AMAX",
}


class LoweringError(Exception):
    """The graph cannot be expressed as a cuDNN frontend graph (the message says why)."""


@dataclass
class LoweredGraph:
    """A cuDNN frontend graph built from an OpGraph, before validation and heuristics."""

    graph: Any
    #: uids of the caller's tensors (inputs and outputs), in the order execute reads them
    io_uids: tuple[int, ...]
    #: uid -> host tensor holding a pass-by-value scalar (kept alive with the graph)
    scalars: dict[int, torch.Tensor] = field(default_factory=dict)
    #: uid -> bytes from the tensor's first element to the end of its last (:mod:`.alignment`)
    spans: dict[int, int] = field(default_factory=dict)
    #: uids of the tensors the graph writes
    outputs: frozenset[int] = frozenset()

    def scalar_pointers(self) -> dict[int, int]:
        return {uid: t.data_ptr() for uid, t in self.scalars.items()}


# ---- lowering -------------------------------------------------------------------------------
def _padded(t: TensorAttributes, rank: int) -> tuple[list[int], list[int]]:
    """Dims and strides with leading size-1 dims up to ``rank`` (same memory, same meaning)."""
    dims, strides = list(t.dims), list(t.strides)
    if len(dims) >= rank:
        return dims, strides
    outer = max([d * s for d, s in zip(dims, strides, strict=True)] + [1])
    extra = rank - len(dims)
    return [1] * extra + dims, [outer] * extra + strides


class _Lowering:
    def __init__(self, cudnn: Any, ir: OpGraph, handle: int) -> None:
        self.cudnn = cudnn
        self.ir = ir
        self.g = cudnn.pygraph(
            name=ir.name or "dnntune",
            io_data_type=self.dt(ir.io_data_type),
            intermediate_data_type=self.dt(ir.intermediate_data_type or DataType.FLOAT),
            compute_data_type=self.dt(ir.compute_data_type or DataType.FLOAT),
            handle=handle,
        )
        #: id(IR tensor) -> (cuDNN tensor, rank it was lowered at)
        self.tensors: dict[int, tuple[Any, int]] = {}
        self.io_uids: list[int] = []
        self.outputs: set[int] = set()
        self.scalars: dict[int, torch.Tensor] = {}

    # -- tensors --
    def dt(self, data_type: DataType | None) -> Any:
        return cudnn_data_type(self.cudnn, data_type)

    def rank_of(self, t: TensorAttributes) -> int:
        known = self.tensors.get(id(t))
        return known[1] if known else len(t.dims)

    def inp(
        self,
        t: TensorAttributes,
        rank: int | None = None,
        shape: tuple[list[int], list[int]] | None = None,
    ) -> Any:
        """The cuDNN tensor for an IR input, created (at ``rank`` or ``shape``) on first use."""
        want = rank if rank is not None else (len(shape[0]) if shape else len(t.dims))
        known = self.tensors.get(id(t))
        if known is not None:
            if known[1] != want:
                raise LoweringError(
                    f"tensor {t.name!r} (uid {t.uid}) is used at ranks {known[1]} and {want}"
                )
            return known[0]
        if t.is_virtual:
            raise LoweringError(f"virtual tensor {t.name!r} is read before it is written")
        dims, strides = shape if shape is not None else _padded(t, want)
        assert t.uid is not None and t.data_type is not None
        if t.is_scalar:
            import torch

            host = torch.full((1,), t.value, dtype=t.data_type.to_torch())  # type: ignore[arg-type]
            ct = self.g.tensor(
                dim=dims,
                stride=[1] * len(dims),
                data_type=self.dt(t.data_type),
                is_pass_by_value=True,
                name=t.name or f"scalar{t.uid}",
                uid=t.uid,
            )
            self.scalars[t.uid] = host
        else:
            ct = self.g.tensor(
                dim=dims,
                stride=strides,
                data_type=self.dt(t.data_type),
                name=t.name or f"t{t.uid}",
                uid=t.uid,
            )
            self.io_uids.append(t.uid)
        self.tensors[id(t)] = (ct, want)
        return ct

    def out(
        self,
        t: TensorAttributes | None,
        ct: Any,
        rank: int,
        shape: tuple[list[int], list[int]] | None = None,
    ) -> None:
        """Bind an op's cuDNN output to the IR tensor: outputs get uid, dims, strides, type."""
        if t is None or ct is None:
            return
        assert t.data_type is not None
        if t.is_virtual:
            ct.set_data_type(self.dt(t.data_type))
        else:
            assert t.uid is not None
            dims, strides = shape if shape is not None else _padded(t, rank)
            ct.set_output(True).set_uid(t.uid).set_dim(dims).set_stride(strides)
            ct.set_data_type(self.dt(t.data_type))
            ct.set_name(t.name or f"t{t.uid}")
            self.io_uids.append(t.uid)
            self.outputs.add(t.uid)
        self.tensors[id(t)] = (ct, rank)

    def common(self, node: Node) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"name": node.name}
        if node.compute_data_type is not None:
            kwargs["compute_data_type"] = self.dt(node.compute_data_type)
        return kwargs

    # -- nodes --
    def node(self, node: Node) -> None:
        handler = {
            OpKind.CONV_FPROP: self.conv,
            OpKind.CONV_DGRAD: self.conv,
            OpKind.CONV_WGRAD: self.conv,
            OpKind.MATMUL: self.matmul,
            OpKind.POINTWISE: self.pointwise,
            OpKind.REDUCTION: self.reduction,
            OpKind.LAYERNORM: self.norm,
            OpKind.RMSNORM: self.norm,
            OpKind.BATCHNORM_INFERENCE: self.batchnorm_inference,
            OpKind.SDPA: self.sdpa,
        }.get(node.kind)
        if handler is None:
            raise LoweringError(f"CUDNN_ENGINE does not lower {node.kind.value} nodes")
        handler(node)

    def conv(self, node: Node) -> None:
        p = node.params
        kwargs = self.common(node)
        kwargs.update(
            pre_padding=list(p["pre_padding"]),
            post_padding=list(p["post_padding"]),
            stride=list(p["stride"]),
            dilation=list(p["dilation"]),
        )
        if p.get("conv_mode") is ConvMode.CONVOLUTION:
            kwargs["convolution_mode"] = self.cudnn._compiled_module.convolution_mode.CONVOLUTION
        if node.kind is OpKind.CONV_FPROP:
            x, w = node.inputs["x_tensor_uid"], node.inputs["w_tensor_uid"]
            assert x is not None and w is not None
            rank = len(x.dims)
            y = self.g.conv_fprop(self.inp(x, rank), self.inp(w, rank), **kwargs)
            self.out(node.outputs.get("y_tensor_uid"), y, rank)
            self._set_shape(node.outputs.get("y_tensor_uid"), y)
        elif node.kind is OpKind.CONV_DGRAD:
            dy, w = node.inputs["dy_tensor_uid"], node.inputs["w_tensor_uid"]
            assert dy is not None and w is not None
            rank = len(dy.dims)
            dx = self.g.conv_dgrad(self.inp(dy, rank), self.inp(w, rank), **kwargs)
            self.out(node.outputs.get("dx_tensor_uid"), dx, rank)
            self._set_shape(node.outputs.get("dx_tensor_uid"), dx)
        else:
            x, dy = node.inputs["x_tensor_uid"], node.inputs["dy_tensor_uid"]
            assert x is not None and dy is not None
            rank = len(x.dims)
            dw = self.g.conv_wgrad(self.inp(x, rank), self.inp(dy, rank), **kwargs)
            self.out(node.outputs.get("dw_tensor_uid"), dw, rank)
            self._set_shape(node.outputs.get("dw_tensor_uid"), dw)

    def _set_shape(self, t: TensorAttributes | None, ct: Any) -> None:
        """Give a virtual output explicit dims and strides (dgrad/wgrad cannot infer them)."""
        if t is not None and t.is_virtual and t.dims:
            ct.set_dim(list(t.dims)).set_stride(list(t.strides))

    def matmul(self, node: Node) -> None:
        a, b = node.inputs["a_tensor_uid"], node.inputs["b_tensor_uid"]
        c = node.outputs.get("c_tensor_uid")
        assert a is not None and b is not None
        rank = max(self.rank_of(a), self.rank_of(b), len(c.dims) if c else 0, MIN_RANK)
        out = self.g.matmul(self.inp(a, rank), self.inp(b, rank), **self.common(node))
        self.out(c, out, rank)

    def pointwise(self, node: Node) -> None:
        mode: PointwiseMode = node.params["operation"]
        fields = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")[: mode.arity]
        ins = [node.inputs[f] for f in fields]
        outt = node.outputs.get("out_0_tensor_uid")
        ranks = [self.rank_of(t) for t in ins if t is not None and not t.is_scalar]
        rank = max([*ranks, len(outt.dims) if outt else 1, MIN_RANK])
        args = [self.inp(t, rank) for t in ins if t is not None]
        kwargs = self.common(node)
        p = node.params
        if mode is PointwiseMode.RELU_FWD:
            for ours, theirs in (
                ("relu_lower_clip_slope", "negative_slope"),
                ("relu_lower_clip", "lower_clip"),
                ("relu_upper_clip", "upper_clip"),
            ):
                if p.get(ours) is not None:
                    kwargs[theirs] = float(p[ours])
        elif mode is PointwiseMode.SWISH_FWD and p.get("swish_beta") is not None:
            kwargs["swish_beta"] = float(p["swish_beta"])
        method = getattr(self.g, POINTWISE_METHODS[mode])
        result = method(*args, **kwargs)
        self.out(outt, result, rank)

    def reduction(self, node: Node) -> None:
        x, y = node.inputs["x_tensor_uid"], node.outputs.get("y_tensor_uid")
        assert x is not None and y is not None
        rank = max(self.rank_of(x), MIN_RANK)
        mode = getattr(self.cudnn.reduction_mode, _REDUCTION_NAMES[node.params["mode"]])
        out = self.g.reduction(self.inp(x, rank), mode=mode, **self.common(node))
        if y.is_virtual:
            dims, strides = _padded(y, rank)
            out.set_dim(dims).set_stride(strides)
        self.out(y, out, rank)

    def norm(self, node: Node) -> None:
        x = node.inputs["x_tensor_uid"]
        assert x is not None
        count = int(node.params.get("normalized_dim_count") or len(x.dims) - 1)
        rows = math.prod(x.dims[: len(x.dims) - count])
        feats = math.prod(x.dims[len(x.dims) - count :])
        row_shape = ([rows, feats, 1, 1], [feats, 1, feats, feats])
        param_shape = ([1, feats, 1, 1], [feats, 1, feats, feats])
        stat_shape = ([rows, 1, 1, 1], [1, 1, 1, 1])
        phase = node.params.get("forward_phase") or NormFwdPhase.INFERENCE
        cphase = (
            self.cudnn.norm_forward_phase.TRAINING
            if phase is NormFwdPhase.TRAINING
            else self.cudnn.norm_forward_phase.INFERENCE
        )
        scale = node.inputs["scale_tensor_uid"]
        bias = node.inputs.get("bias_tensor_uid")
        eps = node.inputs["epsilon_tensor_uid"]
        assert scale is not None and eps is not None
        kwargs = self.common(node)
        cx = self.inp(x, shape=row_shape)
        cscale = self.inp(scale, shape=param_shape)
        cbias = None if bias is None else self.inp(bias, shape=param_shape)
        ceps = self.inp(eps, 4)
        if node.kind is OpKind.LAYERNORM:
            assert cbias is not None
            y, mean, inv_var = self.g.layernorm(cphase, cx, cscale, cbias, ceps, **kwargs)
            self.out(node.outputs.get("mean_tensor_uid"), mean, 4, stat_shape)
            self.out(node.outputs.get("inv_variance_tensor_uid"), inv_var, 4, stat_shape)
        else:
            y, inv_rms = self.g.rmsnorm(cphase, cx, cscale, cbias, ceps, **kwargs)
            self.out(node.outputs.get("inv_rms_tensor_uid"), inv_rms, 4, stat_shape)
        self.out(node.outputs.get("y_tensor_uid"), y, 4, row_shape)

    def batchnorm_inference(self, node: Node) -> None:
        x = node.inputs["x_tensor_uid"]
        assert x is not None
        rank = len(x.dims)
        c = x.dims[1]
        channel = ([1, c] + [1] * (rank - 2), [c] + [1] * (rank - 1))
        args = [self.inp(x, rank)]
        for f in (
            "mean_tensor_uid",
            "inv_variance_tensor_uid",
            "scale_tensor_uid",
            "bias_tensor_uid",
        ):
            t = node.inputs[f]
            assert t is not None
            args.append(self.inp(t, shape=channel))
        y = self.g.batchnorm_inference(*args, **self.common(node))
        self.out(node.outputs.get("y_tensor_uid"), y, rank)

    def sdpa(self, node: Node) -> None:
        q, k, v = (node.inputs[f"{n}_tensor_uid"] for n in "qkv")
        assert q is not None and k is not None and v is not None
        p = node.params
        scale = p.get("attn_scale_value")
        if scale is None:  # PyTorch's default; cuDNN's own default would be 1.0
            scale = 1.0 / math.sqrt(q.dims[3])
        stats_t = node.outputs.get("stats_tensor_uid")
        kwargs = self.common(node)
        kwargs.update(attn_scale=float(scale), generate_stats=stats_t is not None)
        mask = node.inputs.get("attn_mask_tensor_uid")
        if mask is not None:
            kwargs["bias"] = self.inp(mask, 4)
        alignment = p.get("diagonal_alignment")
        bottom_right = bool(p.get("causal_mask_bottom_right")) or (
            bool(p.get("causal_mask"))
            and str(getattr(alignment, "name", alignment)).upper() == "BOTTOM_RIGHT"
        )
        if bottom_right:
            kwargs["diagonal_alignment"] = self.cudnn.diagonal_alignment.BOTTOM_RIGHT
            kwargs["diagonal_band_right_bound"] = 0
        elif p.get("causal_mask"):
            kwargs["diagonal_alignment"] = self.cudnn.diagonal_alignment.TOP_LEFT
            kwargs["diagonal_band_right_bound"] = 0
        o, stats = self.g.sdpa(self.inp(q, 4), self.inp(k, 4), self.inp(v, 4), **kwargs)
        self.out(node.outputs.get("o_tensor_uid"), o, 4)
        if stats_t is not None:
            self.out(stats_t, stats, 4)


def lower_graph(cudnn: Any, graph: OpGraph, handle: int) -> LoweredGraph:
    """Build the cuDNN frontend graph of ``graph`` (validated) on ``handle``.

    Raises:
        LoweringError: the graph has something cuDNN cannot express (the message says what).
    """
    reason = unsupported_reason(graph)
    if reason:
        raise LoweringError(reason)
    low = _Lowering(cudnn, graph, handle)
    for node in graph.topological_nodes():
        low.node(node)
    io_uids = tuple(dict.fromkeys(low.io_uids))
    return LoweredGraph(
        low.g, io_uids, low.scalars, byte_spans(graph, io_uids), frozenset(low.outputs)
    )


def uid_signature(graph: OpGraph) -> tuple[int | None, ...]:
    """Uids in the canonical tensor order of the graph key: two graphs with equal keys and
    equal signatures can share one lowered cuDNN graph (their variant packs match)."""
    seen: dict[int, int | None] = {}
    for node in graph.topological_nodes():
        for _, t in sorted(node.inputs.items()):
            if t is not None:
                seen.setdefault(id(t), t.uid)
        for _, t in sorted(node.outputs.items()):
            if t is not None:
                seen.setdefault(id(t), t.uid)
    return tuple(seen.values())
