"""Session 53 probe (GPU): why the race of routes chose dnntune's route for generate()'s decode
steps with a DynamicCache (race medians 7.061 against 7.875 ms) while the optimized model then
ran 0.82x eager per token. Forms, timed side by side in ABBA rounds: eager; the optimized model
with every forward on dnntune's route (no race); with every forward on PyTorch's route. Per
form: generate()'s ms per new token (no extra syncs), and each decode forward's time with a
device sync before and after (as the race times), early (steps 3-10) and late (steps 40-47).
Then: which objects keep a static cache alive after a generate() call of an optimized model."""

import copy, gc, json, os, statistics, sys, time, weakref
from pathlib import Path

sys.path.insert(0, "benchmarks")
import torch
from _models_zoo import Setting, _llama_config, _place, _token_ids
from transformers import LlamaForCausalLM

import dnntune.torch as dtt
from dnntune.torch import _route_race
from dnntune.torch._support import pytorch_route

OUT = Path(os.environ.get("OUT", "."))
NEW = 48
QUICK = os.environ.get("QUICK") == "1"  # a dry run on the CPU
s = Setting(torch.device("cpu" if QUICK else "cuda"), torch.float32 if QUICK else torch.bfloat16, QUICK)
if QUICK:
    torch.cuda.synchronize = lambda *a: None
torch.manual_seed(0)
eager = _place(LlamaForCausalLM(_llama_config(s, use_cache=True)), s)
ids = _token_ids(s, eager.config.vocab_size, 1, 128)
opt = copy.deepcopy(eager)
dtt.optimize(opt, (ids,), policy="heuristic", time_budget_s=15)
res = {}


def gen(m, n=NEW, **kw):
    with torch.no_grad():
        return m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False, pad_token_id=0, **kw)


def route_part():
    global routes
    routes = opt.__dict__.pop(_route_race.ROUTES, None)


    class Form:
        def __init__(self, model, pytorch):
            self.model, self.pytorch = model, pytorch

        def __call__(self, **kw):
            pytorch_route.on = self.pytorch
            try:
                return gen(self.model, **kw)
            finally:
                pytorch_route.on = False


    forms = {"eager": Form(eager, False), "dnntune_route": Form(opt, False), "pytorch_route": Form(opt, True)}
    for _ in range(3):
        for f in forms.values():
            f(n=8)
    ms = {k: [] for k in forms}
    for r in range(6):
        order = list(forms.items())
        for k, f in order if r % 2 == 0 else order[::-1]:
            torch.cuda.synchronize(); t = time.perf_counter(); f(); torch.cuda.synchronize()
            ms[k].append((time.perf_counter() - t) * 1e3 / NEW)
    res.update({"ms_per_token": {k: statistics.median(v) for k, v in ms.items()}, "rounds": ms})
    res["paired_vs_eager"] = {k: statistics.median(e / o for e, o in zip(ms["eager"], v)) for k, v in ms.items()}
    print("[route_probe] per token", {k: round(v, 3) for k, v in res["ms_per_token"].items()}, "paired", {k: round(v, 3) for k, v in res["paired_vs_eager"].items()}, flush=True)

    # each forward's time with a sync before and after (the race's clock)
    steps = {k: [] for k in forms}
    for k, f in forms.items():
        model = f.model
        times = []
        def pre(mod, a, kw):
            torch.cuda.synchronize(); mod._t0 = time.perf_counter()
        def post(mod, a, kw, out):
            torch.cuda.synchronize(); times.append((time.perf_counter() - mod._t0) * 1e3)
        h1 = model.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = model.register_forward_hook(post, with_kwargs=True)
        for _ in range(3):
            times.clear(); f()
            steps[k].append(list(times))
        h1.remove(); h2.remove()
    synced = {k: {"early": statistics.median([t for run in v for t in run[3:11]]),
                  "late": statistics.median([t for run in v for t in run[40:48]]),
                  "all": statistics.median([t for run in v for t in run[1:]])} for k, v in steps.items()}
    res["synced_forward_ms"] = synced
    print("[route_probe] synced forward ms", json.dumps(synced), flush=True)
    if routes is not None:
        opt.__dict__[_route_race.ROUTES] = routes



def static_part():
    from transformers import StaticCache
    seen = []
    orig = StaticCache.__init__
    def init(self, *a, **k):
        orig(self, *a, **k); seen.append(weakref.ref(self))
    StaticCache.__init__ = init
    g = copy.deepcopy(eager)
    torch.manual_seed(0)
    dtt.optimize(g, (ids[:, :12].contiguous(),), policy="heuristic", cuda_graph=True, check_speed=False, revert_if_slower=False)
    from dnntune.torch.cuda_graphs import graphs_of
    st = graphs_of(g)
    import logging
    logging.basicConfig(level=logging.WARNING, format="[log] %(name)s %(message)s")
    logging.getLogger("dnntune").setLevel(logging.DEBUG)
    def attrs(m):
        return {n: {k: (type(v).__name__, v if isinstance(v, (int, float, str, bool, type(None))) else id(v))
                    for k, v in mod.__dict__.items() if not k.startswith("_dnntune") and k not in ("_parameters", "_buffers", "_modules")}
                for n, mod in m.named_modules()}
    last = attrs(g)
    for i in range(4):
        before = st.records
        # as tests/torch/test_static_caches.py's first GPU test: scores returned, another
        # model's generate() in between
        gen(g, n=8, cache_implementation="static", disable_compile=True, output_scores=True,
            return_dict_in_generate=True)
        gen(eager, n=8, cache_implementation="static", disable_compile=True)
        alive = [w() is not None for w in seen]
        now = attrs(g)
        changed = {n: {k: (last.get(n, {}).get(k), v) for k, v in d.items() if last.get(n, {}).get(k) != v} for n, d in now.items()}
        changed = {n: d for n, d in changed.items() if d}
        last = now
        print(f"[route_probe] static call {i}: records {before}->{st.records}, caches alive {alive}, held {len(st.held_caches)}, attrs changed {str(changed)[:600]}", flush=True)
    logging.getLogger("dnntune").setLevel(logging.WARNING)
    chains = []
    for w in seen:
        c = w()
        if c is None:
            continue
        for ref in gc.get_referrers(c):
            if ref is seen or isinstance(ref, list) and ref is locals():
                continue
            desc = type(ref).__name__
            if isinstance(ref, dict):
                owners = [type(o).__name__ + ":" + str(getattr(o, "__qualname__", ""))[:60] for o in gc.get_referrers(ref)[:6]]
                desc += f" keys={list(ref)[:8]} owners={owners}"
            elif hasattr(ref, "f_code"):
                desc += f" frame {ref.f_code.co_name} {ref.f_code.co_filename}:{ref.f_lineno}"
            elif isinstance(ref, (list, tuple)):
                owners = [type(o).__name__ for o in gc.get_referrers(ref)[:6]]
                desc += f" len={len(ref)} owners={owners}"
            chains.append(desc[:400])
    print("[route_probe] referrers of live caches:", *chains, sep="\n  ", flush=True)
    gc.collect()
    print("[route_probe] after gc.collect:", [w() is not None for w in seen], flush=True)
    res["static_referrers"] = chains


import traceback
for part in (static_part, route_part):
    try:
        part()
    except Exception:
        traceback.print_exc()
(OUT / "route_probe.json").write_text(json.dumps(res, indent=1))
