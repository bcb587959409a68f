"""Real model code for ``model_conformance.py --zoo``: the architectures users bring, from
torchvision, timm and transformers, at small sizes with random weights (nothing is
downloaded), each wrapped to take one float tensor and return one, so that every check of the
random models applies (a text model takes ``inputs_embeds``, an audio model its features).

Dropout and stochastic depth are off (a train step must be deterministic to be compared), as
in the random models. New weights are the model's own, perturbed by half their magnitude, and
an edit is a tenth of it (an optimizer step): random weights at unit scale would overflow a
deep real network, where the random models are shallow. A model whose library is missing is
left out of the zoo (:func:`available`), with the reason.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _random_models import Case, new_state
from torch import nn

__all__ = ["ZOO", "available", "perturbed_state", "zoo_case", "zoo_entries"]


@dataclass(frozen=True)
class Entry:
    name: str
    library: str
    #: the module, in float32 on the CPU (before its dtype, device and layout are set)
    build: Callable[[], nn.Module]
    #: one input of batch ``b``: ``shape(b)``
    shape: Callable[[int], tuple[int, ...]]
    cnn: bool = False


class Main(nn.Module):
    """A model called as ``model(x)`` or with ``x`` as a keyword, returning its main tensor
    (a transformers output's ``last_hidden_state``, a tuple's first element). transformers'
    encoders get an attention mask with the last token padded out, built here from ``x``'s
    shape, as a tokenizer's batch would bring it."""

    def __init__(self, model: nn.Module, keyword: str | None = None, mask: bool = False):
        super().__init__()
        self.model, self.keyword, self.mask = model, keyword, mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs = {}
        if self.mask:
            mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
            mask[:, -1] = 0
            kwargs["attention_mask"] = mask
        out = self.model(**{self.keyword: x}, **kwargs) if self.keyword else self.model(x)
        if isinstance(out, torch.Tensor):
            return out
        hidden = getattr(out, "last_hidden_state", None)
        return hidden if hidden is not None else out[0]


def _tv(name: str, **kwargs: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return torchvision.models.get_model(name, weights=None, num_classes=10, **kwargs)

    return build


def _tv_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(32, 8, 2, 2, 64, 128, num_classes=10)


def _tv_swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer([4, 4], 32, [2, 2], [2, 4], [4, 4], num_classes=10)


def _tv_swin_v2() -> nn.Module:
    from torchvision.models.swin_transformer import (
        PatchMergingV2,
        SwinTransformer,
        SwinTransformerBlockV2,
    )

    return SwinTransformer(
        [4, 4],
        32,
        [2, 2],
        [2, 4],
        [4, 4],
        num_classes=10,
        block=SwinTransformerBlockV2,
        downsample_layer=PatchMergingV2,
    )


def _tv_convnext() -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 2)], num_classes=10)


def _timm(name: str, **kwargs: object) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)

    return build


#: small sizes every transformers config below shares
_HF_TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}
_HF_TEXT |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_HF_DECODER = _HF_TEXT | {"num_key_value_heads": 2}


def _hf(
    config: str, model: str, keyword: str, mask: bool = False, **sizes: object
) -> Callable[[], nn.Module]:
    """A transformers model: ``model`` a top-level class or ``module:Class``; attention through
    SDPA where the model has attention (``attn_implementation`` in ``sizes`` otherwise)."""

    def build() -> nn.Module:
        import transformers

        kwargs = {"attn_implementation": "sdpa", **sizes}
        if kwargs["attn_implementation"] is None:
            del kwargs["attn_implementation"]
        cfg = getattr(transformers, config)(**kwargs)
        for key, value in cfg.to_dict().items():  # dropout and layer drop off
            if isinstance(value, float) and ("dropout" in key or "drop_prob" in key):
                setattr(cfg, key, 0.0)
        where, _, name = model.rpartition(":")
        cls = getattr(importlib.import_module(where) if where else transformers, name)
        return Main(cls(cfg), keyword, mask)

    return build


def _text(name: str, family: str, mask: bool = False, **sizes: object) -> Entry:
    """transformers' ``{family}Model`` of ``{family}Config(**sizes)``, fed ``inputs_embeds`` of
    7 tokens (``mask``: with the last one padded out, as an encoder's batch brings it)."""
    build = _hf(f"{family}Config", f"{family}Model", "inputs_embeds", mask, **sizes)
    return Entry(name, "transformers", build, _tokens(7))


def _pixels(name: str, family: str, cnn: bool = False, **sizes: object) -> Entry:
    """transformers' ``{family}Model`` of ``{family}Config(**sizes)``, fed 32x32 images."""
    build = _hf(f"{family}Config", f"{family}Model", "pixel_values", **sizes)
    return Entry(name, "transformers", build, _image(32), cnn=cnn)


def _image(size: int) -> Callable[[int], tuple[int, ...]]:
    return lambda b: (b, 3, size, size)


def _tokens(s: int, d: int = 64) -> Callable[[int], tuple[int, ...]]:
    return lambda b: (b, s, d)


