"""The models of ``benchmarks/models.py``: each a ``ModelSpec`` whose ``build`` makes a
``Workload`` (the module, in eval mode on the setting's device and dtype, and its inputs).

Real library code with random weights (torchvision, timm, transformers; nothing is downloaded),
channels_last for the CNNs, and two tiny pure-torch models for ``--quick`` and the CPU test. A
model whose library is missing says so (``ModelSpec.unavailable``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


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
            _import_errors[module] = describe(exc)
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


def _timm_cnn(name: str) -> Callable[[Setting], Workload]:
    def build(s: Setting) -> Workload:
        import timm

        model = timm.create_model(name, pretrained=False)
        return Workload(
            _place(model, s, channels_last=True), _images(s, 32, 64 if s.quick else 224)
        )

    return build


def _token_ids(s: Setting, vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), device=s.device, dtype=torch.int64)


def _bert(s: Setting) -> Workload:
    from transformers import BertConfig, BertModel

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    small |= {"intermediate_size": 128, "vocab_size": 1000}
    config = BertConfig(attn_implementation="sdpa", **(small if s.quick else {}))
    ids = _token_ids(s, config.vocab_size, s.batch(32), 16 if s.quick else 128)
    return Workload(_place(BertModel(config), s), (ids,), compare="norm")


def _gpt2(s: Setting) -> Workload:
    """GPT-2 small (its Conv1D layers and written-out ``gelu_new``), 8x512 tokens."""
    from transformers import GPT2Config, GPT2Model

    small = {"n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 64}
    config = GPT2Config(attn_implementation="sdpa", **(small if s.quick else {}))
    ids = _token_ids(s, config.vocab_size, s.batch(8), 16 if s.quick else 512)
    return Workload(_place(GPT2Model(config), s), (ids,), compare="norm")


def _clip_vision(s: Setting) -> Workload:
    """CLIP ViT-B/16's vision tower (QuickGELU MLPs), 32x224x224."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    small |= {"num_attention_heads": 2, "image_size": 32, "patch_size": 8}
    config = CLIPVisionConfig(
        attn_implementation="sdpa", **(small if s.quick else {"patch_size": 16})
    )
    return Workload(
        _place(CLIPVisionModel(config), s),
        _images(s, 32, config.image_size),
        compare="norm",
    )


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


def _llama_prefill_default(s: Setting) -> Workload:
    """The prefill as a user's default ``LlamaModel(config)`` runs it: ``use_cache=True``, so
    the forward builds and returns a ``DynamicCache`` (what a replay hands out afresh)."""
    from transformers import LlamaModel

    config = _llama_config(s, use_cache=True)
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
        ModelSpec(
            "timm_efficientnet_b0",
            "cnn",
            "timm efficientnet_b0 (BatchNormAct2d, SE, SiLU), 32x224x224",
            _timm_cnn("efficientnet_b0"),
            ("timm",),
        ),
        ModelSpec(
            "timm_regnety_016",
            "cnn",
            "timm regnety_016 (BatchNormAct2d, SE, ReLU), 32x224x224",
            _timm_cnn("regnety_016"),
            ("timm",),
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
        ModelSpec(
            "timm_convnext_tiny",
            "cnn",
            "timm convnext_tiny (its GELU class in the MLP), 32x224x224",
            _timm_cnn("convnext_tiny"),
            ("timm",),
        ),
        ModelSpec(
            "gpt2", "decoder", "GPT2Model (small: Conv1D, gelu_new), 8x512 tokens", _gpt2, HF
        ),
        ModelSpec(
            "clip_vision",
            "vit",
            "CLIPVisionModel (ViT-B/16, QuickGELU), 32x224x224",
            _clip_vision,
            HF,
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
            "llama_prefill_cache",
            "decoder",
            "the same prefill with the default use_cache=True (it returns a DynamicCache)",
            _llama_prefill_default,
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


def make_setting(args: argparse.Namespace) -> Setting:
    """The device, dtype (default bf16 on CUDA, fp32 elsewhere) and size of ``args``."""
    device = torch.device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    return Setting(device, dtypes[dtype], args.quick)


def describe(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
