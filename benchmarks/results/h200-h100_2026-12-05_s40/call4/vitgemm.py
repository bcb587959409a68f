"""ViT-B/16's GEMMs (32x197 tokens) as dnntune graphs: fc1 + bias + GELU, proj/fc2 + bias +
residual, bf16; and PyTorch's cuBLASLt GELU epilogue against addmm + gelu."""
import sys, statistics
from pathlib import Path
import torch, dnntune as dt
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
BF = dt.DataType.BFLOAT16
def gemm(name, m, k, n, tail):
    g = dt.Graph(name=name, io_data_type=BF, intermediate_data_type=dt.DataType.FLOAT, compute_data_type=dt.DataType.FLOAT)
    x = g.tensor(name="X", dims=[1, m, k], strides=[m * k, k, 1], data_type=BF)
    w = g.tensor(name="W", dims=[1, k, n], strides=[k * n, 1, k], data_type=BF)
    b = g.tensor(name="B", dims=[1, 1, n], strides=[n, n, 1], data_type=BF)
    y = g.pointwise(g.matmul(x, w), b, mode=dt.PointwiseMode.ADD)
    if tail == "gelu":
        y = g.pointwise(y, mode=dt.PointwiseMode.GELU_FWD)
    elif tail == "gelu_tanh":
        y = g.pointwise(y, mode=dt.PointwiseMode.GELU_APPROX_TANH_FWD)
    elif tail == "residual":
        r = g.tensor(name="R", dims=[1, m, n], strides=[m * n, n, 1], data_type=BF)
        y = g.pointwise(y, r, mode=dt.PointwiseMode.ADD)
    y.set_output(True); y.set_data_type(BF); g.validate(); g.save(out / f"{name}.json")
M = 32 * 197
gemm("vit_fc1_gelu", M, 768, 3072, "gelu")
gemm("gpt2_cfc_gelu_tanh", 4096, 768, 3072, "gelu_tanh")
gemm("vit_fc1", M, 768, 3072, None)
gemm("vit_proj_residual", M, 768, 768, "residual")
gemm("vit_fc2_residual", M, 3072, 768, "residual")
if torch.cuda.is_available():
    dev = "cuda"; bf = torch.bfloat16
    x = torch.randn(M, 768, device=dev, dtype=bf); w = torch.randn(3072, 768, device=dev, dtype=bf) / 28; b = torch.randn(3072, device=dev, dtype=bf)
    fns = {"addmm+gelu": lambda: torch.nn.functional.gelu(torch.addmm(b, x, w.t())),
           "addmm+gelu_tanh": lambda: torch.nn.functional.gelu(torch.addmm(b, x, w.t()), approximate="tanh"),
           "_addmm_activation(gelu)": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
           "addmm": lambda: torch.addmm(b, x, w.t())}
    ref = torch.nn.functional.gelu((x.float() @ w.float().t() + b.float()))
    for k, f in fns.items():
        for _ in range(5): f()
        torch.cuda.synchronize(); ts = []
        for _ in range(20):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20): f()
            e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1) * 50)
        err = (f().float() - ref).abs().max().item() if "gelu" in k else float("nan")
        print(f"{k:26} {statistics.median(ts):7.1f} us  max err vs erf-gelu fp32 {err:.4f}")
