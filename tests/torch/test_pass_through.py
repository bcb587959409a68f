"""Parameters a forward only hands on to its children (transformers' decoder layers: the mask,
the cache, the position embeddings, ``**kwargs``) are traced as such: the rewritten forward
runs for calls with any value there, and a ``**kwargs`` reaches the children as it does in
the module's own forward."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch_models import Gpt2Mlp, SiluMlp, count_fused_tail, optimized_copy

import dnntune.torch as dtt
from dnntune.torch._pass_through import handed_on, pass_through_of
from dnntune.torch._trace_guard import TRACE_GUARD


class _Attention(nn.Module):
    """Takes a mask, position embeddings (a tuple), a cache object and any keyword, and
    records what it was given."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.given: list[dict[str, Any]] = []

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        self.given.append(dict(kwargs))
        if position_embeddings is not None:
            cos, sin = position_embeddings
            x = x * cos + x.flip(-1) * sin
        if attention_mask is not None:
            x = x + attention_mask.sum(-1, keepdim=True)
        if cache is not None:
            cache.append(x.shape)
        return self.proj(x) * kwargs.get("scale", 1.0), None


class DecoderLayer(nn.Module):
    """LLaMA's decoder layer in transformers 5: everything but the hidden states is only
    handed on to the attention."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = _Attention(d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = SiluMlp(d)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Any = None,
        unused: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.attn(
            self.norm1(hidden_states),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            cache=cache,
            **kwargs,
        )
        hidden_states = residual + hidden_states
        residual = hidden_states
        return residual + self.mlp(self.norm2(hidden_states))


class _Branches(DecoderLayer):
    """Reads its mask itself: the mask is no pass-through parameter (traced as None)."""

    def forward(  # type: ignore[override]
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if attention_mask is not None:
            hidden_states = hidden_states + attention_mask.mean()
        h, _ = self.attn(self.norm1(hidden_states), attention_mask=attention_mask)
        return hidden_states + self.mlp(self.norm2(h))


class _ReadsKwargs(DecoderLayer):
    """Reads a keyword of its ``**kwargs``: not traceable."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        h, _ = self.attn(self.norm1(hidden_states), **kwargs)
        return h * kwargs.get("gain", 1.0) + self.mlp(self.norm2(h))


def _optimized(tmp_path: Path, make: Any = DecoderLayer) -> tuple[nn.Module, nn.Module, Any]:
    return optimized_copy(make, tmp_path / "ov.json")


def test_the_pass_through_parameters_are_found() -> None:
    layer = DecoderLayer()
    through = pass_through_of(layer)
    assert through is not None
    assert through.named == (
        "hidden_states",
        "attention_mask",
        "position_embeddings",
        "cache",
        "unused",
    )
    assert [name for _, name in through.free] == [
        "attention_mask",
        "position_embeddings",
        "cache",
        "unused",  # read nowhere
    ]
    assert through.splat == "kwargs"
    branches = pass_through_of(_Branches())
    assert branches is not None and branches.free == () and branches.splat is None
    assert pass_through_of(_ReadsKwargs()) is None  # kwargs.get: more than handed on
    shadowed = type(
        "Shadowed", (DecoderLayer,), {"attn": property(lambda self: self._modules["attn"])}
    )
    # the **kwargs reaches ``self.attn``, a property of the class now: not handed on to a child
    assert pass_through_of(shadowed()) is None


