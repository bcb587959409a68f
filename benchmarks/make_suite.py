"""Regenerate the performance suite in benchmarks/suite/ (and its README) with the builder API.

Every graph is a real layer of a well-known network at a realistic batch or token count, in
the precision it is run in (fp16 or bf16 I/O, fp32 accumulation). The files are hipDNN's graph
JSON plus one extra top-level key, ``comment``, that names the source of the shape (hipDNN's
reader and dnntune's ignore keys they do not know); the README table repeats it with the
citation. Sizes are chosen so that the whole suite runs in one ~8-minute call of
``benchmarks/run.py`` on an H200 and no graph needs more than a few GiB.

    python benchmarks/make_suite.py            # writes benchmarks/suite/*.json and README.md
    python benchmarks/make_suite.py --check    # exit 1 if the committed files are stale
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dnntune as dt
from dnntune.graph import channels_last_strides

F32, F16, BF16 = dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16
OUT_DIR = Path(__file__).resolve().parent / "suite"
_DTYPE_TAG = {F16: "fp16", BF16: "bf16"}

# Citations used by several entries (the README prints them in full once).
BENCHDNN_R50 = "oneDNN benchdnn `tests/benchdnn/inputs/conv/shapes_resnet_50`"
DEEPBENCH_CONV = "DeepBench `code/kernels/conv_problems.h` (training set, ResNet rows)"
TORCHVISION_R50 = "torchvision `models/resnet.py` (ResNet-50 v1.5)"
BERT_LARGE = "BERT-large (Devlin et al. 2019: hidden 1024, 16 heads, FFN 4096), batch 8 x seq 512"
ROCBLAS_BERT = "rocBLAS `scripts/performance/assorted-sizes/sgemm_bert_assorted.sh`"
TB_LLAMA = "tritonbench `tritonbench/data/llama.py` (K, N) pairs"
LLAMA2_7B = "LLaMA-2-7B `config.json` (hidden 4096, intermediate 11008, 32 heads, D 128)"
LLAMA3_8B = "Llama-3-8B `config.json` (hidden 4096, intermediate 14336, 32 q / 8 kv heads)"
FA2_BENCH = (
    "FlashAttention-2 `benchmarks/benchmark_flash_attention.py` seqlens 2k/4k/8k at D 128 "
    "(it runs 16k tokens x 16 heads; 8k tokens x 32 heads here is the same B*H*S)"
)
TB_RMS = "tritonbench `operators/rms_norm/operator.py` (H 1024..32768)"
TB_LN = "tritonbench `operators/layer_norm/operator.py` (M 4096, N 512*i; `--quack-shapes`)"


@dataclass(frozen=True)
class Entry:
    file: str
    op: str
    shape: str
    source: str
    build: Callable[[], dt.Graph]


def _graph(name: str, io: dt.DataType) -> dt.Graph:
    return dt.Graph(name=name, io_data_type=io, compute_data_type=F32, intermediate_data_type=F32)


def _bshd(b: int, s: int, h: int, d: int) -> list[int]:
    """Strides of a [B, H, S, D] view of a [B, S, H, D] buffer (what a QKV projection makes)."""
    return [s * h * d, d, h * d, 1]


# ---- convolutions -----------------------------------------------------------------------------
def conv_bias_relu(
    name: str,
    n: int,
    c: int,
    hw: int,
    k: int,
    r: int,
    stride: int,
    pad: int,
    nhwc: bool,
    io: dt.DataType,
) -> dt.Graph:
    g = _graph(name, io)
    x_dims, w_dims = [n, c, hw, hw], [k, c, r, r]
    x = g.tensor("X", x_dims, channels_last_strides(x_dims) if nhwc else None)
    w = g.tensor("W", w_dims, channels_last_strides(w_dims) if nhwc else None)
    b = g.tensor("B", [1, k, 1, 1])
    y = g.conv_fprop(x, w, padding=pad, stride=stride, name="conv")
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD, name="bias")
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, name="relu")
    y.set_name("Y").set_output(True)
    return g


def conv_dgrad(name: str, n: int, c: int, hw: int, k: int, r: int, pad: int) -> dt.Graph:
    """dx of a stride-1 conv with C inputs, K outputs, spatial hw (NHWC, fp16)."""
    g = _graph(name, F16)
    dy_dims, w_dims, dx_dims = [n, k, hw, hw], [k, c, r, r], [n, c, hw, hw]
    dy = g.tensor("DY", dy_dims, channels_last_strides(dy_dims))
    w = g.tensor("W", w_dims, channels_last_strides(w_dims))
    dx = g.conv_dgrad(dy, w, padding=pad, stride=1, dx_dims=dx_dims, name="dgrad")
    dx.set_name("DX").set_output(True).set_strides(channels_last_strides(dx_dims))
    return g


def conv_wgrad(name: str, n: int, c: int, hw: int, k: int, r: int, pad: int) -> dt.Graph:
    """dw of a stride-1 conv with C inputs, K outputs, spatial hw (NHWC, fp16)."""
    g = _graph(name, F16)
    dy_dims, x_dims, dw_dims = [n, k, hw, hw], [n, c, hw, hw], [k, c, r, r]
    dy = g.tensor("DY", dy_dims, channels_last_strides(dy_dims))
    x = g.tensor("X", x_dims, channels_last_strides(x_dims))
    dw = g.conv_wgrad(dy, x, padding=pad, stride=1, dw_dims=dw_dims, name="wgrad")
    dw.set_name("DW").set_output(True).set_strides(channels_last_strides(dw_dims))
    return g


# ---- GEMMs ------------------------------------------------------------------------------------
def linear(
    name: str,
    m: int,
    k: int,
    n: int,
    io: dt.DataType,
    bias: bool = False,
    act: dt.PointwiseMode | None = None,
) -> dt.Graph:
    """x [M, K] @ W^T where W is an nn.Linear weight [N, K] (seen as [K, N], strides [1, K])."""
    g = _graph(name, io)
    a = g.tensor("X", [m, k])
    w = g.tensor("W", [k, n], [1, k])
    c = g.matmul(a, w, name="matmul")
    if bias:
        c = g.pointwise(c, g.tensor("B", [1, n]), mode=dt.PointwiseMode.ADD, name="bias")
    if act is dt.PointwiseMode.SWISH_FWD:
        c = g.pointwise(c, mode=act, swish_beta=1.0, name="silu")
    elif act is not None:
        c = g.pointwise(c, mode=act, name=act.json_name)
    c.set_name("Y").set_output(True)
    return g


# ---- attention, norms, batch norm, pooling ----------------------------------------------------
def sdpa(name: str, b: int, hq: int, hkv: int, s: int, d: int, causal: bool) -> dt.Graph:
    g = _graph(name, BF16)
    q = g.tensor("Q", [b, hq, s, d], _bshd(b, s, hq, d))
    k = g.tensor("K", [b, hkv, s, d], _bshd(b, s, hkv, d))
    v = g.tensor("V", [b, hkv, s, d], _bshd(b, s, hkv, d))
    (o,) = g.sdpa(q, k, v, causal_mask=causal, attn_scale=1.0 / math.sqrt(d), name="sdpa")
    o.set_name("O").set_output(True).set_strides(_bshd(b, s, hq, d))
    return g


def rmsnorm(name: str, m: int, n: int, eps: float) -> dt.Graph:
    g = _graph(name, BF16)
    x = g.tensor("X", [m, n])
    (y,) = g.rmsnorm(x, g.tensor("SCALE", [1, n]), epsilon=eps, name="rmsnorm")
    y.set_name("Y").set_output(True)
    return g


def layernorm(name: str, m: int, n: int, eps: float) -> dt.Graph:
    g = _graph(name, BF16)
    x = g.tensor("X", [m, n])
    scale, bias = g.tensor("SCALE", [1, n]), g.tensor("BIAS", [1, n])
    (y,) = g.layernorm(x, scale, bias, epsilon=eps, name="layernorm")
    y.set_name("Y").set_output(True)
    return g


def bn_inference(name: str, n: int, c: int, hw: int) -> dt.Graph:
    """fp16 NHWC activations; per-channel statistics in fp32, as cuDNN's BN API takes them."""
    g = _graph(name, F16)
    x_dims = [n, c, hw, hw]
    x = g.tensor("X", x_dims, channels_last_strides(x_dims))
    stats = [
        g.tensor(s, [1, c, 1, 1], data_type=F32) for s in ("MEAN", "INV_VARIANCE", "SCALE", "BIAS")
    ]
    y = g.batchnorm_inference(x, *stats, name="bn")
    y.set_name("Y").set_output(True)
    return g


