"""The learned model: train/predict round trip, the JSON file, errors, concurrent reads."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from learning_helpers import H200, conv_nhwc, family_records, layernorm, matmul, rec

from dnntune.backend.learned import (
    DEFAULT_MODEL,
    Decline,
    ModelParams,
    Prediction,
    RankingModel,
    cached_model,
    load_model,
    model_path,
    predict,
    problem_of,
)
from dnntune.backend.learned.features import FEATURE_VERSION
from dnntune.errors import ConfigFileError
from dnntune.learning import Record, save_model, train

ENGINES = ["CUDNN_ENGINE", "TORCH_ENGINE", "TRITON_ENGINE", "TORCH_COMPILE_ENGINE"]


@pytest.fixture
def model() -> RankingModel:
    return train(family_records(), ModelParams(k=3, radius=4.0))


def _first(result: Prediction | Decline) -> str:
    assert isinstance(result, Prediction), result
    return result.engines[0]


def test_predicts_unseen_shapes_from_their_neighbours(model: RankingModel) -> None:
    small = problem_of(matmul(16, 4096, 4096))
    large = problem_of(matmul(16384, 4096, 4096))
    assert _first(predict(model, small, H200, ENGINES)) == "TORCH_ENGINE"
    assert _first(predict(model, large, H200, ENGINES)) == "CUDNN_ENGINE"
    norm = predict(model, problem_of(layernorm(32768, 1024)), H200, ["TRITON_ENGINE", *ENGINES])
    assert isinstance(norm, Prediction)
    assert norm.engines[:2] == ["CUDNN_ENGINE", "TRITON_ENGINE"]
    # engines no neighbour measured follow in the order given (the static order)
    assert norm.engines[2:] == ["TORCH_ENGINE", "TORCH_COMPILE_ENGINE"]
    assert norm.confidence > 0.5 and norm.neighbours and norm.scores["CUDNN_ENGINE"] == 1.0


def test_declines_outside_what_it_has_seen(model: RankingModel) -> None:
    far_conv = problem_of(conv_nhwc(8, 2048, 7, 2048, 1))
    result = predict(model, far_conv, H200, ENGINES)
    assert isinstance(result, Decline) and "outside the trained data" in result.reason
    other_device = predict(model, problem_of(matmul(16, 4096, 4096)), "nvidia-a100", ENGINES)
    assert isinstance(other_device, Decline) and "nvidia-a100" in other_device.reason
    assert isinstance(predict(model, problem_of(matmul(16, 4096, 4096)), H200, []), Decline)
    unmeasured = predict(model, problem_of(matmul(16, 4096, 4096)), H200, ["FAKE_ENGINE"])
    assert isinstance(unmeasured, Decline) and "no neighbour measured" in unmeasured.reason


def test_static_first_engine_kept_within_the_margin() -> None:
    records = [
        rec(matmul(m, 1024, 1024), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.02}) for m in (8, 16)
    ]
    m = train(records, ModelParams(k=2, radius=4.0, margin=0.03, min_confidence=0.0))
    p = predict(m, problem_of(matmul(12, 1024, 1024)), H200, ["CUDNN_ENGINE", "TORCH_ENGINE"])
    assert isinstance(p, Prediction) and p.kept_static and p.engines[0] == "CUDNN_ENGINE"
    strict = train(records, ModelParams(k=2, radius=4.0, margin=0.0, min_confidence=0.0))
    p = predict(strict, problem_of(matmul(12, 1024, 1024)), H200, ["CUDNN_ENGINE", "TORCH_ENGINE"])
    assert _first(p) == "TORCH_ENGINE"


def test_disagreeing_neighbours_decline() -> None:
    records = [
        rec(matmul(8, 1024, 1024), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.5}),
        rec(matmul(32, 1024, 1024), {"TORCH_ENGINE": 1.5, "CUDNN_ENGINE": 1.0}),
    ]
    m = train(records, ModelParams(k=2, radius=4.0, min_confidence=0.6))
    result = predict(m, problem_of(matmul(16, 1024, 1024)), H200, ["CUDNN_ENGINE", "TORCH_ENGINE"])
    assert isinstance(result, Decline) and "neighbours disagree" in result.reason


def test_agreed_tuned_knobs_are_suggested() -> None:
    records = []
    for m in (8, 16):
        r = rec(matmul(m, 1024, 1024), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.5})
        r.configs = {"TORCH_ENGINE": {"knobs": {"torch.intermediate_type": "io"}, "time_ms": 0.9}}
        records.append(r)
    m = train(records, ModelParams(k=2, radius=4.0))
    p = predict(m, problem_of(matmul(12, 1024, 1024)), H200, ["CUDNN_ENGINE", "TORCH_ENGINE"])
    assert isinstance(p, Prediction)
    assert p.knobs == {"TORCH_ENGINE": {"torch.intermediate_type": "io"}}


def test_json_round_trip_keeps_every_prediction(model: RankingModel, tmp_path: Path) -> None:
    path = save_model(model, tmp_path / "model.json")
    loaded = load_model(path)
    assert loaded.to_json() == model.to_json()
    assert loaded.path == str(path)
    for graph in (matmul(16, 4096, 4096), layernorm(1024, 1024), conv_nhwc(8, 96, 28, 64, 3)):
        p = problem_of(graph)
        assert predict(loaded, p, H200, ENGINES) == predict(model, p, H200, ENGINES)
    doc = json.loads(path.read_text())
    assert doc["format"] == "dnntune-heuristics-model" and doc["format_version"] == 2
    assert doc["params"]["k"] == 3 and doc["groups"][0]["points"][0]["ratios"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: "{not json", r"not valid JSON \(line 1"),
        (lambda d: json.dumps({**d, "format": "something-else"}), "not a dnntune-heuristics-model"),
        (lambda d: json.dumps({**d, "format_version": 99}), "format_version 99 is not supported"),
        (lambda d: json.dumps({**d, "feature_version": 0}), "feature_version 0"),
        (
            lambda d: json.dumps(
                {
                    **d,
                    "groups": [
                        {
                            **d["groups"][0],
                            "points": [{"problem": {"op": "matmul"}, "ratios": {"X": "fast"}}],
                        }
                    ],
                }
            ),
            r"groups\[0\]\.points\[0\]\.ratios\.X: expected a finite number",
        ),
        (lambda d: json.dumps({**d, "params": {"k": 0}}), r"params\.k: expected an int >= 1"),
        # a key named twice (a hand edit): json kept the last value, and the file loaded
        (
            lambda d: '{"feature_version": 99, ' + json.dumps(d)[1:],
            r'\(top level\): the key "feature_version" appears twice \(again on line 1\); a '
            r"reader would keep only the last value: delete the one you do not mean",
        ),
        # an integer too large for a float: OverflowError escaped as an internal error
        # (new-user audit, session 56)
        (
            lambda d: json.dumps({**d, "params": {**d["params"], "margin": 10**400}}),
            r"params\.margin: expected a finite number, got 1000000000000000000000000000000000000"
            r"\.\.\.",
        ),
        (
            lambda d: json.dumps({**d, "params": {"per_class": {"gemm": {"k": 1, "radius": 3}}}}),
            r"params\.per_class\.gemm: expected an op class",
        ),
        (
            lambda d: json.dumps({**d, "params": {"per_class": {"norm": {"k": 0, "radius": 3}}}}),
            r"params\.per_class\.norm\.k: expected an int >= 1",
        ),
        (
            lambda d: json.dumps(
                {**d, "format_version": 1, "params": {"per_class": {"norm": {"k": 1, "radius": 3}}}}
            ),
            r"params\.per_class: needs format_version 2",
        ),
    ],
)
def test_corrupt_or_mismatched_files_say_what_where_and_what_to_try(
    model: RankingModel, tmp_path: Path, mutate, message: str
) -> None:
    path = save_model(model, tmp_path / "model.json")
    path.write_text(mutate(json.loads(path.read_text())))
    with pytest.raises(ConfigFileError, match=message) as info:
        load_model(path)
    text = str(info.value)
    assert str(path) in text and "dnntune heuristics train" in text
    assert "DNNTUNE_HEUR_MODEL_PATH" in text


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="cannot read the heuristics model"):
        load_model(tmp_path / "absent.json")
    with pytest.raises(ConfigFileError, match="cannot read the heuristics model"):
        cached_model(tmp_path / "absent.json")


def test_a_file_nested_too_deeply_is_invalid_json(tmp_path: Path) -> None:
    """json.loads raises RecursionError, not JSONDecodeError, past its nesting limit."""
    path = tmp_path / "deep.json"
    path.write_text('{"format": "dnntune-heuristics-model", "x": ' + "[" * 100000 + "]" * 100000)
    for load in (load_model, cached_model):
        with pytest.raises(ConfigFileError, match="not valid JSON \\(nested too deeply\\)") as info:
            load(path)
        assert str(path) in str(info.value) and "dnntune heuristics train" in str(info.value)


def test_cache_reloads_a_replaced_file(model: RankingModel, tmp_path: Path) -> None:
    path = save_model(model, tmp_path / "model.json")
    first = cached_model(path)
    assert cached_model(path) is first
    smaller = train(family_records()[:3], ModelParams(k=1))
    save_model(smaller, path)
    assert cached_model(path).point_count == 3


def test_concurrent_reads_while_the_model_is_rewritten(model: RankingModel, tmp_path: Path) -> None:
    path = save_model(model, tmp_path / "model.json")
    other = train(family_records()[:5], ModelParams(k=1))
    errors: list[BaseException] = []
    counts: set[int] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                counts.add(load_model(path).point_count)
                counts.add(cached_model(path).point_count)
            except BaseException as exc:
                errors.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for i in range(30):
        save_model(other if i % 2 else model, path)
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert counts <= {model.point_count, other.point_count}


def test_model_path_is_the_variable_else_the_shipped_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DNNTUNE_HEUR_MODEL_PATH", str(tmp_path / "mine.json"))
    assert model_path() == tmp_path / "mine.json"
    monkeypatch.delenv("DNNTUNE_HEUR_MODEL_PATH")
    assert model_path() == (DEFAULT_MODEL if DEFAULT_MODEL.is_file() else None)


def test_the_shipped_model_loads_and_holds_h200_and_h100_data() -> None:
    if not DEFAULT_MODEL.is_file():
        pytest.skip("no model shipped")
    shipped = load_model(DEFAULT_MODEL)
    # an H100 80GB HBM3 (session 57's three suite runs) has a group of its own
    assert {d for d, _ in shipped.groups} == {"nvidia-h200", "nvidia-h100-80gb-hbm3"}
    assert shipped.evaluation is not None
    assert shipped.evaluation["B"]["regret_geomean"] <= shipped.evaluation["A"]["regret_geomean"]


def test_a_format_version_1_file_still_loads_and_predicts_the_same(
    model: RankingModel, tmp_path: Path
) -> None:
    path = save_model(model, tmp_path / "model.json")
    doc = json.loads(path.read_text())
    assert "per_class" not in doc["params"]
    path.write_text(json.dumps({**doc, "format_version": 1}))
    loaded = load_model(path)
    p = problem_of(matmul(16, 4096, 4096))
    assert predict(loaded, p, H200, ENGINES) == predict(model, p, H200, ENGINES)


def test_per_class_parameters_apply_to_their_class_only(tmp_path: Path) -> None:
    # norm problems get a radius too small to reach any trained norm: declined; matmuls
    # keep the overall k and radius and are answered
    params = ModelParams(k=3, radius=4.0, per_class={"norm": (1, 0.5)})
    model = train(family_records(), params)
    assert params.for_class("norm").radius == 0.5 and params.for_class("norm").k == 1
    assert params.for_class("matmul").radius == 4.0 and not params.for_class("matmul").per_class
    near_norm = problem_of(layernorm(2048, 1024))
    assert isinstance(predict(model, near_norm, H200, ENGINES), Decline)
    plain = train(family_records(), ModelParams(k=3, radius=4.0))
    assert _first(predict(plain, near_norm, H200, ENGINES)) == "CUDNN_ENGINE"
    assert _first(predict(model, problem_of(matmul(16, 4096, 4096)), H200, ENGINES)) == (
        "TORCH_ENGINE"
    )
    loaded = load_model(save_model(model, tmp_path / "model.json"))
    assert loaded.params.per_class == {"norm": (1, 0.5)}
    doc = json.loads((tmp_path / "model.json").read_text())
    assert doc["params"]["per_class"] == {"norm": {"k": 1, "radius": 0.5}}
    assert isinstance(predict(loaded, near_norm, H200, ENGINES), Decline)


def test_a_trained_problem_follows_its_own_measurements() -> None:
    """The shipped model put cuDNN first for a layernorm whose own three sessions all had
    Triton 1.16x faster: its four nearest neighbours (other norms) outvoted it. A problem at
    distance 0 now decides alone; a shape next to it still follows the neighbours."""
    own = layernorm(16384, 4096)
    records = [rec(own, {"TRITON_ENGINE": 1.0, "CUDNN_ENGINE": 1.16})] + [
        rec(layernorm(rows, cols), {"CUDNN_ENGINE": 1.0, "TRITON_ENGINE": 1.3})
        for rows, cols in ((8192, 4096), (16384, 2048), (32768, 4096), (16384, 8192))
    ]
    m = train(records, ModelParams(k=5, radius=8.0, margin=0.0, min_confidence=0.0))
    engines = ["TRITON_ENGINE", "CUDNN_ENGINE"]
    exact = predict(m, problem_of(own), H200, engines)
    assert isinstance(exact, Prediction) and exact.engines[0] == "TRITON_ENGINE"
    assert [n.distance for n in exact.neighbours] == [0.0] and exact.confidence == 1.0
    near = predict(m, problem_of(layernorm(12288, 4096)), H200, engines)
    assert _first(near) == "CUDNN_ENGINE"


def _gemm_epilogue_records() -> list[Record]:
    """Plain GEMMs where TORCH_ENGINE wins and fused ones (bias) where TRITON_ENGINE wins, of
    the same sizes (the H200's fresh GEMM labels, simplified)."""
    out = []
    for m in (32, 128, 512, 2048):
        out.append(rec(matmul(m, 4096, 4096), {"TORCH_ENGINE": 1.0, "TRITON_ENGINE": 1.3}))
        out.append(
            rec(matmul(m, 4096, 4096, bias=True), {"TRITON_ENGINE": 1.0, "TORCH_ENGINE": 1.5})
        )
    return out


def test_fused_and_plain_gemms_learn_from_their_own_kind() -> None:
    m = train(_gemm_epilogue_records(), ModelParams(k=3, radius=6.0))
    engines = ["CUDNN_ENGINE", "TORCH_ENGINE", "TRITON_ENGINE"]
    plain = predict(m, problem_of(matmul(256, 4096, 4096)), H200, engines)
    fused = predict(m, problem_of(matmul(256, 4096, 4096, bias=True)), H200, engines)
    assert _first(plain) == "TORCH_ENGINE" and _first(fused) == "TRITON_ENGINE"
    assert isinstance(plain, Prediction) and plain.confidence > 0.5
    # under feature version 1 (epilogue count only, weight 1) the three nearest of a plain
    # GEMM are the two plain ones 1 size unit away and a fused one at distance 1: they disagree
    v1 = train(_gemm_epilogue_records(), ModelParams(k=3, radius=6.0))
    v1.feature_version = 1
    old = predict(v1, problem_of(matmul(256, 4096, 4096)), H200, engines)
    assert isinstance(old, Decline) or old.confidence < plain.confidence


def test_a_feature_version_1_file_still_loads_and_predicts_as_trained(tmp_path: Path) -> None:
    """A model trained before the fused feature is compared on the features it was trained
    on: no fused feature, its own weights."""
    m = train(_gemm_epilogue_records(), ModelParams(k=3, radius=6.0))
    path = save_model(m, tmp_path / "model.json")
    doc = json.loads(path.read_text())
    assert doc["feature_version"] == FEATURE_VERSION == 2 and doc["params"]["weights"]["fused"]
    weights = {n: w for n, w in doc["params"]["weights"].items() if n != "fused"}
    path.write_text(
        json.dumps({**doc, "feature_version": 1, "params": {**doc["params"], "weights": weights}})
    )
    loaded = load_model(path)
    assert loaded.feature_version == 1
    q = problem_of(matmul(256, 4096, 4096, bias=True))
    got = predict(loaded, q, H200, ["CUDNN_ENGINE", "TORCH_ENGINE", "TRITON_ENGINE"])
    near = got.neighbours[0].distance if isinstance(got, Prediction) else None
    # its nearest: the fused GEMMs 1 size unit away, no fused term in the distance
    assert near == pytest.approx(1.0)
    assert save_model(loaded, tmp_path / "again.json") and (
        json.loads((tmp_path / "again.json").read_text())["feature_version"] == 1
    )


def test_a_file_without_a_fused_weight_ties_it_to_the_op_weight(tmp_path: Path) -> None:
    m = train(_gemm_epilogue_records(), ModelParams(k=3, radius=6.0))
    doc = m.to_json()
    doc["params"]["weights"] = {"op": 1.0, "dtype": 1.0, "epilogue": 1.0}
    (tmp_path / "model.json").write_text(json.dumps(doc))
    assert load_model(tmp_path / "model.json").params.weights["fused"] == 1.0


def test_a_newer_feature_version_is_refused_with_what_to_try(
    model: RankingModel, tmp_path: Path
) -> None:
    doc = model.to_json()
    (tmp_path / "model.json").write_text(json.dumps({**doc, "feature_version": 3}))
    with pytest.raises(ConfigFileError, match=r"feature_version 3.*reads feature versions 1, 2"):
        load_model(tmp_path / "model.json")


def test_radius_0_takes_exact_matches_with_full_confidence() -> None:
    """``--radius 0`` (exact matches only) divided by zero in the confidence, so predict and
    every tune under a budget raised ZeroDivisionError (new-user audit, session 56)."""
    records = [
        rec(matmul(m, 1024, 1024), {"TORCH_ENGINE": 1.0, "CUDNN_ENGINE": 1.5}) for m in (8, 16)
    ]
    m = train(records, ModelParams(k=1, radius=0.0))
    seen = predict(m, problem_of(matmul(8, 1024, 1024)), H200, ["CUDNN_ENGINE", "TORCH_ENGINE"])
    assert isinstance(seen, Prediction) and seen.engines[0] == "TORCH_ENGINE"
    assert seen.confidence == 1.0
    unseen = predict(m, problem_of(matmul(12, 1024, 1024)), H200, ["CUDNN_ENGINE", "TORCH_ENGINE"])
    assert isinstance(unseen, Decline)
