"""The reader and the Config policy: matching rules, v1/v2, wildcards, decline paths."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from overrides_helpers import (
    FakeEngine,
    conv_bias_relu_graph,
    conv_graph,
    layernorm_graph,
    matmul_graph,
    pointwise_graph,
    write_winner,
)

import dnntune as dt
from dnntune.backend.engine import engine_id
from dnntune.backend.handle import Handle
from dnntune.backend.heuristics import (
    CONFIG_POLICY,
    HeuristicMode,
    PolicyDecision,
    order_engines,
    registered_policies,
)
from dnntune.backend.knobs import KnobSetting
from dnntune.overrides.policy import ConfigPolicy, match_override_file

F = dt.DataType.FLOAT


def _order(graph: dt.Graph, handle: Handle, cands: list[FakeEngine]) -> PolicyDecision | None:
    return ConfigPolicy().order(graph, handle, cands, HeuristicMode.A)


def _names(decision: PolicyDecision | None) -> list[str]:
    assert decision is not None
    return [e.name for e in decision.engines]


def _write_doc(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _conv_entry(engine: str = "FAKE_B", **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "op": "conv_fprop",
        "engine_name": engine,
        "tensors": [
            {"tensor_id": "x_tensor_uid", "dim": [2, 8, 8, 8], "stride": [512, 64, 8, 1]},
            {"tensor_id": "w_tensor_uid", "dim": [16, 8, 3, 3], "stride": [72, 9, 3, 1]},
        ],
    }
    entry.update(overrides)
    return entry


def test_policy_is_installed_by_import() -> None:
    assert isinstance(registered_policies()[CONFIG_POLICY], ConfigPolicy)


# ---- round trip -----------------------------------------------------------------------------


def test_round_trip_write_load_match_returns_winner_with_typed_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    path = tmp_path / "o.json"
    knobs = [
        KnobSetting("fake.tile", 64),
        KnobSetting("fake.alpha", 2.0),
        KnobSetting("fake.algo", "winograd"),
    ]
    write_winner(conv_graph(), path, "FAKE_B", knobs=knobs)
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    decision = _order(conv_graph(), handle, cands)
    assert _names(decision) == ["FAKE_B", "FAKE_Z", "FAKE_A", "FAKE_C"]
    assert decision is not None
    assert decision.policy == CONFIG_POLICY
    assert "FAKE_B" in decision.reason
    matched: dict[str, Any] = decision.matched
    assert matched["source"] == "override_file"
    assert matched["engine_id"] == engine_id("FAKE_B")
    assert matched["entry_index"] == 0
    assert matched["knob_settings"] == knobs
    assert [type(s.value) for s in matched["knob_settings"]] == [int, float, str]
    assert matched["knobs"] == {"fake.tile": 64, "fake.alpha": 2.0, "fake.algo": "winograd"}
    assert matched["autotune_metadata"]["rank"] == 0


def test_chain_uses_config_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    path = tmp_path / "o.json"
    write_winner(matmul_graph(), path, "FAKE_C")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    decision = order_engines(matmul_graph(), handle, cands, HeuristicMode.FALLBACK)
    assert decision.policy == CONFIG_POLICY
    assert decision.engines[0].name == "FAKE_C"


def test_file_is_reread_on_every_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_winner(conv_graph(), a, "FAKE_A")
    write_winner(conv_graph(), b, "FAKE_C")
    assert _order(conv_graph(), handle, cands) is None
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(a))
    assert _names(_order(conv_graph(), handle, cands))[0] == "FAKE_A"
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(b))
    assert _names(_order(conv_graph(), handle, cands))[0] == "FAKE_C"
    write_winner(conv_graph(), b, "FAKE_Z")  # the file changes under the same variable
    assert _names(_order(conv_graph(), handle, cands))[0] == "FAKE_Z"


# ---- decline paths --------------------------------------------------------------------------


def test_unset_variable_declines(handle: Handle, cands: list[FakeEngine]) -> None:
    assert _order(conv_graph(), handle, cands) is None


def test_empty_candidates_decline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle
) -> None:
    path = tmp_path / "o.json"
    write_winner(conv_graph(), path, "FAKE_A")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    assert _order(conv_graph(), handle, []) is None


def test_engine_not_a_candidate_declines(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handle: Handle,
    cands: list[FakeEngine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = _write_doc(
        tmp_path / "o.json",
        {"version": 2, "engine_overrides": [_conv_entry("CUDNN_ENGINE"), _conv_entry("FAKE_A")]},
    )
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.INFO, logger="dnntune"):
        assert _order(conv_graph(), handle, cands) is None
    assert "not a candidate" in caplog.text


def test_a_misspelled_engine_name_is_warned_about_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handle: Handle,
    cands: list[FakeEngine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An engine no installed provider has can never be used: say so (at the default level),
    once, rather than declining in silence (it was logged at INFO only)."""
    path = _write_doc(
        tmp_path / "o.json", {"version": 2, "engine_overrides": [_conv_entry("TORCH_ENGIN")]}
    )
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        assert _order(conv_graph(), handle, cands) is None
        assert _order(conv_graph(), handle, cands) is None
    warned = [r for r in caplog.records if "TORCH_ENGIN'" in r.getMessage()]
    assert len(warned) == 1 and "check its spelling" in warned[0].getMessage()
    assert "TORCH_ENGINE" in warned[0].getMessage()  # the known names


