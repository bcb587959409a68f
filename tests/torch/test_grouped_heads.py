"""Grouped-query attention with a mask without repeated key/value heads: PyTorch's op as
dnntune calls it (a one-token query packed onto its key/value heads, else the heads repeated,
never ``enable_gqa`` with a mask), TORCH_ENGINE's lowering, and transformers' ``use_gqa_in_sdpa``
routed inside optimized models only."""

from __future__ import annotations

import copy
import inspect
import sys
from typing import Any

import _grouped_attention_form as form
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.providers._torch import sdpa as sdpa_module
from dnntune.providers._torch.sdpa import fused_takes_grouped, grouped, grouped_masked
from dnntune.torch._grouped_heads import GROUPED, PREDICATE, install_grouped_heads
from dnntune.torch.functional import scaled_dot_product_attention

DT = torch.float64


def _reference(q: Any, k: Any, v: Any, mask: Any) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every call of PyTorch's SDPA: (query shape, key shape, enable_gqa given)."""
    calls: list[tuple[Any, ...]] = []
    original = F.scaled_dot_product_attention

    def spy(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((tuple(q.shape), tuple(k.shape), kwargs.get("enable_gqa", False)))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


MASKS = {  # name: mask shape for batch 2, 8 heads, 1 query row, 40 keys; dtype
    "bool [B,1,1,L]": ((2, 1, 1, 40), torch.bool),
    "additive [1,L]": ((1, 40), DT),
    "additive [1,1,L]": ((1, 1, 40), DT),
    "bool per head [B,H,1,L]": ((2, 8, 1, 40), torch.bool),
}


def _case(shape: tuple[int, ...], dtype: torch.dtype, rows: int = 1) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q = torch.randn(2, 8, rows, 16, dtype=DT)
    k, v = torch.randn(2, 2, 40, 16, dtype=DT), torch.randn(2, 2, 40, 16, dtype=DT)
    if dtype is torch.bool:
        mask = torch.rand(shape) > 0.3
        mask[..., 0] = True  # every row attends somewhere
    else:
        mask = torch.randn(shape, dtype=DT)
    return q, k, v, mask


@pytest.mark.parametrize("case", list(MASKS))
def test_without_a_fused_kernel_the_heads_are_repeated(
    case: str, sdpa_calls: list[tuple[Any, ...]]
) -> None:
    q, k, v, mask = _case(*MASKS[case])
    assert grouped(q, k, v)
    assert not fused_takes_grouped(q, k, v, mask)  # the CPU: no fused kernel of PyTorch's
    want = _reference(q, k, v, mask)
    sdpa_calls.clear()
    got = grouped_masked(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # never enable_gqa with a mask PyTorch's fused kernels refuse (its float32 math kernel)
    assert sdpa_calls == [((2, 8, 1, 16), (2, 8, 40, 16), False)]


@pytest.mark.parametrize("rows", [1, 5])
def test_where_a_fused_kernel_takes_it_the_heads_are_shared(
    rows: int, sdpa_calls: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    q, k, v, mask = _case((2, 1, rows, 40), torch.bool, rows)
    monkeypatch.setattr(sdpa_module, "fused_takes_grouped", lambda *_: True)
    want = _reference(q, k, v, mask)
    sdpa_calls.clear()
    got = grouped_masked(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert sdpa_calls == [((2, 8, rows, 16), (2, 2, 40, 16), True)]  # no copy of the cache


def test_pytorchs_checks_are_asked_once_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, mask = _case((2, 1, 1, 40), torch.bool)
    asked: list[int] = []

    class Params:
        def __init__(self, *args: Any) -> None:
            asked.append(len(args))

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", Params)
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda p, d: False)
    monkeypatch.setattr(torch.backends.cuda, "can_use_efficient_attention", lambda p, d: True)
    monkeypatch.setattr(torch.backends.cuda, "can_use_cudnn_attention", lambda p, d: False)
    monkeypatch.setattr(sdpa_module, "_fused_grouped", {})
    assert fused_takes_grouped(q, k, v, mask) and fused_takes_grouped(q, k, v, mask)
    assert asked == [7]  # (query, key, value, mask, dropout, is_causal, enable_gqa), once
    monkeypatch.delattr(torch.backends.cuda, "can_use_cudnn_attention")  # an older PyTorch
    monkeypatch.setattr(torch.backends.cuda, "can_use_efficient_attention", lambda p, d: False)
    assert not fused_takes_grouped(q[:1], k[:1], v[:1], mask[:1])


def test_not_grouped() -> None:
    q, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 3, 8)
    assert not grouped(q, k, k)  # as many key/value heads as query heads
    assert not grouped(q, k[:, :3], k[:, :3])  # 4 query heads over 3: PyTorch's error
    assert not grouped(q, k[:, :2], k[:, :1])  # keys and values of different head counts
    assert not grouped(q[0], k[0], k[0])  # 3-D


def test_dnntunes_sdpa_never_asks_pytorch_for_gqa_with_a_mask(
    sdpa_calls: list[tuple[Any, ...]],
) -> None:
    torch.manual_seed(2)
    q = torch.randn(1, 8, 1, 16)
    k, v = torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16)
    mask = torch.ones(1, 1, 1, 24, dtype=torch.bool)
    mask[..., 20:] = False  # a static cache's empty slots
    want = _reference(q.double(), k.double(), v.double(), mask).float()
    got = scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sdpa_calls and not any(gqa for *_, gqa in sdpa_calls)
    # without a mask PyTorch's fused kernels take enable_gqa: it is still passed
    sdpa_calls.clear()
    scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert all(gqa for *_, gqa in sdpa_calls if _[1][1] == 2)


@pytest.fixture
def transformers_form(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The written-out attention registered as transformers' SDPA module, its predicate as
    written (a route installed by one test does not reach the next)."""
    monkeypatch.setitem(sys.modules, GROUPED, form)
    monkeypatch.setattr(form, PREDICATE, form.written_use_gqa_in_sdpa)
    form.repeats[0] = 0
    return form


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = form.Attention()

    def forward(self, x: Any, key: Any, value: Any, mask: Any) -> torch.Tensor:
        return self.attn(x, key, value, mask)


def _inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(3)
    x = torch.randn(2, 1, 64)
    key, value = torch.randn(2, 2, 32, 8), torch.randn(2, 2, 32, 8)
    mask = torch.ones(2, 1, 1, 32, dtype=torch.bool)
    mask[:, :, :, 25:] = False
    return x, key, value, mask


LINE = f"{GROUPED}: grouped-query attention with a mask, key/value heads not repeated"


def test_inside_an_optimized_forward_the_heads_are_not_repeated(
    transformers_form: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as on a GPU whose fused kernel takes the grouped call with its mask
    monkeypatch.setattr(sdpa_module, "fused_takes_grouped", lambda *_: True)
    inputs = _inputs()
    ref = _Model().eval()
    with torch.no_grad():
        want = ref(*inputs)
    assert transformers_form.repeats[0] == 2  # eager: keys and values repeated
    model = copy.deepcopy(ref)
    report = dtt.optimize(
        model, inputs, policy="heuristic", overrides=None, cuda_graph=False, check_speed=False
    )
    assert LINE in report.fusions
    transformers_form.repeats[0] = 0
    with torch.no_grad():
        got = model(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert transformers_form.repeats[0] == 0
    # outside an optimized forward transformers' answer stands: the heads are repeated
    _, key, value, mask = inputs
    predicate = getattr(transformers_form, PREDICATE)
    assert predicate is not transformers_form.written_use_gqa_in_sdpa  # routed
    assert predicate(mask, key, value) is False
    assert predicate(None, key, value) is True
    with torch.no_grad():
        ref(*inputs)
    assert transformers_form.repeats[0] == 2
    # a second optimize keeps the one route; a model whose forward never asks it is not told
    # it ran (the route is the process's)
    dtt.optimize(copy.deepcopy(ref), policy="heuristic", overrides=None, cuda_graph=False)
    assert getattr(transformers_form, PREDICATE) is predicate
    other = dtt.optimize(
        nn.Linear(4, 4).eval(),
        (torch.randn(2, 4),),
        policy="heuristic",
        overrides=None,
        cuda_graph=False,
        check_speed=False,
    )
    assert not any(GROUPED in f for f in other.fusions)


def test_where_the_heads_are_repeated_anyway_the_report_claims_nothing(
    transformers_form: Any,
) -> None:
    """On the CPU no fused kernel of PyTorch's takes a grouped call with a mask: dnntune's
    attention repeats the heads itself, as transformers would have, so the report has no line
    saying they were not repeated (a new-user audit read one in a CPU Mistral's report)."""
    inputs = _inputs()
    ref = _Model().eval()
    with torch.no_grad():
        want = ref(*inputs)
    model = copy.deepcopy(ref)
    report = dtt.optimize(
        model, inputs, policy="heuristic", overrides=None, cuda_graph=False, check_speed=False
    )
    assert not any(GROUPED in f for f in report.fusions), report.fusions
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), want, rtol=1e-5, atol=1e-5)


def test_a_traced_forward_keeps_transformers_answer(transformers_form: Any) -> None:
    model = _Model().eval()
    dtt.optimize(model, policy="heuristic", overrides=None, cuda_graph=False)
    inputs = _inputs()
    transformers_form.repeats[0] = 0
    exported = torch.export.export(model, inputs, strict=False)
    assert transformers_form.repeats[0] == 2  # what PyTorch records is transformers' own path
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(*inputs), model(*inputs))


