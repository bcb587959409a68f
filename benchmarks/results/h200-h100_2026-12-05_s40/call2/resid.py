"""Residual add fused into a linear's epilogue vs PyTorch's linear + add, bf16, CUDA-graph replay."""
import statistics, torch, torch.nn.functional as F
import dnntune.torch as dtt
dtt.configure(policy="tune", ranking_metric="device")
dev = "cuda"; dt = torch.bfloat16
SHAPES = [("vit fc2", 6304, 3072, 768), ("vit proj", 6304, 768, 768),
          ("llama down", 2048, 5632, 2048), ("llama o_proj", 2048, 2048, 2048),
          ("gpt2 mlp c_proj", 4096, 3072, 768), ("gpt2 attn c_proj", 4096, 768, 768)]
def graph_of(fn, n=40):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n): fn()
    return g, n
for name, m, k, n in SHAPES:
    h = torch.randn(m, k, device=dev, dtype=dt); x = torch.randn(m, n, device=dev, dtype=dt)
    w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5; b = torch.randn(n, device=dev, dtype=dt)
    ref = (h.float() @ w.float().t() + b.float() + x.float())
    variants = {"torch": lambda: F.linear(h, w, b) + x,
                "dnn+add": lambda: dtt.linear(h, w, b) + x,
                "dnn fused": lambda: dtt.linear(h, w, b, residual=x)}
    errs = {v: (f().float() - ref).abs().max().item() for v, f in variants.items()}
    graphs = {v: graph_of(f) for v, f in variants.items()}
    times = {v: [] for v in variants}
    for _ in range(15):
        for v, (g, cnt) in graphs.items():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
            times[v].append(e0.elapsed_time(e1) * 1000 / cnt)
    med = {v: statistics.median(t) for v, t in times.items()}
    print(f"{name:18} M{m} K{k} N{n}: " + "  ".join(f"{v} {med[v]:.1f} us (err {errs[v]:.3f})" for v in variants)
          + f"  | fused/torch {med['torch']/med['dnn fused']:.3f}x")
