"""session 48: where generate()'s decode steps lose after optimize (H100): ms/token of eager, dnntune, dnntune
with every op forced to PyTorch's (the refine flag's path), and the device kernels of 16 decode tokens of each"""
import copy, sys, time, statistics, torch, warnings, collections, json, os
sys.path.insert(0, "benchmarks")
from transformers import LlamaForCausalLM
from _models_zoo import Setting, _llama_config, _place, _token_ids
import dnntune.torch as dtt
from dnntune.torch import _calls
warnings.simplefilter("ignore")
torch.manual_seed(0)
Q = os.environ.get("DEV") == "cpu"
s = Setting(torch.device("cpu"), torch.float32, True) if Q else Setting(torch.device("cuda"), torch.bfloat16, False)
eager = _place(LlamaForCausalLM(_llama_config(s, use_cache=True)), s)
ids = _token_ids(s, eager.config.vocab_size, 1, 128)
opt = copy.deepcopy(eager)
rep = dtt.optimize(opt, (ids,), overrides="/tmp/dec_ov.json", time_budget_s=15)
print(rep.choice, flush=True)
N = 32
def gen(m, n=N):
    with torch.no_grad():
        return m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
def forced(m, n=N):
    tok = _calls._pytorch_forced.set(True)
    try: return gen(m, n)
    finally: _calls._pytorch_forced.reset(tok)
fs = {"eager": lambda n=N: gen(eager, n), "dnntune": lambda n=N: gen(opt, n), "forced": lambda n=N: forced(opt, n)}
for f in fs.values(): f(); f()
t = {k: [] for k in fs}
for _ in range(6):
    for k, f in fs.items():
        Q or torch.cuda.synchronize(); a = time.perf_counter(); f(); Q or torch.cuda.synchronize(); t[k].append((time.perf_counter() - a) * 1e3 / N)
res = {k: statistics.median(v) for k, v in t.items()}
print("ms/token", {k: round(v, 3) for k, v in res.items()}, flush=True)
from torch.profiler import profile, ProfilerActivity
kern = {}
for k, f in fs.items():
    with profile(activities=[ProfilerActivity.CPU if Q else ProfilerActivity.CUDA]) as p:
        f(16)
    c = collections.Counter(); n = collections.Counter()
    for e in p.events():
        if Q or e.device_type.name == "CUDA":
            c[e.name] += e.device_time; n[e.name] += 1
    kern[k] = (sum(c.values()) / 16, [(name[:90], round(us / 16, 1), n[name] / 16) for name, us in c.most_common(14)])
    print(k, "device us/token", round(kern[k][0], 1), flush=True)
    for row in kern[k][1]: print("   ", row)
json.dump({"ms_per_token": res, "rounds": t, "kernels": kern}, open(os.environ.get("OUTF", "/tmp/decode_gpu.json"), "w"), indent=1)