def test_an_attention_module_of_another_shape_is_not_routed(
    transformers_form: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transformers_form, "sdpa_attention_forward", form.sdpa_without_gqa)
    assert install_grouped_heads() is False
    assert getattr(transformers_form, PREDICATE) is transformers_form.written_use_gqa_in_sdpa


def test_without_transformers_nothing_is_routed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, GROUPED, raising=False)
    assert install_grouped_heads() is False


def test_transformers_llama_decode_with_a_static_cache() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.integrations import sdpa_attention

    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=100,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=24)
    # transformers 5.24 renamed the keyword
    name = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"
    with torch.no_grad():
        lm(input_ids=torch.randint(0, 100, (1, 8)), use_cache=True, **{name: cache})
    step = {"input_ids": torch.randint(0, 100, (1, 1)), name: cache}
    step |= {"position_ids": torch.tensor([[8]]), "use_cache": True}
    lengths = [getattr(layer, "cumulative_length", None) for layer in cache.layers]

    def decode(model: nn.Module) -> torch.Tensor:
        for n in lengths:  # the cache's write position rewound (transformers 5 advances it)
            if isinstance(n, torch.Tensor):
                n.fill_(8)
        with torch.no_grad():
            return model(**step).logits

    want = decode(lm)
    model = copy.deepcopy(lm)
    report = dtt.optimize(
        model, policy="heuristic", overrides=None, cuda_graph=False, check_speed=False
    )
    calls = [0]
    original = sdpa_attention.repeat_kv

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    sdpa_attention.repeat_kv = counted
    try:
        got = decode(model)
    finally:
        sdpa_attention.repeat_kv = original
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert calls[0] == 0
    assert isinstance(report, dtt.OptimizeReport)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_cuda_a_grouped_decode_with_a_mask_matches_float64(
    dtype: torch.dtype, sdpa_calls: list[tuple[Any, ...]]
) -> None:
    torch.manual_seed(4)
    q = torch.randn(2, 16, 1, 128, device="cuda", dtype=dtype)
    k = torch.randn(2, 4, 2048, 128, device="cuda", dtype=dtype)
    v = torch.randn(2, 4, 2048, 128, device="cuda", dtype=dtype)
    mask = torch.zeros(2, 1, 1, 2048, dtype=torch.bool, device="cuda")
    mask[..., :1500] = True  # a static cache's filled slots
    want = _reference(q.double(), k.double(), v.double(), mask)
    eager = _reference(q, k, v, mask)  # what transformers runs: repeated heads
    sdpa_calls.clear()
    got = grouped_masked(q, k, v, mask)
    shared = fused_takes_grouped(q, k, v, mask)
    assert sdpa_calls[-1][1:] == (
        ((2, 4, 2048, 128), True) if shared else ((2, 16, 2048, 128), False)
    )
    error, eager_error = (float((t.double() - want).abs().max()) for t in (got, eager))
    assert error <= max(2 * eager_error, 1e-2)


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("replay", [False, True])
def test_on_cuda_an_optimized_decode_runs_without_repeats(
    transformers_form: Any, replay: bool
) -> None:
    torch.manual_seed(5)
    ref = _Model().cuda().half().eval()
    inputs = tuple(t.cuda() for t in _inputs())
    inputs = tuple(t.half() if t.is_floating_point() else t for t in inputs)
    with torch.no_grad():
        want = ref(*inputs)
    model = copy.deepcopy(ref)
    dtt.optimize(
        model, inputs, policy="heuristic", overrides=None, cuda_graph=replay, check_speed=False
    )
    transformers_form.repeats[0] = 0
    with torch.no_grad():
        for _ in range(3):  # uncaptured, or recorded and replayed
            got = model(*inputs)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    if not replay:  # (a replay runs no Python)
        assert transformers_form.repeats[0] == 0
