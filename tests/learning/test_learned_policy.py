"""HeuristicMode.B in the policy chain: only for mode B, after Config, declines to static."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from learning_helpers import F, conv_nhwc, matmul, named, rec
from overrides_helpers import write_winner

import dnntune as dt
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import (
    CONFIG_POLICY,
    DEFAULT_ORDER,
    LEARNED_POLICY,
    STATIC_POLICY,
    HeuristicMode,
    order_engines,
    registered_policies,
)
from dnntune.backend.learned import ModelParams, device_class
from dnntune.learning import save_model, train


@pytest.fixture
def handle() -> Handle:
    return dt.create_handle("cpu")


@pytest.fixture
def here(handle: Handle) -> str:
    """This machine's device class (the model must know it for B to answer on the CPU)."""
    return device_class(str(handle.device_signature()["name"]))


@pytest.fixture
def model_file(tmp_path: Path, here: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model, named by DNNTUNE_HEUR_MODEL_PATH, in which TORCH_COMPILE_ENGINE wins the
    small float matmuls of this machine."""
    records = [
        rec(matmul(m, 64, 64, F), {"TORCH_COMPILE_ENGINE": 1.0, "TORCH_ENGINE": 2.0}, here)
        for m in (4, 8, 16)
    ]
    path = save_model(train(records, ModelParams(k=3, radius=4.0)), tmp_path / "model.json")
    monkeypatch.setenv("DNNTUNE_HEUR_MODEL_PATH", str(path))
    return path


def test_the_learned_policy_sits_between_config_and_static() -> None:
    assert DEFAULT_ORDER == (CONFIG_POLICY, LEARNED_POLICY, STATIC_POLICY)
    assert LEARNED_POLICY in registered_policies()


def test_applies_only_for_mode_b(handle: Handle, model_file: Path) -> None:
    graph = matmul(8, 64, 64, F)
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    policy = registered_policies()[LEARNED_POLICY]
    for mode in (HeuristicMode.A, HeuristicMode.FALLBACK):
        assert policy.order(graph, handle, cands, mode) is None
        assert order_engines(graph, handle, cands, mode).policy == STATIC_POLICY
    decision = order_engines(graph, handle, cands, HeuristicMode.B)
    assert decision.policy == LEARNED_POLICY
    assert [e.name for e in decision.engines] == ["TORCH_COMPILE_ENGINE", "TORCH_ENGINE"]
    assert decision.matched["source"] == "learned_model"
    assert decision.matched["path"] == str(model_file)
    assert "engine_id" not in decision.matched  # suggestions only: no stored knobs applied


def test_get_engine_configs_in_mode_b_through_the_facade(handle: Handle, model_file: Path) -> None:
    g = matmul(8, 64, 64, F)
    g.build_operation_graph(handle)
    names_a = [c.engine_name for c in g.get_engine_configs([dt.HeuristicMode.A])]
    names_b = [c.engine_name for c in g.get_engine_configs([dt.HeuristicMode.B])]
    assert names_a[0] == "TORCH_ENGINE"
    assert names_b == ["TORCH_COMPILE_ENGINE", "TORCH_ENGINE"]


def test_declines_outside_its_data(handle: Handle, model_file: Path) -> None:
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    far = matmul(4096, 4096, 4096, F)  # sizes far from every trained matmul
    assert order_engines(far, handle, cands, HeuristicMode.B).policy == STATIC_POLICY
    conv = conv_nhwc(2, 8, 8, 8, 3, F)  # an op class the model never saw
    assert order_engines(conv, handle, cands, HeuristicMode.B).policy == STATIC_POLICY
    assert order_engines(matmul(8, 64, 64, F), handle, cands[:1], HeuristicMode.B).policy == (
        STATIC_POLICY
    )


def test_without_a_model_mode_b_is_the_static_order(
    handle: Handle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the shipped model knows the H200 only: on this CPU it declines as well
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    decision = order_engines(matmul(8, 64, 64, F), handle, cands, HeuristicMode.B)
    assert decision.policy == STATIC_POLICY
    assert [e.name for e in decision.engines] == ["TORCH_ENGINE", "TORCH_COMPILE_ENGINE"]


def test_corrupt_model_warns_once_and_falls_back(
    handle: Handle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = tmp_path / "broken_model.json"
    bad.write_text('{"format": "dnntune-heuristics-model", "format_version": 7}')
    monkeypatch.setenv("DNNTUNE_HEUR_MODEL_PATH", str(bad))
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    with caplog.at_level(logging.DEBUG, logger="dnntune.backend.heuristics"):
        for _ in range(2):
            decision = order_engines(matmul(8, 64, 64, F), handle, cands, HeuristicMode.B)
            assert decision.policy == STATIC_POLICY
    records = [r for r in caplog.records if "learned model unusable" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG]
    message = records[0].getMessage()
    assert str(bad) in message and "format_version 7" in message
    assert "dnntune heuristics train" in message


def test_config_policy_still_comes_first(
    handle: Handle, tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = matmul(8, 64, 64, F)
    overrides = tmp_path / "overrides.json"
    write_winner(graph, overrides, "TORCH_ENGINE")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(overrides))
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    decision = order_engines(graph, handle, cands, HeuristicMode.B)
    assert decision.policy == CONFIG_POLICY
    assert decision.engines[0].name == "TORCH_ENGINE"
    # an override entry that does not match falls through to the learned ranking
    other = matmul(16, 64, 64, F)
    assert order_engines(other, handle, cands, HeuristicMode.B).policy == LEARNED_POLICY


def test_a_model_file_that_names_a_key_twice_is_corrupt_and_mode_b_falls_back(
    handle: Handle, model_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file's other content is a model mode B ranks with (the first test); json kept the
    last of the two ``k`` values and the model was used as if nothing were wrong."""
    doc = json.loads(model_file.read_text())
    text = json.dumps(doc, indent=1)
    model_file.write_text(text.replace('"k": 3,', '"k": 1,\n  "k": 3,', 1))
    cands = named("TORCH_ENGINE", "TORCH_COMPILE_ENGINE")
    with caplog.at_level(logging.WARNING, logger="dnntune.backend.heuristics"):
        decision = order_engines(matmul(8, 64, 64, F), handle, cands, HeuristicMode.B)
    assert decision.policy == STATIC_POLICY
    (record,) = [r for r in caplog.records if "learned model unusable" in r.getMessage()]
    message = record.getMessage()
    assert f'{model_file}: params: the key "k" appears twice' in message
    assert "dnntune heuristics train" in message
