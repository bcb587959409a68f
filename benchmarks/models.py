"""Real models: ``dnntune.torch.optimize`` against eager, CUDA graphs and ``torch.compile``.

Each model is real library code with random weights (torchvision, timm, transformers; nothing
is downloaded), in eval mode, bf16 on CUDA (fp32 on the CPU), channels_last for the CNNs:
ResNet-50, EfficientNet-B0, ViT-B/16 (timm), Swin-T, ConvNeXt-T, a BERT-base encoder, a
LLaMA-style decoder (prefill, and decode against a preallocated ``StaticCache``), the Whisper
encoder, and two tiny pure-torch models (``tiny_cnn``, ``tiny_mlp``) for ``--quick`` and the CPU
test. A model whose library is missing is skipped with its reason.

Variants, all in one process, timed side by side (``_interleaved``: a time-based warm-up each,
then rounds that time every variant over a burst of back-to-back calls, in a rotating order;
the median ms per forward, ``torch.backends.cudnn.benchmark`` on throughout, also while
``optimize`` runs: it decides in the conditions of use):

* ``eager``; ``eager_graph``: the eager forward recorded once with a plain ``torch.cuda.graph``
  (input copied into a static buffer, replay, static output read);
* ``compile`` (default mode) and ``max_autotune`` (``mode="max-autotune"``), compile seconds
  reported (the first call). A compile past ``--compile-timeout-s`` ends the model's subprocess
  and the model runs again without that variant (a "timeout" cell). dnntune's routing of
  ``F.scaled_dot_product_attention`` and the pools (for good, from its first ``optimize``) is
  installed first, so the compiled code traces what it later runs and is not recompiled;
* ``dnntune``: ``optimize(copy, inputs, policy, overrides, cuda_graph=False)``; ``dnntune_graph``:
  ``cuda_graph=True``; ``dnntune_auto``: ``cuda_graph="auto"`` (it picks among PyTorch's and
  dnntune's forward, each uncaptured or replayed). The three share one override file; tune
  seconds are each ``optimize`` call's wall time (its speed checks included).

Every variant's output is compared with eager's on the same input (max abs error; pass within
bf16 tolerance: element-wise with an absolute part scaled to the output's RMS for the vision
models, the relative error of the norm for the transformers). A failing variant is a cell with
the exception, never the end of the run. By default each model runs in its own subprocess with
a wall-clock limit (``--model-timeout-s``; ``--budget-s`` for the whole run), so a CUDA fault or
a hang costs that model only (``--in-process``: one process, no limits). dnntune's, Inductor's
and Triton's on-disk caches are fresh per model (first-run tuning and compile seconds) unless
``--keep-cache``.

The LLaMA decode step re-runs the same position each call (the cache's write position is
rewound before each step, one in-place copy): real decode advances it, which changes nothing
that is timed here. It attends over the whole static cache, as compiled static-cache decoders do.

Usage::

    python benchmarks/models.py --list
    python benchmarks/models.py --out results/models                      # every model, CUDA
    python benchmarks/models.py --models resnet50,llama_decode --skip-max-autotune
    python benchmarks/models.py --models bert_base,llama_decode --skip-compile \
        --skip-max-autotune --budget-s 280                        # a short GPU session
    python benchmarks/models.py --device cpu --quick --models tiny_cnn,tiny_mlp --skip-compile

Writes ``<out>/models.json`` (after every model) and ``<out>/models.md``, each model's log in
``<out>/logs/`` (``--out`` or ``$OUT`` or ``.``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib
import importlib.metadata
import inspect
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.errors import InvalidValueError

VARIANTS = (
    "eager",
    "eager_graph",
    "compile",
    "max_autotune",
    "dnntune",
    "dnntune_graph",
    "dnntune_auto",
)
#: the compiled variants early: a compile cut by ``--compile-timeout-s`` then costs only the
#: setups before it when the model runs again without that variant
SETUP_ORDER = VARIANTS
#: the variants whose setup ``--compile-timeout-s`` limits, by the stage a model reports
SKIP_FLAGS_BY_STAGE = {"setup compile": "compile", "setup max_autotune": "max_autotune"}
TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-2}
#: the issue's targets for cuda_graph="auto"
TARGET_GEOMEAN_OVER_EAGER_GRAPH = 1.15
TARGET_COMPILE_TIME_SHARE = 0.1


# ---- models ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    device: torch.device
    dtype: torch.dtype
    quick: bool

    def batch(self, full: int) -> int:
        return 2 if self.quick else full


@dataclass
class Workload:
    """What every variant runs: ``model(*inputs)``; ``inputs`` are optimize's example inputs."""

    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    #: "elementwise" (vision outputs) or "norm" (relative error of the norm: transformers)
    compare: str = "elementwise"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    description: str
    build: Callable[[Setting], Workload]
    requires: tuple[str, ...] = ()

    def unavailable(self) -> str | None:
        """Why this model cannot run here (a missing library), or None."""
        for module in self.requires:
            reason = _import_error(module)
            if reason:
                return f"needs {module} ({reason})"
        return None