def pool(
    name: str, n: int, c: int, hw: int, mode: dt.ResampleMode, window: int, stride: int, pad: int
) -> dt.Graph:
    g = _graph(name, F16)
    x_dims = [n, c, hw, hw]
    x = g.tensor("X", x_dims, channels_last_strides(x_dims))
    y = g.resample(x, mode=mode, window=window, stride=stride, padding=pad, name="pool")
    y.set_name("Y").set_output(True)
    return g


# ---- the suite --------------------------------------------------------------------------------
def _conv(
    layer: str,
    c: int,
    hw: int,
    k: int,
    r: int,
    u: int,
    p: int,
    nhwc: bool,
    io: dt.DataType,
    row: int,
) -> Entry:
    layout = "nhwc" if nhwc else "nchw"
    tag = _DTYPE_TAG[io]
    name = f"resnet50_{layer}_conv{r}x{r}{'' if u == 1 else f's{u}'}_bias_relu_{layout}_{tag}"
    return Entry(
        f"conv_fprop_{name}.json",
        f"conv_fprop {r}x{r} s{u} p{p} + bias + relu, {tag}, {layout.upper()}",
        f"N 32, C {c}, {hw}x{hw}, K {k}",
        f"ResNet-50 {layer} ({BENCHDNN_R50} row {row}); batch 32",
        lambda: conv_bias_relu(name, 32, c, hw, k, r, u, p, nhwc, io),
    )


