"""Format version 3 of the learned model: a unanimous vote overrides the margin
(``consensus``), a unanimous large gain answers beyond the radius (``far_gain``), an op class
may have its own feature weights (``class_weights``); older files keep their behaviour."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from learning_helpers import H200, layernorm, matmul, rec, rmsnorm

from dnntune.backend.learned import Decline, ModelParams, Prediction, load_model, predict
from dnntune.backend.learned import problem_of as problem
from dnntune.backend.learned.model import FORMAT_VERSION, READABLE_VERSIONS
from dnntune.backend.learned.predict import FAR_REACH
from dnntune.errors import ConfigFileError
from dnntune.learning import Record, merge, save_model, train
from dnntune.learning import evaluation as ev

PAIR = ["CUDNN_ENGINE", "TORCH_ENGINE"]


def _close_wins() -> list[Record]:
    """Three GEMMs where TORCH_ENGINE beats cuDNN (A's first) by 1-2 %, inside the margin."""
    return [
        rec(matmul(m, 1024, 1024), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.0 + gap})
        for m, gap in ((8, 0.01), (16, 0.02), (32, 0.015))
    ]


def test_a_unanimous_vote_overrides_the_margin() -> None:
    query = problem(matmul(12, 1024, 1024))
    off = train(_close_wins(), ModelParams(k=3, radius=4.0, min_confidence=0.0))
    kept = predict(off, query, H200, PAIR)
    assert isinstance(kept, Prediction) and kept.kept_static and kept.engines[0] == "CUDNN_ENGINE"
    on = train(_close_wins(), ModelParams(k=3, radius=4.0, consensus=3))
    moved = predict(on, query, H200, PAIR)
    assert isinstance(moved, Prediction) and not moved.kept_static
    assert moved.engines[0] == "TORCH_ENGINE" and moved.confidence > 0.5


def test_consensus_needs_enough_voters_and_every_one_of_them() -> None:
    query = problem(matmul(12, 1024, 1024))
    too_few = train(_close_wins()[:2], ModelParams(k=3, radius=4.0, consensus=3))
    p = predict(too_few, query, H200, PAIR)
    assert not isinstance(p, Prediction) or p.engines[0] == "CUDNN_ENGINE"
    split = [
        *_close_wins()[:2],
        rec(matmul(32, 1024, 1024), {"CUDNN_ENGINE": 1.0, "TORCH_ENGINE": 1.01}),
    ]
    m = train(split, ModelParams(k=3, radius=4.0, consensus=3, min_confidence=0.0))
    p = predict(m, query, H200, PAIR)
    assert isinstance(p, Prediction) and p.engines[0] == "CUDNN_ENGINE" and p.kept_static


def _one_far_norm() -> list[Record]:
    """One trained layernorm where cuDNN (not A's first, Triton) is 5x faster."""
    return [rec(layernorm(128, 768), {"CUDNN_ENGINE": 1.0, "TRITON_ENGINE": 5.0})]


def test_far_gain_answers_a_large_unanimous_gain_beyond_the_radius() -> None:
    engines = ["TRITON_ENGINE", "CUDNN_ENGINE"]
    query = problem(layernorm(2048, 768))  # 4 size units away
    off = train(_one_far_norm(), ModelParams(k=3, radius=3.0))
    result = predict(off, query, H200, engines)
    assert isinstance(result, Decline) and "outside the trained data" in result.reason
    on = train(_one_far_norm(), ModelParams(k=3, radius=3.0, far_gain=3.0))
    far = predict(on, query, H200, engines)
    assert isinstance(far, Prediction) and far.engines[0] == "CUDNN_ENGINE"
    # a gain under far_gain, or a problem beyond FAR_REACH radii, still declines
    small = train(_one_far_norm(), ModelParams(k=3, radius=3.0, far_gain=6.0))
    assert isinstance(predict(small, query, H200, engines), Decline)
    beyond = problem(layernorm(128 * 2 ** int(FAR_REACH * 3.0 + 1), 768))
    assert isinstance(predict(on, beyond, H200, engines), Decline)


