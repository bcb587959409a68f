"""Session 50: where generate() spends the time per token that an optimized model's decode
forwards do not (call 3: decode forwards 1.04x eager on PyTorch's route, generate() 0.90x):
cProfile of generate() on the eager model and on the optimized one with PyTorch's route forced,
the functions whose own time differs most; and generate() of one token, the call's own cost
with its prompt (call 3's figures put about 35 ms a call there, against 3 ms for eager)."""
import copy, cProfile, os, pstats, statistics, sys, tempfile, time
sys.path.insert(0, "benchmarks")
import torch
import dnntune.torch as dtt
from dnntune.torch._support import pytorch_route
from generate import CACHES, Prompt, Setting, _llama_config, _place, _token_ids
from transformers import LlamaForCausalLM

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
s = Setting(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32, dev.type == "cpu")
torch.manual_seed(0)
eager = _place(LlamaForCausalLM(_llama_config(s, use_cache=True)), s)
ids = _token_ids(s, eager.config.vocab_size, 1, 128)
P = Prompt(ids, CACHES[sys.argv[2] if len(sys.argv) > 2 else "dynamic"])
opt = copy.deepcopy(eager)
dtt.optimize(opt, (ids,), overrides=os.path.join(tempfile.mkdtemp(), "o.json"), time_budget_s=8,
             revert_if_slower=False)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
N = 32


def gen(model, on):
    pytorch_route.on = on
    try:
        sync(); t0 = time.perf_counter(); P.generate(model, N); sync()
    finally:
        pytorch_route.on = False
    return (time.perf_counter() - t0) / N * 1e3


forms = {"eager": (eager, False), "opt_pytorch_route": (opt, True), "opt_dnntune_route": (opt, False)}
for m, on in forms.values():
    gen(m, on)
t = {k: [] for k in forms}
for _ in range(3):
    for k, (m, on) in forms.items():
        t[k].append(gen(m, on))
print("generate(), 32 tokens, ms/token:", {k: round(statistics.median(v), 3) for k, v in t.items()})


def one_token(model, on):  # a generate() call's own cost and its prompt: one new token
    pytorch_route.on = on
    try:
        sync(); t0 = time.perf_counter(); P.generate(model, 1); sync()
    finally:
        pytorch_route.on = False
    return (time.perf_counter() - t0) * 1e3


t1 = {k: [] for k in forms}
for _ in range(5):
    for k, (m, on) in forms.items():
        t1[k].append(one_token(m, on))
print("generate(), 1 token (the call and its prompt), ms:", {k: round(statistics.median(v), 3) for k, v in t1.items()})
stats = {}
for k, (m, on) in forms.items():
    pr = cProfile.Profile()
    pytorch_route.on = on
    pr.enable(); P.generate(m, N); sync(); pr.disable()
    pytorch_route.on = False
    stats[k] = pstats.Stats(pr).stats
    print(k, "total s", round(sum(v[2] for v in stats[k].values()), 4), "calls", sum(v[1] for v in stats[k].values()))


def own(st):
    return {f"{f[0].split('site-packages/')[-1]}:{f[1]}({f[2]})": (v[1], v[2]) for f, v in st.items()}


e = own(stats["eager"])
for k in ("opt_pytorch_route", "opt_dnntune_route"):
    o = own(stats[k])
    diff = sorted(((o.get(f, (0, 0))[1] - e.get(f, (0, 0))[1], f) for f in set(o) | set(e)), reverse=True)
    print(f"--- own time, {k} minus eager (ms; calls eager -> {k})")
    for d, f in diff[:30]:
        print(f"{d*1e3:9.2f}  {e.get(f, (0,0))[0]:6d} -> {o.get(f, (0,0))[0]:6d}  {f[-150:]}")