def _dgrad(layer: str, c: int, hw: int, k: int, r: int, p: int, row: int) -> Entry:
    name = f"resnet50_{layer}_conv{r}x{r}_dgrad_nhwc_fp16"
    return Entry(
        f"conv_dgrad_{name}.json",
        f"conv_dgrad {r}x{r} p{p}, fp16, NHWC",
        f"N 32, dy K {k} {hw}x{hw} -> dx C {c}",
        f"ResNet-50 {layer} backward-data ({BENCHDNN_R50} row {row}; {DEEPBENCH_CONV})",
        lambda: conv_dgrad(name, 32, c, hw, k, r, p),
    )


def _wgrad(layer: str, c: int, hw: int, k: int, r: int, p: int, row: int) -> Entry:
    name = f"resnet50_{layer}_conv{r}x{r}_wgrad_nhwc_fp16"
    return Entry(
        f"conv_wgrad_{name}.json",
        f"conv_wgrad {r}x{r} p{p}, fp16, NHWC (dw KRSC)",
        f"N 32, x C {c} {hw}x{hw}, dy K {k} -> dw [{k}, {c}, {r}, {r}]",
        f"ResNet-50 {layer} backward-weights ({BENCHDNN_R50} row {row}; {DEEPBENCH_CONV})",
        lambda: conv_wgrad(name, 32, c, hw, k, r, p),
    )


def _gemm(
    name: str,
    m: int,
    k: int,
    n: int,
    io: dt.DataType,
    source: str,
    bias: bool = False,
    act: dt.PointwiseMode | None = None,
) -> Entry:
    epilogue = (" + bias" if bias else "") + (
        "" if act is None else " + " + ("silu" if act is dt.PointwiseMode.SWISH_FWD else "gelu")
    )
    return Entry(
        f"matmul_{name}.json",
        f"matmul (nn.Linear weight){epilogue}, {_DTYPE_TAG[io]}",
        f"M {m}, K {k}, N {n}",
        source,
        lambda: linear(name, m, k, n, io, bias, act),
    )


