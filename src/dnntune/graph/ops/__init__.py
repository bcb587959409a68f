"""The operation specs, looked up by kind or by hipDNN JSON type name."""

from __future__ import annotations

from dnntune.graph.node import OpKind
from dnntune.graph.ops.base import OpSpec, Param, ParamKind
from dnntune.graph.ops.conv import CONV_DGRAD, CONV_FPROP, CONV_WGRAD, ConvMode
from dnntune.graph.ops.elementwise import MATMUL, POINTWISE, REDUCTION, RESAMPLE
from dnntune.graph.ops.norms import (
    BATCHNORM,
    BATCHNORM_BACKWARD,
    BATCHNORM_INFERENCE,
    LAYERNORM,
    RMSNORM,
)
from dnntune.graph.ops.sdpa import SDPA

__all__ = ["ALL_SPECS", "ConvMode", "OpSpec", "Param", "ParamKind", "spec_for", "spec_for_json"]

ALL_SPECS: tuple[OpSpec, ...] = (
    CONV_FPROP,
    CONV_DGRAD,
    CONV_WGRAD,
    MATMUL,
    POINTWISE,
    REDUCTION,
    LAYERNORM,
    RMSNORM,
    BATCHNORM,
    BATCHNORM_INFERENCE,
    BATCHNORM_BACKWARD,
    SDPA,
    RESAMPLE,
)
_BY_KIND = {s.kind: s for s in ALL_SPECS}
_BY_JSON = {s.json_type: s for s in ALL_SPECS}


def spec_for(kind: OpKind) -> OpSpec:
    return _BY_KIND[kind]


def spec_for_json(json_type: str) -> OpSpec | None:
    return _BY_JSON.get(json_type)
