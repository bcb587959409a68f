"""Session 54 probe: what PyTorch's route costs over eager in a decode step with a DynamicCache.

On an H100 (session 54, route_probe.py) the optimized 8-layer LLaMA-style decoder with every
forward forced onto PyTorch's route ran 0.967x eager per token in generate() and 5.69 against
5.39 ms a synced decode forward; on this repo's CPU (8 layers of 64, one thread) the same
forced route reads 1.001x eager. Here, three forms in ABBA rounds (eager, the optimized model
on PyTorch's route, on dnntune's): 64 decode forwards back to back after a 128-token prompt,
an untouched eager copy beside them (session 55: two copies of one model read apart on
a host-bound forward), then a cProfile diff (PyTorch's route less eager, 200 forwards: own time and calls per
function). ``QUICK=1``: a dry run on the CPU with the tiny config.
"""

import copy, cProfile, json, os, pstats, statistics, sys, time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import torch
from _models_zoo import Setting, _llama_config, _place, _token_ids
from transformers import DynamicCache, LlamaForCausalLM

import dnntune.torch as dtt
from dnntune.torch import _route_race
from dnntune.torch._support import pytorch_route

QUICK = os.environ.get("QUICK") == "1"
OUT = Path(os.environ.get("OUT", "."))
s = Setting(torch.device("cpu" if QUICK else "cuda"), torch.float32 if QUICK else torch.bfloat16, QUICK)
sync = (lambda: None) if QUICK else torch.cuda.synchronize
torch.manual_seed(0)
eager = _place(LlamaForCausalLM(_llama_config(s, use_cache=True)), s)
ids = _token_ids(s, eager.config.vocab_size, 1, 16 if QUICK else 128)
opt = copy.deepcopy(eager)
copy_ = copy.deepcopy(eager)  # the control: two copies of one model read apart (session 55)
print(dtt.optimize(opt, (ids,), policy="heuristic", time_budget_s=15, revert_if_slower=False), flush=True)
opt.__dict__.pop(_route_race.ROUTES, None)


def decode(m, pt, n=64):
    pytorch_route.on = pt
    try:
        with torch.no_grad():
            cache = DynamicCache(config=eager.config)
            out = m(input_ids=ids, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            sync(); t = time.perf_counter()
            for i in range(n):
                pos = torch.tensor([ids.shape[1] + i], device=ids.device)
                out = m(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=pos)
                tok = out.logits[:, -1:].argmax(-1)
            sync()
            return (time.perf_counter() - t) / n * 1e3
    finally:
        pytorch_route.on = False


forms = {"eager": (eager, False), "eager_copy": (copy_, False), "pytorch_route": (opt, True), "dnntune_route": (opt, False)}
for f in forms.values():
    decode(*f)
ms = {k: [] for k in forms}
for r in range(8):
    for k in list(forms) if r % 2 == 0 else list(forms)[::-1]:
        ms[k].append(decode(*forms[k]))
res = {"ms_per_forward": {k: statistics.median(v) for k, v in ms.items()}, "rounds": ms}
res["paired_vs_eager"] = {k: statistics.median(e / o for e, o in zip(ms["eager"], v)) for k, v in ms.items()}
print("[route_cost] ms per decode forward", json.dumps({k: round(v, 4) for k, v in res["ms_per_forward"].items()}),
      "paired", json.dumps({k: round(v, 3) for k, v in res["paired_vs_eager"].items()}), flush=True)
stats = {}
for k in ("eager", "pytorch_route"):
    p = cProfile.Profile(); p.enable(); decode(*forms[k], n=200); p.disable()
    stats[k] = {f"{f.split('/')[-1]}:{l}:{n}": (v[1], v[2]) for (f, l, n), v in pstats.Stats(p).stats.items()}
rows = []
for key in set(stats["eager"]) | set(stats["pytorch_route"]):
    ne, te = stats["eager"].get(key, (0, 0)); nr, tr = stats["pytorch_route"].get(key, (0, 0))
    if nr != ne or abs(tr - te) > 2e-4:
        rows.append((tr - te, nr - ne, key))
rows.sort(reverse=True)
res["profile_diff"] = [{"ms": round(d * 1e3, 3), "calls": n, "function": k} for d, n, k in rows[:60]]
for d, n, k in rows[:40]:
    print(f"[route_cost] {d * 1e3:8.2f} ms {n:7d} calls  {k}", flush=True)
print("[route_cost] own-time difference over 200 forwards:", round(sum(r[0] for r in rows) * 1e3, 2), "ms", flush=True)
(OUT / "pytorch_route_cost.json").write_text(json.dumps(res, indent=1))