GELU, SILU = dt.PointwiseMode.GELU_FWD, dt.PointwiseMode.SWISH_FWD

SUITE: list[Entry] = [
    # ResNet-50 fused conv + bias + relu, batch 32 (benchdnn shapes_resnet_50 rows 1-20).
    _conv("conv1", 3, 224, 64, 7, 2, 3, True, F16, 1),
    _conv("res2a_branch2b", 64, 56, 64, 3, 1, 1, True, F16, 4),
    _conv("res2a_branch1", 64, 56, 256, 1, 1, 0, True, F16, 2),
    _conv("res3a_branch2a", 256, 56, 128, 1, 2, 0, True, F16, 7),
    _conv("res3a_branch2b", 128, 28, 128, 3, 1, 1, True, F16, 8),
    _conv("res3a_branch2c", 128, 28, 512, 1, 1, 0, True, F16, 9),
    _conv("res4a_branch2b", 256, 14, 256, 3, 1, 1, True, F16, 13),
    _conv("res4b_branch2a", 1024, 14, 256, 1, 1, 0, True, F16, 15),
    _conv("res5a_branch2b", 512, 7, 512, 3, 1, 1, True, F16, 18),
    _conv("res3a_branch2b", 128, 28, 128, 3, 1, 1, True, BF16, 8),
    _conv("res4a_branch2c", 256, 14, 1024, 1, 1, 0, True, BF16, 14),
    _conv("res2a_branch2b", 64, 56, 64, 3, 1, 1, False, F16, 4),
    _conv("res4a_branch2b", 256, 14, 256, 3, 1, 1, False, BF16, 13),
    # Backward convolutions (fp16 NHWC).
    _dgrad("res2a_branch2b", 64, 56, 64, 3, 1, 4),
    _dgrad("res3a_branch2b", 128, 28, 128, 3, 1, 8),
    _dgrad("res4a_branch2c", 256, 14, 1024, 1, 0, 14),
    _wgrad("res2b_branch2a", 256, 56, 64, 1, 0, 5),
    _wgrad("res3a_branch2b", 128, 28, 128, 3, 1, 8),
    # BERT-large encoder GEMMs (fp16), M = batch 8 x seq 512 = 4096 tokens.
    _gemm(
        "bert_large_qkv_m4096_k1024_n3072_bias_fp16",
        4096,
        1024,
        3072,
        F16,
        f"{BERT_LARGE}: fused QKV projection (3 x 1024)",
        bias=True,
    ),
    _gemm(
        "bert_large_ffn_up_m4096_k1024_n4096_bias_gelu_fp16",
        4096,
        1024,
        4096,
        F16,
        f"{BERT_LARGE}: FFN up ({ROCBLAS_BERT}: N N 4096 4096 1024)",
        bias=True,
        act=GELU,
    ),
    _gemm(
        "bert_large_ffn_down_m4096_k4096_n1024_bias_fp16",
        4096,
        4096,
        1024,
        F16,
        f"{BERT_LARGE}: FFN down ({ROCBLAS_BERT}: N T 1024 4096 4096)",
        bias=True,
    ),
    # LLaMA prefill GEMMs (bf16).
    _gemm(
        "llama2_7b_qkv_m2048_k4096_n12288_bf16",
        2048,
        4096,
        12288,
        BF16,
        f"{LLAMA2_7B}: fused wqkv, 2048-token prefill ({TB_LLAMA}: K 4096, N 12288)",
    ),
    _gemm(
        "llama2_7b_ffn_gate_m2048_k4096_n11008_silu_bf16",
        2048,
        4096,
        11008,
        BF16,
        f"{LLAMA2_7B}: FFN gate w1 + SiLU, 2048-token prefill ({TB_LLAMA}: K 4096)",
        act=SILU,
    ),
    _gemm(
        "llama2_7b_ffn_down_m2048_k11008_n4096_bf16",
        2048,
        11008,
        4096,
        BF16,
        f"{LLAMA2_7B}: FFN down w2, 2048-token prefill ({TB_LLAMA}: K 11008, N 4096)",
    ),
    _gemm(
        "llama3_8b_ffn_gate_m4096_k4096_n14336_silu_bf16",
        4096,
        4096,
        14336,
        BF16,
        f"{LLAMA3_8B}: FFN gate + SiLU, 4096-token prefill",
        act=SILU,
    ),
    _gemm(
        "llama3_8b_ffn_down_m4096_k14336_n4096_bf16",
        4096,
        14336,
        4096,
        BF16,
        f"{LLAMA3_8B}: FFN down, 4096-token prefill",
    ),
    # LLaMA decode GEMMs (bf16): M = batch of sequences, one token each.
    _gemm(
        "llama2_7b_decode_o_proj_m1_k4096_n4096_bf16",
        1,
        4096,
        4096,
        BF16,
        f"{LLAMA2_7B}: attention wo, decode batch 1 ({TB_LLAMA}: K 4096, N 4096, BS 1)",
    ),
    _gemm(
        "llama2_7b_decode_ffn_gate_m8_k4096_n11008_silu_bf16",
        8,
        4096,
        11008,
        BF16,
        f"{LLAMA2_7B}: FFN gate + SiLU, decode batch 8",
        act=SILU,
    ),
    _gemm(
        "llama2_7b_decode_ffn_down_m16_k11008_n4096_bf16",
        16,
        11008,
        4096,
        BF16,
        f"{LLAMA2_7B}: FFN down, decode batch 16 ({TB_LLAMA}: K 11008, N 4096, BS 16)",
    ),
    _gemm(
        "llama3_8b_decode_ffn_gate_m32_k4096_n14336_silu_bf16",
        32,
        4096,
        14336,
        BF16,
        f"{LLAMA3_8B}: FFN gate + SiLU, decode batch 32",
        act=SILU,
    ),
    _gemm(
        "llama3_8b_decode_qkv_m32_k4096_n6144_bf16",
        32,
        4096,
        6144,
        BF16,
        f"{LLAMA3_8B}: fused wqkv (4096 + 2 x 1024), decode batch 32",
    ),
    # Attention (bf16; q/k/v/o are [B, S, H, D] buffers seen as [B, H, S, D]).
    Entry(
        "sdpa_bert_large_b8_h16_s512_d64_bf16.json",
        "sdpa, non-causal, bf16",
        "B 8, H 16, S 512, D 64",
        f"{BERT_LARGE} self-attention",
        lambda: sdpa("bert_large_sdpa_b8_h16_s512_d64", 8, 16, 16, 512, 64, causal=False),
    ),
    Entry(
        "sdpa_llama2_7b_causal_b4_h32_s2048_d128_bf16.json",
        "sdpa, causal, bf16",
        "B 4, H 32, S 2048, D 128",
        f"{LLAMA2_7B}; {FA2_BENCH}",
        lambda: sdpa("llama2_7b_sdpa_causal_b4_s2048", 4, 32, 32, 2048, 128, causal=True),
    ),
    Entry(
        "sdpa_llama2_7b_causal_b2_h32_s4096_d128_bf16.json",
        "sdpa, causal, bf16",
        "B 2, H 32, S 4096, D 128",
        f"{LLAMA2_7B}; {FA2_BENCH}",
        lambda: sdpa("llama2_7b_sdpa_causal_b2_s4096", 2, 32, 32, 4096, 128, causal=True),
    ),
    Entry(
        "sdpa_llama2_7b_causal_b1_h32_s8192_d128_bf16.json",
        "sdpa, causal, bf16",
        "B 1, H 32, S 8192, D 128",
        f"{LLAMA2_7B}; {FA2_BENCH}",
        lambda: sdpa("llama2_7b_sdpa_causal_b1_s8192", 1, 32, 32, 8192, 128, causal=True),
    ),
    Entry(
        "sdpa_llama3_8b_gqa_causal_b2_hq32_hkv8_s4096_d128_bf16.json",
        "sdpa, causal, grouped-query (4 q heads per kv head), bf16",
        "B 2, Hq 32, Hkv 8, S 4096, D 128",
        f"{LLAMA3_8B}; GQA as cudnn-frontend `benchmark/attention_inference/configs/llama.py`",
        lambda: sdpa("llama3_8b_sdpa_gqa_causal_b2_s4096", 2, 32, 8, 4096, 128, causal=True),
    ),
    # Norms at LLM widths (bf16).
    Entry(
        "norm_rmsnorm_llama2_7b_m16384_n4096_bf16.json",
        "rmsnorm, eps 1e-5, bf16",
        "M 16384, N 4096",
        f"{LLAMA2_7B}: 16k tokens; {TB_RMS}",
        lambda: rmsnorm("llama2_7b_rmsnorm_m16384_n4096", 16384, 4096, 1e-5),
    ),
    Entry(
        "norm_rmsnorm_llama2_70b_m4096_n8192_bf16.json",
        "rmsnorm, eps 1e-5, bf16",
        "M 4096, N 8192",
        f"LLaMA-2-70B (hidden 8192): 4096 tokens; {TB_RMS}",
        lambda: rmsnorm("llama2_70b_rmsnorm_m4096_n8192", 4096, 8192, 1e-5),
    ),
    Entry(
        "norm_layernorm_bert_large_m65536_n1024_bf16.json",
        "layernorm, eps 1e-12, bf16",
        "M 65536, N 1024",
        "BERT-large (hidden 1024), batch 128 x seq 512; " + TB_LN,
        lambda: layernorm("bert_large_layernorm_m65536_n1024", 65536, 1024, 1e-12),
    ),
    Entry(
        "norm_layernorm_m16384_n4096_bf16.json",
        "layernorm, eps 1e-5, bf16",
        "M 16384, N 4096",
        "GPT-style hidden 4096, 16k tokens; " + TB_LN,
        lambda: layernorm("layernorm_m16384_n4096", 16384, 4096, 1e-5),
    ),
    Entry(
        "norm_layernorm_m4096_n8192_bf16.json",
        "layernorm, eps 1e-5, bf16",
        "M 4096, N 8192",
        TB_LN + " default sweep (M 4096, N 8192)",
        lambda: layernorm("layernorm_m4096_n8192", 4096, 8192, 1e-5),
    ),
    # Batch norm inference (fp16 NHWC, fp32 statistics), ResNet-50 shapes at batch 32.
    Entry(
        "batchnorm_inference_resnet50_bn_conv1_n32_c64_112x112_nhwc_fp16.json",
        "batchnorm_inference, fp16 NHWC, fp32 stats",
        "N 32, C 64, 112x112",
        f"ResNet-50 bn1 after conv1 ({TORCHVISION_R50})",
        lambda: bn_inference("resnet50_bn_conv1_n32_c64_112", 32, 64, 112),
    ),
    Entry(
        "batchnorm_inference_resnet50_res3_n32_c512_28x28_nhwc_fp16.json",
        "batchnorm_inference, fp16 NHWC, fp32 stats",
        "N 32, C 512, 28x28",
        f"ResNet-50 res3 block output bn ({TORCHVISION_R50})",
        lambda: bn_inference("resnet50_bn_res3_n32_c512_28", 32, 512, 28),
    ),
    # Pooling (fp16 NHWC).
    Entry(
        "pool_max_resnet50_pool1_3x3s2_n32_c64_112x112_nhwc_fp16.json",
        "max pooling 3x3 stride 2 pad 1, fp16 NHWC",
        "N 32, C 64, 112x112 -> 56x56",
        f"ResNet-50 maxpool after the stem ({TORCHVISION_R50}: MaxPool2d(3, 2, 1))",
        lambda: pool("resnet50_pool1_maxpool3x3s2", 32, 64, 112, dt.ResampleMode.MAXPOOL, 3, 2, 1),
    ),
    Entry(
        "pool_avg_resnet50_global_7x7_n32_c2048_nhwc_fp16.json",
        "average pooling 7x7 stride 7 (global), fp16 NHWC",
        "N 32, C 2048, 7x7 -> 1x1",
        f"ResNet-50 global average pool ({TORCHVISION_R50}: AdaptiveAvgPool2d(1))",
        lambda: pool(
            "resnet50_global_avgpool7x7",
            32,
            2048,
            7,
            dt.ResampleMode.AVGPOOL_INCLUDE_PADDING,
            7,
            7,
            0,
        ),
    ),
    Entry(
        "pool_avg_inception_v3_3x3s1_n32_c768_17x17_nhwc_fp16.json",
        "average pooling 3x3 stride 1 pad 1 (padding counted), fp16 NHWC",
        "N 32, C 768, 17x17",
        "Inception-v3 InceptionC branch_pool (torchvision `models/inception.py`: "
        "F.avg_pool2d(x, 3, 1, 1))",
        lambda: pool(
            "inception_v3_avgpool3x3s1",
            32,
            768,
            17,
            dt.ResampleMode.AVGPOOL_INCLUDE_PADDING,
            3,
            1,
            1,
        ),
    ),
]


