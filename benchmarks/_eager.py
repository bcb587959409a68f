"""PyTorch eager baseline: a dnntune graph turned into the torch calls a user would write.

The translator emits Python source, one line per operation, and compiles it into a function of
the graph's input tensors that returns its outputs. The code is what a PyTorch user writes for
the layer: ``F.conv2d(x, w, bias)`` then ``F.relu`` (an ``nn.Conv2d`` with bias), ``F.linear``
for an ``nn.Linear`` weight with its bias fused into the GEMM, ``F.gelu``/``F.silu``,
``F.scaled_dot_product_attention``, ``F.layer_norm``/``F.rms_norm``, ``F.batch_norm`` with
running statistics, ``F.max_pool2d``/``F.avg_pool2d``/``F.adaptive_avg_pool2d``; for
backward convolutions ``F.conv_transpose2d`` (data gradient) and the ``convolution_backward``
call autograd makes for a conv layer's weight. Tensors keep the graph's dtype and layout (a
channels-last buffer stays channels-last), so the baseline runs under the same conditions as
dnntune's plans. The source is kept (``EagerProgram.source``) so reports can show it.

What a user keeps as model state rather than computes per call (BatchNorm's running variance,
which the graph stores as an inverse standard deviation; the layer weight whose layout autograd
hands to the weight gradient) is derived once, outside the function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from _eager_ops import NotTranslatable, lit, pointwise_expr

from dnntune.graph import (
    ConvMode,
    Node,
    OpGraph,
    OpKind,
    PointwiseMode,
    ReductionMode,
    ResampleMode,
    TensorAttributes,
)

__all__ = ["BN_EPSILON", "EagerProgram", "NotTranslatable", "translate"]

#: epsilon of the BatchNorm a user would have (running_var = 1 / inv_var**2 - eps)
BN_EPSILON = 1e-5


@dataclass
class EagerProgram:
    """A graph as a plain PyTorch function: ``fn(*args(pack))`` returns the outputs in order."""

    source: str
    fn: Callable[..., tuple[torch.Tensor, ...]]
    #: uids of the graph inputs passed as the first arguments, in order
    input_uids: list[int]
    #: uids of the graph outputs, in the order ``fn`` returns them
    output_uids: list[int]
    #: values derived once from the pack (model state), passed after the inputs
    derived: list[Callable[[dict[int, torch.Tensor]], torch.Tensor]] = field(default_factory=list)

    def args(self, pack: dict[int, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The arguments of ``fn`` for a variant pack (``{uid: tensor}``)."""
        return tuple(pack[u] for u in self.input_uids) + tuple(d(pack) for d in self.derived)

    def outputs(self, results: tuple[torch.Tensor, ...]) -> dict[int, torch.Tensor]:
        return dict(zip(self.output_uids, results, strict=True))