def test_far_gain_declines_when_the_far_neighbours_disagree() -> None:
    records = [
        *_one_far_norm(),
        rec(layernorm(128, 1536), {"TRITON_ENGINE": 1.0, "CUDNN_ENGINE": 1.2}),
    ]
    m = train(records, ModelParams(k=3, radius=3.0, far_gain=3.0, min_confidence=0.0))
    result = predict(m, problem(layernorm(2048, 1024)), H200, ["TRITON_ENGINE", "CUDNN_ENGINE"])
    assert isinstance(result, Decline) and "outside the trained data" in result.reason


def test_class_weights_apply_to_their_class_only() -> None:
    params = ModelParams(k=3, radius=4.0, class_weights={"norm": {"op": 1.0, "fused": 1.0}})
    assert params.for_class("norm").weights == {"op": 1.0, "fused": 1.0}
    assert params.for_class("matmul").weights == params.weights
    assert params.for_class("norm").k == 3 and not params.for_class("norm").class_weights


def test_version_3_round_trip_and_version(tmp_path: Path) -> None:
    params = ModelParams(
        k=3,
        radius=4.0,
        per_class={"matmul": (5, 6.0)},
        class_weights={"norm": {"op": 1.0, "fused": 1.0, "dtype": 1.0, "epilogue": 1.0}},
        consensus=3,
        far_gain=3.0,
    )
    model = train(_close_wins(), params)
    path = save_model(model, tmp_path / "model.json")
    doc = json.loads(path.read_text())
    assert doc["format_version"] == FORMAT_VERSION == 3 and 3 in READABLE_VERSIONS
    assert doc["params"]["consensus"] == 3 and doc["params"]["far_gain"] == 3.0
    assert doc["params"]["per_class"]["norm"] == {
        "k": 3,
        "radius": 4.0,
        "weights": {"dtype": 1.0, "epilogue": 1.0, "fused": 1.0, "op": 1.0},
    }
    loaded = load_model(path)
    assert loaded.params.class_weights == params.class_weights
    assert loaded.params.consensus == 3 and loaded.params.far_gain == 3.0
    assert loaded.params.per_class == {"matmul": (5, 6.0), "norm": (3, 4.0)}
    query = problem(matmul(12, 1024, 1024))
    assert predict(loaded, query, H200, PAIR) == predict(model, query, H200, PAIR)
    # a model without the new parameters is still written as version 2 (older readers)
    plain = json.loads(save_model(train(_close_wins()), tmp_path / "p.json").read_text())
    assert plain["format_version"] == 2 and "consensus" not in plain["params"]


def _model_file(tmp_path: Path, version: int, params: dict) -> Path:
    """A trained model's file with ``format_version`` and ``params`` replaced."""
    doc = train(_close_wins()).to_json()
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**doc, "format_version": version, "params": params}))
    return path


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"consensus": 3}, r"params\.consensus: needs format_version 3"),
        ({"far_gain": 3.0}, r"params\.far_gain: needs format_version 3"),
        (
            {"per_class": {"norm": {"k": 1, "radius": 3, "weights": {"op": 1}}}},
            r"params\.per_class\.norm\.weights: needs format_version 3",
        ),
    ],
)
def test_version_3_fields_in_an_older_file_are_refused(
    tmp_path: Path, params: dict, match: str
) -> None:
    path = _model_file(tmp_path, 2, params)
    with pytest.raises(ConfigFileError, match=match) as info:
        load_model(path)
    assert str(path) in str(info.value) and "DNNTUNE_HEUR_MODEL_PATH" in str(info.value)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"consensus": -1}, r"params\.consensus: expected an int >= 0"),
        ({"consensus": True}, r"params\.consensus: expected an int >= 0"),
        ({"far_gain": 0.5}, r"params\.far_gain: expected >= 1"),
        ({"far_gain": "big"}, r"params\.far_gain: expected a finite number"),
        (
            {"per_class": {"norm": {"k": 1, "radius": 3, "weights": {"op": -1}}}},
            r"params\.per_class\.norm\.weights\.op: expected >= 0",
        ),
    ],
)
def test_malformed_version_3_fields_name_the_field(
    tmp_path: Path, params: dict, match: str
) -> None:
    path = _model_file(tmp_path, 3, params)
    with pytest.raises(ConfigFileError, match=match):
        load_model(path)