_T5 = {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16, "vocab_size": 100}
_WHISPER = {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4}
_WHISPER |= {"encoder_ffn_dim": 128, "max_source_positions": 16, "num_mel_bins": 16}
_VISION = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
_VISION |= {"intermediate_size": 128, "image_size": 32, "patch_size": 8}
_HF_CNN = {"hidden_sizes": [16, 32], "depths": [1, 1], "num_channels": 3}
_HF_CNN |= {"attn_implementation": None}

ZOO: tuple[Entry, ...] = (
    Entry("tv_resnet18", "torchvision", _tv("resnet18"), _image(64), cnn=True),
    Entry("tv_resnet50", "torchvision", _tv("resnet50"), _image(64), cnn=True),
    Entry("tv_resnext50", "torchvision", _tv("resnext50_32x4d"), _image(64), cnn=True),
    Entry("tv_mobilenet_v2", "torchvision", _tv("mobilenet_v2"), _image(64), cnn=True),
    Entry("tv_mobilenet_v3", "torchvision", _tv("mobilenet_v3_small"), _image(64), cnn=True),
    Entry("tv_efficientnet_b0", "torchvision", _tv("efficientnet_b0"), _image(64), cnn=True),
    Entry("tv_regnet_y", "torchvision", _tv("regnet_y_400mf"), _image(64), cnn=True),
    Entry("tv_shufflenet", "torchvision", _tv("shufflenet_v2_x0_5"), _image(64), cnn=True),
    Entry("tv_squeezenet", "torchvision", _tv("squeezenet1_1"), _image(64), cnn=True),
    Entry("tv_mnasnet", "torchvision", _tv("mnasnet0_5"), _image(64), cnn=True),
    Entry("tv_densenet121", "torchvision", _tv("densenet121"), _image(64), cnn=True),
    Entry("tv_convnext", "torchvision", _tv_convnext, _image(64), cnn=True),
    Entry("tv_vit", "torchvision", _tv_vit, _image(32)),
    Entry("tv_swin", "torchvision", _tv_swin, _image(32)),
    Entry("tv_swin_v2", "torchvision", _tv_swin_v2, _image(32)),
    Entry("timm_resnet26d", "timm", _timm("resnet26d"), _image(64), cnn=True),
    Entry("timm_efficientnet_b0", "timm", _timm("efficientnet_b0"), _image(64), cnn=True),
    Entry("timm_mobilenetv3", "timm", _timm("mobilenetv3_small_050"), _image(64), cnn=True),
    Entry("timm_convnext_atto", "timm", _timm("convnext_atto"), _image(64), cnn=True),
    Entry("timm_regnety_002", "timm", _timm("regnety_002"), _image(64), cnn=True),
    Entry("timm_ghostnet", "timm", _timm("ghostnet_050"), _image(64), cnn=True),
    Entry("timm_rexnet", "timm", _timm("rexnet_100"), _image(64), cnn=True),
    Entry("timm_cspresnet", "timm", _timm("cspresnet50"), _image(64), cnn=True),
    Entry("timm_dla", "timm", _timm("dla34"), _image(64), cnn=True),
    Entry(
        "timm_vit_tiny",
        "timm",
        _timm("vit_tiny_patch16_224", img_size=32, patch_size=8),
        _image(32),
    ),
    Entry("timm_deit_tiny", "timm", _timm("deit_tiny_patch16_224", img_size=32), _image(32)),
    Entry("timm_mobilevit", "timm", _timm("mobilevit_xxs"), _image(64), cnn=True),
    Entry("timm_poolformer", "timm", _timm("poolformerv2_s12"), _image(64), cnn=True),
    Entry("timm_levit", "timm", _timm("levit_128s", img_size=64), _image(64)),
    _text("hf_bert", "Bert", True, **_HF_TEXT),
    _text("hf_roberta", "Roberta", True, **_HF_TEXT),
    _text(
        "hf_distilbert",
        "DistilBert",
        True,
        dim=64,
        n_layers=2,
        n_heads=4,
        hidden_dim=128,
        vocab_size=100,
    ),
    _text("hf_albert", "Albert", True, embedding_size=64, **_HF_TEXT),
    _text("hf_electra", "Electra", True, embedding_size=64, **_HF_TEXT),
    _text("hf_gpt2", "GPT2", n_embd=64, n_layer=2, n_head=4, vocab_size=100),
    _text("hf_llama", "Llama", **_HF_DECODER),
    _text("hf_mistral", "Mistral", **_HF_DECODER),
    _text("hf_qwen2", "Qwen2", **_HF_DECODER),
    _text("hf_qwen3", "Qwen3", **_HF_DECODER),
    _text("hf_phi3", "Phi3", **_HF_DECODER),
    _text("hf_gemma", "Gemma", head_dim=16, **_HF_DECODER),
    _text(
        "hf_opt",
        "OPT",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        word_embed_proj_dim=64,
        vocab_size=100,
    ),
    Entry(
        "hf_t5_encoder",
        "transformers",
        _hf("T5Config", "T5EncoderModel", "inputs_embeds", **_T5),
        _tokens(7),
    ),
    Entry(
        "hf_whisper_encoder",
        "transformers",
        _hf(
            "WhisperConfig",
            "transformers.models.whisper.modeling_whisper:WhisperEncoder",
            "input_features",
            **_WHISPER,
        ),
        lambda b: (b, 16, 32),
    ),
    Entry(  # its layers end in a branch on the states' dtype (float16's clamp)
        "hf_bart_encoder",
        "transformers",
        _hf(
            "BartConfig",
            "transformers.models.bart.modeling_bart:BartEncoder",
            "inputs_embeds",
            d_model=64,
            encoder_layers=2,
            encoder_attention_heads=4,
            encoder_ffn_dim=128,
            vocab_size=100,
            max_position_embeddings=64,
        ),
        _tokens(7),
    ),
    _pixels("hf_vit", "ViT", **_VISION),
    _pixels("hf_convnext", "ConvNext", cnn=True, num_stages=2, **_HF_CNN),
    _pixels("hf_resnet", "ResNet", cnn=True, embedding_size=16, **_HF_CNN),
    _pixels(
        "hf_swin",
        "Swin",
        image_size=32,
        patch_size=4,
        embed_dim=32,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
    ),
    _pixels("hf_clip_vision", "CLIPVision", **_VISION),
    # grouped-query decoders with a padded batch: the attention's mask with fewer key/value
    # heads than query heads (transformers repeats them; dnntune's attention shares them)
    _text("hf_llama_padded", "Llama", True, **_HF_DECODER),
    _text("hf_qwen3_padded", "Qwen3", True, **_HF_DECODER),
)