def readme() -> str:
    lines = [
        "# Performance suite",
        "",
        "Generated by `python benchmarks/make_suite.py` with dnntune's builder API; do not edit",
        "by hand. Each file is a graph in hipDNN's JSON format with one extra top-level key,",
        "`comment`, naming the source of its shape (readers ignore keys they do not know).",
        "Run it with `python benchmarks/run.py --suite benchmarks/suite --out $OUT`.",
        "",
        "Shapes are real layers at realistic batch or token counts: ResNet-50 at batch 32",
        "(convolutions fused with their bias and ReLU, as inference runs them), BERT-large at",
        "8 x 512 tokens, LLaMA prefill at 2048-4096 tokens and decode at 1-32 sequences,",
        "attention at 8k tokens per batch. Every GEMM weight is an `nn.Linear` weight `[N, K]`",
        "seen as the `[K, N]` operand (strides `[1, K]`); attention tensors are `[B, S, H, D]`",
        "buffers seen as `[B, H, S, D]`, as a fused QKV projection leaves them.",
        "",
        f"{len(SUITE)} graphs.",
        "",
        "| file | op | shape | source / citation |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{e.file}` | {e.op} | {e.shape} | {e.source} |" for e in SUITE]
    lines += [
        "",
        "Sources:",
        "",
        f"- {BENCHDNN_R50}: the 20 distinct ResNet-50 (v1) convolution layers, mb 1 in the file;",
        "  batch 32 here (dnn-benchmarking's methodology uses N 32 for its ResNet batch-norm",
        "  example; DeepBench's ResNet rows use N 8 and 16).",
        f"- {DEEPBENCH_CONV}.",
        f"- {TORCHVISION_R50}.",
        f"- {BERT_LARGE}; {ROCBLAS_BERT} (column-major sizes).",
        f"- {TB_LLAMA}; {LLAMA2_7B}; {LLAMA3_8B}.",
        f"- {FA2_BENCH}.",
        f"- {TB_RMS}; {TB_LN}.",
        "",
    ]
    return "\n".join(lines)


def render() -> dict[str, str]:
    """File name -> text of every generated file."""
    files: dict[str, str] = {}
    for entry in SUITE:
        g = entry.build()
        g.validate()
        doc = g.to_dict()
        doc["comment"] = f"{entry.op}; {entry.shape}; source: {entry.source}"
        if entry.file in files:
            raise ValueError(f"duplicate suite file name {entry.file}")
        files[entry.file] = json.dumps(doc, indent=2) + "\n"
    files["README.md"] = readme()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    parser.add_argument("--check", action="store_true", help="only check the files are current")
    args = parser.parse_args(argv)
    files = render()
    stale = [
        name
        for name, text in files.items()
        if not (args.out / name).is_file() or (args.out / name).read_text() != text
    ]
    extra = (
        sorted(p.name for p in args.out.glob("*.json") if p.name not in files)
        if args.out.is_dir()
        else []
    )
    if args.check:
        for name in stale:
            print(f"stale: {args.out / name}")
        for name in extra:
            print(f"not generated: {args.out / name}")
        return 1 if stale or extra else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in extra:
        (args.out / name).unlink()
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