class _NoCrossAttention(DecoderLayer):
    """GPT-2's block: a cross attention called only with encoder states, a child this instance
    does not have (``self.cross``); the cache is handed on all the same."""

    def forward(  # type: ignore[override]
        self, hidden_states: torch.Tensor, cache: Any = None, encoder: Any = None
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.attn(self.norm1(hidden_states), cache=cache)
        hidden_states = residual + hidden_states
        if encoder is not None:
            hidden_states, _ = self.cross(hidden_states, encoder, cache=cache)
        return hidden_states + self.mlp(self.norm2(hidden_states))


def test_a_call_of_an_attribute_the_module_does_not_have_still_hands_on(tmp_path: Path) -> None:
    through = pass_through_of(_NoCrossAttention())
    assert through is not None and [n for _, n in through.free] == ["cache"]
    torch.manual_seed(0)
    model = _NoCrossAttention().eval()
    fast = copy.deepcopy(model)
    x = torch.randn(2, 5, 16)
    dtt.optimize(fast, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=False)
    assert getattr(type(fast), "_dnntune_residual_fused", False)
    cache: list[Any] = []
    with torch.no_grad():
        torch.testing.assert_close(fast(x, cache), model(x, []))
    assert cache == [torch.Size([2, 5, 16])]  # handed on: the rewritten forward ran
    assert fast.__dict__[TRACE_GUARD].holds(fast, (x, cache), {})


def _source_cases() -> list[tuple[str, set[str]]]:
    return [
        ("def forward(self, x, m):\n    return self.a(x, m)\n", {"m"}),
        ("def forward(self, x, m):\n    return self.a(x, mask=m)\n", {"m"}),
        ("def forward(self, x, **kw):\n    return self.a(x, **kw)\n", {"kw"}),
        ("def forward(self, x, m):\n    return self.helper(x)(m)\n", set()),  # not self.<attr>(m)
        ("def forward(self, x, m):\n    return F.relu(x, m)\n", set()),  # not a child's call
        ("def forward(self, x, m):\n    m = m * 2\n    return self.a(x, m)\n", set()),  # assigned
        ("def forward(self, x, m):\n    return (lambda: self.a(x, m))()\n", set()),  # nested
        ("def forward(self, x, m):\n    return self.a(x, *m)\n", set()),  # starred
        ("def forward(self, x, m):\n    return m(x)\n", set()),  # called itself
        ("def forward(self, x, m):\n    return x\n", {"m"}),  # read nowhere
        ("def forward(self, x, m):\n    return self.a(**locals())\n", set()),  # unnamed
        ("def forward(self, x, m):\n    return self.a(x, **vars())\n", set()),
    ]


@pytest.mark.parametrize(("source", "free"), _source_cases())
def test_which_reads_hand_a_parameter_on(source: str, free: set[str]) -> None:
    found = handed_on(source)
    assert found is not None
    assert {p for p in found if p != "x"} == free


def test_the_layer_fuses_and_runs_rewritten_for_any_value_handed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, report = _optimized(tmp_path)
    assert "<root>: mlp + residual add" in [str(f) for f in report.fusions]
    seen = count_fused_tail(monkeypatch, model.mlp.down)
    x = torch.randn(2, 5, 16)
    mask = torch.randn(2, 5, 5)
    pos = (torch.rand(16), torch.rand(16))
    calls: list[dict[str, Any]] = [
        {},
        {"attention_mask": mask},
        {"attention_mask": mask, "position_embeddings": pos, "cache": []},
        {"position_embeddings": pos, "scale": 0.5},  # a keyword through **kwargs
        {"unused": object()},
    ]
    with torch.no_grad():
        for kwargs in calls:
            seen.clear()
            model.attn.given.clear()
            ref.attn.given.clear()
            got = model(x, **kwargs)
            torch.testing.assert_close(got, ref(x, **kwargs), atol=1e-5, rtol=1e-5)
            assert seen == [1], f"the rewritten forward ran for {sorted(kwargs)}"
            assert model.attn.given == ref.attn.given  # the same keywords reached the child
        # by position as well
        torch.testing.assert_close(model(x, mask, pos), ref(x, mask, pos), atol=1e-5, rtol=1e-5)
        cache: list[Any] = []
        model(x, cache=cache)
        assert len(cache) == 1  # the child wrote into the object it was handed


def test_more_positional_arguments_than_parameters_raise_as_before(tmp_path: Path) -> None:
    ref, model, _ = _optimized(tmp_path)
    x = torch.randn(2, 5, 16)
    args = (x, None, None, None, None, "extra")
    with pytest.raises(TypeError) as want:
        ref(*args)
    with pytest.raises(TypeError) as got:
        model(*args)
    assert str(got.value) == str(want.value)


def test_a_parameter_the_forward_reads_is_still_traced_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, model, report = _optimized(tmp_path, _Branches)
    assert "<root>: mlp + residual add" in [str(f) for f in report.fusions]
    seen = count_fused_tail(monkeypatch, model.mlp.down)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        assert seen == [1]
        seen.clear()
        mask = torch.randn(2, 5, 5)
        torch.testing.assert_close(model(x, mask), ref(x, mask), atol=1e-5, rtol=1e-5)
        assert seen == []  # its own forward: the trace took the branch for None


def test_a_forward_reading_its_kwargs_is_not_rewritten(tmp_path: Path) -> None:
    ref, model, report = _optimized(tmp_path, _ReadsKwargs)
    assert not [f for f in report.fusions if str(f).startswith("<root>:")]
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x, gain=2.0), ref(x, gain=2.0), atol=1e-5, rtol=1e-5)


