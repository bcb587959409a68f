"""optimize's wall time on one model (budget 12 s, as models.py), nothing else in the process."""
import sys, time
import torch
from _models_zoo import SPECS, Setting
import dnntune.torch as dtt

name = sys.argv[1]
w = SPECS[name].build(Setting(torch.device("cuda"), torch.bfloat16, False))
torch.cuda.synchronize()
t0 = time.perf_counter()
report = dtt.optimize(w.model, w.inputs, policy="tune", overrides=None, time_budget_s=12.0)
wall = time.perf_counter() - t0
lines = [l.strip() for l in str(report).splitlines() if "took" in l or "module(s)" in l or "untuned" in l]
print(f"{name} optimize_s {wall:.2f} | " + " | ".join(lines))
