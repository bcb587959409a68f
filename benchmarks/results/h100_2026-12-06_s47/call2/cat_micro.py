"""GPT-2's cache update: torch.cat([empty, k], -2) of a transposed view of c_attn's output,
against other copies of the same view, device time only (a sleep kernel first so the host
queues everything), 24 tensors as in GPT-2 small 8x512."""
import json
import torch
torch.manual_seed(0)
dev = "cuda"
B, S, H, D = 8, 512, 12, 64
qkv = [torch.randn(B, S, 3 * H * D, device=dev, dtype=torch.bfloat16) for _ in range(12)]
views = []
for t in qkv:
    q, k, v = t.split(H * D, dim=2)
    views += [k.view(B, S, H, D).transpose(1, 2), v.view(B, S, H, D).transpose(1, 2)]
empty = torch.tensor([], device=dev, dtype=torch.bfloat16)
def cat():
    return [torch.cat([empty, x], dim=-2) for x in views]
def contig():
    return [x.contiguous() for x in views]
def clone_pf():
    return [x.clone() for x in views]
def foreach():
    out = [torch.empty(x.shape, device=dev, dtype=x.dtype) for x in views]
    torch._foreach_copy_(out, views)
    return out
def bshd():  # copy into (B,S,H,D)-contiguous memory, handed out as its transpose (same values)
    out = [torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in views]
    for o, x in zip(out, views):
        o.copy_(x.transpose(1, 2))
    return [o.transpose(1, 2) for o in out]
res = {}
fs = [("cat", cat), ("contiguous", contig), ("clone", clone_pf), ("foreach", foreach), ("bshd_copy", bshd)]
for name, f in fs * 3:
    for _ in range(3): f()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(3_000_000)
        s.record(); out = f(); e.record(); e.synchronize(); times.append(s.elapsed_time(e) * 1000)
        del out
    times.sort(); res.setdefault(name, []).append(round(times[len(times) // 2], 1))
    assert all(torch.equal(a, b) for a, b in zip(f(), views))
print(json.dumps(res))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    for name, f in fs:
        f(); torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12))
