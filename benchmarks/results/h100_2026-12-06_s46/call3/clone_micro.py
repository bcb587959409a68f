"""Clone strategies for a replay's outputs (GPT-2's: 24 cache tensors and the hidden state, 6.3 MB
each), device time only: a long sleep kernel first, so every launch is queued before the GPU
reaches it; the events then time the copies alone."""
import json
import torch
torch.manual_seed(0)
dev = "cuda"
srcs = [torch.randn(8, 12, 512, 64, device=dev, dtype=torch.bfloat16) for _ in range(24)]
srcs.append(torch.randn(8, 512, 768, device=dev, dtype=torch.bfloat16))
def clones():
    return [t.clone() for t in srcs]
def foreach():
    out = [torch.empty_like(t) for t in srcs]
    torch._foreach_copy_(out, srcs)
    return out
res = {}
for name, f in [("clone", clones), ("foreach", foreach)] * 3:
    for _ in range(3): f()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time: the host queues everything below
        s.record(); out = f(); e.record(); e.synchronize(); times.append(s.elapsed_time(e) * 1000)
        del out
    times.sort(); res[name] = round(times[len(times) // 2], 1)
    assert all(torch.equal(a, b) for a, b in zip(f(), srcs))
print(json.dumps(res))
