"""Helpers of the CLI tests: small graphs written with the builder API, subprocess settings."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dnntune as dt
from dnntune.backend.engine import Engine, Plan
from dnntune.backend.handle import Handle
from dnntune.backend.knobs import IntConstraint, Knob, KnobSetting, KnobValueType, StringConstraint
from dnntune.errors import NotSupportedError
from dnntune.graph.ir import OpGraph
from dnntune.graph.node import OpKind

REPO = Path(__file__).resolve().parents[2]


def matmul_bias_relu(name: str = "mm_bias_relu", m: int = 8, k: int = 16, n: int = 8) -> dt.Graph:
    g = dt.Graph(
        name=name,
        io_data_type=dt.DataType.FLOAT,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    a = g.tensor(name="A", dims=[1, m, k], data_type=dt.DataType.FLOAT)
    b = g.tensor(name="B", dims=[1, k, n], data_type=dt.DataType.FLOAT)
    bias = g.tensor(name="bias", dims=[1, 1, n], data_type=dt.DataType.FLOAT)
    c = g.matmul(a, b)
    c = g.pointwise(c, bias, mode=dt.PointwiseMode.ADD)
    y = g.pointwise(c, mode=dt.PointwiseMode.RELU_FWD)
    y.set_output(True).set_name("Y")
    return g


def pointwise_mul(name: str = "pw_mul", rows: int = 4, cols: int = 8) -> dt.Graph:
    g = dt.Graph(
        name=name,
        io_data_type=dt.DataType.FLOAT,
        compute_data_type=dt.DataType.FLOAT,
        intermediate_data_type=dt.DataType.FLOAT,
    )
    x = g.tensor(name="X", dims=[rows, cols], data_type=dt.DataType.FLOAT)
    s = g.tensor(name="S", dims=[rows, cols], data_type=dt.DataType.FLOAT)
    y = g.pointwise(x, s, mode=dt.PointwiseMode.MUL)
    y.set_output(True).set_name("Y")
    return g


def bad_uid_document() -> dict:
    """A graph document whose second node names a tensor uid that does not exist."""
    doc = json.loads(matmul_bias_relu("bad_graph").to_json())
    doc["nodes"][1]["inputs"]["in_1_tensor_uid"] = 777
    return doc


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DNNTUNE_")}
    env["DNNTUNE_CACHE_DIR"] = os.environ.get("DNNTUNE_CACHE_DIR", "")
    env["COLUMNS"] = "200"
    return env


PYTHON = sys.executable


class MatmulOnlyEngine(Engine):
    """A listing-only test engine: applies to matmul graphs on the CPU, has two knobs."""

    name = "TEST_CLI_MATMUL_ONLY"
    provider = "cli-tests"
    devices = ("cpu",)

    def check_support(self, graph: OpGraph, handle: Handle) -> None:
        if graph.core_node().kind is not OpKind.MATMUL:
            raise NotSupportedError("TEST_CLI_MATMUL_ONLY runs only matmul graphs")

    def knobs(self, graph: OpGraph | None = None) -> list[Knob]:
        return [
            Knob("cli_tests.tile", "tile size", KnobValueType.INT64, 4, IntConstraint(1, 8)),
            Knob(
                "cli_tests.order",
                "loop order",
                KnobValueType.STRING,
                "ij",
                StringConstraint(frozenset({"ij", "ji"})),
            ),
        ]

    def compile(self, graph: OpGraph, knob_settings: Sequence[KnobSetting], handle: Handle) -> Plan:
        raise NotSupportedError("TEST_CLI_MATMUL_ONLY only takes part in listings")


def padded_graph(path: Path, row_stride: int) -> Path:
    """pw_mul whose X rows are ``row_stride`` elements apart: valid, and as big as that says."""
    doc = json.loads(pointwise_mul(name=path.stem).to_json())
    x = next(t for t in doc["tensors"] if t["name"] == "X")
    x["strides"] = [row_stride, 1]
    path.write_text(json.dumps(doc))
    return path


def half_matmul(m: int, k: int = 1024, n: int = 1024) -> dt.Graph:
    """A validated fp16 [m, k] x [k, n] matmul (B column-major), named ``mm<m>``."""
    g = dt.Graph(name=f"mm{m}", io_data_type=dt.DataType.HALF, compute_data_type=dt.DataType.FLOAT)
    a = g.tensor(name="A", dims=[m, k], data_type=dt.DataType.HALF)
    b = g.tensor(name="B", dims=[k, n], strides=[1, k], data_type=dt.DataType.HALF)
    g.matmul(a, b).set_output(True)
    g.validate()
    return g


#: the fewest warm-up and timed iterations a bench test needs
BENCH_FAST = ["--warmup", "1", "--iters", "3"]


def bench_graph_file(tmp_path: Path, name: str = "mm") -> Path:
    """A small matmul graph saved as ``<name>.json`` in ``tmp_path``."""
    from dnntune import testing

    g = testing.small_matmul_graph()
    g.name = name
    path = tmp_path / f"{name}.json"
    g.save(path)
    return path


def invoke(args: list[str]) -> Any:
    """The CLI's real entry point in-process, exceptions not caught."""
    from typer.testing import CliRunner

    from dnntune.cli.app import app

    return CliRunner().invoke(app, args, catch_exceptions=False)


def oracle_row(
    tmp_path: Path, *extra: str, setup: Callable[[Any], None] | None = None
) -> tuple[dict[str, Any], Any]:
    """``dnntune bench --oracle --validate reference`` of a small matmul with FAKE_ENGINE_A
    alone, through the real entry point: the engine's one result row and the fakes
    (``setup(fakes)`` runs first, inside them)."""
    from typer.testing import CliRunner

    from dnntune import testing
    from dnntune.cli.app import app

    g = testing.small_matmul_graph()
    path, out = tmp_path / "mm.json", tmp_path / "r.json"
    g.save(path)
    args = ["bench", "-g", str(path), *BENCH_FAST, "--oracle", "--validate", "reference", *extra]
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]) as fakes:
        if setup is not None:
            setup(fakes)
        result = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["graphs"][0]["results"]
    return row, fakes


def causal_mask_twice(tmp_path: Path) -> tuple[Path, str, int]:
    """The causal SDPA example with a second ``causal_mask`` line (false) after the first; its
    path, the SDPA node's attributes' JSON path and the second line's number."""
    causal = REPO / "examples" / "graphs" / "llama3_gqa_sdpa_causal.json"
    lines = causal.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"causal_mask":' in line)
    lines.insert(at + 1, lines[at].replace("true", "false"))
    path = tmp_path / "twice.json"
    path.write_text("\n".join(lines) + "\n")
    doc = json.loads(causal.read_text())
    index = next(i for i, n in enumerate(doc["nodes"]) if n["type"] == "SdpaAttributes")
    return path, f"nodes[{index}].attributes", at + 2
