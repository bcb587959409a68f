"""Session 50: what PyTorch's route costs an optimized LLaMA-style model's decode steps
against the eager model (generate.py's model; one process, forms alternated per round):
decode forwards timed back to back (no sync between steps), and whole generate() calls with
the route forced for every forward."""
import copy, os, statistics, sys, tempfile, time
sys.path.insert(0, "benchmarks")
import torch
import dnntune.torch as dtt
from dnntune.torch._support import pytorch_route
from generate import Setting, _generate, _llama_config, _place, _token_ids
from transformers import LlamaForCausalLM

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
quick = dev.type == "cpu"
s = Setting(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32, quick)
torch.manual_seed(0)
eager = _place(LlamaForCausalLM(_llama_config(s, use_cache=True)), s)
ids = _token_ids(s, eager.config.vocab_size, 1, 128)
opt = copy.deepcopy(eager)
rep = dtt.optimize(opt, (ids,), overrides=os.path.join(tempfile.mkdtemp(), "o.json"), time_budget_s=15)
print("optimize:", rep.choice if hasattr(rep, "choice") else "", "reverted", rep.reverted)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


class Route:
    def __init__(self, on): self.on = on
    def __enter__(self): pytorch_route.on = self.on
    def __exit__(self, *a): pytorch_route.on = False


def steps(model, n=48):
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, tok, L = out.past_key_values, ids[:, -1:], ids.shape[1]
        mask = torch.ones(1, L, dtype=torch.long, device=dev)
        sync(); t0 = time.perf_counter()
        for i in range(n):
            mask = torch.cat([mask, mask[:, :1]], 1)
            model(tok, attention_mask=mask, past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([L + i], device=dev))
        sync()
        return (time.perf_counter() - t0) / n * 1e3


def gen(model):
    sync(); t0 = time.perf_counter(); _generate(model, ids, 32); sync()
    return (time.perf_counter() - t0) / 32 * 1e3


forms = {"eager": (eager, False), "pytorch_route": (opt, True), "dnntune_route": (opt, False)}
res = {k: {"steps": [], "generate": []} for k in forms}
for model, on in forms.values():  # warm
    with Route(on): steps(model, 8); gen(model)
for r in range(6):
    for name, (model, on) in forms.items():
        with Route(on):
            res[name]["steps"].append(steps(model))
            res[name]["generate"].append(gen(model))
for name in forms:
    st, ge = (statistics.median(res[name][k]) for k in ("steps", "generate"))
    print(f"{name:14s} decode forward {st:.3f} ms ({statistics.median(res['eager']['steps'])/st:.3f}x eager), "
          f"generate {ge:.3f} ms/token ({statistics.median(res['eager']['generate'])/ge:.3f}x eager)")
import cProfile, pstats, io
for name in ("eager", "pytorch_route"):
    model, on = forms[name]
    pr = cProfile.Profile()
    with Route(on):
        pr.enable(); steps(model, 32); pr.disable()
    buf = io.StringIO(); pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
    print(f"--- cProfile {name} (32 decode forwards)\n" + buf.getvalue()[:6000])
