"""transformers 5.2x's wrappers around a decoder layer's forward (``@deprecate_kwarg`` and
``forward_with_checkpointing``) no longer keep the layer from being rewritten: the rewritten
forward runs for the calls the wrappers pass on unchanged, and a call that passes the old
keyword, or a layer that checkpoints in training, runs the module's own wrapped forward."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _transformers_wrappers as fake
import pytest
import torch
from torch import nn
from torch_models import SiluMlp, count_fused_tail, optimized_copy

from dnntune.torch._known_wrappers import Wrappers, wrappers_of
from dnntune.torch._tracing import not_traceable


@pytest.fixture
def _as_transformers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fake wrappers' module under transformers' two module names."""
    monkeypatch.setitem(sys.modules, "transformers.utils.deprecation", fake)
    monkeypatch.setitem(sys.modules, "transformers.modeling_layers", fake)
    yield


class _Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.caches: list[Any] = []

    def forward(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, cache: Any = None
    ) -> tuple[torch.Tensor, None]:
        if attention_mask is not None:
            x = x + attention_mask.sum(-1, keepdim=True)
        self.caches.append(cache)
        return self.proj(x), None


class Layer(fake.CheckpointingLayer):
    """A decoder layer as transformers 5.25 writes LLaMA's: both wrappers around its forward."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = _Attention(d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = SiluMlp(d)

    @fake.deprecate_kwarg("past_key_values", "9.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        residual = hidden_states
        h, _ = self.attn(self.norm1(hidden_states), attention_mask=attention_mask, cache=cache)
        hidden_states = residual + h
        return hidden_states + self.mlp(self.norm2(hidden_states))


def _unknown(func: Any) -> Any:
    @functools.wraps(func)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return inner


class _OtherDecorator(Layer):
    @_unknown
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return hidden_states + self.mlp(self.norm2(hidden_states))


class _TwoRenames(Layer):
    """A decorator in the source that the wrappers around the forward do not match."""

    @fake.deprecate_kwarg("layer_past", "9.0", new_name="cache")
    @_unknown
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return hidden_states + self.mlp(self.norm2(hidden_states))


_FAKE = pytest.mark.usefixtures("_as_transformers")


@_FAKE
def test_the_wrappers_are_recognised() -> None:
    assert wrappers_of(nn.Linear.forward) == Wrappers()
    assert wrappers_of(Layer.forward) == Wrappers(("past_key_values",), True)
    assert wrappers_of(_OtherDecorator.forward) is None
    assert wrappers_of(_TwoRenames.forward) is None
    assert not_traceable(Layer(), none_defaults=True) is None
    for cls in (_OtherDecorator, _TwoRenames):
        why = not_traceable(cls(), none_defaults=True)
        assert why is not None and "decorated" in why


@_FAKE
def test_a_wrapper_that_is_not_transformers_own_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same wrapper code counts only where it is transformers' module's."""
    monkeypatch.delitem(sys.modules, "transformers.utils.deprecation")
    monkeypatch.delitem(sys.modules, "transformers.modeling_layers")
    assert wrappers_of(Layer.forward) is None


@_FAKE
def test_the_wrapped_layer_is_rewritten_and_the_wrappers_still_act(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, report = optimized_copy(Layer, tmp_path / "ov.json")
    assert "<root>: mlp + residual add" in [str(f) for f in report.fusions]
    seen = count_fused_tail(monkeypatch, model.mlp.down)
    x, mask = torch.randn(2, 5, 16), torch.randn(2, 5, 5)
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}, {"cache": "c"}):
            seen.clear()
            torch.testing.assert_close(model(x, **kwargs), ref(x, **kwargs), atol=1e-5, rtol=1e-5)
            assert seen == [1], f"the rewritten forward did not run for {sorted(kwargs)}"
        # the old keyword: the module's own forward, whose wrapper renames it
        seen.clear()
        with pytest.warns(FutureWarning, match="past_key_values"):
            got = model(x, past_key_values="old")
        assert seen == [] and model.attn.caches[-1] == "old"
        torch.testing.assert_close(got, ref(x), atol=1e-5, rtol=1e-5)


@_FAKE
def test_a_checkpointing_layer_in_training_runs_its_own_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, _ = optimized_copy(Layer, tmp_path / "ov.json")
    seen = count_fused_tail(monkeypatch, model.mlp.down)
    x = torch.randn(2, 5, 16)
    for m in (ref, model):
        m.train()
        m.gradient_checkpointing = True
        m(x).square().sum().backward()
        assert m.__dict__.get("checkpointed") is True
    assert seen == []
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    model.eval()  # checkpointing set, but not training: the rewritten forward
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref.eval()(x), atol=1e-5, rtol=1e-5)
    assert seen == [1]


def test_transformers_own_llama_layer_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where transformers is installed: its LLaMA decoder layer, whatever wraps its forward
    in this version, fuses its MLP's residual add and computes what it computed."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
    sizes |= {"num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 64}
    config = llama.LlamaConfig(**sizes, attn_implementation="sdpa")

    def make() -> nn.Module:
        return llama.LlamaDecoderLayer(config, layer_idx=0)

    ref, model, report = optimized_copy(make, tmp_path / "ov.json")
    assert "<root>: mlp + residual add" in [str(f) for f in report.fusions]
    seen = count_fused_tail(monkeypatch, model.mlp.down_proj)
    rotary = llama.LlamaRotaryEmbedding(config)
    x = torch.randn(1, 6, 32)
    pos = rotary(x, torch.arange(6)[None])
    with torch.no_grad():
        got, want = model(x, position_embeddings=pos), ref(x, position_embeddings=pos)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert seen == [1]  # the rewritten forward ran
