"""Session 57 probe (issue 23): where the Whisper encoder's copy and add kernels come from.

Session 45's kernel profile (graph_kernels.py, H100) found auto's replayed forward running 37
direct-copy kernels (510 us) and 15 adds (370 us) of its 2.05 ms, as many as eager's, where
max-autotune runs 12 copies (64 us). Here the eager forward and dnntune's uncaptured forward
(optimize(cuda_graph=False)) are each profiled once with shapes and Python stacks: every
aten::copy_/clone/contiguous/add with its input shapes and strides and the model line that
made it, and the CUDA kernel time under it. ``QUICK=1``: the CPU dry run with a tiny config.
"""

import collections, copy, json, os, sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import torch
from _models_zoo import SPECS, Setting

import dnntune.torch as dtt

QUICK = os.environ.get("QUICK") == "1"
OUT = Path(os.environ.get("OUT", "."))
dev = torch.device("cpu" if QUICK else "cuda")
s = Setting(dev, torch.float32 if QUICK else torch.bfloat16, QUICK)
torch.manual_seed(0)
w = SPECS["whisper_encoder"].build(s)
model, inputs = w.model, w.inputs
opt = copy.deepcopy(model)
report = dtt.optimize(opt, inputs, policy="tune", time_budget_s=15, cuda_graph=False, revert_if_slower=False)
print(report, flush=True)
WANT = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::add", "aten::add_", "aten::mul", "aten::reshape", "aten::to", "aten::_to_copy")


class Sources(torch.overrides.TorchFunctionMode):
    """The model line of each copy-making call (a torch function mode: the profiler's own
    stacks are empty for C++ ops)."""

    def __init__(self):
        super().__init__()
        self.rows = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in ("contiguous", "clone", "copy_", "add", "__add__", "__iadd__", "add_", "mul", "__mul__", "reshape", "to"):
            import traceback
            src = "?"
            for f in reversed(traceback.extract_stack()[:-1]):
                if "torch/" not in f.filename and "copies.py" not in f.filename:
                    src = f"{f.filename.split('/')[-1]}:{f.lineno} {f.line}"[:140]
                    break
            shapes = [tuple(a.shape) + (tuple(a.stride()),) for a in args if isinstance(a, torch.Tensor)]
            self.rows[(name, str(shapes)[:100], src)] += 1
        return func(*args, **(kwargs or {}))


def sources(m):
    with torch.no_grad(), Sources() as mode:
        m(*inputs)
    return sorted(([n, *k] for k, n in mode.rows.items()), key=lambda r: (r[3], r[1]))


def frame(ev):
    for f in ev.stack or ():
        if "site-packages/transformers" in f or "/tf517/" in f or "modeling_" in f:
            return f.split("/")[-1]
    for f in ev.stack or ():
        if "dnntune" in f:
            return f.split("/src/")[-1]
    return (ev.stack or ["?"])[0].split("/")[-1]


def prof(m):
    with torch.no_grad():
        m(*inputs); m(*inputs)
        if not QUICK: torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU] + ([] if QUICK else [torch.profiler.ProfilerActivity.CUDA])
        with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=True) as p:
            m(*inputs)
            if not QUICK: torch.cuda.synchronize()
    rows = collections.defaultdict(lambda: [0, 0.0])
    for ev in p.events():
        if ev.name in WANT and (ev.cpu_parent is None or ev.cpu_parent.name not in WANT):
            dev_us = getattr(ev, "device_time_total", 0.0) or 0.0
            key = (ev.name, str(ev.input_shapes)[:120], frame(ev))
            rows[key][0] += 1; rows[key][1] += dev_us
    return sorted(([n, round(t, 1), *k] for k, (n, t) in rows.items()), key=lambda r: -r[1])


res = {"report": str(report), "eager": prof(model), "dnntune": prof(opt)}
res["eager_sources"], res["dnntune_sources"] = sources(model), sources(opt)
for form in ("eager_sources", "dnntune_sources"):
    print(f"== {form}: calls, op, (shape, strides) of tensor args, from")
    for r in res[form]:
        print(f"{r[0]:4d} {r[1]:12} {r[2]:60} {r[3]}")
for form in ("eager", "dnntune"):
    print(f"== {form}: calls, device us, op, input shapes, from")
    for r in res[form][:30]:
        print(f"{r[0]:4d} {r[1]:8.1f}  {r[2]:18} {r[3]:60} {r[4]}")
(OUT / "whisper_copies.json").write_text(json.dumps(res, indent=1))