def test_training_and_saving_keep_the_module_s_own_behaviour(tmp_path: Path) -> None:
    ref, model, _ = _optimized(tmp_path)
    x = torch.randn(2, 5, 16)
    mask = torch.randn(2, 5, 5)
    for m in (ref, model):
        m.train()
        m(x, attention_mask=mask, scale=2.0).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
    model.eval()
    ref.eval()
    path = tmp_path / "model.pt"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    assert type(loaded) is DecoderLayer
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(x, attention_mask=mask), ref(x, attention_mask=mask), atol=1e-5, rtol=1e-5
        )
    pickle.dumps(model)


class Gpt2Block(nn.Module):
    """GPT-2's block in transformers 5: the cache, the mask and ``**kwargs`` (``position_ids``
    from GPT2Model) handed on to the attention; an encoder's states read (so traced as None);
    the MLP's ``Conv1D`` c_proj before the residual add."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = _Attention(d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = Gpt2Mlp(d, 4 * d)

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        use_cache: bool | None = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        attn_output, _ = self.attn(
            self.ln_1(hidden_states), cache=past_key_values, attention_mask=attention_mask, **kwargs
        )
        hidden_states = attn_output + residual
        if encoder_hidden_states is not None:
            hidden_states = hidden_states + encoder_hidden_states
        residual = hidden_states
        feed_forward_hidden_states = self.mlp(self.ln_2(hidden_states))
        return residual + feed_forward_hidden_states


def test_gpt2s_mlp_add_runs_as_its_conv1d_epilogue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dnntune.torch import functional as dtf

    ref, model, report = _optimized(tmp_path, Gpt2Block)
    assert "<root>: mlp + residual add" in [str(f) for f in report.fusions]
    residuals: list[bool] = []
    real = dtf.linear

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        residuals.append(kwargs.get("residual") is not None)
        out: torch.Tensor = real(*args, **kwargs)
        return out

    monkeypatch.setattr(dtf, "linear", spy)
    x = torch.randn(2, 5, 16)
    mask = torch.randn(2, 5, 5)
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask, "position_ids": torch.arange(5)}):
            residuals.clear()
            got = model(x, [], **kwargs)
            torch.testing.assert_close(got, ref(x, [], **kwargs), atol=1e-5, rtol=1e-5)
            assert residuals.count(True) == 1  # c_proj with the block's add
            assert (
                model.attn.given[-1]
                == ref.attn.given[-1]
                == ({"position_ids": kwargs["position_ids"]} if kwargs else {})
            )
        residuals.clear()
        enc = torch.randn(2, 5, 16)
        torch.testing.assert_close(model(x, None, None, enc), ref(x, None, None, enc))
        assert residuals.count(True) == 0  # read by the forward: its own forward runs
