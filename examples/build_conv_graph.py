"""Build a conv + bias + relu graph with the builder API, check it, and save it as JSON.

    python examples/build_conv_graph.py [out.json]

Shows: logical NCHW dims with the layout in the strides (here NHWC), shape inference (the
conv output's dims are known as soon as the node is added), validation errors that name the
node and field, the graph key, and the hipDNN JSON round trip.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import dnntune as dt
from dnntune.graph import channels_last_strides


def build(n: int = 1, c: int = 64, hw: int = 14, k: int = 64) -> dt.Graph:
    """ResNet-50 res2a_branch2b (3x3, pad 1) + bias + relu, NHWC, fp32."""
    g = dt.Graph(
        name="conv_bias_relu",
        io_data_type=dt.DataType.FLOAT,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    x_dims, w_dims = [n, c, hw, hw], [k, c, 3, 3]  # logical N, C, H, W and K, C, R, S
    x = g.tensor("X", x_dims, channels_last_strides(x_dims))
    w = g.tensor("W", w_dims, channels_last_strides(w_dims))
    b = g.tensor("B", [1, k, 1, 1])
    y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="conv")
    print(f"conv output inferred: dims {y.dims}, strides {y.strides} (NHWC kept)")
    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD, name="bias")
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, name="relu")
    y.set_name("Y").set_output(True)
    g.validate()
    return g


def show_a_validation_error() -> None:
    g = dt.Graph(name="bad", io_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [1, 64, 14, 14])
    w = g.tensor("W", [64, 48, 3, 3])  # 64 input channels are not a multiple of 48
    try:
        g.conv_fprop(x, w, padding=1, name="conv")
    except dt.InvalidValueError as exc:
        print(f"rejected: {exc}")


def main(argv: list[str]) -> int:
    g = build()
    print(f"graph key: {g.key()}")
    out = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp()) / "conv_bias_relu.json"
    g.save(out)
    again = dt.Graph.load(out)  # loading validates; bad files raise GraphFormatError
    assert again.key() == g.key() and again.to_dict() == g.to_dict()
    print(f"saved and reloaded {out} ({len(again.nodes)} nodes, same key)")
    show_a_validation_error()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