def zoo_entries(names: str) -> tuple[Entry, ...]:
    """The zoo's entries named in ``names``: ``all``, or comma-separated names and libraries.

    Raises:
        SystemExit: a name that is neither an entry nor a library, with the names there are.
    """
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted == ["all"]:
        return ZOO
    known = {e.name for e in ZOO} | {e.library for e in ZOO}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise SystemExit(
            f"--zoo: unknown model or library {', '.join(unknown) or repr(names)}; "
            f"use 'all', a library ({', '.join(sorted({e.library for e in ZOO}))}) or one of "
            f"{', '.join(e.name for e in ZOO)}"
        )
    return tuple(e for e in ZOO if e.name in wanted or e.library in wanted)


def available(entries: tuple[Entry, ...] = ZOO) -> tuple[list[Entry], dict[str, str]]:
    """The entries whose library imports here, and why each other library does not."""
    missing: dict[str, str] = {}
    for library in sorted({e.library for e in entries}):
        try:
            importlib.import_module(library)
        except Exception as exc:  # an import error, or a broken install
            missing[library] = f"{type(exc).__name__}: {exc}"
    return [e for e in entries if e.library not in missing], missing


def _quiet(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off, wherever a module keeps its probability."""
    for m in model.modules():
        for attr in ("p", "drop_prob"):
            value = getattr(m, attr, None)
            name = type(m).__name__.lower()
            if isinstance(value, float) and ("drop" in name or "stochastic" in name):
                setattr(m, attr, 0.0)
    return model


def zoo_case(seed: int, entries: list[Entry], device: str, dtype: torch.dtype) -> Case:
    """The zoo's model ``seed % len(entries)``, with layout and batch drawn from ``seed``."""
    entry = entries[seed % len(entries)]
    rng = random.Random(seed)
    torch.manual_seed(seed)  # the library's own initialisation
    model = _quiet(entry.build())
    g = torch.Generator().manual_seed(seed)
    cl_model = entry.cnn and rng.random() < 0.3
    cl_input = entry.cnn and rng.random() < 0.3
    model = model.to(device=device, dtype=dtype)
    if cl_model:
        model = model.to(memory_format=torch.channels_last)

    def make_input(batch: int) -> torch.Tensor:
        x = torch.randn(entry.shape(batch), generator=g).to(device=device, dtype=dtype)
        return x.to(memory_format=torch.channels_last) if cl_input else x

    layout = (
        f"{' channels_last model' if cl_model else ''}{' channels_last input' if cl_input else ''}"
    )
    desc = f"{entry.library} {entry.name}{layout}"
    batch = rng.choice([2, 3])
    return Case(
        seed,
        model.eval(),
        make_input,
        batch,
        cl_model,
        cl_input,
        desc,
        new_state=perturbed_state,
        relative_edits=True,
        float32_draws=True,
    )


def perturbed_state(model: nn.Module, g: torch.Generator) -> dict[str, torch.Tensor]:
    """New weights for a real model: its own, each moved by half its mean magnitude at random;
    new batch-norm statistics (on the CPU, in float32)."""

    def draw(name: str, value: torch.Tensor) -> torch.Tensor:
        if name.endswith("running_mean"):
            return torch.randn(value.shape, generator=g) * 0.1
        scale = value.float().abs().mean().clamp(min=0.02).item() * 0.5
        return value.float() + torch.randn(value.shape, generator=g) * scale

    return new_state(model, draw, g)