_import_errors: dict[str, str] = {}


def _import_error(module: str) -> str:
    if module not in _import_errors:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(module)
            _import_errors[module] = ""
        except Exception as exc:  # not installed, or installed and broken: either way, skip
            _import_errors[module] = _describe(exc)
    return _import_errors[module]


def _place(model: nn.Module, s: Setting, channels_last: bool = False) -> nn.Module:
    model = model.to(device=s.device, dtype=s.dtype).eval()
    if channels_last:  # (Module.to's stubs lack memory_format)
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


def _images(s: Setting, batch: int, size: int) -> tuple[torch.Tensor, ...]:
    x = torch.randn(s.batch(batch), 3, size, size, device=s.device, dtype=s.dtype)
    return (x.contiguous(memory_format=torch.channels_last),)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


class TinyMLP(nn.Module):
    """A pre-norm transformer block: attention, then a GELU MLP."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(a)
        return x + self.mlp(self.norm2(x))


def _tiny_cnn(s: Setting) -> Workload:
    return Workload(_place(TinyCNN(), s, channels_last=True), _images(s, 32, 16 if s.quick else 64))


def _tiny_mlp(s: Setting) -> Workload:
    x = torch.randn(s.batch(32), 16 if s.quick else 128, 64, device=s.device, dtype=s.dtype)
    return Workload(_place(TinyMLP(), s), (x,))


def _torchvision(name: str) -> Callable[[Setting], Workload]:
    def build(s: Setting) -> Workload:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
        return Workload(
            _place(model, s, channels_last=True), _images(s, 32, 64 if s.quick else 224)
        )

    return build


def _vit_b16(s: Setting) -> Workload:
    import timm

    size = 64 if s.quick else 224
    model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=size)
    return Workload(_place(model, s), _images(s, 32, size), compare="norm")


def _token_ids(s: Setting, vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), device=s.device, dtype=torch.int64)


def _bert(s: Setting) -> Workload:
    from transformers import BertConfig, BertModel

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    small |= {"intermediate_size": 128, "vocab_size": 1000}
    config = BertConfig(attn_implementation="sdpa", **(small if s.quick else {}))
    ids = _token_ids(s, config.vocab_size, s.batch(32), 16 if s.quick else 128)
    return Workload(_place(BertModel(config), s), (ids,), compare="norm")


def _llama_config(s: Setting, use_cache: bool) -> Any:
    from transformers import LlamaConfig

    if s.quick:
        sizes = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
        sizes |= {"num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 512}
    else:
        sizes = {"hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16}
        sizes |= {"num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000}
    return LlamaConfig(
        **sizes, max_position_embeddings=4096, use_cache=use_cache, attn_implementation="sdpa"
    )


def _llama_prefill(s: Setting) -> Workload:
    from transformers import LlamaModel

    config = _llama_config(s, use_cache=False)
    ids = _token_ids(s, config.vocab_size, 1, 16 if s.quick else 2048)
    return Workload(_place(LlamaModel(config), s), (ids,), compare="norm")


def _cache_keywords(lm: nn.Module) -> tuple[str, bool]:
    """How this transformers version's forward takes the cache: the keyword (5.24 renamed
    ``past_key_values`` to ``cache``) and whether it wants ``cache_position`` (4.x)."""
    params = inspect.signature(lm.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "cache_position" in params


def _cache_kwargs(keywords: tuple[str, bool], cache: Any, position: torch.Tensor) -> dict[str, Any]:
    name, wants_position = keywords
    kwargs: dict[str, Any] = {name: cache, "use_cache": True, "position_ids": position[None]}
    return kwargs | ({"cache_position": position} if wants_position else {})


def _static_cache(config: Any, batch: int, max_len: int, s: Setting) -> Any:
    """A ``StaticCache`` built with the arguments this transformers version takes."""
    from transformers import StaticCache

    offered = {"config": config, "max_cache_len": max_len, "batch_size": batch}
    offered |= {"max_batch_size": batch, "device": s.device, "dtype": s.dtype}
    params = inspect.signature(StaticCache.__init__).parameters
    if "batch_size" in params:
        offered.pop("max_batch_size")
    return StaticCache(**{k: v for k, v in offered.items() if k in params})


class DecodeStep(nn.Module):
    """One decode step of a causal LM at a fixed position of a preallocated ``StaticCache``.

    The cache is a plain attribute (its tensors are written each step: not the module's
    buffers); ``copy.deepcopy`` gives each variant its own. transformers 5 keeps the write
    position in the cache (``cumulative_length``, advanced by each update): it is rewound to
    ``position`` before every step, so every call writes and reads the same slots.
    """

    def __init__(self, lm: nn.Module, cache: Any, position: int, device: torch.device) -> None:
        super().__init__()
        self.lm = lm
        self.cache = cache
        self.keywords = _cache_keywords(lm)
        self.position = torch.tensor([position], device=device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        lengths = [
            layer.cumulative_length
            for layer in getattr(self.cache, "layers", ())
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
        ]
        if lengths:
            torch._foreach_copy_(lengths, [self.position[0]] * len(lengths))
        out = self.lm(
            input_ids=input_ids, **_cache_kwargs(self.keywords, self.cache, self.position)
        )
        return out.logits


def _llama_decode(s: Setting) -> Workload:
    from transformers import LlamaForCausalLM

    config = _llama_config(s, use_cache=True)
    lm = _place(LlamaForCausalLM(config), s)
    prefill, max_len = (16, 32) if s.quick else (1024, 2048)
    cache = _static_cache(config, 1, max_len, s)
    prompt = _token_ids(s, config.vocab_size, 1, prefill)
    with torch.no_grad():  # filled once, before any variant exists
        positions = torch.arange(prefill, device=s.device)
        lm(input_ids=prompt, **_cache_kwargs(_cache_keywords(lm), cache, positions))
    step = DecodeStep(lm, cache, prefill, s.device)
    return Workload(step.eval(), (_token_ids(s, config.vocab_size, 1, 1),), compare="norm")


def _whisper_encoder(s: Setting) -> Workload:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    if s.quick:
        sizes = {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 2}
        sizes |= {"encoder_ffn_dim": 128, "max_source_positions": 50}
    else:  # whisper-base's encoder
        sizes = {"d_model": 512, "encoder_layers": 6, "encoder_attention_heads": 8}
        sizes |= {"encoder_ffn_dim": 2048}
    config = WhisperConfig(attn_implementation="sdpa", **sizes)
    frames = 2 * config.max_source_positions  # the encoder wants exactly this many
    x = torch.randn(s.batch(4), config.num_mel_bins, frames, device=s.device, dtype=s.dtype)
    return Workload(_place(WhisperEncoder(config), s), (x,), compare="norm")


TV, HF = ("torchvision",), ("transformers",)
SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("tiny_cnn", "tiny", "conv-BN-ReLU x2, pool, linear", _tiny_cnn),
        ModelSpec("tiny_mlp", "tiny", "a transformer block: LayerNorm, SDPA, GELU MLP", _tiny_mlp),
        ModelSpec(
            "resnet50", "cnn", "torchvision resnet50, 32x224x224", _torchvision("resnet50"), TV
        ),
        ModelSpec(
            "efficientnet_b0",
            "cnn",
            "torchvision efficientnet_b0 (SE blocks, SiLU), 32x224x224",
            _torchvision("efficientnet_b0"),
            TV,
        ),
        ModelSpec("vit_b16", "vit", "timm vit_base_patch16_224, 32x224x224", _vit_b16, ("timm",)),
        ModelSpec("swin_t", "vit", "torchvision swin_t, 32x224x224", _torchvision("swin_t"), TV),
        ModelSpec(
            "convnext_tiny",
            "cnn",
            "torchvision convnext_tiny, 32x224x224",
            _torchvision("convnext_tiny"),
            TV,
        ),
        ModelSpec("bert_base", "encoder", "BertModel (sdpa), 32x128 tokens", _bert, HF),
        ModelSpec(
            "llama_prefill",
            "decoder",
            "LlamaModel 2048 hidden, 8 layers, GQA 16/4, 1x2048 tokens, no cache",
            _llama_prefill,
            HF,
        ),
        ModelSpec(
            "llama_decode",
            "decoder",
            "LlamaForCausalLM (same config), 1 token at 1024 of a 2048 StaticCache",
            _llama_decode,
            HF,
        ),
        ModelSpec(
            "whisper_encoder",
            "audio",
            "WhisperEncoder (whisper-base sizes), 4x80x3000 mel frames",
            _whisper_encoder,
            HF,
        ),
    )
}


# ---- variants --------------------------------------------------------------------------------
class NotApplicable(Exception):
    """A variant that does not run here (a skip flag, no CUDA, an uncapturable forward)."""


@dataclass
class Context:
    setting: Setting
    args: argparse.Namespace
    overrides: Path


@dataclass
class Prepared:
    fn: Callable[[], Any]
    info: dict[str, Any] = field(default_factory=dict)


def _sync(s: Setting) -> None:
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)


def _eager(w: Workload, ctx: Context) -> Prepared:
    model, inputs = w.model, w.inputs
    return Prepared(lambda: model(*inputs))


def _eager_graph(w: Workload, ctx: Context) -> Prepared:
    if ctx.setting.device.type != "cuda":
        raise NotApplicable("CUDA only")
    model, inputs = w.model, w.inputs
    static = [t.clone() for t in inputs]
    try:
        side = torch.cuda.Stream(ctx.setting.device)
        side.wait_stream(torch.cuda.current_stream(ctx.setting.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                model(*static)
        torch.cuda.current_stream(ctx.setting.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = model(*static)
    except Exception as exc:
        _sync(ctx.setting)
        raise NotApplicable(f"not capturable: {_describe(exc)}") from exc

    def replay() -> Any:
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        graph.replay()
        return out

    return Prepared(replay)


def _compiled(mode: str | None, skip: str) -> Callable[[Workload, Context], Prepared]:
    def setup(w: Workload, ctx: Context) -> Prepared:
        if getattr(ctx.args, skip):
            raise NotApplicable(f"skipped (--{skip.replace('_', '-')})")
        compiled = torch.compile(copy.deepcopy(w.model), mode=mode)
        inputs = w.inputs
        start = time.perf_counter()
        compiled(*inputs)  # compiles (max-autotune: and benchmarks its kernels)
        _sync(ctx.setting)
        return Prepared(lambda: compiled(*inputs), {"compile_s": time.perf_counter() - start})

    return setup


def _dnntune(cuda_graph: bool | str) -> Callable[[Workload, Context], Prepared]:
    def setup(w: Workload, ctx: Context) -> Prepared:
        if cuda_graph is not False and ctx.setting.device.type != "cuda":
            # without CUDA, "auto" is cuda_graph=False: the dnntune cell
            raise NotApplicable("CUDA only")
        model, inputs = copy.deepcopy(w.model), w.inputs
        start = time.perf_counter()
        try:
            report = dtt.optimize(
                model,
                inputs,
                policy=ctx.args.policy,
                overrides=ctx.overrides,
                cuda_graph=cuda_graph,  # type: ignore[arg-type]  # a newer optimize takes "auto"
            )
        except (TypeError, InvalidValueError) as exc:
            if cuda_graph == "auto" and "cuda_graph" in str(exc):
                raise NotApplicable("cuda_graph='auto' not supported") from exc
            raise
        info = {
            "tune_s": time.perf_counter() - start,
            "tuning_s": report.tuning_time_ms / 1e3,
            "reverted": report.reverted,
            "swapped": len(report.swapped),
            "autotune_calls": report.autotune_calls,
            "check_speedup": report.speedup,
            # cuda_graph="auto": what it kept, and the forward times it decided on
            "choice": getattr(report, "choice", None),
            "check_eager_ms": report.eager_forward_ms,
            "check_eager_graph_ms": getattr(report, "eager_graph_ms", None),
            "check_ms": report.forward_ms,
            "report": str(report),
        }
        return Prepared(lambda: model(*inputs), info)

    return setup


SETUPS: dict[str, Callable[[Workload, Context], Prepared]] = {
    "eager": _eager,
    "eager_graph": _eager_graph,
    "compile": _compiled(None, "skip_compile"),
    "max_autotune": _compiled("max-autotune", "skip_max_autotune"),
    "dnntune": _dnntune(False),
    "dnntune_graph": _dnntune(True),
    "dnntune_auto": _dnntune("auto"),
}


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _output(value: Any) -> torch.Tensor:
    """The tensor a forward's result is compared by: itself, or its first tensor (a
    transformers ModelOutput's last_hidden_state or logits)."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value
    for item in items:
        if isinstance(item, torch.Tensor):
            return item
    raise TypeError(f"no tensor in the output ({type(value).__name__})")


