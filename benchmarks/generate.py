"""``generate()`` after ``optimize``: a causal LM's greedy generation, eager against optimized,
timed side by side (issue 23's user path past the example forward).

``optimize`` decides on its example inputs (a prompt, a prefill): there ``cuda_graph="auto"``
may keep a replay. A generation loop's decode steps pass the growing ``DynamicCache`` object,
which a replay cannot take (``docs/torch.md``), so they run uncaptured, on the same swaps, with
the host cost of dnntune's per-layer routing and fused calls (session 47, CPU: a LLaMA decoder
layer 172 µs eager against 234 µs optimized). This benchmark reads what a user sees: the
wall time of ``model.generate`` per new token, eager and optimized, in alternated rounds in one
process, and whether the greedy tokens agree.

    PYTHONPATH=src:benchmarks python benchmarks/generate.py --new-tokens 64 --prompt 128
    python benchmarks/generate.py --quick --device cpu      # the tiny config (the CPU test)
    python benchmarks/generate.py --quick --device cpu --dtype fp32 --keep-optimized \
        --without-race --new-tokens 48 --rounds 8           # the race of routes, on and off

An optimized model's uncaptured forwards (the decode steps here) race dnntune's route against
PyTorch's own forward per set of input shapes and run the faster
(``dnntune/torch/_route_race.py``).
``--without-race`` adds a third form, timed in the same rounds: the same optimized model with
the race left out (every forward on dnntune's route, as before session 49).
``--cache static`` generates with transformers' ``StaticCache`` (``cache_implementation=
"static"``, its own ``torch.compile`` turned off): the decode steps' inputs keep their shapes,
and they replay as CUDA graphs (``docs/torch.md``; ``DNNTUNE_STATIC_CACHE_REPLAY=0`` turns that
off); the result's ``graphs`` counts the recordings and replays.
``--eager-copy`` adds a control form, timed in the same rounds: an untouched deep copy of the
eager model (the optimized model is a deep copy too). Two copies of one model read apart on a
host-bound forward (``models.py``'s ``eager_copy`` read 1.00-1.10x of ``eager``, session 26,
H200), so a gap between eager and the optimized model within that spread is not the
optimization's.
``--keep-optimized`` passes ``revert_if_slower=False``, so that a model whose prompt forward
``optimize`` found slower (the tiny one on a CPU) is measured optimized, not reverted.

The model is ``models.py``'s LLaMA-style decoder (``_models_zoo._llama_config``: 8 layers of
2048, grouped-query attention, bf16 on CUDA; random weights, nothing downloaded). Writes
``<out>/generate.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _src_path import use_checkout_src

    use_checkout_src(__file__)  # PYTHONPATH's dnntune, where it gives one, wins

import torch
from _models_run import _sync
from _models_zoo import Setting, _llama_config, _place, _token_ids

import dnntune
import dnntune.torch as dtt
from dnntune.torch import _route_race

#: ``generate``'s options for each ``--cache``: transformers' default cache, or a
#: ``StaticCache`` (the decode steps' inputs keep their shapes) without transformers' own
#: ``torch.compile`` of the forward, which it would otherwise turn on for a static cache on CUDA
CACHES: dict[str, dict[str, Any]] = {
    "dynamic": {},
    "static": {"cache_implementation": "static", "disable_compile": True},
}


@dataclass(frozen=True)
class Prompt:
    """The prompt's token ids and the options every ``generate`` call of the run takes."""

    ids: torch.Tensor
    options: dict[str, Any] = field(default_factory=dict)

    def generate(self, model: Any, new_tokens: int, **extra: Any) -> Any:
        """``model.generate``'s greedy output for ``new_tokens`` new tokens (``extra``: more
        of its options), every run the same length, whatever it draws."""
        with torch.no_grad():
            return model.generate(
                input_ids=self.ids,
                attention_mask=torch.ones_like(self.ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                **self.options,
                **extra,
            )

    def new_tokens(self, model: Any, new_tokens: int) -> torch.Tensor:
        return self.generate(model, new_tokens)[:, self.ids.shape[1] :]


@contextlib.contextmanager
def _without_race(model: Any) -> Iterator[None]:
    """Every forward of the optimized ``model`` on dnntune's route (no race), while in force."""
    routes = model.__dict__.pop(_route_race.ROUTES, None)
    try:
        yield
    finally:
        if routes is not None:
            model.__dict__[_route_race.ROUTES] = routes


#: warm-up generate calls of each form: enough for a race of routes to choose for the prompt,
#: which races one forward a call
WARM_CALLS = 2 * _route_race.SAMPLES


def _routes(model: Any) -> str:
    """The routes the model's races chose, per set of input shapes raced (and how many races
    have not chosen yet)."""
    routes = model.__dict__.get(_route_race.ROUTES)
    if routes is None:
        return "no race"
    races = [r for r in (*routes.by_shapes.values(), routes.changing) if r is not None]
    chosen = [r.pytorch_chosen for r in races if r.pytorch_chosen is not None]
    undecided = len(races) - len(chosen)
    # which races chose dnntune's route: their forwards (the changing shapes' race runs
    # most decode steps) and their medians, ms (dnntune's / PyTorch's)
    ours = [
        f"{r.what}, {_median_ms(r.times[0]):.3f} / {_median_ms(r.times[1]):.3f}"
        if r.times[0] and r.times[1]
        else f"{r.what}, optimize's choice"
        for r in races
        if r.pytorch_chosen is False
    ]
    return (
        f"PyTorch's forward {sum(chosen)}, dnntune {len(chosen) - sum(chosen)}"
        + (f", racing {undecided}" if undecided else "")
        + (f" (dnntune's: {'; '.join(ours)})" if ours else "")
    )


def _median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


def _graphs(model: Any) -> dict[str, int]:
    from dnntune.torch.cuda_graphs import graphs_of

    state = graphs_of(model)
    return {"records": state.records, "replays": state.replays}


def _scores(model: Any, prompt: Prompt, new_tokens: int) -> torch.Tensor:
    """The logits each greedy step chose from, [steps, vocab] in float32 (not timed)."""
    out = prompt.generate(model, new_tokens, output_scores=True, return_dict_in_generate=True)
    return torch.stack([step[0].float() for step in out.scores])


def agreement(eager: torch.Tensor, optimized: torch.Tensor) -> dict[str, Any]:
    """How the two forms' logits agree, step by step ([steps, vocab] each; -inf where a
    processor banned a token): the first step whose greedy token differs, the largest logit
    difference up to it, and how close a call it was: eager's margin between its own pick
    and the optimized form's (a tie in bf16 flips on rounding; a wrong kernel shows as a
    difference far beyond the margin)."""
    picks_e, picks_o = eager.argmax(-1), optimized.argmax(-1)
    differ = (picks_e != picks_o).nonzero()
    first = int(differ[0, 0]) if len(differ) else None
    upto = eager.shape[0] if first is None else first + 1
    both = torch.isfinite(eager[:upto]) & torch.isfinite(optimized[:upto])
    diff = (eager[:upto] - optimized[:upto]).abs()[both]
    out: dict[str, Any] = {
        "first_different_step": first,
        "max_logit_diff": float(diff.max()) if diff.numel() else 0.0,
        "logit_scale": float(eager[:upto][torch.isfinite(eager[:upto])].abs().max()),
    }
    if first is not None:
        row = eager[first]
        out["eager_margin_at_flip"] = float(row[picks_e[first]] - row[picks_o[first]])
    return out


def _timed(model: Any, prompt: Prompt, new_tokens: int, setting: Setting, race: bool = True) -> Any:
    if not race:
        with _without_race(model):
            return _timed(model, prompt, new_tokens, setting)
    _sync(setting)
    start = time.perf_counter()
    tokens = prompt.new_tokens(model, new_tokens)
    _sync(setting)
    return (time.perf_counter() - start) * 1e3 / new_tokens, tokens


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import LlamaForCausalLM

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    setting = Setting(device, dtype, args.quick)
    torch.manual_seed(0)
    eager = _place(LlamaForCausalLM(_llama_config(setting, use_cache=True)), setting)
    ids = _token_ids(setting, eager.config.vocab_size, args.batch, args.prompt)
    prompt = Prompt(ids, CACHES[args.cache])
    optimized = copy.deepcopy(eager)
    eager_copy = copy.deepcopy(eager) if args.eager_copy else None
    overrides = args.overrides or os.path.join(tempfile.mkdtemp(), "generate_overrides.json")
    start = time.perf_counter()
    report = dtt.optimize(
        optimized,
        (ids,),
        policy=args.policy,
        overrides=overrides,
        time_budget_s=args.tune_budget_s,
        revert_if_slower=not args.keep_optimized,
    )
    optimize_s = time.perf_counter() - start
    forms = {"eager": eager, "dnntune": optimized}
    if args.without_race:
        forms["dnntune_without_race"] = optimized
    if eager_copy is not None:  # the control: an untouched copy, as the optimized model is one
        forms["eager_copy"] = eager_copy
    # warm: each form's first generate calls (recordings, lazy setup), as many as the races
    # need to choose for the prompt (one forward a call) and the decode steps: the timed
    # rounds read the routes a user's later calls run
    for _ in range(WARM_CALLS):
        for model in forms.values():
            prompt.generate(model, min(args.new_tokens, 4))
    times: dict[str, list[float]] = {name: [] for name in forms}
    tokens: dict[str, torch.Tensor] = {}
    routes = []
    for i in range(args.rounds):
        # the forms' order turns round each round (ABBA), so that a drift over the run (the
        # host's clock, a background task) weighs on each form alike
        order = list(forms.items())
        for name, model in order if i % 2 == 0 else order[::-1]:
            race = name != "dnntune_without_race"
            ms, tokens[name] = _timed(model, prompt, args.new_tokens, setting, race)
            times[name].append(ms)
            if name == "dnntune":
                routes.append(_routes(optimized))
    logits = agreement(
        _scores(eager, prompt, args.new_tokens), _scores(optimized, prompt, args.new_tokens)
    )
    same = (tokens["eager"] == tokens["dnntune"]).all(dim=0)
    first_diff = int((~same).nonzero()[0, 0]) if not bool(same.all()) else None
    median = {name: statistics.median(ms) for name, ms in times.items()}
    return {
        "benchmark": "generate",
        "args": {k: str(v) for k, v in vars(args).items()},
        "versions": {
            "torch": torch.__version__,
            "dnntune_path": str(Path(dnntune.__file__).resolve().parent),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        },
        "optimize_s": optimize_s,
        "choice": getattr(report, "choice", None),
        "report": str(report),
        "ms_per_token": median,
        "rounds_ms_per_token": times,
        "speedup": median["eager"] / median["dnntune"],
        "speedups": {name: median["eager"] / ms for name, ms in median.items()},
        # the median of each round's own ratio (eager's ms / the form's, both timed in that
        # round): steadier than the ratio of medians where the rounds drift
        "paired_speedups": {
            name: statistics.median(e / o for e, o in zip(times["eager"], ms, strict=True))
            for name, ms in times.items()
        },
        "reverted": bool(getattr(report, "reverted", False)),
        "routes_per_round": routes,
        # the whole forward's CUDA graphs: recorded, and replayed (decode steps replay with
        # a static cache, ``dnntune/torch/_static_caches.py``)
        "graphs": _graphs(optimized),
        "same_tokens": bool(same.all()),
        "first_different_token": first_diff,
        "logits": logits,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--quick", action="store_true", help="the tiny config (CPU test)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (the example)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--cache",
        choices=sorted(CACHES),
        default="dynamic",
        help="generate's KV cache: transformers' default (dynamic) or a StaticCache",
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--policy", default="tune")
    p.add_argument("--tune-budget-s", type=float, default=15.0)
    p.add_argument("--overrides", default=None, help="override file (default: a fresh one)")
    p.add_argument(
        "--keep-optimized",
        action="store_true",
        help="optimize with revert_if_slower=False (measure the optimized model, not a revert)",
    )
    p.add_argument(
        "--without-race",
        action="store_true",
        help="also time the optimized model with every forward on dnntune's route",
    )
    p.add_argument(
        "--eager-copy",
        action="store_true",
        help="also time an untouched deep copy of the eager model (the copy-to-copy spread)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (try --device cpu --quick)")
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.json").write_text(json.dumps(result, indent=1))
    ms = result["ms_per_token"]
    logits = result["logits"]
    agree = (
        "same tokens"
        if result["same_tokens"]
        else (
            f"tokens differ from #{result['first_different_token']} (eager's margin there "
            f"{logits.get('eager_margin_at_flip', float('nan')):.3g}, largest logit difference "
            f"up to it {logits['max_logit_diff']:.3g} of logits up to "
            f"{logits['logit_scale']:.3g})"
        )
    )
    without = (
        f", without the race {ms['dnntune_without_race']:.3f} ms/token "
        f"({result['speedups']['dnntune_without_race']:.2f}x)"
        if "dnntune_without_race" in ms
        else ""
    )
    if "eager_copy" in ms:
        without += (
            f", an eager copy {ms['eager_copy']:.3f} ms/token "
            f"({result['paired_speedups']['eager_copy']:.2f}x per round: the copies' spread)"
        )
    route = result["routes_per_round"][-1] if result["routes_per_round"] else "no race"
    print(
        f"[generate] eager {ms['eager']:.3f} ms/token, dnntune {ms['dnntune']:.3f} ms/token "
        f"({result['speedup']:.2f}x, per round {result['paired_speedups']['dnntune']:.2f}x; "
        f"optimize {result['optimize_s']:.1f} s, "
        f"{result['choice']}{', reverted' if result['reverted'] else ''}; routes raced: "
        f"{route}; graphs recorded {result['graphs']['records']}, replayed "
        f"{result['graphs']['replays']}){without}; {agree}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
