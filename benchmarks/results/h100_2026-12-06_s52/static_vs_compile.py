"""Session 52 probe: transformers' own default for a static cache on CUDA (generate() torch.compiles
the forward, mode "reduce-overhead") against dnntune's static-cache replay (optimize, then
generate with disable_compile) and eager (disable_compile), the 8-layer LLaMA-style decoder of
benchmarks/generate.py, bf16, interleaved rounds. Also: what transformers' compile does with an
optimized model (dnntune's wrappers under dynamo). Run from the repo root."""

import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, "benchmarks")
from _models_run import _sync
from _models_zoo import Setting, _llama_config, _place, _token_ids
from generate import Prompt, agreement

import dnntune.torch as dtt
from dnntune.torch.cuda_graphs import graphs_of


def main() -> None:
    from transformers import LlamaForCausalLM

    new, rounds = int(os.environ.get("NEW", 64)), int(os.environ.get("ROUNDS", 4))
    quick = os.environ.get("QUICK") == "1"  # the tiny config on the CPU: a dry run
    setting = Setting(
        torch.device("cpu" if quick else "cuda"), torch.float32 if quick else torch.bfloat16, quick
    )
    torch.manual_seed(0)
    eager = _place(LlamaForCausalLM(_llama_config(setting, use_cache=True)), setting)
    ids = _token_ids(setting, eager.config.vocab_size, 1, 8 if quick else 128)
    compiled_ref = copy.deepcopy(eager)
    pytorch_graph = copy.deepcopy(eager)  # PyTorch's forward, recorded by dnntune's CUDA graphs
    from dnntune.torch.cuda_graphs import install

    pytorch_graph.__dict__["_dnntune_graph_auto"] = True
    install(pytorch_graph)
    optimized = copy.deepcopy(eager)
    optimized_compiled = copy.deepcopy(eager)
    out = {}
    for model in (optimized, optimized_compiled):
        t = time.perf_counter()
        dtt.optimize(
            model,
            (ids,),
            policy="tune",
            time_budget_s=15.0,
            overrides=os.path.join(tempfile.mkdtemp(), "ov.json"),
        )
        out.setdefault("optimize_s", []).append(time.perf_counter() - t)
    plain = Prompt(ids, {"cache_implementation": "static", "disable_compile": True})
    auto = Prompt(ids, {"cache_implementation": "static"})  # transformers' default: compiled
    forms = {
        "eager": (eager, plain),
        "transformers_compile": (compiled_ref, auto),
        "dnntune_replay": (optimized, plain),
        "dnntune_under_transformers_compile": (optimized_compiled, auto),
        "pytorch_graph": (pytorch_graph, plain),
    }
    wanted = os.environ.get("FORMS")
    if wanted:
        forms = {k: v for k, v in forms.items() if k in wanted.split(",") or k == "eager"}
    first = {}
    for name, (model, prompt) in forms.items():  # first calls: compile, recordings
        _sync(setting)
        t = time.perf_counter()
        try:
            prompt.generate(model, new)
        except Exception as exc:
            out.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]
        _sync(setting)
        first[name] = time.perf_counter() - t
    out["first_call_s"] = first
    live = {k: v for k, v in forms.items() if k not in out.get("errors", {})}
    for _ in range(2):
        for model, prompt in live.values():
            prompt.generate(model, 8)
    times = {k: [] for k in live}
    tokens = {}
    for _ in range(rounds):
        for name, (model, prompt) in live.items():
            _sync(setting)
            t = time.perf_counter()
            tokens[name] = prompt.new_tokens(model, new)
            _sync(setting)
            times[name].append((time.perf_counter() - t) * 1e3 / new)
    med = {k: statistics.median(v) for k, v in times.items()}
    out["ms_per_token"] = med
    out["rounds"] = times
    out["vs_eager"] = {k: med["eager"] / v for k, v in med.items()}
    out["same_tokens_as_eager"] = {k: bool((t == tokens["eager"]).all()) for k, t in tokens.items()}
    out["graphs"] = {
        k: (graphs_of(forms[k][0]).records, graphs_of(forms[k][0]).replays)
        for k in forms
        if k not in ("eager", "transformers_compile")
    }
    if os.environ.get("PROFILE"):  # where the host time of a replayed generate goes
        import cProfile
        import io
        import pstats

        for name in os.environ["PROFILE"].split(","):
            model, prompt = live[name]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2):
                prompt.generate(model, new)
            _sync(setting)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
            out.setdefault("profile", {})[name] = buf.getvalue()

    def scores(model, prompt):
        o = prompt.generate(model, new, output_scores=True, return_dict_in_generate=True)
        return torch.stack([s[0].float() for s in o.scores])

    ref = scores(eager, plain)
    out["logits_vs_eager"] = {k: agreement(ref, scores(*live[k])) for k in live if k != "eager"}
    for name, text in out.pop("profile", {}).items():
        print(f"=== profile {name} (2 generate calls of {new} tokens)\n{text}")
    print(json.dumps(out, indent=1))
    print(
        "[static_vs_compile]",
        {k: round(v, 3) for k, v in med.items()},
        {k: round(v, 2) for k, v in out["vs_eager"].items()},
        "first",
        {k: round(v, 1) for k, v in first.items()},
    )


if __name__ == "__main__":
    main()