def test_a_version_2_file_keeps_its_behaviour(tmp_path: Path) -> None:
    """A version 2 file has neither consensus nor far_gain: the margin holds as before."""
    model = train(_close_wins(), ModelParams(k=3, radius=4.0, min_confidence=0.0))
    path = save_model(model, tmp_path / "model.json")
    assert json.loads(path.read_text())["format_version"] == 2
    loaded = load_model(path)
    assert loaded.params.consensus == 0 and loaded.params.far_gain is None
    p = predict(loaded, problem(matmul(12, 1024, 1024)), H200, PAIR)
    assert isinstance(p, Prediction) and p.engines[0] == "CUDNN_ENGINE"


def _many_close_wins(winner: str) -> list[Record]:
    """Eight GEMMs, one size unit apart, where ``winner`` beats the other engine by 2 %."""
    other = "CUDNN_ENGINE" if winner == "TORCH_ENGINE" else "TORCH_ENGINE"
    return [
        rec(matmul(m, 1024, 1024), {winner: 1.0, other: 1.02}) for m in (8 << i for i in range(8))
    ]


def test_the_inner_folds_choose_the_vote_rules() -> None:
    """Whether a model uses consensus and far_gain is the inner folds' choice, as k and the
    radius are (chosen with fixed values, looked at on held-out results, they overstated the
    held-out figures): on. GEMMs where TORCH_ENGINE wins inside the margin every time, the
    consensus rule scores better and is chosen; where A's first engine wins anyway, the rules
    change nothing and the tie goes to both off."""
    assert ev.VOTE_RULES[0] == (0, None)
    assert (ev.CONSENSUS, ev.FAR_GAIN) in ev.VOTE_RULES
    base = ModelParams(min_confidence=0.0)
    wins = ev.select_params(merge(_many_close_wins("TORCH_ENGINE")), base, ((3, 8.0),), k=4)
    assert wins.consensus == ev.CONSENSUS
    ties = ev.select_params(merge(_many_close_wins("CUDNN_ENGINE")), base, ((3, 8.0),), k=4)
    assert ties.consensus == 0 and ties.far_gain is None
    # no rules to choose from: the base's are kept
    kept = ev.select_params(
        merge(_many_close_wins("TORCH_ENGINE")), ev.training_params(), ((3, 8.0),), k=4, rules=()
    )
    assert kept.consensus == ev.CONSENSUS and kept.far_gain == ev.FAR_GAIN
    assert replace(ev.training_params(), k=1).k == 1


def _norm_kinds_and_gemms() -> list[Record]:
    """Norms whose kinds interleave in size, cuDNN faster on all (a layernorm learns from the
    rmsnorm next to it only at op weight 1), and GEMMs where the plain ones run fastest on
    TORCH_ENGINE and the fused ones of twice their M on cuDNN (a plain GEMM learns from its
    own kind only at op/fused weight 4)."""
    out = []
    for i in range(8):
        graph = (layernorm if i % 2 == 0 else rmsnorm)(1024 << (2 * i), 1024)
        out.append(rec(graph, {"CUDNN_ENGINE": 1.0, "TRITON_ENGINE": 1.5}))
    for m in (32, 128, 512, 2048, 8192):
        out.append(rec(matmul(m, 4096, 4096), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.3}))
        out.append(
            rec(matmul(2 * m, 4096, 4096, bias=True), {"CUDNN_ENGINE": 1.0, "TORCH_ENGINE": 1.5})
        )
    return out


def test_the_inner_folds_give_a_class_its_own_op_weight() -> None:
    merged = merge(_norm_kinds_and_gemms())
    base = ev.training_params(min_confidence=0.0)
    chosen = ev.select_params(merged, base, ((1, 3.0),), k=4)
    assert chosen.for_class("norm").weights["op"] == 1.0
    assert chosen.for_class("matmul").weights["op"] == 4.0
    assert chosen.for_class("matmul").weights["fused"] == 4.0
    assert len(chosen.class_weights) == 1
    (own,) = chosen.class_weights
    assert ev._params_json(chosen)["per_class"][own]["op_weight"] == chosen.class_weights[own]["op"]
    # one weight for the whole model (format version 2's choice) loses one class or the other
    nested = ev.evaluate(_norm_kinds_and_gemms(), k=4, grid=((1, 3.0),)).summary()
    assert nested["by_op_class"]["norm"]["B"]["top1"] >= 0.75
    assert nested["by_op_class"]["matmul"]["B"]["top1"] >= 0.5
