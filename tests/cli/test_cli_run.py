"""``dnntune run``: the heuristic plan of each graph, checked against the reference and timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import padded_graph

from dnntune import testing


def test_run_fake_engines_pass(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    result = cli(
        "run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0", "--json", str(report)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.count("PASS") == 2
    assert "2 of 2 graphs ran and matched the reference" in result.stdout
    recs = json.loads(report.read_text())
    assert [r["plan"] for r in recs] == [testing.FAKE_ENGINE_A] * 2
    assert all(r["passed"] is True for r in recs)
    assert recs[0]["min_time_ms"] == pytest.approx(1.0)
    assert recs[0]["policy"] == "SelectionHeuristic::StaticOrdering"


def test_times_taken_on_a_busy_cpu_are_marked(cli, fakes, graph_dir: Path, tmp_path: Path) -> None:
    """The fake clock scripts timing threads that wait for a core 60 % of the time: both rows'
    times are marked, a line says why, and the JSON records the share (session 20: a CPU
    maxpool read 11.6 ms beside busy processes, 0.09 ms alone, and nothing said so)."""
    fakes.clock.busy_share = 0.6
    report = tmp_path / "run.json"
    result = cli(
        "run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0", "--json", str(report)
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.count(" ms*") == 4  # min and median of both graphs
    text = " ".join(result.stdout.split())
    assert "2 graphs were timed while the CPU was busy" in text
    assert "waited for a core up to 60% of the time" in text
    recs = json.loads(report.read_text())
    assert all(r["timed_while_busy"] is True for r in recs)
    assert recs[0]["cpu_wait_share"] == pytest.approx(0.6, abs=0.01)
    fakes.clock.busy_share = 0.0
    quiet = cli("run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0")
    assert quiet.exit_code == 0 and "*" not in quiet.stdout and "busy" not in quiet.stdout


def test_wrong_output_is_a_mismatch(cli, graph_dir: Path) -> None:
    with testing.fake_engines(names=[testing.FAKE_ENGINE_WRONG]):
        result = cli("run", "-g", str(graph_dir / "b_pw_mul.json"))
        unchecked = cli("run", "-g", str(graph_dir / "b_pw_mul.json"), "--no-verify")
    assert result.exit_code == 1
    assert "MISMATCH" in result.stdout
    assert "output 'Y'" in result.stderr
    assert unchecked.exit_code == 0, unchecked.output


def test_bad_graph_fails_but_others_run(cli, fakes, graph_dir: Path, bad_graph: Path) -> None:
    result = cli("run", "-g", str(graph_dir), str(bad_graph))
    assert result.exit_code == 1
    assert result.stdout.count("PASS") == 2
    assert "FAILED" in result.stdout
    assert "nodes[1].inputs.in_1_tensor_uid" in result.stderr
    assert "2 of 3 graphs" in result.stderr


def test_no_engine_applies(cli, graph_dir: Path) -> None:
    with testing.fake_engines(names=[]):
        result = cli("run", "-g", str(graph_dir / "b_pw_mul.json"))
    assert result.exit_code == 1
    assert "no engine supports" in result.stderr


def test_missing_path_is_usage_error(cli, tmp_path: Path) -> None:
    assert cli("run", "-g", str(tmp_path / "missing.json")).exit_code == 2


def test_real_engines_on_cpu(cli, graph_dir: Path) -> None:
    pytest.importorskip("dnntune.providers.torch_eager")
    result = cli("run", "-g", str(graph_dir), "--device", "cpu", "--iters", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("PASS") == 2
    assert "TORCH_ENGINE" in result.stdout


def test_an_error_outside_dnntune_fails_one_graph_and_the_others_run(
    cli, fakes, graph_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An out-of-memory RuntimeError while making inputs: that graph FAILED, the batch goes on."""
    from dnntune import reference

    original = reference.make_inputs

    def out_of_memory(graph: Any, *args: Any, **kwargs: Any) -> Any:
        if graph.name == "pw_mul":
            raise RuntimeError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return original(graph, *args, **kwargs)

    monkeypatch.setattr(reference, "make_inputs", out_of_memory)
    result = cli("run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0")
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output
    assert result.stdout.count("PASS") == 1 and "FAILED" in result.stdout  # the table is shown
    assert "b_pw_mul.json: RuntimeError: CUDA out of memory" in result.stderr
    assert "1 of 2 graphs ran and matched the reference" in result.stderr


