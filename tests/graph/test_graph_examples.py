"""The example graphs: current with their generator, hipDNN-loadable, small, and covering."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import dnntune as dt

EXAMPLES_ROOT = Path(__file__).resolve().parents[2] / "examples"
GRAPHS = sorted((EXAMPLES_ROOT / "graphs").glob("*.json"))
HIPDNN_TOP_KEYS = {
    "name",
    "compute_data_type",
    "io_data_type",
    "intermediate_data_type",
    "tensors",
    "nodes",
}


def import_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES_ROOT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def make_graphs() -> Iterator[ModuleType]:
    module = import_script("make_graphs")
    yield module
    sys.modules.pop(module.__name__, None)


def test_committed_graphs_match_the_generator(make_graphs: ModuleType, tmp_path: Path) -> None:
    rendered = make_graphs.render()
    assert set(rendered) == {p.name for p in GRAPHS} | {"README.md"}
    assert make_graphs.main(["--check"]) == 0
    assert make_graphs.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(rendered)


def test_readme_describes_every_graph() -> None:
    readme = (EXAMPLES_ROOT / "graphs" / "README.md").read_text()
    for path in GRAPHS:
        assert f"`{path.name}`" in readme


def test_examples_dir_fixture(examples_dir: Path) -> None:
    assert sorted(examples_dir.glob("*.json")) == GRAPHS


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.name)
def test_example_is_hipdnn_loadable_and_small(path: Path) -> None:
    doc = json.loads(path.read_text())
    assert set(doc) == HIPDNN_TOP_KEYS
    g = dt.Graph.load(path)
    assert all(n.compute_data_type is not None for n in g.nodes)
    elements = sum(t.numel for t in g.tensors)
    assert elements < 3_000_000, f"{path.name} is too large for a quick CPU run"
    assert g.name and g.output_tensors()


def test_examples_cover_the_required_problems() -> None:
    graphs = {p.name: dt.Graph.load(p) for p in GRAPHS}
    assert len(graphs) >= 14

    def kinds(g: dt.Graph) -> list[str]:
        return [n.kind.value for n in g.nodes]

    def has(pred) -> bool:  # type: ignore[no-untyped-def]
        return any(pred(g) for g in graphs.values())

    conv_chain = ["conv_fprop", "pointwise", "pointwise"]
    nhwc = [
        g
        for g in graphs.values()
        if kinds(g) == conv_chain and g.input_tensors()[0].strides[1] == 1
    ]
    nchw = [
        g
        for g in graphs.values()
        if kinds(g) == conv_chain
        and g.input_tensors()[0].strides[-1] == 1
        and g.input_tensors()[0].dims[1] > 1
        and g.input_tensors()[0].strides[1] != 1
    ]
    assert nhwc and nchw
    assert any(g.io_data_type is dt.DataType.HALF for g in nhwc)
    assert has(lambda g: kinds(g) == ["conv_dgrad"]) and has(lambda g: kinds(g) == ["conv_wgrad"])
    assert has(
        lambda g: (
            kinds(g) == ["matmul", "pointwise", "pointwise"]
            and g.nodes[2].params["operation"] is dt.PointwiseMode.GELU_FWD
        )
    )
    assert has(lambda g: kinds(g) == ["matmul"] and g.input_tensors()[0].dims[-2] <= 8)
    sdpas = [g.nodes[0] for g in graphs.values() if kinds(g) == ["sdpa_fwd"]]
    assert {bool(n.params["causal_mask"]) for n in sdpas} == {True, False}
    assert any(
        n.inputs["q_tensor_uid"].dims[1] > n.inputs["k_tensor_uid"].dims[1]  # type: ignore[union-attr]
        for n in sdpas
    )
    for single in ("rmsnorm", "layernorm", "batchnorm_inference", "reduction"):
        assert has(lambda g, s=single: kinds(g) == [s]), single
    modes = {g.nodes[0].params["mode"] for g in graphs.values() if kinds(g) == ["resample_fwd"]}
    assert dt.ResampleMode.MAXPOOL in modes and len(modes) >= 2
    assert has(lambda g: kinds(g) == ["pointwise", "pointwise"])


def test_build_conv_graph_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = import_script("build_conv_graph")
    try:
        assert module.main(["build_conv_graph.py", str(tmp_path / "g.json")]) == 0
    finally:
        sys.modules.pop(module.__name__, None)
    out = capsys.readouterr().out
    assert "strides [12544, 1, 896, 64] (NHWC kept)" in out
    assert "rejected: node 'conv' (conv_fprop): w_tensor_uid" in out
    assert dt.Graph.load(tmp_path / "g.json").key() in out


def test_autotune_script_compiles() -> None:
    source = (EXAMPLES_ROOT / "autotune_conv.py").read_text()
    compile(source, "autotune_conv.py", "exec")
