"""Which threads run while optimize's main thread waits (session 46): optimize(model, budget 12 s)
from empty caches, with a sampler thread reading every thread's Python stack every 2 ms; prints
per thread the innermost frames seen most often, and optimize's wall time."""
import collections, copy, sys, threading, time, json
import torch
from _models_zoo import SPECS, Setting
import dnntune.torch as dtt

model_name = sys.argv[1]
spec = SPECS[model_name]
s = Setting(torch.device("cuda"), torch.bfloat16, False)
w = spec.build(s)
model = w.model
stop = threading.Event()
counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
names = {}

def frames(f, n=4):
    out = []
    while f is not None and len(out) < n:
        code = f.f_code
        out.append(f"{code.co_filename.split('site-packages/')[-1].split('/src/')[-1]}:{f.f_lineno}({code.co_name})")
        f = f.f_back
    return " <- ".join(out)

def sample():
    me = threading.get_ident()
    while not stop.is_set():
        for t in threading.enumerate():
            names[t.ident] = t.name
        for ident, f in sys._current_frames().items():
            if ident == me:
                continue
            counts[names.get(ident, str(ident))][frames(f)] += 1
        time.sleep(0.002)

th = threading.Thread(target=sample, name="sampler", daemon=True)
th.start()
t0 = time.perf_counter()
report = dtt.optimize(model, w.inputs, policy="tune", overrides=None, time_budget_s=12.0)
wall = time.perf_counter() - t0
stop.set(); th.join()
print(f"# {model_name}: optimize {wall:.2f} s")
print("\n".join(l for l in str(report).splitlines() if "took" in l or "budget" in l or "module(s)" in l))
for name, c in counts.items():
    total = sum(c.values())
    print(f"\n## thread {name}: {total} samples")
    for stack, n in c.most_common(12):
        print(f"{n:6d} {stack}")
