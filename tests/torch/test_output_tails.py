"""A child's output projection takes its parent's residual add (``torch/_output_tails.py``):
transformers' attention modules end in ``o_proj`` (GPT-2: ``c_proj`` and a dropout) and return
it first; their decoder layer adds it to the residual stream."""

from __future__ import annotations

import copy
import textwrap
from typing import Any

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import _swap_classes as swap_classes
from dnntune.torch import modules as dnntune_modules
from dnntune.torch._armed import take_armed
from dnntune.torch._known_wrappers import wrappers_of
from dnntune.torch._output_tails import fused_output_tail, output_tail_of


class _Attention(nn.Module):
    """Not traceable as a whole (a Python branch on a tensor's value), returns a tuple."""

    def __init__(self, d: int = 16, dropout: bool = False) -> None:
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.dropout = nn.Dropout(0.1) if dropout else nn.Identity()

    def forward(
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q = self.q_proj(hidden_states)
        if bool(q.abs().sum() > 0):  # no trace can stand for this
            q = torch.softmax(q, dim=-1) * hidden_states
        attn_output = q.contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, None


class _DropoutAttention(_Attention):
    def forward(
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q = self.q_proj(hidden_states)
        if bool(q.abs().sum() > 0):
            q = torch.softmax(q, dim=-1) * hidden_states
        attn_output = self.o_proj(q)
        attn_output = self.dropout(attn_output)
        return attn_output, None


class _Block(nn.Module):
    def __init__(self, attention: nn.Module, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        residual = x
        h, _ = self.attn(self.norm(x), mask=mask)
        return residual + h


class _Model(nn.Module):
    def __init__(
        self, attention: type[_Attention] = _Attention, d: int = 16, **kwargs: Any
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(attention(d, **kwargs), d) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _optimized(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, Any]:
    fast = copy.deepcopy(model)
    report = dtt.optimize(
        fast, (x,), policy="heuristic", cuda_graph=False, revert_if_slower=False, refine=False
    )
    return fast, report


def _taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each armed Linear call took the residual, from now on."""
    seen: list[bool] = []

    def spy(layer: nn.Module, x: torch.Tensor, fused: Any) -> torch.Tensor | None:
        out = take_armed(layer, x, fused)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(dnntune_modules, "take_armed", spy)
    monkeypatch.setattr(swap_classes, "take_armed", spy)  # transformers' Conv1D on dnntune
    return seen


# ---- the source ----------------------------------------------------------------------------
def test_the_source_of_an_attention_that_returns_its_projection_first() -> None:
    tail = output_tail_of(
        textwrap.dedent(
            """
            def forward(self, x, mask=None):
                y = self.q(x)
                out = y.reshape(2, -1).contiguous()
                out = self.o_proj(out)
                out = self.drop(out)
                return out, None
            """
        )
    )
    assert tail is not None
    assert tail.chain == ("o_proj", "drop") and tail.plain == {"o_proj", "drop"}
    assert {"o_proj", "drop", "q"} <= tail.once


@pytest.mark.parametrize(
    "body",
    [
        "out = self.o_proj(x)\n    return out",  # not a tuple: the traced tails' case
        "out = self.o_proj(x)\n    return out, out",  # the sum would be returned twice
        "out = self.o_proj(x)\n    return (*out,)",
        "out = self.o_proj(x) * 2\n    return out, None",  # something after the projection
        "out = self.o_proj(x)\n    out = out * 2\n    return out, None",
        "return self.o_proj(x), None",
    ],
)
def test_forwards_that_do_not_end_in_their_projection(body: str) -> None:
    tail = output_tail_of(f"def forward(self, x):\n    {body}\n")
    assert tail is None or "o_proj" not in tail.chain


def test_a_projection_read_twice_or_a_decorated_forward_is_not_taken() -> None:
    twice = output_tail_of(
        "def forward(self, x):\n    y = self.o_proj(x)\n    out = self.o_proj(y)\n"
        "    return out, None\n"
    )
    assert twice is not None and "o_proj" not in twice.once
    decorated = "@something\ndef forward(self, x):\n    out = self.o_proj(x)\n    return out, 1\n"
    assert output_tail_of(decorated) is None
    # transformers 5.2x renames a keyword and calls the body: what it returns stands
    renaming = decorated.replace("@something", '@deprecate_kwarg("past_key_values", new_name="c")')
    assert output_tail_of(renaming) is not None
    assert output_tail_of("def forward(self, x):\n    return (\n") is None


# ---- the fused call ------------------------------------------------------------------------
@pytest.mark.parametrize(("attention", "dropout"), [(_Attention, False), (_DropoutAttention, True)])
def test_the_projection_takes_the_parents_add(
    monkeypatch: pytest.MonkeyPatch, attention: type[_Attention], dropout: bool
) -> None:
    torch.manual_seed(0)
    model, x = _Model(attention, dropout=dropout).eval(), torch.randn(3, 5, 16)
    expected = model(x)
    fast, report = _optimized(model, x)
    assert "blocks.0: attn + residual add" in report.fusions
    taken = _taken(monkeypatch)
    with torch.no_grad():
        got = fast(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert taken == [False, True, False, True]  # q_proj passes by; o_proj takes the add


def test_training_a_hook_or_another_residual_type_runs_the_add_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = _Model().eval(), torch.randn(3, 5, 16)
    fast, _ = _optimized(model, x)
    taken = _taken(monkeypatch)
    # training: no residual handed over, gradients as PyTorch's
    fast.train()
    model.train()
    fast(x.requires_grad_()).sum().backward()
    assert taken == []
    fast.eval()
    model.eval()
    # a hook of the user's on the projection: it sees the projection's own output
    seen: list[torch.Tensor] = []
    blocks: Any = fast.blocks
    first = blocks[0]
    handle = first.attn.o_proj.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    handle.remove()
    assert len(seen) == 1 and taken == [False, True]  # only block 1 armed its projection
    # a residual the projection cannot take (float64 beside a float32 layer): the add as written
    taken.clear()
    x64 = torch.randn(3, 5, 16, dtype=torch.float64)
    plain: Any = model.blocks[0]
    with torch.no_grad():
        y = fused_output_tail(first.attn, x64, False, (first.norm(x),), {})
        ref = plain.attn(plain.norm(x))[0] + x64
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ref)
    assert taken == [False, False]  # q_proj and o_proj: neither takes a float64 residual


def test_a_child_that_is_not_an_attention_is_left_alone() -> None:
    class _Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.o_proj = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.o_proj(x)
            return out * 2, out  # the projection's output is not returned first

    class _Parent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair = _Pair()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, _ = self.pair(x)
            return x + a

    torch.manual_seed(0)
    model, x = _Parent().eval(), torch.randn(4, 8)
    fast, report = _optimized(model, x)
    assert not any("pair + residual add" in f for f in report.fusions)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))


# ---- transformers' own modules -------------------------------------------------------------
def test_transformers_llama_and_gpt2_layers_hand_their_add_to_the_projection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=100,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    # GPT-2's block calls ``self.crossattention`` only with encoder states, a child this
    # configuration does not have: the cache is still handed on (a DynamicCache by default)
    gpt2 = transformers.GPT2Model(
        transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32)
    ).eval()
    # transformers 5.25 with the ``kernels`` package wraps LLaMA's attention forward in a hub
    # kernel's wrapper, which may run another forward: then its add stays the layer's own
    from transformers.models.llama.modeling_llama import LlamaAttention

    llama_wrapped = wrappers_of(LlamaAttention.forward) is None
    for model, name, fused in (
        (llama, "model.layers.0: self_attn", not llama_wrapped),
        (gpt2, "h.0: attn", True),
    ):
        ids = torch.randint(0, 100, (2, 7))
        with torch.no_grad():
            expected = model(ids)[0]
        fast, report = _optimized(model, ids)
        assert (f"{name} + residual add" in report.fusions) is fused, report.fusions
        taken = _taken(monkeypatch)
        with torch.no_grad():
            got = fast(ids)[0]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        if not fused:
            assert True not in taken
            continue
        assert taken.count(True) == 2, taken  # both layers' projections took the add


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_the_gpu_the_projection_takes_the_add_within_tolerance(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The projection's GEMM adds the residual in its epilogue (one rounding where eager
    rounds the product and then the sum): compared with float64 math on the same weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    model = _Model(d=64).eval().to("cuda", dtype)
    x = torch.randn(4, 32, 64, device="cuda", dtype=dtype)
    reference = copy.deepcopy(model).double()
    fast, report = _optimized(model, x)
    assert "blocks.0: attn + residual add" in report.fusions
    taken = _taken(monkeypatch)
    with torch.no_grad():
        got = fast(x)
        expected = reference(x.double())
    assert taken.count(True) == 2
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2)
