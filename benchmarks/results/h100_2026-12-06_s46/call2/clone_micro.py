"""Clone strategies for a replay's outputs: 25 tensors of GPT-2's output size (6.3 MB each).
(Call 2's version: host-bound, the events time the launches too; call 3 repeats it on the
device clock.)"""
import torch, json, sys
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
def one_buffer():
    n = sum(t.numel() for t in srcs)
    buf = torch.empty(n, device=dev, dtype=torch.bfloat16)
    outs, at = [], 0
    for t in srcs:
        outs.append(buf[at:at + t.numel()].view(t.shape)); at += t.numel()
    torch._foreach_copy_(outs, srcs)
    return outs
res = {}
for name, f in [("clone", clones), ("foreach", foreach), ("one_buffer", one_buffer)] * 2:
    for _ in range(5): f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(30):
        s.record(); f(); e.record(); e.synchronize(); times.append(s.elapsed_time(e) * 1000)
    times.sort(); res[name] = times[len(times) // 2]
    assert all(torch.equal(a, b) for a, b in zip(f(), srcs))
print(json.dumps(res))
