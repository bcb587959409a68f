"""What the learned ranking sees of a graph: problem extraction, features, distance."""

from __future__ import annotations

import pytest
from learning_helpers import BF, H, conv_nhwc, layernorm, matmul

import dnntune as dt
from dnntune.backend.learned import (
    Problem,
    TensorInfo,
    device_class,
    op_class_of,
    problem_from_tensors,
    problem_of,
)
from dnntune.backend.learned.features import UNKNOWN_PENALTY, distance, features, tied_weights
from dnntune.errors import InvalidValueError
from dnntune.graph.node import OpKind


def test_matmul_problem_has_mnk_layout_dtype_and_epilogue() -> None:
    p = problem_of(matmul(8, 4096, 11008, bias=True))
    assert p.op == "matmul" and p.op_class == "matmul"
    assert p.dtype == "half"
    assert p.dims == {"m": 8, "k": 4096, "n": 11008, "batch": 1}
    assert p.flags == {"a_transposed": 0, "b_transposed": 1}  # an nn.Linear weight
    assert p.epilogue == 1


def test_conv_problem_reads_channels_last_and_sizes() -> None:
    p = problem_of(conv_nhwc(32, 64, 56, 256, 3))
    assert p.dims == {
        "n": 32,
        "c": 64,
        "h": 56,
        "w": 56,
        "k": 256,
        "r": 3,
        "s": 3,
        "groups": 1,
        "stride": 1,
    }
    assert p.flags["channels_last"] == 1
    assert p.epilogue == 0


def test_norm_sdpa_and_pooling_problems() -> None:
    norm = problem_of(layernorm(8192, 1024))
    assert (norm.op, norm.dims, norm.dtype) == (
        "layernorm",
        {"rows": 8192, "cols": 1024},
        "bfloat16",
    )

    g = dt.Graph(name="sdpa", io_data_type=BF)
    q = g.tensor(name="Q", dims=[2, 32, 512, 128])
    k = g.tensor(name="K", dims=[2, 8, 512, 128])
    v = g.tensor(name="V", dims=[2, 8, 512, 128])
    (o,) = g.sdpa(q, k, v, causal_mask=True)
    o.set_output(True)
    g.validate()
    sdpa = problem_of(g)
    assert sdpa.dims == {
        "batch": 2,
        "heads": 32,
        "kv_heads": 8,
        "seq_q": 512,
        "seq_kv": 512,
        "head_dim": 128,
    }
    assert sdpa.flags == {"causal": 1}

    pool = dt.Graph(name="pool", io_data_type=H)
    x = pool.tensor(name="X", dims=[32, 2048, 7, 7], strides=[100352, 1, 14336, 2048])
    pool.resample(
        x, mode=dt.ResampleMode.AVGPOOL_EXCLUDE_PADDING, window=[7, 7], stride=[1, 1]
    ).set_output(True)
    pool.validate()
    p = problem_of(pool)
    assert p.op_class == "pool"
    assert (p.dims["out_h"], p.dims["out_w"], p.dims["r"]) == (1, 1, 7)
    assert p.flags == {"channels_last": 1, "max_pool": 0}


def test_override_entry_tensors_give_a_partial_problem() -> None:
    p = problem_from_tensors(
        "conv_fprop",
        {
            "x_tensor_uid": TensorInfo((2, 8, 8, 8), (512, 1, 64, 8)),
            "w_tensor_uid": TensorInfo((16, 8, 3, 3), (72, 1, 24, 8)),
        },
    )
    assert p.dtype is None and p.epilogue is None  # the file does not say
    assert p.dims["k"] == 16 and p.flags["channels_last"] == 1
    with pytest.raises(InvalidValueError, match="unknown op kind"):
        problem_from_tensors("conv_sideways", {})


def test_problem_json_round_trip_and_keys() -> None:
    p = problem_of(matmul(64, 1024, 1024, bias=True))
    assert Problem.from_json(p.to_json()) == p
    half, bf16 = problem_of(matmul(64, 1024, 1024)), problem_of(matmul(64, 1024, 1024, BF))
    assert half.key() != bf16.key()  # different problems ...
    assert half.shape_key() == bf16.shape_key()  # ... of one shape (one K-fold group)
    with pytest.raises(InvalidValueError, match=r"problem\.dims\.m"):
        Problem.from_json({"op": "matmul", "dims": {"m": 0}})
    with pytest.raises(InvalidValueError, match=r"problem\.op"):
        Problem.from_json({"op": "nope"})


def test_op_classes_and_device_class() -> None:
    assert op_class_of(OpKind.CONV_WGRAD) == "conv"
    assert op_class_of(OpKind.RMSNORM) == "norm"
    assert op_class_of(OpKind.BATCHNORM_INFERENCE) == "other"
    assert device_class("NVIDIA H200") == "nvidia-h200"
    assert device_class("  ") == "unknown"


def test_features_are_log2_sizes_and_the_distance_weighs_them() -> None:
    a = features(problem_of(matmul(8, 4096, 4096)))
    b = features(problem_of(matmul(16, 4096, 4096)))
    assert a["log2_m"] == 3.0 and a["dtype"] == "half" and a["b_transposed"] == 1.0
    assert distance(a, b) == pytest.approx(1.0)  # one size 2x apart
    assert distance(a, a) == 0.0
    # a categorical mismatch costs its weight; an unknown value costs part of it
    assert distance({"op": "matmul"}, {"op": "conv_fprop"}) == pytest.approx(4.0)
    assert distance({"dtype": "half"}, {"dtype": None}) == pytest.approx(UNKNOWN_PENALTY)
    assert distance({"dtype": "half"}, {"dtype": "float"}, {"dtype": 2.0}) == pytest.approx(2.0)


def test_fused_tells_a_gemm_with_an_epilogue_from_a_plain_one() -> None:
    plain = features(problem_of(matmul(64, 4096, 4096)))
    fused = features(problem_of(matmul(64, 4096, 4096, bias=True)))
    assert plain["fused"] == 0.0 and fused["fused"] == 1.0
    # weighted like the op kind (4) and the epilogue count (1): sqrt(4**2 + 1**2)
    assert distance(plain, fused) == pytest.approx(17**0.5)
    # a fused GEMM 4x smaller in M stays nearer than the same GEMM unfused
    smaller = features(problem_of(matmul(16, 4096, 4096, bias=True)))
    assert distance(fused, smaller) < distance(fused, plain)
    # unknown epilogue (an override entry): unknown fused, half its weight
    unknown = features(Problem("matmul", "half", {"m": 64, "n": 4096, "k": 4096, "batch": 1}))
    assert unknown["fused"] is None


def test_feature_version_1_has_no_fused_feature() -> None:
    fused = problem_of(matmul(64, 4096, 4096, bias=True))
    v1 = features(fused, version=1)
    assert "fused" not in v1 and v1["epilogue"] == 1.0
    assert {**v1, "fused": 1.0} == features(fused)
    assert tied_weights({"op": 4.0, "dtype": 1.0}, 1.0) == {"op": 1.0, "fused": 1.0, "dtype": 1.0}
