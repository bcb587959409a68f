"""The performance suite (benchmarks/suite) and the eager baseline translator.

Every suite file must load and validate, be what ``benchmarks/make_suite.py`` generates, name
its source, and stay small enough for one device call; the README must list every file. The
eager translator (the PyTorch baseline of ``benchmarks/run.py``) must compute what
``dnntune.reference`` computes on the example graphs.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import dnntune as dt
from dnntune import reference

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "benchmarks" / "suite"
EXAMPLES = REPO / "examples" / "graphs"
sys.path.insert(0, str(REPO / "benchmarks"))

from _eager import translate  # noqa: E402
from _measure import category_of  # noqa: E402

SUITE_FILES = sorted(SUITE.glob("*.json"))
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.json"))


def test_suite_has_at_least_40_graphs() -> None:
    assert len(SUITE_FILES) >= 40


@pytest.mark.parametrize("path", SUITE_FILES, ids=lambda p: p.stem)
def test_suite_file_loads_validates_and_names_its_source(path: Path) -> None:
    g = dt.Graph.load(path)
    g.validate()
    doc = json.loads(path.read_text())
    assert doc.get("comment", "").count("source:") == 1
    # One device call runs the whole suite: no graph may need more than a few GiB of buffers.
    io_bytes = sum(t.numel * t.data_type.itemsize for t in g.io_tensors() if t.data_type)
    assert io_bytes < 2 << 30, f"{path.name}: {io_bytes / 2**30:.2f} GiB of buffers"


def test_suite_files_match_the_shipped_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "src" / "dnntune" / "graph" / "graph.schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for path in SUITE_FILES:
        errors = [e.message for e in validator.iter_errors(json.loads(path.read_text()))]
        assert not errors, (path.name, errors[:3])


def test_suite_covers_every_category() -> None:
    counts = Counter(category_of(dt.Graph.load(p)) for p in SUITE_FILES)
    for category, least in {
        "conv_fprop": 10,
        "conv_dgrad": 2,
        "conv_wgrad": 2,
        "gemm": 6,
        "gemm_decode": 4,
        "sdpa": 4,
        "norm": 3,
        "batchnorm": 1,
        "pool": 2,
    }.items():
        assert counts[category] >= least, (category, counts)


def test_conv_suite_covers_layouts_and_types() -> None:
    convs = [p.stem for p in SUITE_FILES if p.stem.startswith("conv_fprop")]
    for tag in ("nhwc", "nchw", "fp16", "bf16"):
        assert any(tag in name for name in convs), tag


def test_readme_lists_every_file() -> None:
    text = (SUITE / "README.md").read_text()
    for path in SUITE_FILES:
        assert f"`{path.name}`" in text, path.name


def test_suite_is_what_make_suite_generates() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import make_suite

    assert make_suite.main(["--check", "--out", str(SUITE)]) == 0


@pytest.mark.parametrize("path", SUITE_FILES, ids=lambda p: p.stem)
def test_eager_translator_covers_every_suite_graph(path: Path) -> None:
    program = translate(dt.Graph.load(path))
    assert program.source.startswith("def eager_")
    assert program.output_uids


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_eager_translator_matches_reference(path: Path) -> None:
    g = dt.Graph.load(path)
    g.validate()
    program = translate(g)
    pack = reference.make_inputs(g, "cpu", seed=3)
    with torch.no_grad():
        outputs = program.outputs(program.fn(*program.args(pack)))
    inputs = {t.uid: pack[t.uid] for t in g.input_tensors() if t.uid is not None}
    expected = reference.run(g, inputs)
    for t in g.output_tensors():
        assert t.uid is not None
        got = outputs[t.uid]
        assert list(got.shape) == t.dims
        result = reference.compare(got, expected[t.uid], reference.tolerance_for(g, t))
        assert result.ok, f"{path.name} {t.name}: {result.message}\n{program.source}"


def test_eager_uses_what_a_user_writes() -> None:
    """Bias folds into the conv / linear call, activations are the F.* functions."""
    conv = translate(dt.Graph.load(EXAMPLES / "resnet50_conv3x3_bias_relu_nhwc.json")).source
    assert "F.conv2d(" in conv and ".reshape(-1)" in conv and "F.relu(" in conv
    assert "+" not in conv
    ffn = translate(dt.Graph.load(EXAMPLES / "bert_base_ffn_matmul_bias_gelu.json")).source
    assert "F.linear(" in ffn and "F.gelu(" in ffn
    gqa = translate(dt.Graph.load(EXAMPLES / "llama3_gqa_sdpa_causal.json")).source
    assert "F.scaled_dot_product_attention(" in gqa
    assert "is_causal=True" in gqa and "enable_gqa=True" in gqa
