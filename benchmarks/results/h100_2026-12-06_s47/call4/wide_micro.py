"""The lone cat's copy of GPT-2's 24 key/value views: clone as bf16 against the same bytes
copied as int64 (4 values a load), device time only (a sleep kernel first)."""
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
def clone():
    return [x.clone(memory_format=torch.contiguous_format) for x in views]
def wide():
    return [x.view(torch.int64).clone(memory_format=torch.contiguous_format).view(torch.bfloat16) for x in views]
def wide32():
    return [x.view(torch.int32).clone(memory_format=torch.contiguous_format).view(torch.bfloat16) for x in views]
res = {}
fs = [("clone", clone), ("int64", wide), ("int32", wide32)]
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
    got = f()
    assert all(torch.equal(a, b) and a.stride() == b.contiguous().stride() for a, b in zip(got, views))
print(json.dumps(res))
