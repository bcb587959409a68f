"""Squeeze-excitation-like conv graphs (1x1 conv over a 1x1 or 2x2 map, bias, activation) as
graph JSON, for `dnntune run` / `dnntune tune --report` on the device."""
import sys
from pathlib import Path
import dnntune as dt

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
DT = {"bf16": dt.DataType.BFLOAT16, "fp16": dt.DataType.HALF}
ACT = {"silu": dt.PointwiseMode.SWISH_FWD, "sigmoid": dt.PointwiseMode.SIGMOID_FWD,
       "relu": dt.PointwiseMode.RELU_FWD}
def strides(d, nhwc):
    n, c, h, w = d
    return [c * h * w, 1, w * c, c] if nhwc else [c * h * w, h * w, w, 1]
for dtype in ("bf16", "fp16"):
    for n, c, k in ((2, 16, 32), (2, 32, 16), (8, 64, 16), (32, 16, 4)):
        for hw in (1, 2):
            for nhwc in (False, True):
                for act in ("silu", "sigmoid"):
                    name = f"se_{dtype}_n{n}_c{c}_k{k}_{hw}x{hw}_{'nhwc' if nhwc else 'nchw'}_{act}"
                    g = dt.Graph(name=name, io_data_type=DT[dtype],
                                 intermediate_data_type=dt.DataType.FLOAT,
                                 compute_data_type=dt.DataType.FLOAT)
                    x = g.tensor(name="X", dims=[n, c, hw, hw], strides=strides([n, c, hw, hw], nhwc), data_type=DT[dtype])
                    w = g.tensor(name="W", dims=[k, c, 1, 1], strides=strides([k, c, 1, 1], nhwc), data_type=DT[dtype])
                    b = g.tensor(name="B", dims=[1, k, 1, 1], strides=[k, 1, 1, 1], data_type=DT[dtype])
                    y = g.conv_fprop(x, w, padding=0, stride=1, dilation=1)
                    y = g.pointwise(y, b, mode=dt.PointwiseMode.ADD)
                    y = g.pointwise(y, mode=ACT[act])
                    y.set_output(True)
                    y.set_data_type(DT[dtype])
                    g.validate()
                    g.save(out / f"{name}.json")
print(len(list(out.glob("*.json"))), "graphs")