def test_binary_file_is_an_invalid_graph_and_the_others_run(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    result = cli("run", "-g", str(binary), str(graph_dir), "--iters", "2", "--warmup", "0")
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output
    assert f"{binary}: not a UTF-8 text file (byte 0x89 at offset 0)" in result.stderr
    assert result.stdout.count("PASS") == 2


def test_a_huge_padded_input_is_refused_before_allocating(
    cli, fakes, graph_dir: Path, tmp_path: Path
) -> None:
    """A stride raised to 10**9: validate accepts the graph, run refuses its 11 GiB input."""
    huge = padded_graph(tmp_path / "huge.json", 1_000_000_000)
    assert cli("validate", "-g", str(huge)).exit_code == 0
    report = tmp_path / "run.json"
    result = cli("run", "-g", str(huge), str(graph_dir), "--iters", "1", "--json", str(report))
    assert result.exit_code == 1, result.output
    assert result.stdout.count("PASS") == 2  # the other graphs ran
    assert (
        "graph 'huge' needs 11.18 GiB for its input and output buffers, more than the limit of "
        "8.00 GiB; the largest is tensor 'X'"
    ) in result.stderr
    assert "--max-input-gb" in result.stderr
    recs = {r["graph"]: r for r in json.loads(report.read_text())}
    assert recs["huge"]["input_bytes"] == (3 * 1_000_000_000 + 8 + 2 * 32) * 4
    assert recs["pw_mul"]["input_bytes"] == 3 * 32 * 4


def test_max_input_gb_lowers_and_raises_the_limit(cli, fakes, tmp_path: Path) -> None:
    padded = padded_graph(tmp_path / "padded.json", 1_000_000)  # about 11.4 MiB
    args = ["run", "-g", str(padded), "--iters", "1", "--warmup", "0"]
    refused = cli(*args, "--max-input-gb", "0.01")
    assert refused.exit_code == 1
    assert "more than the limit of 10.2 MiB" in refused.stderr
    assert cli(*args, "--max-input-gb", "0.02").exit_code == 0
    assert cli(*args, "--max-input-gb", "0").exit_code == 0  # no limit
    assert cli(*args, "--max-input-gb", "-1").exit_code == 2


def test_no_verify_title_does_not_claim_a_comparison(cli, fakes, graph_dir: Path) -> None:
    """With --no-verify nothing is compared with the reference: the title said "heuristic plan
    vs reference" all the same."""
    verified = cli("run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0")
    assert verified.exit_code == 0, verified.output
    assert "heuristic plan vs reference" in verified.stdout
    result = cli("run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "reference" not in result.stdout
    assert "dnntune run on cpu: heuristic plan (not verified)" in result.stdout


def test_one_graph_summary_is_singular(cli, fakes, graph_dir: Path) -> None:
    """The summary said "1 of 1 graphs"."""
    one = str(graph_dir / "b_pw_mul.json")
    result = cli("run", "-g", one, "--iters", "2", "--warmup", "0")
    assert result.exit_code == 0, result.output
    assert "1 of 1 graph ran and matched the reference" in result.stdout
    unchecked = cli("run", "-g", one, "--iters", "2", "--warmup", "0", "--no-verify")
    assert "1 of 1 graph ran (not verified)" in unchecked.stdout
    with testing.fake_engines(names=[testing.FAKE_ENGINE_WRONG]):
        wrong = cli("run", "-g", one, "--iters", "2", "--warmup", "0")
    assert wrong.exit_code == 1
    assert "0 of 1 graph ran and matched the reference" in wrong.stderr
    both = cli("run", "-g", str(graph_dir), "--iters", "2", "--warmup", "0")
    assert "2 of 2 graphs ran and matched the reference" in both.stdout


def test_the_json_results_are_strict_json_when_an_error_is_infinite(
    cli, graph_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """A non-finite error (an engine output of inf) was written as a bare ``Infinity``, which
    strict parsers refuse (new-user audit, session 56); it is the string "inf", as graph files
    write it."""
    from dnntune.workflows.heuristic_run import GraphRunReport

    real = GraphRunReport.to_dict
    monkeypatch.setattr(
        GraphRunReport, "to_dict", lambda self: {**real(self), "max_abs_error": float("inf")}
    )
    out = tmp_path / "r.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        result = cli("run", "-g", str(graph_dir / "b_pw_mul.json"), "--json", str(out))
    assert result.exit_code == 0, result.output

    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    (row,) = json.loads(out.read_text(), parse_constant=refuse)
    assert row["max_abs_error"] == "inf"


def test_a_broken_or_looping_link_is_named_as_such(cli, graph_dir: Path, tmp_path: Path) -> None:
    """A link loop given to -g read "no such file or directory", and broken links in a folder
    were left out without a word (new-user audit, session 56)."""
    loop, gone = tmp_path / "loop.json", tmp_path / "gone.json"
    loop.symlink_to(loop)
    gone.symlink_to(tmp_path / "missing.json")
    for link, said in ((loop, "a symbolic link in a loop"), (gone, "which does not exist")):
        result = cli("run", "-g", str(link))
        assert result.exit_code == 2, result.output
        assert said in " ".join(result.output.replace("\u2502", " ").split())
    (tmp_path / "mul.json").write_text((graph_dir / "b_pw_mul.json").read_text())
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]):
        folder = cli("run", "-g", str(tmp_path))
    assert folder.exit_code == 0, folder.output
    assert "gone.json: left out, a symbolic link to" in " ".join(folder.output.split())