class _Emitter:
    """Walks the graph in topological order and writes one statement per operation."""

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.params: list[str] = []
        self.derived: list[Callable[[dict[int, torch.Tensor]], torch.Tensor]] = []
        self.absorbed: set[int] = set()
        self.consumers: dict[int, list[Node]] = {}
        for node in graph.nodes:
            for t in node.inputs.values():
                if t is not None:
                    self.consumers.setdefault(id(t), []).append(node)
        for t in graph.input_tensors():
            assert t.uid is not None
            name = f"t{t.uid}"
            self.names[id(t)] = name
            self.params.append(name)

    # ---- names ----------------------------------------------------------------------------
    def ref(self, t: TensorAttributes | None) -> str:
        if t is None:
            raise NotTranslatable("missing operand")
        if t.is_scalar:
            return lit(float(t.value))  # type: ignore[arg-type]
        return self.names[id(t)]

    def bind(self, t: TensorAttributes | None, expr: str) -> None:
        if t is None:
            return
        name = f"t{t.uid}" if t.uid is not None else f"v{len(self.names)}"
        self.names[id(t)] = name
        self.lines.append(f"{name} = {expr}")

    def derive(self, name: str, fn: Callable[[dict[int, torch.Tensor]], torch.Tensor]) -> str:
        self.params.append(name)
        self.derived.append(fn)
        return name

    # ---- peepholes: what a user fuses by writing one call ---------------------------------
    def _sole_consumer(self, t: TensorAttributes | None) -> Node | None:
        if t is None or not t.is_virtual:
            return None
        users = self.consumers.get(id(t), [])
        return users[0] if len(users) == 1 else None

    def _bias_add(
        self, produced: TensorAttributes | None, bias_dims: int
    ) -> tuple[Node, str] | None:
        """The ADD node that adds a bias vector (all dims 1 but ``bias_dims``) to ``produced``."""
        node = self._sole_consumer(produced)
        if node is None or node.kind is not OpKind.POINTWISE:
            return None
        if node.params.get("operation") is not PointwiseMode.ADD:
            return None
        a, b = node.inputs.get("in_0_tensor_uid"), node.inputs.get("in_1_tensor_uid")
        other = b if a is produced else a
        if other is None or other.is_scalar or other.is_virtual or produced is None:
            return None
        if len(other.dims) != len(produced.dims):
            return None
        wanted = [
            d if i == bias_dims % len(produced.dims) else 1 for i, d in enumerate(produced.dims)
        ]
        if other.dims != wanted:
            return None
        return node, f"{self.ref(other)}.reshape(-1)"

    # ---- operations -----------------------------------------------------------------------
    def emit(self, node: Node) -> None:
        if id(node) in self.absorbed:
            return
        handler = getattr(self, f"_op_{node.kind.name.lower()}", None)
        if handler is None:
            raise NotTranslatable(f"{node.kind.value} has no eager translation")
        handler(node)

    def _conv_args(self, node: Node, n: int) -> tuple[list[int], list[int], list[int], list[int]]:
        def spatial(key: str, default: int) -> list[int]:
            value = node.params.get(key)
            return [default] * n if value is None else [int(v) for v in value]

        return (
            spatial("pre_padding", 0),
            spatial("post_padding", 0),
            spatial("stride", 1),
            spatial("dilation", 1),
        )

    def _op_conv_fprop(self, node: Node) -> None:
        x, w = node.inputs["x_tensor_uid"], node.inputs["w_tensor_uid"]
        y = node.outputs["y_tensor_uid"]
        assert x is not None and w is not None and y is not None
        n = len(x.dims) - 2
        pre, post, stride, dilation = self._conv_args(node, n)
        groups = x.dims[1] // w.dims[1]
        xs, ws = self.ref(x), self.ref(w)
        if node.params.get("conv_mode") is ConvMode.CONVOLUTION:
            ws = f"{ws}.flip({lit(list(range(2, 2 + n)))})"
        if pre != post:
            pad = [v for i in reversed(range(n)) for v in (pre[i], post[i])]
            xs, pre = f"F.pad({xs}, {lit(pad)})", [0] * n
        bias = "None"
        fused = self._bias_add(y, 1)
        if fused is not None:
            add, bias = fused
            self.absorbed.add(id(add))
            y = add.outputs["out_0_tensor_uid"]
        self.bind(
            y,
            f"F.conv{n}d({xs}, {ws}, {bias}, stride={lit(stride)}, padding={lit(pre)}, "
            f"dilation={lit(dilation)}, groups={groups})",
        )

    def _op_conv_dgrad(self, node: Node) -> None:
        dy, w = node.inputs["dy_tensor_uid"], node.inputs["w_tensor_uid"]
        dx = node.outputs["dx_tensor_uid"]
        assert dy is not None and w is not None and dx is not None
        n = len(dy.dims) - 2
        pre, post, stride, dilation = self._conv_args(node, n)
        if pre != post or node.params.get("conv_mode") is ConvMode.CONVOLUTION:
            raise NotTranslatable("dgrad with asymmetric padding or CONVOLUTION mode")
        groups = dx.dims[1] // w.dims[1]
        # The data gradient is a transposed convolution with the forward weight: what a user
        # calls for it, and what keeps a channels-last dy channels-last (torch.nn.grad's
        # conv2d_input passes an expanded dummy input, which loses the layout).
        extra = [
            dx.dims[2 + i]
            - (
                (dy.dims[2 + i] - 1) * stride[i]
                - 2 * pre[i]
                + dilation[i] * (w.dims[2 + i] - 1)
                + 1
            )
            for i in range(n)
        ]
        self.bind(
            dx,
            f"F.conv_transpose{n}d({self.ref(dy)}, {self.ref(w)}, None, stride={lit(stride)}, "
            f"padding={lit(pre)}, output_padding={lit(extra)}, groups={groups}, "
            f"dilation={lit(dilation)})",
        )

    def _op_conv_wgrad(self, node: Node) -> None:
        dy, x = node.inputs["dy_tensor_uid"], node.inputs["x_tensor_uid"]
        dw = node.outputs["dw_tensor_uid"]
        assert dy is not None and x is not None and dw is not None
        n = len(x.dims) - 2
        pre, post, stride, dilation = self._conv_args(node, n)
        if pre != post or node.params.get("conv_mode") is ConvMode.CONVOLUTION:
            raise NotTranslatable("wgrad with asymmetric padding or CONVOLUTION mode")
        groups = x.dims[1] // dw.dims[1]
        # The call autograd makes for a conv layer's weight gradient (loss.backward() is how a
        # user gets it): convolution_backward with the layer's weight, whose layout (here dw's)
        # picks the algorithm. torch.nn.grad.conv2d_weight passes a stride-0 dummy weight
        # instead, which turns a channels-last problem into an NCHW one.
        x_uid = x.uid
        dims, strides = list(dw.dims), list(dw.strides)

        def layer_weight(pack: dict[int, torch.Tensor]) -> torch.Tensor:
            like = pack[x_uid]  # type: ignore[index]
            return torch.empty_strided(dims, strides, dtype=like.dtype, device=like.device)

        weight = self.derive(f"layer_weight_{len(self.derived)}", layer_weight)
        self.bind(
            dw,
            f"torch.ops.aten.convolution_backward({self.ref(dy)}, {self.ref(x)}, {weight}, None, "
            f"{lit(stride)}, {lit(pre)}, {lit(dilation)}, False, {lit([0] * n)}, {groups}, "
            "(False, True, False))[1]",
        )

    def _op_matmul(self, node: Node) -> None:
        a, b = node.inputs["a_tensor_uid"], node.inputs["b_tensor_uid"]
        c = node.outputs["c_tensor_uid"]
        assert a is not None and b is not None and c is not None
        k, n = b.dims[-2], b.dims[-1]
        if all(d == 1 for d in b.dims[:-2]):
            # An unbatched weight: the nn.Linear call, bias fused into the GEMM when present.
            weight = f"{self.ref(b)}.mT"
            if len(b.dims) > 2:
                weight = f"{self.ref(b)}.reshape({k}, {n}).mT"
            bias = ""
            fused = self._bias_add(c, -1)
            if fused is not None:
                add, bias_expr = fused
                self.absorbed.add(id(add))
                bias = f", {bias_expr}"
                c = add.outputs["out_0_tensor_uid"]
            expr = f"F.linear({self.ref(a)}, {weight}{bias})"
            if list(c.dims) != [*a.dims[:-1], n]:  # type: ignore[union-attr]
                expr = f"{expr}.reshape({lit(c.dims)})"  # type: ignore[union-attr]
            self.bind(c, expr)
            return
        self.bind(c, f"torch.matmul({self.ref(a)}, {self.ref(b)})")

    def _op_pointwise(self, node: Node) -> None:
        mode: PointwiseMode = node.params["operation"]
        fields = ("in_0_tensor_uid", "in_1_tensor_uid", "in_2_tensor_uid")[: mode.arity]
        operands = [node.inputs.get(f) for f in fields]
        args = [self.ref(t) for t in operands]
        scalar = [t is not None and t.is_scalar for t in operands]
        out = node.outputs["out_0_tensor_uid"]
        self.bind(out, pointwise_expr(node, mode, args, scalar))

    def _op_reduction(self, node: Node) -> None:
        x, y = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
        assert x is not None and y is not None
        dims = [i for i, (a, b) in enumerate(zip(x.dims, y.dims, strict=True)) if b == 1 and a != 1]
        xs, d = self.ref(x), lit(dims)
        mode: ReductionMode = node.params["mode"]
        if not dims:
            dims_expr = {
                ReductionMode.AMAX: f"{xs}.abs()",
                ReductionMode.NORM1: f"{xs}.abs()",
                ReductionMode.NORM2: f"{xs}.abs()",
            }.get(mode, xs)
            self.bind(y, dims_expr)
            return
        expr = {
            ReductionMode.ADD: f"torch.sum({xs}, {d}, keepdim=True)",
            ReductionMode.AVG: f"torch.mean({xs}, {d}, keepdim=True)",
            ReductionMode.MAX: f"torch.amax({xs}, {d}, keepdim=True)",
            ReductionMode.MIN: f"torch.amin({xs}, {d}, keepdim=True)",
            ReductionMode.AMAX: f"torch.amax({xs}.abs(), {d}, keepdim=True)",
            ReductionMode.NORM1: f"torch.linalg.vector_norm({xs}, 1, {d}, keepdim=True)",
            ReductionMode.NORM2: f"torch.linalg.vector_norm({xs}, 2, {d}, keepdim=True)",
        }.get(mode)
        if expr is None:
            raise NotTranslatable(f"reduction mode {mode.name}")
        self.bind(y, expr)

    def _op_resample(self, node: Node) -> None:
        x, y = node.inputs["x_tensor_uid"], node.outputs["y_tensor_uid"]
        assert x is not None and y is not None
        n = len(x.dims) - 2
        if n != 2:
            raise NotTranslatable("pooling over other than 2 spatial dims")
        window = [int(v) for v in node.params.get("window") or [1] * n]
        stride = [int(v) for v in node.params.get("stride") or window]
        pre = [int(v) for v in node.params.get("pre_padding") or [0] * n]
        post = [int(v) for v in node.params.get("post_padding") or [0] * n]
        if pre != post or any(2 * p > w for p, w in zip(pre, window, strict=True)):
            raise NotTranslatable("pooling padding that torch's pooling ops do not take")
        mode: ResampleMode = node.params["mode"]
        xs = self.ref(x)
        whole = window == x.dims[2:] and stride == window and pre == [0] * n
        if mode is ResampleMode.MAXPOOL:
            expr = f"F.max_pool2d({xs}, {lit(window)}, {lit(stride)}, {lit(pre)})"
        elif whole:
            expr = f"F.adaptive_avg_pool2d({xs}, 1)"  # ResNet's global average pool
        else:
            include = mode is ResampleMode.AVGPOOL_INCLUDE_PADDING
            expr = (
                f"F.avg_pool2d({xs}, {lit(window)}, {lit(stride)}, {lit(pre)}, "
                f"count_include_pad={include})"
            )
        self.bind(y, expr)

    def _norm_shape(self, node: Node, x: TensorAttributes) -> list[int]:
        count = node.params.get("normalized_dim_count") or (len(x.dims) - 1)
        return x.dims[len(x.dims) - int(count) :]

    def _eps(self, node: Node) -> str:
        eps = node.inputs.get("epsilon_tensor_uid")
        if eps is None or not eps.is_scalar:
            raise NotTranslatable("epsilon must be a pass-by-value scalar")
        return lit(float(eps.value))  # type: ignore[arg-type]

    def _training_outputs(self, node: Node, allowed: set[str]) -> None:
        extra = [f for f, t in node.outputs.items() if t is not None and f not in allowed]
        if extra:
            raise NotTranslatable(f"{node.kind.value} training outputs {extra}")

    def _op_layernorm(self, node: Node) -> None:
        self._training_outputs(node, {"y_tensor_uid"})
        x = node.inputs["x_tensor_uid"]
        assert x is not None
        shape = lit(self._norm_shape(node, x))
        scale = f"{self.ref(node.inputs['scale_tensor_uid'])}.reshape({shape})"
        bias = f"{self.ref(node.inputs['bias_tensor_uid'])}.reshape({shape})"
        self.bind(
            node.outputs["y_tensor_uid"],
            f"F.layer_norm({self.ref(x)}, {shape}, {scale}, {bias}, eps={self._eps(node)})",
        )

    def _op_rmsnorm(self, node: Node) -> None:
        self._training_outputs(node, {"y_tensor_uid"})
        x = node.inputs["x_tensor_uid"]
        assert x is not None
        shape = lit(self._norm_shape(node, x))
        scale = f"{self.ref(node.inputs['scale_tensor_uid'])}.reshape({shape})"
        expr = f"F.rms_norm({self.ref(x)}, {shape}, {scale}, eps={self._eps(node)})"
        bias = node.inputs.get("bias_tensor_uid")
        if bias is not None:
            expr = f"{expr} + {self.ref(bias)}"
        self.bind(node.outputs["y_tensor_uid"], expr)

    def _op_batchnorm_inference(self, node: Node) -> None:
        x = node.inputs["x_tensor_uid"]
        assert x is not None
        inv = node.inputs["inv_variance_tensor_uid"]
        assert inv is not None and inv.uid is not None
        inv_uid = inv.uid

        def running_var(pack: dict[int, torch.Tensor]) -> torch.Tensor:
            inv_std = pack[inv_uid].float().reshape(-1)
            return (1.0 / inv_std.square() - BN_EPSILON).to(pack[inv_uid].dtype)

        var = self.derive(f"running_var_{len(self.derived)}", running_var)
        mean, scale, bias = (
            f"{self.ref(node.inputs[f])}.reshape(-1)"
            for f in ("mean_tensor_uid", "scale_tensor_uid", "bias_tensor_uid")
        )
        self.bind(
            node.outputs["y_tensor_uid"],
            f"F.batch_norm({self.ref(x)}, {mean}, {var}, {scale}, {bias}, training=False, "
            f"eps={BN_EPSILON!r})",
        )

    def _op_sdpa(self, node: Node) -> None:
        self._training_outputs(node, {"o_tensor_uid"})
        q, k = node.inputs["q_tensor_uid"], node.inputs["k_tensor_uid"]
        assert q is not None and k is not None
        causal = bool(node.params.get("causal_mask"))
        bottom_right = bool(node.params.get("causal_mask_bottom_right"))
        alignment = node.params.get("diagonal_alignment")
        if causal and str(getattr(alignment, "name", alignment)).upper() == "BOTTOM_RIGHT":
            causal, bottom_right = False, True
        same_len = q.dims[2] == k.dims[2]
        if bottom_right and not same_len:
            raise NotTranslatable("bottom-right causal mask with Sq != Skv")
        mask_t = node.inputs.get("attn_mask_tensor_uid")
        if (causal or bottom_right) and mask_t is not None:
            raise NotTranslatable("causal mask together with an explicit mask")
        scale = node.params.get("attn_scale_value")
        scale = 1.0 / math.sqrt(q.dims[3]) if scale is None else float(scale)
        extra = ""
        if mask_t is not None:
            extra += f", attn_mask={self.ref(mask_t)}"
        if causal or bottom_right:
            extra += ", is_causal=True"
        if q.dims[1] != k.dims[1]:
            extra += ", enable_gqa=True"
        self.bind(
            node.outputs["o_tensor_uid"],
            f"F.scaled_dot_product_attention({self.ref(q)}, {self.ref(k)}, "
            f"{self.ref(node.inputs['v_tensor_uid'])}{extra}, scale={scale!r})",
        )


