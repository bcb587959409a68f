"""benchmarks/patch_embed.py through its real entry point, on the CPU: the graph files it
writes load, and the large-patch cases are the ones a tune tries as one GEMM."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import run_benchmark

import dnntune as dt
from dnntune.providers.torch_eager import CONV_AS_GEMM, TorchEngine


def test_the_graph_files_load_and_name_their_patches(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("times the cases on a GPU; this test is the CPU path")
    result = run_benchmark("patch_embed.py", "--graphs", str(tmp_path / "g"), out=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "wrote 5 graph files" in result.stdout and "graph files only" in result.stdout
    suggested = {}
    for path in sorted((tmp_path / "g").glob("*.json")):
        graph = dt.Graph.load(path)
        graph.validate()
        variants = TorchEngine().suggested_variants(graph)
        suggested[path.stem] = any(CONV_AS_GEMM in v for v in variants)
    assert suggested == {
        "patch_clip_b16": True,
        "patch_convnext_down": False,
        "patch_swin_convnext_stem": False,
        "patch_vit_b16": True,
        "patch_vit_b32": True,
    }
