# seed 21: the layout check (batch+1, NCHW copy of a channels-last example) wrong under
# cuda_graph="auto". Which block goes wrong, in the recording's warm-up or only in replay?
import sys, copy, random, warnings, logging, torch, torch.nn as nn
logging.basicConfig(level=logging.WARNING)
logging.getLogger('dnntune.torch.runtime').setLevel(logging.INFO)
logging.getLogger('dnntune.torch.runtime').addFilter(lambda r: 'verification' in r.getMessage())
sys.path.insert(0, "benchmarks")
from model_conformance import make_case
import dnntune.torch as dtt
from dnntune.torch import runtime
dev = "cuda"; seed = 21
cuda_graph = sys.argv[1] if len(sys.argv) > 1 else "auto"
cg = {"auto": "auto", "true": True, "false": False}[cuda_graph]
case = make_case(seed, dev, torch.bfloat16)
eager = copy.deepcopy(case.model)
exact = copy.deepcopy(case.model).double().to(memory_format=torch.contiguous_format)
x = case.make_input(case.batch)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    rep = dtt.optimize(case.model, (x,), policy="heuristic", cuda_graph=cg, check_speed=cg == "auto",
                       revert_if_slower=False)
print("cuda_graph", cuda_graph, "fusions", rep.fusions)
ours = case.model
def rel(a, b): return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-9)).item()
def run_check(inp, what, hooks=True):
    got = {}
    hs = [] if not hooks else [m.register_forward_hook(lambda m, i, o, n=n: got.setdefault(n, []).append(o.detach().clone()))
          for n, m in ours.named_children()] + \
         [m.register_forward_hook(lambda m, i, o, n=n: got.setdefault(n, []).append(o.detach().clone()))
          for n, m in ours.features.named_children()] if hasattr(ours, "features") else []
    want = {}
    hs2 = [] if not hooks else [m.register_forward_hook(lambda m, i, o, n=n: want.setdefault(n, o.detach().double()))
           for n, m in exact.features.named_children()]
    with torch.no_grad():
        ref = exact(inp.double().contiguous())
        e = eager(inp)
        outs = [ours(inp) for _ in range(3)]
    for h in hs + hs2: h.remove()
    print(f"{what}: input {tuple(inp.shape)} stride {inp.stride()}: eager {rel(e, ref):.3g} "
          + " ".join(f"call{i+1} {rel(o, ref):.3g}" for i, o in enumerate(outs)))
    for n in want:
        print("   block", n, "calls seen", len(got.get(n, [])), [f"{rel(o, want[n]):.3g}" for o in got.get(n, [])],
              "layout", [str(o.stride()) for o in got.get(n, [])][:1])
for a, b in (("example", x), ("batch", case.make_input(case.batch + 2))):
    run_check(b, a, hooks=False)
o2 = case.make_input(case.batch + 1)
run_check(o2.contiguous(), "layout (no hooks)", hooks=False)
run_check(x, "example")
run_check(case.make_input(case.batch + 2), "batch")
other = case.make_input(case.batch + 1)
run_check(other.contiguous(memory_format=torch.contiguous_format), "layout")
run_check(other.contiguous(memory_format=torch.channels_last), "layout as CL")
st = getattr(ours, "__dict__", {})
print("heuristic plans rejected:", runtime.runtime_stats.heuristic_rejected)
for key, k in list(runtime.cache()._items.items()):
    d = runtime.describe(k)
    if d["source"] != "heuristic":
        print(str(key[0])[:300], "->", d)