def _error(out: torch.Tensor, ref: torch.Tensor, compare: str, tol: float) -> dict[str, Any]:
    if out.shape != ref.shape:
        return {"pass": False, "error_note": f"shape {tuple(out.shape)} != {tuple(ref.shape)}"}
    a, b = out.detach().double(), ref.detach().double()
    diff = (a - b).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
    if not bool(torch.isfinite(a).all()):
        ok = False
    elif compare == "norm":
        ok = rel <= tol
    else:  # random-weight outputs are not unit scale: the absolute part follows their RMS
        scale = max(1.0, float(b.square().mean().sqrt()))
        ok = bool((diff <= tol * scale + tol * b.abs()).all())
    return {"max_abs_err": max_abs, "rel_err": rel, "pass": ok}


def _setup(
    name: str, w: Workload, ctx: Context, ref: torch.Tensor
) -> tuple[Prepared | None, dict[str, Any]]:
    """Prepare one variant and check its output: (the prepared call or None, its cell)."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.simplefilter("ignore", quiet)  # the libraries' notices, not problems
        try:
            with torch.no_grad():
                prepared = SETUPS[name](w, ctx)
                out = _output(prepared.fn()).clone()
            _sync(ctx.setting)
        except NotApplicable as exc:
            return None, {"status": "n/a", "reason": str(exc)}
        except Exception as exc:
            return None, {"status": "error", "reason": _describe(exc)}
    cell: dict[str, Any] = {"status": "ok", "setup_s": time.perf_counter() - start}
    cell |= prepared.info
    cell |= _error(out, ref, w.compare, TOLERANCE[ctx.setting.dtype])
    if caught:
        cell["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return prepared, cell


# ---- timing ----------------------------------------------------------------------------------
def _interleaved(
    fns: dict[str, Callable[[], Any]], s: Setting, warmup_s: float, rounds: int
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per-call ms of every variant, per round, timed side by side; and the variants that
    raised (their reason). As ``torch_e2e._side_by_side``: each variant warms up for at least
    ``warmup_s`` and 3 calls (and sizes its burst to about 10 ms); then each round times
    every variant, in a rotating order, over its burst of back-to-back calls with one sync
    (CUDA events on CUDA), so a clock change or a noisy neighbour hits all alike."""
    cuda = s.device.type == "cuda"
    bursts: dict[str, int] = {}
    failed: dict[str, str] = {}
    for name, fn in fns.items():
        try:
            n, t0 = 0, time.perf_counter()
            while n < 3 or time.perf_counter() - t0 < warmup_s:
                fn()
                n += 1
                if n % 5 == 0:
                    _sync(s)
            _sync(s)
            t0, n_timed = time.perf_counter(), 3
            for _ in range(n_timed):
                fn()
            _sync(s)
            per_call = (time.perf_counter() - t0) / n_timed
            bursts[name] = max(3, min(200, int(0.010 / max(per_call, 1e-7))))
        except Exception as exc:
            failed[name] = f"while timing: {_describe(exc)}"
    samples: dict[str, list[float]] = {name: [] for name in bursts}
    for r in range(rounds):
        names = [n for n in bursts if n not in failed]
        if not names:
            break
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = fns[name], bursts[name]
            try:
                samples[name].append(_burst_ms(fn, n, s, cuda))
            except Exception as exc:
                failed[name] = f"while timing: {_describe(exc)}"
    return {k: v for k, v in samples.items() if k not in failed and v}, failed


