"""Device us of PyTorch's linear (+ add) at the LLaMA prefill's MLP shapes, CUDA-graph replays."""
import statistics, torch
import torch.nn.functional as F
M, K, N = 2048, 5632, 2048
dev, dt = "cuda", torch.bfloat16
cases = {}
for name, (k, n) in {"down": (K, N), "gate": (N, K)}.items():
    x = torch.randn(M, k, device=dev, dtype=dt); w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5
    r = torch.randn(M, n, device=dev, dtype=dt)
    cases[f"{name} linear"] = lambda x=x, w=w: F.linear(x, w)
    cases[f"{name} linear+add"] = lambda x=x, w=w, r=r: F.linear(x, w) + r
    cases[f"{name} addmm"] = lambda x=x, w=w, r=r: torch.addmm(r, x, w.t())
    cases[f"{name} linear+silu"] = lambda x=x, w=w: F.silu(F.linear(x, w))
graphs = {}
for k, f in cases.items():
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20): f()
    graphs[k] = g
res = {k: [] for k in cases}
for _ in range(15):
    for k, g in graphs.items():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        res[k].append(a.elapsed_time(b) * 1000 / 20)
for k, v in res.items():
    print(f"{k:20s} {statistics.median(v):8.1f} us")
