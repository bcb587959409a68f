"""``generate()`` after ``optimize``: a causal LM's greedy tokens and scores are eager's through a
whole generation loop (its cache growing a token a step, a new call signature each step, the
padding mask of a left-padded batch), on the kernel path on the CPU and on the GPU with the
default ``cuda_graph="auto"``. transformers is not installed in CI; these run where it is."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch_models import kernel_plan

import dnntune.torch as dtt
from dnntune.torch import _route_race, runtime

transformers = pytest.importorskip("transformers")

_SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 300}


def _llama() -> Any:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=128,
        **_SMALL,
    )
    return transformers.LlamaForCausalLM, config


def _gpt2() -> Any:
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300)
    return transformers.GPT2LMHeadModel, config


def _generate(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )


def _check(make: Any, device: str, atol: float, races: bool, **options: Any) -> None:
    """``races``: optimize with its speed check, so the loop's forwards race dnntune's route
    against PyTorch's forward (``torch/_route_race.py``); else every forward on dnntune's."""
    torch.manual_seed(0)
    cls, config = make()
    config._attn_implementation = "sdpa"
    ref = cls(config).eval().to(device)
    model = copy.deepcopy(ref)
    ids = torch.randint(3, 300, (2, 10), device=device)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # the first row left-padded
    want = _generate(ref, ids, mask)
    report = dtt.optimize(
        model,
        example_kwargs={"input_ids": ids, "attention_mask": mask},
        policy="heuristic",
        overrides=None,
        check_speed=races,
        revert_if_slower=False,
        **options,
    )
    assert report.fusions, "the decoder layers were not rewritten"
    assert report.races is races
    # the first loop decides each step's signature (and races), the second reuses them
    for _ in range(2):
        got = _generate(model, ids, mask)
        assert torch.equal(got.sequences, want.sequences)
        for mine, theirs in zip(got.scores, want.scores, strict=True):
            torch.testing.assert_close(mine, theirs, atol=atol, rtol=0)
    if races:  # some forwards ran on PyTorch's route (a race's samples)
        routes = model.__dict__[_route_race.ROUTES]
        raced = [*routes.by_shapes.values(), routes.changing]
        assert any(r is not None and r.times[1] for r in raced)


@pytest.mark.parametrize("races", [False, True], ids=["dnntune", "races"])
@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_greedy_generation_on_the_kernel_path_matches_eager(
    make: Any, races: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    _check(make, "cpu", atol=1e-5, races=races)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("races", [False, True], ids=["dnntune", "races"])
@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_greedy_generation_on_cuda_matches_eager(
    make: Any, races: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 without TF32, each engine's heuristic plan, replays where they pay: the tokens
    of eager, its scores within float32 reassociation."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    _check(make, "cuda", atol=1e-3, races=races)