def _burst_ms(fn: Callable[[], Any], n: int, s: Setting, cuda: bool) -> float:
    _sync(s)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / n
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e3 / n


# ---- one model -------------------------------------------------------------------------------
def run_model(
    spec: ModelSpec, args: argparse.Namespace, on_update: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Build, set up every variant, time them side by side; the row (also passed to
    ``on_update`` at the start of every stage, so a run cut short keeps what finished)."""
    s = _setting(args)
    row: dict[str, Any] = {"model": spec.name, "family": spec.family, "status": "ok"}
    row |= {"description": spec.description, "dtype": str(s.dtype).removeprefix("torch.")}
    row["variants"] = {}
    reason = spec.unavailable()
    if reason:
        return row | {"status": "skipped", "reason": reason}

    def stage(name: str) -> None:
        row.update(stage=name, stage_started=time.time())
        on_update(row)

    if s.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    _route_like_dnntune()
    with tempfile.TemporaryDirectory() as tmp, _fresh_cache(tmp, args.keep_cache):
        stage("build")
        try:
            w, ref = _build(spec, s)
        except Exception as exc:
            del row["stage"], row["stage_started"]
            return row | {"status": "error", "reason": f"build: {_describe(exc)}"}
        row["inputs"] = [[*t.shape] for t in w.inputs]
        ctx = Context(s, args, Path(tmp) / "ov.json")
        fns: dict[str, Callable[[], Any]] = {}
        for name in SETUP_ORDER:
            stage(f"setup {name}")
            prepared, row["variants"][name] = _setup(name, w, ctx, ref)
            if prepared is not None:
                fns[name] = prepared.fn
        stage("timing")
        _time_variants(row["variants"], fns, s, args)
        del row["stage"], row["stage_started"], fns, w
        _release(s)
    return row


def _build(spec: ModelSpec, s: Setting) -> tuple[Workload, torch.Tensor]:
    """The workload (seeded, built on the device; the libraries' warnings kept quiet) and
    eager's output, the reference of every variant."""
    torch.manual_seed(0)
    with warnings.catch_warnings(), s.device:
        warnings.simplefilter("ignore")
        w = spec.build(s)
    with torch.no_grad():
        w.model(*w.inputs)  # cudnn.benchmark picks its algorithms here, outside any timing
        return w, _output(w.model(*w.inputs)).clone()


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _route_like_dnntune() -> None:
    """Route ``F.scaled_dot_product_attention`` and the pools as dnntune's first ``optimize``
    does (for good, for every caller), before anything is compiled: the compiled variants
    trace the functions they later run with, and are not recompiled while timed."""
    module = importlib.import_module("dnntune.torch.optimize")
    install = getattr(module, "_install_routers", None)
    if install is not None:
        install()


def _time_variants(
    cells: dict[str, dict[str, Any]],
    fns: dict[str, Callable[[], Any]],
    s: Setting,
    args: argparse.Namespace,
) -> None:
    """Time the prepared variants side by side; their medians, rounds and speedups go into
    their cells (a variant that raised while timed becomes an error cell)."""
    graphs = _dynamo_graphs()
    with torch.no_grad():
        samples, failed = _interleaved(fns, s, args.warmup_s, args.rounds)
    if _dynamo_graphs() != graphs:  # a compiled variant recompiled while warmed up or timed
        for name in ("compile", "max_autotune"):
            if name in fns:
                cells[name]["recompiled_while_timed"] = _dynamo_graphs() - graphs
    for name, reason in failed.items():
        cells[name] |= {"status": "error", "reason": reason}
    eager_ms = statistics.median(samples["eager"]) if "eager" in samples else None
    for name, rounds in samples.items():
        cells[name] |= {"median_ms": statistics.median(rounds), "rounds_ms": rounds}
        if eager_ms:
            cells[name]["speedup"] = eager_ms / cells[name]["median_ms"]


#: the on-disk caches that make a second tune or compile fast: fresh per model by default
CACHE_VARIABLES = ("DNNTUNE_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@contextlib.contextmanager
def _fresh_cache(tmp: str, keep: bool) -> Iterator[None]:
    """dnntune's, Inductor's and Triton's caches in ``tmp``, so tuning and compile seconds are
    first-run costs, alike for both (``keep``: the caches as the environment sets them)."""
    if keep:
        yield
        return
    previous = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    for name in CACHE_VARIABLES:
        os.environ[name] = str(Path(tmp) / name.lower())
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _release(s: Setting) -> None:
    gc.collect()
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)
        torch.cuda.empty_cache()
    with contextlib.suppress(Exception):
        torch._dynamo.reset()


def _setting(args: argparse.Namespace) -> Setting:
    device = torch.device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    return Setting(device, dtypes[dtype], args.quick)


# ---- running many models ---------------------------------------------------------------------
def _forwarded(args: argparse.Namespace) -> list[str]:
    """The flags a model's subprocess gets (everything but selection and output)."""
    flags = ["--device", args.device, "--policy", args.policy, "--rounds", str(args.rounds)]
    flags += ["--warmup-s", str(args.warmup_s), "--compile-timeout-s", str(args.compile_timeout_s)]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    for flag in ("quick", "skip_compile", "skip_max_autotune", "keep_cache"):
        if getattr(args, flag):
            flags.append("--" + flag.replace("_", "-"))
    return flags


def _run_isolated(
    spec: ModelSpec, args: argparse.Namespace, out: Path, deadline: float
) -> dict[str, Any]:
    """``run_model`` in a subprocess; its log in ``out/logs``. A compile that runs past
    ``--compile-timeout-s`` ends the subprocess, and the model runs again without that variant
    (a timeout cell); each subprocess has ``--model-timeout-s``, and none runs past
    ``deadline`` (``time.monotonic()``, from ``--budget-s``)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{spec.name}.log"
    log.write_text("")
    timed_out: dict[str, str] = {}
    while True:
        limit_s = min(args.model_timeout_s, deadline - time.monotonic())
        row, problem = _attempt(spec, args, log, [*timed_out], limit_s)
        variant = SKIP_FLAGS_BY_STAGE.get(problem or "")
        if variant is None or variant in timed_out:
            break
        timed_out[variant] = f"compile over --compile-timeout-s {args.compile_timeout_s:g} s"
    for variant, reason in timed_out.items():
        row.setdefault("variants", {})[variant] = {"status": "timeout", "reason": reason}
    return row


def _attempt(
    spec: ModelSpec, args: argparse.Namespace, log: Path, skip: list[str], limit_s: float
) -> tuple[dict[str, Any], str | None]:
    """One subprocess run of the model, at most ``limit_s``: its row, and what cut it short
    (a compile stage that ran too long, "timeout", "exit code N") or None."""
    with tempfile.TemporaryDirectory() as tmp, log.open("a") as sink:
        row_file = Path(tmp) / "row.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", spec.name]
        cmd += ["--json-out", str(row_file), *_forwarded(args)]
        cmd += [f"--skip-{v.replace('_', '-')}" for v in skip]
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        started, problem = time.time(), None
        row: dict[str, Any] = {"model": spec.name, "family": spec.family, "variants": {}}
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                with contextlib.suppress(OSError, ValueError):  # not written yet
                    row = json.loads(row_file.read_text())
                now, stage = time.time(), row.get("stage", "")
                if stage in SKIP_FLAGS_BY_STAGE:
                    problem = stage if now - row["stage_started"] > args.compile_timeout_s else None
                if problem is None and now - started > limit_s:
                    problem = "timeout"
                if problem:
                    break
        finally:  # a cut (or this process ended by SIGTERM): the subprocess and its workers
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if row_file.exists():
            row = json.loads(row_file.read_text())
    stage = row.pop("stage", None)
    row.pop("stage_started", None)
    where = f" during {stage}" if stage else ""
    if problem == "timeout":
        reason = f"over its time limit ({limit_s:.0f} s){where}"
        row |= {"status": "timeout", "reason": reason}
    elif problem is None and proc.returncode != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1][:300] if lines else "no output"
        problem = f"exit code {proc.returncode}"
        row |= {"status": "error", "reason": f"{problem}{where}: {last} (see {log})"}
    return row, problem


def _versions(s: Setting) -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "torchvision", "timm", "transformers", "dnntune"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["dnntune_commit"] = _git_commit()
    found["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    found["device"] = (
        torch.cuda.get_device_name(s.device)
        if s.device.type == "cuda"
        else (platform.processor() or platform.machine())
    )
    return found


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return done.stdout.strip()
    return None


def _fmt_cell(cell: dict[str, Any] | None, variant: str) -> str:
    if not cell:
        return "-"
    status = cell.get("status")
    if status == "n/a":
        return "not capturable" if "not capturable" in cell["reason"] else "n/a"
    if status != "ok" or "median_ms" not in cell:
        return "not timed" if status == "ok" else str(status)
    if variant == "eager" or "speedup" not in cell:  # (no eager time: this one's own)
        text = f"{cell['median_ms']:.3f}" + ("" if variant == "eager" else " ms")
    else:
        text = f"{cell['speedup']:.2f}x"
    extra = []
    for key in ("compile_s", "tune_s"):
        if key in cell:
            extra.append(f"{cell[key]:.1f} s" if cell[key] < 10 else f"{cell[key]:.0f} s")
    if "tune_s" in cell:
        extra += ["reverted"] if cell.get("reverted") and variant != "dnntune_auto" else []
    if cell.get("choice"):
        extra.append(str(cell["choice"]))
    return f"{text} ({', '.join(extra)})" if extra else text


def _fmt_error(row: dict[str, Any]) -> str:
    cells = [(v, c) for v, c in row.get("variants", {}).items() if c and "pass" in c]
    if not cells:
        return "-"
    worst = max((c.get("max_abs_err", math.inf) for _, c in cells), default=0.0)
    failing = [v for v, c in cells if not c["pass"]]
    return f"{worst:.2g} " + (f"FAIL ({', '.join(failing)})" if failing else "ok")


def _ms(row: dict[str, Any], variant: str) -> float | None:
    cell = row.get("variants", {}).get(variant) or {}
    return cell.get("median_ms") if cell.get("status") == "ok" else None


def summary(rows: list[dict[str, Any]], variant: str = "dnntune_auto") -> dict[str, Any]:
    """The issue's targets for ``variant``: geomean over eager_graph, models where it is at
    least the best of eager and eager_graph, models where it is at least max-autotune's speed
    at <= 0.1x its compile time."""
    over_graph, best_misses, beat_compile, with_compile = [], [], [], 0
    measured = 0
    for row in rows:
        ms = _ms(row, variant)
        if ms is None:
            continue
        measured += 1
        graph, eager = _ms(row, "eager_graph"), _ms(row, "eager")
        if graph:
            over_graph.append(graph / ms)
        best = min(t for t in (eager, graph) if t) if eager or graph else None
        if best is not None and ms > best:
            best_misses.append(f"{row['model']} {best / ms:.2f}x")
        mat = _ms(row, "max_autotune")
        if mat:
            with_compile += 1
            tune_s = row["variants"][variant].get("tune_s", math.inf)
            compile_s = row["variants"]["max_autotune"].get("compile_s", 0.0)
            if ms <= mat and tune_s <= TARGET_COMPILE_TIME_SHARE * compile_s:
                beat_compile.append(row["model"])
    geomean = math.exp(statistics.fmean(map(math.log, over_graph))) if over_graph else None
    return {
        "variant": variant,
        "models": measured,
        "geomean_over_eager_graph": geomean,
        "models_with_eager_graph": len(over_graph),
        "at_least_best_of_eager_and_graph": measured - len(best_misses),
        "misses": best_misses,
        "beat_max_autotune_at_tenth_compile_time": beat_compile,
        "models_with_max_autotune": with_compile,
    }


def _summary_lines(found: dict[str, Any]) -> list[str]:
    v, n = found["variant"], found["models"]
    if not n:
        return [f"- {v}: measured on no model"]
    geo, best = found["geomean_over_eager_graph"], found["at_least_best_of_eager_and_graph"]
    beat = len(found["beat_max_autotune_at_tenth_compile_time"])
    with_c = found["models_with_max_autotune"]
    lines = []
    if geo is not None:
        met = "met" if geo >= TARGET_GEOMEAN_OVER_EAGER_GRAPH else "not met"
        lines.append(
            f"- {v}: geomean over eager_graph {geo:.3f}x on {found['models_with_eager_graph']} "
            f"model(s) (target >= {TARGET_GEOMEAN_OVER_EAGER_GRAPH}x: {met})"
        )
    lines.append(
        f"- {v}: >= max(eager, eager_graph) on {best}/{n} model(s) "
        f"(target all: {'met' if best == n else 'not met'})"
        + (f"; below on {', '.join(found['misses'])}" if found["misses"] else "")
    )
    if with_c:
        half = beat * 2 >= with_c
        lines.append(
            f"- {v}: >= max_autotune at <= {TARGET_COMPILE_TIME_SHARE}x its compile time on "
            f"{beat}/{with_c} model(s) (target half: {'met' if half else 'not met'})"
        )
    return lines


def render(rows: list[dict[str, Any]]) -> str:
    """The markdown table, the notes (reasons of cells that did not run) and the targets."""
    head = [
        "model",
        "eager ms",
        "eager_graph",
        "compile",
        "max_autotune (compile s)",
        "dnntune (tune s, reverted?)",
        "dnntune_graph (tune s)",
        "dnntune_auto (tune s, choice)",
        "max err vs eager",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        if row.get("status") in ("skipped", "error", "timeout") and not row.get("variants"):
            lines.append(f"| {row['model']} | {row['status']} |" + " |" * (len(head) - 2))
            notes.append(f"- {row['model']}: {row['status']}: {row.get('reason', '')}")
            continue
        if row.get("status") not in (None, "ok"):
            notes.append(f"- {row['model']}: {row['status']}: {row.get('reason', '')}")
        cells = [_fmt_cell(row["variants"].get(v), v) for v in VARIANTS]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {_fmt_error(row)} |")
        for v, c in row["variants"].items():
            if c and c.get("status") != "ok" and not _plain_na(c):
                notes.append(f"- {row['model']} / {v}: {c['status']}: {c.get('reason', '')}")
    lines += [
        "",
        "Cells: speedup over eager (median ms per forward, interleaved rounds); n/a: CUDA only,"
        " or skipped by a flag.",
    ]
    if notes:
        lines += ["", *notes]
    lines += ["", "Targets (cuda_graph='auto'; dnntune_graph and dnntune for reference):"]
    for variant in ("dnntune_auto", "dnntune_graph", "dnntune"):
        lines += _summary_lines(summary(rows, variant))
    return "\n".join(lines)


def _plain_na(cell: dict[str, Any]) -> bool:
    """n/a for a reason the table's legend gives (no CUDA, a skip flag)."""
    reason = cell.get("reason", "")
    return cell.get("status") == "n/a" and (reason == "CUDA only" or reason.startswith("skipped"))


def _progress(row: dict[str, Any], seconds: float) -> str:
    """The line printed as a model finishes (and the warnings its variants raised)."""
    if row.get("status") in ("skipped", "error", "timeout") and not row.get("variants"):
        return f"[models] {row['model']}: {row['status']}: {row.get('reason', '')}"
    parts = []
    for v, cell in row["variants"].items():
        if cell and not _plain_na(cell):
            unit = " ms" if v == "eager" and "median_ms" in cell else ""
            parts.append(f"{v} {_fmt_cell(cell, v)}{unit}")
    status = "" if row.get("status") == "ok" else f" [{row['status']}: {row.get('reason')}]"
    lines = [
        f"[models] {row['model']}: {', '.join(parts)}; max err {_fmt_error(row)}"
        f" ({seconds:.0f} s){status}"
    ]
    for v, cell in row["variants"].items():
        lines += [f"  warning ({v}): {w}" for w in (cell or {}).get("warnings", ())]
    return "\n".join(lines)


def _write(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "models.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "models.json")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--list", action="store_true", help="list the models and whether they run")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default bf16 on CUDA")
    p.add_argument("--policy", choices=["tune", "heuristic"], default="tune")
    p.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    p.add_argument("--warmup-s", type=float, default=0.3, help="warm-up per variant")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--skip-max-autotune", action="store_true")
    p.add_argument("--compile-timeout-s", type=float, default=300)
    p.add_argument("--model-timeout-s", type=float, default=600, help="per model subprocess")
    p.add_argument(
        "--budget-s", type=float, help="start no model after this, cut the one running then"
    )
    p.add_argument(
        "--in-process", action="store_true", help="no subprocess per model (and no time limits)"
    )
    p.add_argument(
        "--keep-cache", action="store_true", help="dnntune's, Inductor's, Triton's caches as set"
    )
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    p.add_argument("--one", help=argparse.SUPPRESS)  # a subprocess's model
    p.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
    if args.list:
        for spec in SPECS.values():
            state = spec.unavailable() or "available"
            print(f"{spec.name:16} {spec.family:8} {state:40.200} {spec.description}")
        return 0
    if args.one:
        json_out = args.json_out or Path(f"{args.one}.json")

        def save(row: dict[str, Any]) -> None:
            json_out.with_suffix(".tmp").write_text(json.dumps(row, indent=1))
            json_out.with_suffix(".tmp").replace(json_out)  # whole, for the parent to read

        save(run_model(SPECS[args.one], args, save))
        return 0
    wanted = [m for m in args.models.split(",") if m] or list(SPECS)
    unknown = [m for m in wanted if m not in SPECS]
    if unknown:
        print(f"unknown model(s): {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {
        "benchmark": "models",
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    doc |= {"versions": _versions(_setting(args)), "models": []}
    if not args.in_process:
        # ``timeout`` (or any SIGTERM) ends the run through Python: the running model's
        # subprocess is ended too, and models.json keeps what finished
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    deadline = time.monotonic() + (args.budget_s or math.inf)
    for name in wanted:
        spec, start = SPECS[name], time.perf_counter()
        if time.monotonic() >= deadline:
            reason = f"not started: over --budget-s {args.budget_s:g} s"
            row = {"model": name, "status": "skipped", "reason": reason, "variants": {}}
        elif args.in_process or spec.unavailable():
            try:
                row = run_model(spec, args, lambda row: None)
            except Exception as exc:  # a bug here must not end the other models' run
                row = {"model": name, "status": "error", "reason": _describe(exc), "variants": {}}
        else:
            row = _run_isolated(spec, args, args.out, deadline)
        doc["models"].append(row)
        doc["summary"] = [summary(doc["models"], v) for v in ("dnntune_auto", "dnntune_graph")]
        _write(args.out, doc)
        print(_progress(row, time.perf_counter() - start), flush=True)
    table = render(doc["models"])
    (args.out / "models.md").write_text(f"# Real models\n\n{table}\n")
    print(f"\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
