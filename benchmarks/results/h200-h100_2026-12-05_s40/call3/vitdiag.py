"""ViT-B/16 bf16 32x224: PyTorch vs dnntune (fused, unfused), each captured as a plain CUDA graph,
timed side by side, and the kernels each replay runs (profiler totals per kernel name)."""
import collections, copy, statistics, sys, time, torch, timm
import dnntune.torch as dtt
torch.backends.cudnn.benchmark = True
name = sys.argv[1] if len(sys.argv) > 1 else "vit_base_patch16_224"
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
base = timm.create_model(name, pretrained=False).eval().to(dev, dt)
x = torch.randn(32, 3, 224, 224, device=dev, dtype=dt)
forms = {"pytorch": copy.deepcopy(base)}
for tag, fuse in (("dnn_fused", True), ("dnn_unfused", False)):
    m = copy.deepcopy(base); t0 = time.time()
    rep = dtt.optimize(m, (x,), policy="tune", overrides=f"/tmp/ov_{tag}.json", cuda_graph=False,
                       fuse=fuse, check_speed=False, revert_if_slower=False, time_budget_s=15)
    print(tag, f"optimize {time.time()-t0:.1f} s, fusions {len(rep.fusions)}:", [str(f) for f in rep.fusions][:3])
    print("\n".join(str(rep).splitlines()[:8]))
    forms[tag] = m
def capture(m):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(3): m(x)
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        out = m(x)
    return g, out
graphs = {k: capture(m) for k, m in forms.items()}
with torch.no_grad():
    ref = forms["pytorch"](x).float()
for k, (g, out) in graphs.items():
    g.replay(); torch.cuda.synchronize(); print(k, "max err vs eager", (out.float() - ref).abs().max().item())
times = collections.defaultdict(list)
for _ in range(12):
    for k, (g, _) in graphs.items():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10): g.replay()
        e1.record(); torch.cuda.synchronize(); times[k].append(e0.elapsed_time(e1) / 10)
for k, t in times.items(): print(f"{k:12} replay {statistics.median(t):.3f} ms")
from torch.profiler import profile, ProfilerActivity
for k, (g, _) in graphs.items():
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): g.replay()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[e.name[:90]]; a[0] += 1; a[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    tot = sum(v[1] for v in agg.values()) / 5
    print(f"== {k}: kernels total {tot/1000:.3f} ms per replay")
    for n, (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {us/5:9.1f} us  x{c//5:4d}  {n}")
