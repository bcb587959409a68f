"""Which lowering function turns each operation kind into a step (one entry per OpKind)."""

from __future__ import annotations

from dnntune.graph.node import OpKind
from dnntune.providers._torch.conv import lower_conv_dgrad, lower_conv_fprop, lower_conv_wgrad
from dnntune.providers._torch.elementwise import (
    lower_matmul,
    lower_pointwise,
    lower_reduction,
)
from dnntune.providers._torch.norms import (
    lower_batchnorm,
    lower_batchnorm_backward,
    lower_batchnorm_inference,
    lower_layernorm,
    lower_rmsnorm,
)
from dnntune.providers._torch.pooling import lower_resample
from dnntune.providers._torch.program import Lowerer
from dnntune.providers._torch.sdpa import lower_sdpa

__all__ = ["LOWERERS"]

LOWERERS: dict[OpKind, Lowerer] = {
    OpKind.CONV_FPROP: lower_conv_fprop,
    OpKind.CONV_DGRAD: lower_conv_dgrad,
    OpKind.CONV_WGRAD: lower_conv_wgrad,
    OpKind.MATMUL: lower_matmul,
    OpKind.POINTWISE: lower_pointwise,
    OpKind.REDUCTION: lower_reduction,
    OpKind.RESAMPLE: lower_resample,
    OpKind.LAYERNORM: lower_layernorm,
    OpKind.RMSNORM: lower_rmsnorm,
    OpKind.BATCHNORM: lower_batchnorm,
    OpKind.BATCHNORM_INFERENCE: lower_batchnorm_inference,
    OpKind.BATCHNORM_BACKWARD: lower_batchnorm_backward,
    OpKind.SDPA: lower_sdpa,
}
