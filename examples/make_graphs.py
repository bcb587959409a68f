"""Regenerate the example graphs in examples/graphs/ (and their README) with the builder API.

Each graph is a real layer of a well-known network, scaled down (batch, tokens or spatial size)
so that a CPU run of the reference and the torch engine takes milliseconds. The source shape
is recorded in the README table; the JSON files are hipDNN's format, loadable by hipDNN's own
reader, so they carry no extra provenance fields.

    python examples/make_graphs.py            # writes examples/graphs/*.json and README.md
    python examples/make_graphs.py --check    # exit 1 if the committed files are stale
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dnntune as dt
from dnntune.graph import channels_last_strides

F32, F16 = dt.DataType.FLOAT, dt.DataType.HALF
OUT_DIR = Path(__file__).resolve().parent / "graphs"


@dataclass(frozen=True)
class Example:
    file: str
    ops: str
    source: str
    scaled: str
    build: Callable[[], dt.Graph]


def _graph(name: str, io: dt.DataType = F32) -> dt.Graph:
    return dt.Graph(name=name, io_data_type=io, compute_data_type=F32, intermediate_data_type=F32)


def _bshd(b: int, s: int, h: int, d: int) -> list[int]:
    """Strides of a [B, H, S, D] view of a [B, S, H, D] buffer (what a QKV projection makes)."""
    return [s * h * d, d, h * d, 1]


def _linear_weight(k: int, n: int, batch: bool = False) -> tuple[list[int], list[int]]:
    """Dims and strides of an nn.Linear weight [N, K] used as the [K, N] matmul operand."""
    if batch:
        return [1, k, n], [k * n, 1, k]
    return [k, n], [1, k]


def conv_bias_relu(
    name: str,
    x_dims: list[int],
    k: int,
    r: int,
    pad: int,
    stride: int,
    nhwc: bool,
    io: dt.DataType = F32,
) -> dt.Graph:
    g = _graph(name, io)
    n, c, _, _ = x_dims
    w_dims = [k, c, r, r]
    x = g.tensor("X", x_dims, channels_last_strides(x_dims) if nhwc else None)
    w = g.tensor("W", w_dims, channels_last_strides(w_dims) if nhwc else None)
    b = g.tensor("B", [1, k, 1, 1])
    y = g.conv_fprop(x, w, padding=pad, stride=stride, name="conv")
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD, name="bias")
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, name="relu")
    y.set_name("Y").set_output(True)
    del n
    return g


def conv_dgrad() -> dt.Graph:
    g = _graph("resnet50_res3a_branch2b_dgrad")
    dy = g.tensor("DY", [1, 128, 7, 7])
    w = g.tensor("W", [128, 128, 3, 3])
    dx = g.conv_dgrad(dy, w, padding=1, stride=1, dx_dims=[1, 128, 7, 7], name="dgrad")
    dx.set_name("DX").set_output(True)
    return g


def conv_wgrad() -> dt.Graph:
    g = _graph("resnet50_res2b_branch2a_wgrad")
    dy = g.tensor("DY", [2, 64, 14, 14])
    x = g.tensor("X", [2, 256, 14, 14])
    dw = g.conv_wgrad(dy, x, padding=0, stride=1, dw_dims=[64, 256, 1, 1], name="wgrad")
    dw.set_name("DW").set_output(True)
    return g


def depthwise_relu6() -> dt.Graph:
    g = _graph("mobilenetv2_block2_depthwise3x3_s2_relu6")
    x_dims, w_dims = [1, 96, 14, 14], [96, 1, 3, 3]
    x = g.tensor("X", x_dims, channels_last_strides(x_dims))
    w = g.tensor("W", w_dims, channels_last_strides(w_dims))
    y = g.conv_fprop(x, w, padding=1, stride=2, name="depthwise")
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, relu_upper_clip=6.0, name="relu6")
    y.set_name("Y").set_output(True)
    return g


def bert_ffn() -> dt.Graph:
    g = _graph("bert_base_ffn_up_matmul_bias_gelu")
    tokens, hidden, ffn = 4, 768, 3072
    a = g.tensor("X", [1, tokens, hidden])
    b_dims, b_strides = _linear_weight(hidden, ffn, batch=True)
    b = g.tensor("W", b_dims, b_strides)
    bias = g.tensor("B", [1, 1, ffn])
    c = g.matmul(a, b, name="matmul")
    c = g.pointwise(c, bias, mode=dt.PointwiseMode.ADD, name="bias")
    c = g.pointwise(c, mode=dt.PointwiseMode.GELU_FWD, name="gelu")
    c.set_name("Y").set_output(True)
    return g


def llama_skinny() -> dt.Graph:
    g = _graph("llama_decode_skinny_matmul_m4_k1024_n1024")
    a = g.tensor("X", [4, 1024])
    b_dims, b_strides = _linear_weight(1024, 1024)
    b = g.tensor("W", b_dims, b_strides)
    c = g.matmul(a, b, name="matmul")
    c.set_name("Y").set_output(True)
    return g


def sdpa(name: str, b: int, hq: int, hkv: int, s: int, d: int, causal: bool) -> dt.Graph:
    g = _graph(name)
    q = g.tensor("Q", [b, hq, s, d], _bshd(b, s, hq, d))
    k = g.tensor("K", [b, hkv, s, d], _bshd(b, s, hkv, d))
    v = g.tensor("V", [b, hkv, s, d], _bshd(b, s, hkv, d))
    (o,) = g.sdpa(q, k, v, causal_mask=causal, attn_scale=1.0 / math.sqrt(d), name="sdpa")
    o.set_name("O").set_output(True)
    return g


def rmsnorm() -> dt.Graph:
    g = _graph("llama_rmsnorm_m64_h4096")
    x = g.tensor("X", [64, 4096])
    scale = g.tensor("SCALE", [1, 4096])
    (y,) = g.rmsnorm(x, scale, epsilon=1e-6, name="rmsnorm")
    y.set_name("Y").set_output(True)
    return g


def layernorm() -> dt.Graph:
    g = _graph("bert_base_layernorm_s128_h768")
    x = g.tensor("X", [1, 128, 768])
    scale = g.tensor("SCALE", [1, 1, 768])
    bias = g.tensor("BIAS", [1, 1, 768])
    (y,) = g.layernorm(x, scale, bias, epsilon=1e-12, name="layernorm")
    y.set_name("Y").set_output(True)
    return g


def bn_inference() -> dt.Graph:
    g = _graph("resnet50_bn_inference_n2_c64_28x28")
    x = g.tensor("X", [2, 64, 28, 28])
    stats = [g.tensor(n, [1, 64, 1, 1]) for n in ("MEAN", "INV_VARIANCE", "SCALE", "BIAS")]
    y = g.batchnorm_inference(x, *stats, name="bn")
    y.set_name("Y").set_output(True)
    return g


def maxpool() -> dt.Graph:
    g = _graph("resnet50_stem_maxpool3x3_s2")
    x = g.tensor("X", [1, 64, 28, 28])
    y = g.resample(x, mode=dt.ResampleMode.MAXPOOL, window=3, stride=2, padding=1, name="pool")
    y.set_name("Y").set_output(True)
    return g


def avgpool() -> dt.Graph:
    g = _graph("inception_v3_mixed_avgpool3x3_s1_exclude_pad")
    x = g.tensor("X", [1, 768, 8, 8])
    y = g.resample(
        x, mode=dt.ResampleMode.AVGPOOL_EXCLUDE_PADDING, window=3, stride=1, padding=1, name="pool"
    )
    y.set_name("Y").set_output(True)
    return g


def global_avg_reduction() -> dt.Graph:
    g = _graph("resnet50_global_average_reduction")
    x = g.tensor("X", [1, 2048, 7, 7])
    y = g.reduction(x, mode=dt.ReductionMode.AVG, axes=[2, 3], name="mean_hw")
    y.set_name("Y").set_output(True)
    return g


def swiglu() -> dt.Graph:
    g = _graph("llama_ffn_swiglu_pointwise_m16_n11008")
    gate = g.tensor("GATE", [16, 11008])
    up = g.tensor("UP", [16, 11008])
    act = g.pointwise(gate, mode=dt.PointwiseMode.SWISH_FWD, swish_beta=1.0, name="silu")
    y = g.pointwise(act, up, mode=dt.PointwiseMode.MUL, name="gate_mul")
    y.set_name("Y").set_output(True)
    return g


EXAMPLES = [
    Example(
        "resnet50_conv3x3_bias_relu_nchw.json",
        "conv_fprop 3x3 p1 + bias + relu, fp32, NCHW",
        "ResNet-50 res2a_branch2b: N 32, C 64, 56x56, K 64 (oneDNN benchdnn shapes_resnet_50 #4)",
        "N 1, 14x14",
        lambda: conv_bias_relu(
            "resnet50_res2a_branch2b_conv_bias_relu_nchw", [1, 64, 14, 14], 64, 3, 1, 1, nhwc=False
        ),
    ),
    Example(
        "resnet50_conv3x3_bias_relu_nhwc.json",
        "the same, NHWC activations and KRSC weights (layout in the strides)",
        "ResNet-50 res2a_branch2b",
        "N 1, 14x14",
        lambda: conv_bias_relu(
            "resnet50_res2a_branch2b_conv_bias_relu_nhwc", [1, 64, 14, 14], 64, 3, 1, 1, nhwc=True
        ),
    ),
    Example(
        "resnet50_conv1x1_s2_bias_relu_nhwc_fp16.json",
        "conv_fprop 1x1 stride 2 + bias + relu, fp16 I/O, fp32 compute, NHWC",
        "ResNet-50 res3a_branch2a: C 256, 56x56, K 128, stride 2 (benchdnn #7)",
        "N 1, 16x16",
        lambda: conv_bias_relu(
            "resnet50_res3a_branch2a_conv_bias_relu_nhwc_fp16",
            [1, 256, 16, 16],
            128,
            1,
            0,
            2,
            nhwc=True,
            io=F16,
        ),
    ),
    Example(
        "resnet50_conv3x3_dgrad.json",
        "conv_dgrad 3x3 p1",
        "ResNet-50 res3a_branch2b: C 128, 28x28, K 128 (benchdnn #8)",
        "N 1, 7x7",
        conv_dgrad,
    ),
    Example(
        "resnet50_conv1x1_wgrad.json",
        "conv_wgrad 1x1",
        "ResNet-50 res2b_branch2a: C 256, 56x56, K 64 (benchdnn #5)",
        "N 2, 14x14",
        conv_wgrad,
    ),
    Example(
        "mobilenetv2_depthwise3x3_s2_relu6.json",
        "grouped (depthwise) conv_fprop 3x3 stride 2 + relu clipped at 6, NHWC",
        "MobileNetV2 block 2 depthwise: C 96, 112x112, stride 2",
        "N 1, 14x14",
        depthwise_relu6,
    ),
    Example(
        "bert_base_ffn_matmul_bias_gelu.json",
        "matmul + bias + gelu; the weight is an nn.Linear [N, K] buffer (transposed strides)",
        "BERT-base FFN up-projection: tokens 128 x batch, K 768, N 3072",
        "4 tokens",
        bert_ffn,
    ),
    Example(
        "llama_skinny_matmul.json",
        "matmul with M = 4 (decode), nn.Linear weight",
        "tritonbench llama.py (K 1024, N 8192), BS 4",
        "N 1024",
        llama_skinny,
    ),
    Example(
        "bert_base_sdpa_noncausal.json",
        "sdpa, non-causal, q/k/v as [B, S, H, D] buffers",
        "BERT-base attention: H 12, D 64, S 128",
        "B 1, S 64",
        lambda: sdpa("bert_base_sdpa_noncausal_h12_s64_d64", 1, 12, 12, 64, 64, causal=False),
    ),
    Example(
        "llama3_gqa_sdpa_causal.json",
        "sdpa, causal, grouped-query (16 query heads share 2 key/value heads)",
        "Llama-3.1-70B, TP 4 shard: Hq 16, Hkv 2, D 128, prefill S 2048 (cudnn-frontend llama.py)",
        "B 1, S 64",
        lambda: sdpa("llama3_gqa_sdpa_causal_hq16_hkv2_s64_d128", 1, 16, 2, 64, 128, causal=True),
    ),
    Example(
        "llama_rmsnorm.json",
        "rmsnorm over the hidden dim, eps 1e-6",
        "tritonbench rms_norm: M 2048, H 4096",
        "M 64",
        rmsnorm,
    ),
    Example(
        "bert_base_layernorm.json",
        "layernorm over the hidden dim of [B, S, H], eps 1e-12",
        "BERT-base: S 128, H 768",
        "B 1",
        layernorm,
    ),
    Example(
        "resnet50_bn_inference.json",
        "batchnorm_inference",
        "dnn-benchmarking methodology BN: N 32, C 64, 28x28",
        "N 2",
        bn_inference,
    ),
    Example(
        "resnet50_maxpool3x3_s2.json",
        "max pooling 3x3 stride 2 pad 1",
        "ResNet-50 stem pool: C 64, 112x112",
        "N 1, 28x28",
        maxpool,
    ),
    Example(
        "inception_v3_avgpool3x3_exclude_pad.json",
        "average pooling 3x3 stride 1 pad 1, padding excluded from the count",
        "Inception-v3 mixed_6 pool branch: C 768, 17x17",
        "N 1, 8x8",
        avgpool,
    ),
    Example(
        "resnet50_global_avg_reduction.json",
        "reduction AVG over H and W",
        "ResNet-50 global average pool: C 2048, 7x7",
        "N 1",
        global_avg_reduction,
    ),
    Example(
        "llama_swiglu_pointwise.json",
        "pointwise chain: swish(gate) * up",
        "LLaMA-7B FFN: intermediate 11008",
        "16 tokens",
        swiglu,
    ),
]


def readme() -> str:
    lines = [
        "# Example graphs",
        "",
        "Generated by `python examples/make_graphs.py` with dnntune's builder API; do not edit",
        "by hand. Each file is a graph in hipDNN's JSON format (the six top-level keys hipDNN's",
        "reader requires and nothing else), so provenance lives here instead of in the files.",
        "Every graph is a real layer with its channel and head structure intact; batch, tokens",
        "or spatial size are scaled down so that a CPU run (reference plus torch engine, about",
        "100 iterations) takes well under a second.",
        "",
        "| file | operations | source layer and shape | scaled to |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{e.file}` | {e.ops} | {e.source} | {e.scaled} |" for e in EXAMPLES]
    lines += [
        "",
        "Load one with `dt.Graph.load(path)`; `g.validate()`, `g.key()` and `g.to_json()` work",
        "on it directly.",
        "",
    ]
    return "\n".join(lines)


def render() -> dict[str, str]:
    """File name -> text of every generated file."""
    files = {}
    for example in EXAMPLES:
        g = example.build()
        g.validate()
        files[example.file] = g.to_json() + "\n"
    files["README.md"] = readme()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    parser.add_argument("--check", action="store_true", help="only check the files are current")
    args = parser.parse_args(argv)
    files = render()
    stale = [
        n
        for n, text in files.items()
        if not (args.out / n).is_file() or (args.out / n).read_text() != text
    ]
    if args.check:
        for name in stale:
            print(f"stale: {args.out / name}")
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
