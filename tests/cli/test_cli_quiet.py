"""Quiet by default (issue 26 #13): warnings only for what a user must act on.

Expected candidate outcomes (a CUDA-only variant on the CPU, a knob value that does not apply
to the graph) are results: they show in the per-candidate records and with ``-v``, never as
WARNING lines. What the engines print while they compile (torch.compile's max-autotune tables,
Inductor's own log records) is shown only with ``-vv``. All through the real CLI, on the CPU.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import Result

from dnntune import testing
from dnntune.providers import torch_compile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"
#: a small subset of the README's `bench -g examples/graphs --oracle`: a matmul (TORCH_ENGINE's
#: TF32 and CUDA-graph variants) and an attention (its SDPA backends, three of them CUDA-only)
README_SUBSET = ("llama_skinny_matmul.json", "bert_base_sdpa_noncausal.json")


def _warning_lines(result: Result) -> list[str]:
    text = result.stdout + result.stderr
    return [line for line in text.splitlines() if "WARNING" in line or "warning:" in line]


@pytest.fixture
def dnntune_records(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="dnntune"):
        yield caplog


def _bench_oracle(cli: Callable[..., Result], tmp_path: Path, *flags: str) -> Result:
    graphs = [arg for name in README_SUBSET for arg in ("-g", str(EXAMPLES / name))]
    return cli(
        *flags,
        "bench",
        *graphs,
        "--oracle",
        "--engine",
        "TORCH_ENGINE",
        "--warmup",
        "1",
        "--iters",
        "3",
        "-o",
        str(tmp_path / "results.json"),
    )


def test_readme_bench_oracle_prints_no_warnings_on_cpu(
    cli: Callable[..., Result], tmp_path: Path, dnntune_records: pytest.LogCaptureFixture
) -> None:
    result = _bench_oracle(cli, tmp_path)
    assert result.exit_code == 0, result.output
    assert _warning_lines(result) == []
    warned = [r for r in dnntune_records.records if r.levelno >= logging.WARNING]
    assert warned == [], [r.getMessage() for r in warned]
    # the CUDA-only variants were tried and are in the records, as expected outcomes
    unsupported = [
        r for r in dnntune_records.records if "torch.cuda_graph=1 needs a CUDA device" in r.message
    ]
    assert unsupported and all(r.levelno == logging.INFO for r in unsupported)


def test_bench_oracle_verbose_shows_the_expected_outcomes(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    result = _bench_oracle(cli, tmp_path, "-v")
    assert result.exit_code == 0, result.output
    assert _warning_lines(result) == []
    assert "TORCH_ENGINE[torch.cuda_graph=1]: failed compile" in result.stderr
    assert "needs a CUDA device, the handle is on cpu" in result.stderr
    assert "torch.sdpa_backend=cudnn is not available on the CPU" in result.stderr


def test_sweep_knobs_does_not_count_variants_the_cpu_cannot_run(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = cli(
        "tune",
        "-g",
        str(EXAMPLES / "llama_skinny_matmul.json"),
        "--engine",
        "TORCH_ENGINE",
        "--sweep-knobs",
        "--warmup",
        "1",
        "--max-iters",
        "3",
        "-o",
        str(tmp_path / "overrides.json"),
        "--report",
        str(report),
    )
    assert result.exit_code == 0, result.output
    assert _warning_lines(result) == []
    (rec,) = json.loads(report.read_text())
    assert rec["candidates_not_applicable"] > 0  # torch.cuda_graph=1 on the CPU
    # every candidate that applies here was measured: the table's "ok" is n/n, not n/n+1
    assert rec["candidates_succeeded"] == rec["candidates"]
    ok = f"{rec['candidates']}/{rec['candidates']}"
    assert ok in result.stdout


def test_unusable_override_file_is_warned_about_once(
    cli: Callable[..., Result], fakes: testing.FakeEngines, graph_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 2, "engine_overrides": "not a list"}')
    result = cli(
        "run",
        "-g",
        str(graph_dir),
        "--iters",
        "2",
        "--warmup",
        "0",
        env={"DNNTUNE_HEUR_CONFIG_PATH": str(bad)},
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.count("file unusable") == 1, result.stderr


# ---- what the engines print -----------------------------------------------------------------
TABLE = "AUTOTUNE mm(4x16, 16x8) strides: [16, 1]"
INDUCTOR_WARNING = "not enough SMs to use max_autotune_gemm mode"


@pytest.fixture
def chatty_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """torch.compile as it behaves under max-autotune: tables on stdout and stderr, a warning
    through Inductor's own logger (propagate=False, a handler of its own). Yields what a
    handler of Inductor's logger received (nothing while dnntune captures)."""
    real = torch_compile.trial_run
    inductor = logging.getLogger("torch._inductor.select_algorithm")

    def trial_run(name: str, graph: Any, run: Any, args: Sequence[Any]) -> Any:
        print(TABLE)
        sys.stderr.write(f"{TABLE} (stderr)\n")
        inductor.warning(INDUCTOR_WARNING)
        return real(name, graph, run, args)

    monkeypatch.setattr(torch_compile, "trial_run", trial_run)
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    parent = logging.getLogger("torch._inductor")
    parent.addHandler(handler)
    try:
        yield seen
    finally:
        parent.removeHandler(handler)


