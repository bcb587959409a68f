"""Grouped K-fold: no shape of a test fold in its training; scores against the static order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from learning_helpers import BF, H, family_records, layernorm, matmul, rec, rmsnorm

from dnntune.backend.learned import ModelParams
from dnntune.learning import evaluation as ev
from dnntune.learning import grouped_folds, merge
from dnntune.learning.evaluation import (
    evaluate,
    regret_summary,
    select_params,
    train_and_evaluate,
)


def _dtype_twins() -> list:
    """Each matmul shape twice (half and bfloat16): two problems, one shape group."""
    out = []
    for m in (1, 4, 16, 64, 256, 1024, 4096):
        for dtype in (H, BF):
            out.append(rec(matmul(m, 512, 512, dtype), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.2}))
    return out


@given(st.integers(min_value=2, max_value=9), st.integers(min_value=0, max_value=5))
def test_a_shape_group_never_spans_two_folds(k: int, seed: int) -> None:
    merged = merge([*_dtype_twins(), *family_records()])
    folds = grouped_folds(merged, k, seed)
    assert sorted(i for f in folds for i in f) == list(range(len(merged)))
    fold_of_shape: dict[str, int] = {}
    for f, members in enumerate(folds):
        for i in members:
            shape = merged[i].problem.shape_key()
            assert fold_of_shape.setdefault(shape, f) == f
    assert folds == grouped_folds(merged, k, seed)  # the same split on every run


def test_no_test_shape_is_in_its_folds_training(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[str]] = []
    real = ev.model_of

    def spy(train, params):  # type: ignore[no-untyped-def]
        seen.append({m.problem.shape_key() for m in train})
        return real(train, params)

    monkeypatch.setattr(ev, "model_of", spy)
    records = [*_dtype_twins(), *family_records()]
    result = evaluate(records, ModelParams(k=3, radius=6.0), k=4)
    merged = merge(records)
    folds = grouped_folds(merged, 4)
    assert len(seen) == 4
    for train_shapes, members in zip(seen, folds, strict=True):
        assert not train_shapes & {merged[i].problem.shape_key() for i in members}
    assert {c.fold for c in result.cases} == {0, 1, 2, 3}


def test_scores_against_the_static_order() -> None:
    result = evaluate(family_records(), ModelParams(k=3, radius=6.0, min_confidence=0.0), k=4)
    s = result.summary()
    assert s["problems"] == 12 and s["shape_groups"] == 12 and s["folds"] == 4
    # A puts CUDNN first for matmuls: wrong on every small-M one (1.3x slower)
    small = [c for c in result.cases if c.problem.startswith("matmul") and "m=8 " in c.problem]
    assert small and small[0].a_pick == "CUDNN_ENGINE" and small[0].a_ratio == pytest.approx(1.3)
    assert small[0].b_pick == "TORCH_ENGINE" and small[0].b_ratio == 1.0
    assert s["B"]["top1"] > s["A"]["top1"]
    assert s["B"]["regret_geomean"] < s["A"]["regret_geomean"]
    assert s["by_op_class"]["conv"]["A"]["top1"] == 1.0


def test_cases_carry_their_device_and_several_devices_are_scored_apart() -> None:
    """Records of two devices: each case names its device, a test problem is scored with its
    own device's group (a shape measured on both is one shape group), and the summary gives
    each device's scores; one device's summary has no by_device."""
    params = ModelParams(k=3, radius=6.0, min_confidence=0.0)
    one = evaluate(family_records(), params, k=4)
    assert {c.device_class for c in one.cases} == {"nvidia-h200"}
    assert "by_device" not in one.summary()
    two = evaluate(family_records() + family_records("nvidia-h100-80gb-hbm3"), params, k=4)
    s = two.summary()
    assert s["problems"] == 24 and s["shape_groups"] == 12
    assert set(s["by_device"]) == {"nvidia-h200", "nvidia-h100-80gb-hbm3"}
    for device, scores in s["by_device"].items():
        assert scores["B"]["n"] == 12
        mine = [c for c in two.cases if c.device_class == device]
        assert scores["B"]["top1"] == regret_summary([c.b_ratio for c in mine])["top1"]
    # the same labels on both devices: each device's cases are those of the one-device run
    same = sorted((c.problem, c.b_pick, c.b_ratio) for c in one.cases)
    h200 = [c for c in two.cases if c.device_class == "nvidia-h200"]
    assert sorted((c.problem, c.b_pick, c.b_ratio) for c in h200) == same


def test_nested_selection_and_the_trained_model_carry_the_evaluation() -> None:
    model, result = train_and_evaluate(family_records(), k=3)
    s = result.summary()
    assert result.selected and len(s["fold_params"]) == 3
    assert "inner grouped K-fold" in s["method"]
    assert model.evaluation == s
    assert model.training["problems"] == 12
    assert (model.params.k, model.params.radius) in ev.PARAM_GRID


def test_regret_summary() -> None:
    s = regret_summary([1.0, 1.01, 1.5, 1.0])
    assert s["n"] == 4 and s["top1"] == 0.5 and s["within_2pct"] == 0.75
    assert s["regret_max"] == pytest.approx(0.5) and s["regret_p95"] == pytest.approx(0.5)
    assert s["regret_geomean"] == pytest.approx((1.01 * 1.5) ** 0.25 - 1)
    assert regret_summary([]) == {"n": 0}


def test_top1_over_clear_problems_leaves_near_ties_out() -> None:
    s = regret_summary([1.0, 1.01, 1.5, 1.0], [True, False, True, False])
    assert s["n_clear"] == 2 and s["top1_clear"] == 0.5
    assert s["top1"] == 0.5  # the plain metrics are unchanged
    assert "n_clear" not in regret_summary([1.0])
    assert regret_summary([1.01], [False])["n_clear"] == 0


def test_cases_carry_the_runner_up_and_the_summary_the_clear_top1() -> None:
    records = [
        *family_records(),
        rec(matmul(32, 4096, 4096), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.01}),
    ]
    result = evaluate(records, ModelParams(k=3, radius=6.0, min_confidence=0.0), k=4)
    tie = next(c for c in result.cases if "m=32 " in c.problem)
    assert tie.runner_up == pytest.approx(1.01) and not tie.clear
    assert all(c.clear for c in result.cases if c is not tie)
    s = result.summary()
    assert s["B"]["n_clear"] == 12 and s["by_op_class"]["matmul"]["B"]["n_clear"] == 7
    case = result.to_json()["cases"][0]
    assert case["runner_up"] is not None and case["runner_up"] >= 1.0


def _two_classes() -> list:
    """Matmuls whose engines alternate with M (a 3-neighbour vote does better than the
    nearest one alone), and norms with one boundary (the nearest one does better)."""
    out = []
    for m in (1, 4, 16, 64, 256, 1024):
        times = {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.5}
        if m in (4, 64, 1024):
            times = {"TORCH_ENGINE": 1.5, "CUDNN_ENGINE": 1.0}
        out.append(rec(matmul(m, 512, 512), times))
    for i in range(7):
        fast, slow = (
            ("CUDNN_ENGINE", "TRITON_ENGINE") if i < 2 else ("TRITON_ENGINE", "CUDNN_ENGINE")
        )
        out.append(rec(layernorm(1024 << i, 1024), {fast: 1.0, slow: 1.5}))
    return out


def test_per_class_choice_only_where_it_scores_strictly_better() -> None:
    merged = merge(_two_classes())
    grid = ((1, 6.0), (3, 6.0))
    base = ModelParams(min_confidence=0.0)
    overall = select_params(merged, base, grid, k=3, per_class=False)
    own = select_params(merged, base, grid, k=3)
    assert (overall.k, overall.radius) == (own.k, own.radius) == (1, 6.0)
    assert not overall.per_class
    # the matmuls score strictly better with k=3 and get it; the norms do best with the
    # overall choice and keep it (no entry of their own)
    assert own.per_class == {"matmul": (3, 6.0)}
    assert own.for_class("matmul").k == 3 and own.for_class("norm").k == 1


def test_nested_evaluation_records_per_class_choices() -> None:
    result = evaluate(_two_classes(), k=3, grid=((1, 6.0), (3, 6.0)))
    s = result.summary()
    assert len(s["fold_params"]) == 3
    for p in s["fold_params"]:
        assert set(p.get("per_class", {})) <= {"matmul", "norm"}
    plain = evaluate(_two_classes(), k=3, grid=((1, 6.0), (3, 6.0)), per_class=False)
    assert all("per_class" not in p for p in plain.summary()["fold_params"])
    assert all(p["op_weight"] in ev.OP_WEIGHTS for p in s["fold_params"])


def _interleaved_norm_kinds() -> list:
    """Layernorms and rmsnorms whose sizes interleave (rows 2**10, 2**12, ... alternate
    between the kinds), every one faster on cuDNN (A puts Triton first for norms): a norm's
    nearest problem of its own kind is 4 size units away, of the other kind 2."""
    out = []
    for i in range(8):
        graph = (layernorm if i % 2 == 0 else rmsnorm)(1024 << (2 * i), 1024)
        out.append(rec(graph, {"CUDNN_ENGINE": 1.0, "TRITON_ENGINE": 1.5}))
    return out


def test_the_inner_folds_choose_the_op_weight_where_a_kind_learns_from_its_sibling() -> None:
    merged = merge(_interleaved_norm_kinds())
    base = ModelParams(min_confidence=0.0)
    grid = ((1, 3.0),)
    # op weight 4: every neighbour is beyond radius 3 (same kind 4 away, the other kind
    # sqrt(2**2 + 4**2)), so B declines to A's Triton; op weight 1 reaches the other kind
    chosen = select_params(merged, base, grid, k=4)
    assert chosen.weights["op"] == 1.0 and chosen.weights["dtype"] == base.weights["dtype"]
    assert select_params(merged, base, grid, k=4, op_weights=(4.0,)).weights["op"] == 4.0
    nested = evaluate(_interleaved_norm_kinds(), k=4, grid=grid).summary()
    fixed = evaluate(_interleaved_norm_kinds(), k=4, grid=grid, op_weights=(4.0,)).summary()
    assert fixed["B"]["top1"] == 0.0 and nested["B"]["top1"] >= 0.75
    assert 1.0 in {p["op_weight"] for p in nested["fold_params"]}


def test_the_default_op_weight_wins_ties() -> None:
    # one op kind per class: the op weight changes no distance, every choice scores the same
    chosen = select_params(merge(family_records()), ModelParams(min_confidence=0.0), k=3)
    assert chosen.weights["op"] == ev.OP_WEIGHTS[0] == 4.0


def test_the_fused_weight_follows_the_op_weight_chosen() -> None:
    merged = merge(_interleaved_norm_kinds())
    base = ModelParams(min_confidence=0.0)
    for weights in ((1.0,), (4.0,)):
        chosen = select_params(merged, base, ((1, 3.0),), k=4, op_weights=weights)
        assert chosen.weights["op"] == chosen.weights["fused"] == weights[0]
