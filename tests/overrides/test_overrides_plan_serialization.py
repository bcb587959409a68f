"""Plan serialization: JSON (no pickle), full restoration, refusal on graph/device mismatch."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from overrides_helpers import FakeEngine, FakePlan, UnsupportedEngine, conv_graph, matmul_graph

import dnntune as dt
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import KnobSetting
from dnntune.backend.registry import get_registry
from dnntune.errors import InvalidValueError, NotSupportedError
from dnntune.overrides.plan_serialization import PLAN_FORMAT, deserialize_plan, serialize_plan

ENGINE = FakeEngine("FAKE_SERIAL", workspace=4096)
OTHER = FakeEngine("FAKE_OTHER", workspace=4096)  # same knobs: a mix-up would still build
UNSUPPORTED = UnsupportedEngine("FAKE_NEVER")


@pytest.fixture(autouse=True)
def _fake_registry() -> Iterator[None]:
    with get_registry().extra_engines([ENGINE, OTHER, UNSUPPORTED], exclusive=True):
        yield


@pytest.fixture
def handle() -> Handle:
    return dt.create_handle("cpu")


def _plan(graph: dt.Graph, handle: Handle, engine: FakeEngine = ENGINE) -> FakePlan:
    knobs = [
        KnobSetting("fake.tile", 64),
        KnobSetting("fake.alpha", 2.0),
        KnobSetting("fake.algo", "fft"),
    ]
    plan = engine.compile(graph, knobs, handle)
    plan.metadata.update({"solver": ("a", 1), "obj": object(), "inf": float("inf")})
    assert isinstance(plan, FakePlan)
    return plan


def test_round_trip_restores_engine_and_typed_knobs(handle: Handle) -> None:
    graph = conv_graph()
    plan = _plan(graph, handle)
    text = serialize_plan(plan, graph, handle)
    doc = json.loads(text)
    assert doc["format"] == PLAN_FORMAT
    assert doc["engine_name"] == "FAKE_SERIAL" and doc["engine_id"] == ENGINE.id
    assert doc["graph_key"] == graph.key()
    assert doc["device_key"] == handle.device_key()
    assert doc["device_signature"]["type"] == "cpu"
    assert doc["dnntune_version"] == dt.__version__
    assert doc["workspace_size"] == 4096
    assert {"knob_id": "fake.alpha", "type": "double", "value": 2.0} in doc["knob_settings"]
    assert doc["metadata"]["solver"] == ["a", 1]
    assert isinstance(doc["metadata"]["obj"], str) and doc["metadata"]["inf"] == "inf"

    restored = deserialize_plan(conv_graph(), handle, text)  # a fresh, equal graph
    assert restored.engine is ENGINE
    assert restored.knob_settings == plan.knob_settings
    assert [type(s.value) for s in restored.knob_settings] == [
        type(s.value) for s in plan.knob_settings
    ]
    assert restored.workspace_size == 4096
    # bytes and an already parsed document are accepted too
    assert deserialize_plan(graph, handle, text.encode()).engine is ENGINE
    assert deserialize_plan(graph, handle, doc).engine is ENGINE


def test_serialized_form_is_json_not_pickle(handle: Handle) -> None:
    graph = conv_graph()
    text = serialize_plan(_plan(graph, handle), graph, handle)
    assert text.lstrip().startswith("{")
    json.loads(text)


def test_mismatched_graph_is_refused(handle: Handle) -> None:
    graph = conv_graph()
    text = serialize_plan(_plan(graph, handle), graph, handle)
    with pytest.raises(InvalidValueError, match="graph key"):
        deserialize_plan(matmul_graph(), handle, text)
    with pytest.raises(InvalidValueError, match="different problem"):
        deserialize_plan(conv_graph(n=3), handle, text)


def test_mismatched_device_is_refused(handle: Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = conv_graph()
    text = serialize_plan(_plan(graph, handle), graph, handle)
    other = dt.create_handle("cpu")
    monkeypatch.setattr(other, "device_signature", lambda: {"type": "cuda", "name": "NVIDIA H200"})
    with pytest.raises(InvalidValueError, match="NVIDIA H200"):
        deserialize_plan(graph, other, text)


def test_unknown_engine_is_refused(handle: Handle) -> None:
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    doc["engine_name"], doc["engine_id"] = "GONE_ENGINE", 12345
    with pytest.raises(InvalidValueError, match=r"GONE_ENGINE.*not registered"):
        deserialize_plan(graph, handle, doc)


def test_engine_found_by_name_when_id_differs(handle: Handle) -> None:
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    doc["engine_id"] = None
    assert deserialize_plan(graph, handle, doc).engine is ENGINE


def test_engine_that_cannot_run_here_is_refused(handle: Handle) -> None:
    graph = conv_graph()
    text = serialize_plan(_plan(graph, handle, UNSUPPORTED), graph, handle)
    with pytest.raises(NotSupportedError, match="never supported"):
        deserialize_plan(graph, handle, text)


def test_invalid_knob_is_refused(handle: Handle) -> None:
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    doc["knob_settings"] = [{"knob_id": "fake.algo", "type": "string", "value": "magic"}]
    with pytest.raises(InvalidValueError, match=r"fake\.algo"):
        deserialize_plan(graph, handle, doc)
    doc["knob_settings"] = [{"knob_id": "fake.tile", "type": "int", "value": "x"}]
    with pytest.raises(InvalidValueError, match="knob_settings"):
        deserialize_plan(graph, handle, doc)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("not json", "not valid JSON"),
        ("[]", "not a serialized dnntune plan"),
        (json.dumps({"format": "other"}), "not a serialized dnntune plan"),
        (json.dumps({"format": PLAN_FORMAT, "format_version": 99}), "format_version"),
    ],
)
def test_garbage_is_refused(handle: Handle, data: str, fragment: str) -> None:
    with pytest.raises(InvalidValueError, match=fragment):
        deserialize_plan(conv_graph(), handle, data)


@pytest.mark.parametrize("field", ["knob_settings", "graph_key", "device_key"])
def test_an_incomplete_document_is_refused(handle: Handle, field: str) -> None:
    """serialize_plan() writes every one of these; without knob_settings the engine's default
    knobs were restored silently, not the plan that was measured."""
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    del doc[field]
    with pytest.raises(InvalidValueError, match=rf"is missing {field}: the document is incomplete"):
        deserialize_plan(graph, handle, doc)


@pytest.mark.parametrize("knobs", [5, "fake.tile", {"knob_id": "fake.tile", "value": 64}, None])
def test_knob_settings_that_are_not_a_list_are_refused(handle: Handle, knobs: object) -> None:
    """An int raised a bare TypeError; a string or an object was iterated; null meant none."""
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    doc["knob_settings"] = knobs
    with pytest.raises(InvalidValueError, match="knob_settings must be a list of knob objects"):
        deserialize_plan(graph, handle, doc)


def test_a_repeated_knob_is_refused(handle: Handle) -> None:
    """Which of two values the plan used cannot be known; the last one was taken silently."""
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    doc["knob_settings"] = [
        {"knob_id": "fake.tile", "type": "int", "value": 64},
        {"knob_id": "fake.algo", "type": "string", "value": "fft"},
        {"knob_id": "fake.tile", "type": "int", "value": 128},
    ]
    with pytest.raises(
        InvalidValueError,
        match=r"knob_settings\[2\] repeats knob 'fake.tile' \(also knob_settings\[0\]\)",
    ):
        deserialize_plan(graph, handle, doc)


def test_engine_id_and_name_naming_different_engines_are_refused(handle: Handle) -> None:
    """The id's engine was built silently: a plan of another engine than the one named."""
    graph = conv_graph()
    doc = json.loads(serialize_plan(_plan(graph, handle), graph, handle))
    doc["engine_id"] = OTHER.id
    with pytest.raises(
        InvalidValueError,
        match=r"names engine 'FAKE_SERIAL', but its engine_id .* is engine FAKE_OTHER",
    ):
        deserialize_plan(graph, handle, doc)