def translate(graph: OpGraph) -> EagerProgram:
    """The eager PyTorch function of ``graph`` (validated here if needed).

    Raises:
        NotTranslatable: the graph uses something the translator does not express.
    """
    if not graph.is_validated:
        graph.validate()
    emitter = _Emitter(graph)
    for node in graph.topological_nodes():
        emitter.emit(node)
    outputs = graph.output_tensors()
    returns = []
    for t in outputs:
        if id(t) not in emitter.names:
            raise NotTranslatable(f"output {t.name!r} is not produced by a translated node")
        returns.append(emitter.names[id(t)])
    safe = "".join(ch if ch.isalnum() else "_" for ch in graph.name) or "graph"
    body = [*emitter.lines, f"return ({', '.join(returns)},)"]
    source = f"def eager_{safe}({', '.join(emitter.params)}):\n" + "".join(
        f"    {line}\n" for line in body
    )
    namespace: dict[str, Any] = {"torch": torch, "F": F, "math": math}
    exec(compile(source, f"<eager {graph.name}>", "exec"), namespace)
    fn = namespace[f"eager_{safe}"]
    return EagerProgram(
        source=source,
        fn=fn,
        input_uids=[int(t.uid) for t in graph.input_tensors() if t.uid is not None],
        output_uids=[int(t.uid) for t in outputs if t.uid is not None],
        derived=emitter.derived,
    )
