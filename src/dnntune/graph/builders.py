"""GraphBuilder: the cuDNN-frontend style builder methods, each adding one IR node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dnntune.errors import InvalidValueError
from dnntune.graph.builder_base import BuilderBase, Operand, pair
from dnntune.graph.node import OpKind
from dnntune.graph.ops import ConvMode
from dnntune.graph.tensor import TensorAttributes
from dnntune.graph.types import (
    DataType,
    NormFwdPhase,
    PointwiseMode,
    ReductionMode,
    ResampleMode,
    check_bool,
)

__all__ = ["GraphBuilder"]


class GraphBuilder(BuilderBase):
    """Builder methods. Each returns the new output tensor(s): virtual until ``set_output``."""

    # ---- convolution --------------------------------------------------------------------
    def conv_fprop(
        self,
        x: TensorAttributes,
        w: TensorAttributes,
        padding: int | Sequence[int] | None = None,
        stride: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] | None = None,
        *,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        conv_mode: ConvMode = ConvMode.CROSS_CORRELATION,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """Convolution forward: y = conv(x, w). Groups are inferred from ``x.C / w.dims[1]``."""
        n = max(len(x.dims) - 2, 1)
        params = self._conv_params(
            n, padding, stride, dilation, pre_padding, post_padding, conv_mode
        )
        return self._add(
            OpKind.CONV_FPROP,
            name,
            {"x_tensor_uid": x, "w_tensor_uid": w},
            ["y_tensor_uid"],
            params,
            compute_data_type,
        )[0]

    def conv_dgrad(
        self,
        dy: TensorAttributes,
        w: TensorAttributes,
        padding: int | Sequence[int] | None = None,
        stride: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] | None = None,
        *,
        dx_dims: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        conv_mode: ConvMode = ConvMode.CROSS_CORRELATION,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """Convolution data gradient: dx from dy and w.

        Pass ``dx_dims`` when stride > 1 (several input sizes give the same dy) or for grouped
        convolutions (the group count is not recoverable from dy and w alone).
        """
        n = max(len(dy.dims) - 2, 1)
        params = self._conv_params(
            n, padding, stride, dilation, pre_padding, post_padding, conv_mode
        )
        dims = None if dx_dims is None else {"dx_tensor_uid": dx_dims}
        inputs = {"dy_tensor_uid": dy, "w_tensor_uid": w}
        return self._add(
            OpKind.CONV_DGRAD,
            name,
            inputs,
            ["dx_tensor_uid"],
            params,
            compute_data_type,
            dims,
            like=dy,
        )[0]

    def conv_wgrad(
        self,
        dy: TensorAttributes,
        x: TensorAttributes,
        padding: int | Sequence[int] | None = None,
        stride: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] | None = None,
        *,
        dw_dims: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        conv_mode: ConvMode = ConvMode.CROSS_CORRELATION,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """Convolution weight gradient: dw from dy and x. Pass ``dw_dims`` for grouped convs."""
        n = max(len(x.dims) - 2, 1)
        params = self._conv_params(
            n, padding, stride, dilation, pre_padding, post_padding, conv_mode
        )
        dims = None if dw_dims is None else {"dw_tensor_uid": dw_dims}
        inputs = {"dy_tensor_uid": dy, "x_tensor_uid": x}
        return self._add(
            OpKind.CONV_WGRAD,
            name,
            inputs,
            ["dw_tensor_uid"],
            params,
            compute_data_type,
            dims,
            like=x,
        )[0]

    def _conv_params(
        self,
        n: int,
        padding: int | Sequence[int] | None,
        stride: int | Sequence[int] | None,
        dilation: int | Sequence[int] | None,
        pre_padding: Sequence[int] | None,
        post_padding: Sequence[int] | None,
        conv_mode: ConvMode,
    ) -> dict[str, Any]:
        pad = pair(padding, n, "padding")
        return {
            "conv_mode": conv_mode,
            "pre_padding": pair(pre_padding, n, "pre_padding") if pre_padding is not None else pad,
            "post_padding": pair(post_padding, n, "post_padding")
            if post_padding is not None
            else pad,
            "stride": pair(stride, n, "stride"),
            "dilation": pair(dilation, n, "dilation"),
        }

    # ---- matmul and pointwise -----------------------------------------------------------
    def matmul(
        self,
        a: TensorAttributes,
        b: TensorAttributes,
        *,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """Batched matrix multiply c = a @ b (batch dims broadcast)."""
        return self._add(
            OpKind.MATMUL,
            name,
            {"a_tensor_uid": a, "b_tensor_uid": b},
            ["c_tensor_uid"],
            {},
            compute_data_type,
        )[0]

    def pointwise(
        self,
        in_0: Operand,
        in_1: Operand | None = None,
        in_2: Operand | None = None,
        *,
        mode: PointwiseMode,
        compute_data_type: DataType | None = None,
        name: str | None = None,
        **params: float,
    ) -> TensorAttributes:
        """Elementwise op; scalars (floats) become pass-by-value tensors. Inputs broadcast."""
        node_name = name or f"pointwise_{len(self.nodes)}"
        inputs = {
            "in_0_tensor_uid": self._operand(in_0, f"{node_name}::IN_0"),
            "in_1_tensor_uid": None if in_1 is None else self._operand(in_1, f"{node_name}::IN_1"),
            "in_2_tensor_uid": None if in_2 is None else self._operand(in_2, f"{node_name}::IN_2"),
        }
        return self._add(
            OpKind.POINTWISE,
            node_name,
            inputs,
            ["out_0_tensor_uid"],
            {"operation": mode, **params},
            compute_data_type,
        )[0]

    # ---- reduction and resample ---------------------------------------------------------
    def reduction(
        self,
        x: TensorAttributes,
        *,
        mode: ReductionMode,
        axes: Sequence[int] | None = None,
        y_dims: Sequence[int] | None = None,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """Reduce ``x`` over ``axes`` (kept as size-1 dims), or to explicit ``y_dims``."""
        if y_dims is None:
            if axes is None:
                raise InvalidValueError("reduction: pass axes=[...] or y_dims=[...]")
            rank = len(x.dims)
            if any(not -rank <= a < rank for a in axes):
                raise InvalidValueError(f"reduction: axes {list(axes)} out of range for {x.dims}")
            norm_axes = {a % rank for a in axes}
            y_dims = [1 if i in norm_axes else d for i, d in enumerate(x.dims)]
        return self._add(
            OpKind.REDUCTION,
            name,
            {"x_tensor_uid": x},
            ["y_tensor_uid"],
            {"mode": mode},
            compute_data_type,
            {"y_tensor_uid": y_dims},
            like=x,
        )[0]

    def resample(
        self,
        x: TensorAttributes,
        *,
        mode: ResampleMode,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """Pooling forward (max or average) over the spatial dims.

        ``stride`` defaults to the window; padding pads with -inf for max pooling and with
        zeros for average pooling (``AVGPOOL_EXCLUDE_PADDING`` leaves them out of the count).
        """
        n = max(len(x.dims) - 2, 1)
        pad = pair(padding, n, "padding")
        params = {
            "mode": mode,
            "padding_mode": "neg_inf_pad" if mode is ResampleMode.MAXPOOL else "zero_pad",
            "window": pair(window, n, "window"),
            "stride": pair(stride if stride is not None else window, n, "stride"),
            "pre_padding": pair(pre_padding, n, "pre_padding") if pre_padding is not None else pad,
            "post_padding": pair(post_padding, n, "post_padding")
            if post_padding is not None
            else pad,
        }
        return self._add(
            OpKind.RESAMPLE, name, {"x_tensor_uid": x}, ["y_tensor_uid"], params, compute_data_type
        )[0]

    # ---- normalisation ------------------------------------------------------------------
    def layernorm(
        self,
        x: TensorAttributes,
        scale: TensorAttributes,
        bias: TensorAttributes,
        epsilon: Operand = 1e-5,
        *,
        forward_phase: NormFwdPhase = NormFwdPhase.INFERENCE,
        normalized_dim_count: int | None = None,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> list[TensorAttributes]:
        """Layer norm over the last ``normalized_dim_count`` dims (default: all but the first).

        Returns ``[y]`` for inference and ``[y, mean, inv_variance]`` for training.
        """
        node_name = name or f"layernorm_{len(self.nodes)}"
        outs = ["y_tensor_uid"]
        if forward_phase is NormFwdPhase.TRAINING:
            outs += ["mean_tensor_uid", "inv_variance_tensor_uid"]
        inputs = {
            "x_tensor_uid": x,
            "scale_tensor_uid": scale,
            "bias_tensor_uid": bias,
            "epsilon_tensor_uid": self._operand(epsilon, f"{node_name}::EPSILON"),
        }
        return self._add(
            OpKind.LAYERNORM,
            node_name,
            inputs,
            outs,
            {"forward_phase": forward_phase, "normalized_dim_count": normalized_dim_count},
            compute_data_type,
        )

    def rmsnorm(
        self,
        x: TensorAttributes,
        scale: TensorAttributes,
        epsilon: Operand = 1e-6,
        bias: TensorAttributes | None = None,
        *,
        forward_phase: NormFwdPhase = NormFwdPhase.INFERENCE,
        normalized_dim_count: int | None = None,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> list[TensorAttributes]:
        """RMS norm; returns ``[y]`` for inference and ``[y, inv_rms]`` for training."""
        node_name = name or f"rmsnorm_{len(self.nodes)}"
        outs = ["y_tensor_uid"]
        if forward_phase is NormFwdPhase.TRAINING:
            outs.append("inv_rms_tensor_uid")
        inputs = {
            "x_tensor_uid": x,
            "scale_tensor_uid": scale,
            "bias_tensor_uid": bias,
            "epsilon_tensor_uid": self._operand(epsilon, f"{node_name}::EPSILON"),
        }
        return self._add(
            OpKind.RMSNORM,
            node_name,
            inputs,
            outs,
            {"forward_phase": forward_phase, "normalized_dim_count": normalized_dim_count},
            compute_data_type,
        )

    def batchnorm(
        self,
        x: TensorAttributes,
        scale: TensorAttributes,
        bias: TensorAttributes,
        epsilon: Operand = 1e-5,
        *,
        prev_running_mean: TensorAttributes | None = None,
        prev_running_variance: TensorAttributes | None = None,
        momentum: Operand | None = None,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> list[TensorAttributes]:
        """Batch norm, training: returns ``[y, mean, inv_variance]`` plus
        ``[next_running_mean, next_running_variance]`` when running statistics are given."""
        node_name = name or f"batchnorm_{len(self.nodes)}"
        outs = ["y_tensor_uid", "mean_tensor_uid", "inv_variance_tensor_uid"]
        running = prev_running_mean is not None
        if running:
            outs += ["next_running_mean_tensor_uid", "next_running_variance_tensor_uid"]
        inputs = {
            "x_tensor_uid": x,
            "scale_tensor_uid": scale,
            "bias_tensor_uid": bias,
            "epsilon_tensor_uid": self._operand(epsilon, f"{node_name}::EPSILON"),
            "prev_running_mean_tensor_uid": prev_running_mean,
            "prev_running_variance_tensor_uid": prev_running_variance,
            "momentum_tensor_uid": None
            if momentum is None
            else self._operand(momentum, f"{node_name}::MOMENTUM"),
        }
        return self._add(OpKind.BATCHNORM, node_name, inputs, outs, {}, compute_data_type)

    def batchnorm_inference(
        self,
        x: TensorAttributes,
        mean: TensorAttributes,
        inv_variance: TensorAttributes,
        scale: TensorAttributes,
        bias: TensorAttributes,
        *,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> TensorAttributes:
        """y = (x - mean) * inv_variance * scale + bias, per channel."""
        inputs = {
            "x_tensor_uid": x,
            "mean_tensor_uid": mean,
            "inv_variance_tensor_uid": inv_variance,
            "scale_tensor_uid": scale,
            "bias_tensor_uid": bias,
        }
        return self._add(
            OpKind.BATCHNORM_INFERENCE, name, inputs, ["y_tensor_uid"], {}, compute_data_type
        )[0]

    def batchnorm_backward(
        self,
        dy: TensorAttributes,
        x: TensorAttributes,
        mean: TensorAttributes,
        inv_variance: TensorAttributes,
        scale: TensorAttributes,
        *,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> list[TensorAttributes]:
        """Batch-norm backward: returns ``[dx, dscale, dbias]``."""
        inputs = {
            "dy_tensor_uid": dy,
            "x_tensor_uid": x,
            "mean_tensor_uid": mean,
            "inv_variance_tensor_uid": inv_variance,
            "scale_tensor_uid": scale,
        }
        return self._add(
            OpKind.BATCHNORM_BACKWARD,
            name,
            inputs,
            ["dx_tensor_uid", "dscale_tensor_uid", "dbias_tensor_uid"],
            {},
            compute_data_type,
        )

    # ---- attention ----------------------------------------------------------------------
    def sdpa(
        self,
        q: TensorAttributes,
        k: TensorAttributes,
        v: TensorAttributes,
        *,
        attn_mask: TensorAttributes | None = None,
        causal_mask: bool = False,
        causal_mask_bottom_right: bool = False,
        attn_scale: float | None = None,
        generate_stats: bool = False,
        compute_data_type: DataType | None = None,
        name: str | None = None,
    ) -> list[TensorAttributes]:
        """Attention forward ``softmax(q k^T * scale + mask) v`` on [B, H, S, D] tensors.

        Key/value heads may divide query heads (grouped-query attention). Returns ``[o]``, or
        ``[o, stats]`` with ``generate_stats`` (log-sum-exp per row, float32). ``attn_scale``
        is a Python number fixed with the graph (None: ``1/sqrt(D)``); cuDNN frontend also
        takes a pass-by-value tensor there, which this graph does not (give its value).

        ``causal_mask`` keeps key ``j`` for query ``i`` where ``j <= i`` (top-left);
        ``causal_mask_bottom_right`` where ``j <= i + (s_kv - s_q)``, the diagonal ending at the
        last key. With ``s_q > s_kv`` the first ``s_q - s_kv`` query rows then see no key (as does
        a row whose every key a mask removes): such a row's output is 0 and its stats -inf, in
        ``dnntune.reference`` and every engine that runs it (TORCH_ENGINE, TORCH_COMPILE_ENGINE,
        TRITON_ENGINE). That is what ``torch.nn.functional.scaled_dot_product_attention`` gives
        since PyTorch 2.5 (checked on 2.13's CPU kernels) and what cuDNN frontend's own test
        reference computes; the plain-softmax formula in PyTorch's documentation gives NaN there
        (0/0). CUDNN_ENGINE declines bottom-right causal with ``s_q > s_kv``, or with an
        ``attn_mask`` at any lengths: cuDNN frontend refuses both (GRAPH_NOT_SUPPORTED). It
        also declines head dims that are not multiples of 8 (see
        ``dnntune.providers.cudnn.support``).

        Raises:
            InvalidTypeError: a flag that is not a bool (``causal_mask="False"``).
        """
        node = name if isinstance(name, str) and name else f"sdpa_{len(self.nodes)}"
        given = {
            "causal_mask": causal_mask,
            "causal_mask_bottom_right": causal_mask_bottom_right,
            "generate_stats": generate_stats,
        }
        # each a bool: a string such as "False" is true, and was taken as a set flag
        flags = {f: check_bool(value, f"sdpa({node!r}): {f}") for f, value in given.items()}
        outs = ["o_tensor_uid"] + (["stats_tensor_uid"] if flags["generate_stats"] else [])
        inputs = {
            "q_tensor_uid": q,
            "k_tensor_uid": k,
            "v_tensor_uid": v,
            "attn_mask_tensor_uid": attn_mask,
        }
        params: dict[str, Any] = {**flags, "attn_scale_value": attn_scale}
        return self._add(OpKind.SDPA, name, inputs, outs, params, compute_data_type)