@pytest.mark.parametrize(
    "content",
    ["", "{", "[]", '{"version": 2, "engine_overrides": [{"op": 1}]}', '{"version": 9}'],
)
def test_unreadable_file_declines_with_a_warning_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handle: Handle,
    cands: list[FakeEngine],
    caplog: pytest.LogCaptureFixture,
    content: str,
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        assert _order(conv_graph(), handle, cands) is None
    assert str(path) in caplog.text


def test_missing_file_declines_with_a_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handle: Handle,
    cands: list[FakeEngine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(tmp_path / "nope.json"))
    with caplog.at_level(logging.WARNING, logger="dnntune"):
        assert _order(conv_graph(), handle, cands) is None
    assert "nope.json" in caplog.text


def test_chain_falls_through_to_static_order_when_config_declines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{oops")
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    decision = order_engines(conv_graph(), handle, cands, HeuristicMode.FALLBACK)
    assert decision.policy != CONFIG_POLICY


# ---- matching rules -------------------------------------------------------------------------


def _match(doc: Any, graph: dt.Graph, tmp_path: Path) -> str | None:
    path = _write_doc(tmp_path / "o.json", doc)
    found = match_override_file(graph, path)
    return None if found is None else found[0].entry.engine_name


def test_named_ids_match_ignoring_order(tmp_path: Path) -> None:
    entry = _conv_entry()
    entry["tensors"].reverse()
    assert _match({"version": 2, "engine_overrides": [entry]}, conv_graph(), tmp_path) == "FAKE_B"


def test_short_upper_case_ids_of_the_rfc_example_match(tmp_path: Path) -> None:
    entry = _conv_entry()
    entry["tensors"][0]["tensor_id"] = "X"
    entry["tensors"][1]["tensor_id"] = "W"
    assert _match({"version": 2, "engine_overrides": [entry]}, conv_graph(), tmp_path) == "FAKE_B"


def test_v2_pattern_without_id_does_not_match(tmp_path: Path) -> None:
    entry = _conv_entry()
    del entry["tensors"][0]["tensor_id"]
    assert _match({"version": 2, "engine_overrides": [entry]}, conv_graph(), tmp_path) is None


def test_duplicate_ids_do_not_match_twice(tmp_path: Path) -> None:
    entry = _conv_entry()
    entry["tensors"][1] = dict(entry["tensors"][0])
    assert _match({"version": 2, "engine_overrides": [entry]}, conv_graph(), tmp_path) is None


def test_legacy_v1_is_positional(tmp_path: Path) -> None:
    entry = _conv_entry()
    for t in entry["tensors"]:
        del t["tensor_id"]
    assert _match({"engine_overrides": [entry]}, conv_graph(), tmp_path) == "FAKE_B"
    swapped = _conv_entry()
    swapped["tensors"].reverse()  # ids are ignored in v1: positions decide
    assert _match({"engine_overrides": [swapped]}, conv_graph(), tmp_path) is None


def test_legacy_v1_conv_wgrad_positions_are_x_then_dy(tmp_path: Path) -> None:
    g = dt.Graph(name="wgrad", io_data_type=F)
    dy = g.tensor(name="DY", dims=[2, 16, 8, 8])
    x = g.tensor(name="X", dims=[2, 8, 8, 8])
    g.conv_wgrad(dy, x, padding=1).set_output(True)
    g.validate()
    entry = {
        "op": "conv_wgrad",
        "engine_name": "E",
        "tensors": [{"dim": [2, 8, 8, 8]}, {"dim": [2, 16, 8, 8]}],
    }
    assert _match({"engine_overrides": [entry]}, g, tmp_path) == "E"


def test_wildcards_in_dims_and_strides(tmp_path: Path) -> None:
    entry = _conv_entry()
    entry["tensors"][0]["dim"] = [-1, 8, -1, -1]
    entry["tensors"][0]["stride"] = [-1, -1, -1, 1]
    doc = {"version": 2, "engine_overrides": [entry]}
    assert _match(doc, conv_graph(n=7, hw=8), tmp_path) == "FAKE_B"
    assert _match(doc, conv_graph(n=32, hw=8), tmp_path) == "FAKE_B"
    assert _match(doc, conv_graph(c=4, k=16), tmp_path) is None  # C is not a wildcard


def test_empty_stride_means_no_stride_check(tmp_path: Path) -> None:
    entry = _conv_entry()
    for t in entry["tensors"]:
        del t["stride"]
    doc = {"version": 2, "engine_overrides": [entry]}
    assert _match(doc, conv_graph(channels_last=True), tmp_path) == "FAKE_B"
    assert _match(doc, conv_graph(), tmp_path) == "FAKE_B"


def test_stride_mismatch_and_rank_mismatch_do_not_match(tmp_path: Path) -> None:
    doc = {"version": 2, "engine_overrides": [_conv_entry()]}
    assert _match(doc, conv_graph(channels_last=True), tmp_path) is None
    short = _conv_entry()
    short["tensors"][0]["dim"] = [2, 8, 8]
    short["tensors"][0]["stride"] = [64, 8, 1]
    assert _match({"version": 2, "engine_overrides": [short]}, conv_graph(), tmp_path) is None
    wrong_len = _conv_entry()
    wrong_len["tensors"][0]["stride"] = [-1, -1]
    assert _match({"version": 2, "engine_overrides": [wrong_len]}, conv_graph(), tmp_path) is None


def test_first_match_wins(tmp_path: Path) -> None:
    general = _conv_entry("GENERAL")
    general["tensors"][0]["dim"] = [-1, 8, 8, 8]
    doc = {"version": 2, "engine_overrides": [general, _conv_entry("EXACT")]}
    assert _match(doc, conv_graph(), tmp_path) == "GENERAL"


def test_tensor_count_must_be_equal(tmp_path: Path) -> None:
    entry = _conv_entry()
    entry["tensors"].append({"tensor_id": "b_tensor_uid", "dim": [1]})
    assert _match({"version": 2, "engine_overrides": [entry]}, conv_graph(), tmp_path) is None
    entry["tensors"] = entry["tensors"][:1]
    assert _match({"version": 2, "engine_overrides": [entry]}, conv_graph(), tmp_path) is None


def test_criteria_count_and_pairs_must_be_equal(tmp_path: Path) -> None:
    base = {
        "op": "pointwise",
        "engine_name": "PW",
        "tensors": [{"tensor_id": "in_0_tensor_uid", "dim": [4, 8]}],
    }
    relu = pointwise_graph(mode=dt.PointwiseMode.RELU_FWD)
    assert _match({"version": 2, "engine_overrides": [base]}, relu, tmp_path) is None
    ok = dict(base, criteria={"pointwise_mode": 20})
    assert _match({"version": 2, "engine_overrides": [ok]}, relu, tmp_path) == "PW"
    other = dict(base, criteria={"pointwise_mode": 23})
    assert _match({"version": 2, "engine_overrides": [other]}, relu, tmp_path) is None
    extra = dict(base, criteria={"pointwise_mode": 20, "reduction_mode": 1})
    assert _match({"version": 2, "engine_overrides": [extra]}, relu, tmp_path) is None


def test_conv_entry_without_criteria_does_not_match_norm_with_criteria(tmp_path: Path) -> None:
    ln = layernorm_graph(dt.NormFwdPhase.TRAINING)
    path = tmp_path / "o.json"
    write_winner(layernorm_graph(dt.NormFwdPhase.INFERENCE), path, "INF")
    assert match_override_file(ln, path) is None
    write_winner(ln, path, "TRAIN")
    found = match_override_file(ln, path)
    assert found is not None and found[0].entry.engine_name == "TRAIN"


def test_other_nodes_are_tried_after_the_core_node(tmp_path: Path) -> None:
    relu = {
        "op": "pointwise",
        "engine_name": "RELU_RULE",
        "criteria": {"pointwise_mode": 20},
        "tensors": [{"tensor_id": "in_0_tensor_uid", "dim": [2, 16, 8, 8]}],
    }
    graph = conv_bias_relu_graph()
    assert _match({"version": 2, "engine_overrides": [relu]}, graph, tmp_path) == "RELU_RULE"
    # the core node's entry wins even when a rule for another node comes first
    doc = {"version": 2, "engine_overrides": [relu, _conv_entry("CONV_RULE")]}
    assert _match(doc, graph, tmp_path) == "CONV_RULE"


@pytest.mark.parametrize(
    "engine_ref",
    [
        str(engine_id("FAKE_C")),
        f"0x{engine_id('FAKE_C') & 0xFFFFFFFFFFFFFFFF:016x}",
        "FAKE_C",
        engine_id("FAKE_C"),
    ],
)
def test_engine_name_as_name_decimal_or_hex_id(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handle: Handle,
    cands: list[FakeEngine],
    engine_ref: Any,
) -> None:
    path = _write_doc(
        tmp_path / "o.json", {"version": 2, "engine_overrides": [_conv_entry(engine_ref)]}
    )
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    assert _names(_order(conv_graph(), handle, cands))[0] == "FAKE_C"


def test_missing_and_empty_knobs_give_no_knob_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    entries = [_conv_entry("FAKE_A"), _conv_entry("FAKE_A", autotune_metadata={"knobs": []})]
    for entry in entries:
        path = _write_doc(tmp_path / "o.json", {"version": 2, "engine_overrides": [entry]})
        monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
        decision = _order(conv_graph(), handle, cands)
        assert decision is not None
        assert decision.matched["knob_settings"] == []
        assert decision.matched["knobs"] == {}


def test_wildcard_entries_carry_typed_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle, cands: list[FakeEngine]
) -> None:
    entry = _conv_entry(
        "FAKE_A",
        autotune_metadata={
            "knobs": [
                {"knob_id": "fake.tile", "type": "int64", "value": 8},
                {"knob_id": "fake.alpha", "type": "float", "value": 1},
                {"knob_id": "fake.algo", "type": "str", "value": "fft"},
            ]
        },
    )
    entry["tensors"][0]["dim"] = [-1, -1, -1, -1]
    entry["tensors"][0]["stride"] = []
    path = _write_doc(tmp_path / "o.json", {"version": 2, "engine_overrides": [entry]})
    monkeypatch.setenv("DNNTUNE_HEUR_CONFIG_PATH", str(path))
    decision = _order(conv_graph(n=5, channels_last=True), handle, cands)
    assert decision is not None
    assert decision.matched["knobs"] == {"fake.tile": 8, "fake.alpha": 1.0, "fake.algo": "fft"}
    assert isinstance(decision.matched["knobs"]["fake.alpha"], float)
