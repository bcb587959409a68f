"""benchmarks/graph_kernels.py on the CPU: its kernel kinds and its table (the profiling itself
needs CUDA), and its entry point, where a model that cannot be captured is a row of its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench_helpers import REPO, run_benchmark

sys.path.insert(0, str(REPO / "benchmarks"))

import graph_kernels as gk


def test_kernel_names_fall_into_kinds() -> None:
    assert gk.kind_of("triton_per_fused_add_native_layer_norm_3") == "norm"
    assert gk.kind_of("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN") == "gemm"
    assert gk.kind_of("triton_poi_fused_gelu_5") == "elementwise"
    assert gk.kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert gk.kind_of("void at::native::elementwise_kernel<direct_copy_kernel_cuda>") == "copy"
    assert gk.kind_of("Memset (Unknown)") == "other"


def _row() -> dict[str, object]:
    gemm, gelu, fused = (
        "nvjet_gemm",
        "vectorized_elementwise_kernel<GeluCUDAKernelImpl>",
        "triton_tem_fused_mm_gelu_0",
    )
    kernels = {
        "plain": {gemm: [2.0, 80.0], gelu: [1.0, 25.0]},
        "dnntune_auto": {gemm: [2.0, 80.0], gelu: [1.0, 25.0]},
        "dnntune_graph": {gemm: [2.0, 79.0], gelu: [1.0, 25.0]},
        "compiled": {gemm: [1.0, 40.0], fused: [1.0, 45.0]},
    }
    return {
        "model": "m",
        "median_ms": {"plain": 0.11, "dnntune_auto": 0.11, "dnntune_graph": 0.11, "compiled": 0.09},
        "failed": {},
        "dnntune_auto_choice": "pytorch+cuda_graph",
        "dnntune_auto_tune_s": 3.0,
        "dnntune_auto_report": "auto report",
        "dnntune_graph_tune_s": 2.0,
        "dnntune_graph_report": "graph report",
        "compiled_s": 120.0,
        "compile_mode": "max-autotune",
        "kernels": kernels,
        "kinds": {k: gk.by_kind(v) for k, v in kernels.items()},
    }


def test_the_table_compares_each_forward_with_the_plain_capture() -> None:
    text = gk.render(_row())
    assert "compiled 0.0900 ms" in text
    assert "-- kernels that differ most, compiled - plain" in text
    compiled = text.split("compiled - plain")[1]
    assert "+45.0 us" in compiled and "-25.0 us" in compiled and "-40.0 us" in compiled
    assert "-- compiled: mode max-autotune, 120 s" in text
    assert "optimize report, dnntune_auto (3 s)" in text and "graph report" in text
    assert "optimize report, compiled" not in text


def test_without_a_compiled_forward_the_table_has_none() -> None:
    row = _row()
    for key in ("compiled_s", "compile_mode"):
        row.pop(key)
    for table in ("kernels", "kinds", "median_ms"):
        row[table].pop("compiled")  # type: ignore[attr-defined]
    text = gk.render(row)
    assert "compiled" not in text and "dnntune_graph - plain" in text


def test_the_entry_point_writes_a_row_per_model(tmp_path: Path) -> None:
    """On the CPU nothing can be captured: the model's row says so, and the run goes on."""
    done = run_benchmark(
        "graph_kernels.py", "--models", "tiny_mlp", "--device", "cpu", "--quick", out=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads((tmp_path / "graph_kernels.json").read_text())
    assert row["model"] == "tiny_mlp" and "error" in row
    assert "tiny_mlp:" in done.stdout
