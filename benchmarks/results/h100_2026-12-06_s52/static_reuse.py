"""Session 52 probe: does a generate() loop over a static cache replay one recording, or record
again each call (a new StaticCache each call, keyed by its memory)? An optimized model's calls
in a row, then alternating with an eager model's, the recordings counted after each call and
each call timed (64 new tokens, the 8-layer LLaMA-style decoder of benchmarks/generate.py)."""

import copy
import gc
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, "benchmarks")
from _models_run import _sync
from _models_zoo import Setting, _llama_config, _place, _token_ids
from generate import Prompt

import dnntune.torch as dtt
from dnntune.torch.cuda_graphs import graphs_of


def main() -> None:
    from transformers import LlamaForCausalLM

    quick = os.environ.get("QUICK") == "1"
    dev = torch.device("cpu" if quick else "cuda")
    setting = Setting(dev, torch.float32 if quick else torch.bfloat16, quick)
    torch.manual_seed(0)
    eager = _place(LlamaForCausalLM(_llama_config(setting, use_cache=True)), setting)
    ids = _token_ids(setting, eager.config.vocab_size, 1, 8 if quick else 128)
    model = copy.deepcopy(eager)
    dtt.optimize(
        model, (ids,), policy="heuristic", overrides=os.path.join(tempfile.mkdtemp(), "ov.json")
    )
    prompt = Prompt(ids, {"cache_implementation": "static", "disable_compile": True})
    new = int(os.environ.get("NEW", 64))
    state = graphs_of(model)

    def once(m: object, tag: str) -> None:
        _sync(setting)
        t = time.perf_counter()
        prompt.generate(m, new)
        _sync(setting)
        ms = (time.perf_counter() - t) * 1e3
        # caches still alive once the call returned (without a collection): held by a cycle
        # or by dnntune, their memory not free for the next call's cache
        live = sum(type(o).__name__ == "StaticCache" for o in gc.get_objects())
        print(
            f"[reuse] {tag}: {ms:.1f} ms ({ms / new:.3f} ms/token), records {state.records}, "
            f"replays {state.replays}, caches alive {live}",
            flush=True,
        )

    gc.disable()  # (collections at their own times would move the next cache's addresses)
    for i in range(6):
        once(model, f"optimized, in a row #{i}")
    for i in range(4):
        once(eager, f"eager #{i}")
        once(model, f"optimized, after eager #{i}")
    gc.collect()
    gc.enable()
    for i in range(3):
        once(model, f"optimized, collections on #{i}")


if __name__ == "__main__":
    main()
