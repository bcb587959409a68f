"""Device us of a grouped decode attention with a mask: transformers' repeat_kv + SDPA,
dnntune's packed query, PyTorch's enable_gqa (CUDA-graph replays, median of interleaved rounds)."""
import statistics, torch
import torch.nn.functional as F
from dnntune.providers._torch.sdpa import grouped_masked
dev, dt = "cuda", torch.bfloat16
def rep(x, n):
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)
cases = {}
for b, h, hk, L in ((1, 16, 4, 2048), (8, 32, 8, 2048), (1, 32, 8, 4096)):
    q = torch.randn(b, h, 1, 128, device=dev, dtype=dt)
    k = torch.randn(b, hk, L, 128, device=dev, dtype=dt); v = torch.randn_like(k)
    m = torch.zeros(b, 1, 1, L, dtype=torch.bool, device=dev); m[..., : L // 2 + 1] = True
    g = h // hk
    tag = f"b{b} h{h}/{hk} L{L}"
    cases[f"{tag} repeat_kv+sdpa"] = lambda q=q, k=k, v=v, m=m, g=g: F.scaled_dot_product_attention(q, rep(k, g), rep(v, g), m)
    cases[f"{tag} packed"] = lambda q=q, k=k, v=v, m=m: grouped_masked(q, k, v, m)
    cases[f"{tag} enable_gqa"] = lambda q=q, k=k, v=v, m=m: F.scaled_dot_product_attention(q, k, v, m, enable_gqa=True)
    cases[f"{tag} sdpa pre-repeated"] = lambda q=q, k=rep(k, g), v=rep(v, g), m=m: F.scaled_dot_product_attention(q, k, v, m)
graphs = {}
for name, f in cases.items():
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): f()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(20): f()
    graphs[name] = gr
res = {k: [] for k in cases}
for _ in range(15):
    for k, gr in graphs.items():
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); gr.replay(); e.record(); e.synchronize()
        res[k].append(a.elapsed_time(e) * 1000 / 20)
for k, v in res.items():
    print(f"{k:40s} {statistics.median(v):8.1f} us")