def _tune_compile(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, *flags: str
) -> Result:
    return cli(
        *flags,
        "tune",
        "-g",
        str(graph_dir / "b_pw_mul.json"),
        "--engine",
        "TORCH_COMPILE_ENGINE",
        "--warmup",
        "1",
        "--max-iters",
        "3",
        "-o",
        str(tmp_path / "overrides.json"),
    )


def test_engine_output_is_hidden_by_default(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, chatty_compile: io.StringIO
) -> None:
    result = _tune_compile(cli, graph_dir, tmp_path)
    assert result.exit_code == 0, result.output
    assert "AUTOTUNE" not in result.stdout + result.stderr
    assert INDUCTOR_WARNING not in result.stdout + result.stderr
    assert chatty_compile.getvalue() == ""  # Inductor's own handler did not print it either
    assert "TORCH_COMPILE_ENGINE" in result.stdout  # dnntune's table is still there


def test_engine_output_shows_with_vv(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, chatty_compile: io.StringIO
) -> None:
    result = _tune_compile(cli, graph_dir, tmp_path, "-vv")
    assert result.exit_code == 0, result.output
    assert "AUTOTUNE" not in result.stdout  # never among the result tables
    assert f"{TABLE}\n" not in result.stdout
    assert TABLE in result.stderr
    assert f"{TABLE} (stderr)" in result.stderr
    assert INDUCTOR_WARNING in result.stderr
    assert "dnntune.engine_output" in result.stderr


def test_engine_output_is_not_shown_with_v(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path, chatty_compile: io.StringIO
) -> None:
    result = _tune_compile(cli, graph_dir, tmp_path, "-v")
    assert result.exit_code == 0, result.output
    assert "AUTOTUNE" not in result.stdout + result.stderr


def test_wrong_answer_candidate_is_a_result_not_a_warning(
    cli: Callable[..., Result], graph_dir: Path, tmp_path: Path
) -> None:
    """A variant whose output fails verification (TF32 on a float32 graph, on the H200) is a
    failed candidate in the records, shown with -v, never a winner and never a warning."""
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_WRONG]
    args = ["tune", "-g", str(graph_dir / "b_pw_mul.json"), "--strategy", "fixed_average"]
    args += ["--iters", "2", "--warmup", "0"]
    with testing.fake_engines(names=names):
        quiet = cli(*args, "-o", str(tmp_path / "a.json"))
        verbose = cli("-v", *args, "-o", str(tmp_path / "b.json"))
    assert quiet.exit_code == 0, quiet.output
    assert _warning_lines(quiet) == []
    assert "1/2" in quiet.stdout  # tried and failed: counted, unlike a variant that cannot run
    assert verbose.exit_code == 0, verbose.output
    assert f"{testing.FAKE_ENGINE_WRONG} failed: failed verification" in verbose.stderr
