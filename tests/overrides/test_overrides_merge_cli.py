"""merge_files / describe_file, and the ``dnntune overrides`` typer sub-app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from overrides_helpers import (
    conv_graph,
    layernorm_graph,
    matmul_graph,
    pointwise_graph,
    write_winner,
)
from typer.testing import CliRunner

import dnntune as dt
from dnntune.backend.knobs import KnobSetting
from dnntune.cli.overrides_cmd import app as overrides_app
from dnntune.errors import ConfigFileError
from dnntune.overrides.format import load_file
from dnntune.overrides.merge import describe_file, merge_files


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_winner(conv_graph(), a, "CONV_A")
    write_winner(matmul_graph(), a, "MM_A")
    write_winner(conv_graph(), b, "CONV_B")  # same key as a's conv entry, other engine
    write_winner(pointwise_graph(), b, "PW_B")
    write_winner(matmul_graph(), b, "MM_A")  # same key, same engine: not a conflict
    return a, b


def _engines(path: Path) -> list[str]:
    return [e["engine_name"] for e in json.loads(path.read_text())["engine_overrides"]]


# ---- library --------------------------------------------------------------------------------


def test_merge_later_file_wins_and_conflicts_are_reported(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = files
    out = tmp_path / "merged.json"
    report = merge_files([a, b], out)
    assert _engines(out) == ["CONV_B", "MM_A", "PW_B"]  # first position, later content
    assert report.entries_read == 5
    assert report.entries_written == 3
    assert report.replaced == 2
    assert len(report.conflicts) == 1
    c = report.conflicts[0]
    assert (c.kept_engine, c.dropped_engine) == ("CONV_B", "CONV_A")
    assert c.kept_from == str(b) and c.dropped_from == str(a)
    assert c.key == "conv_fprop x[2,8,8,8]/[512,64,8,1] w[16,8,3,3]/[72,9,3,1]"
    assert load_file(out).named_tensor_ids


def test_merge_reports_knob_differences_as_conflicts(tmp_path: Path) -> None:
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "o.json"
    write_winner(conv_graph(), a, "E", knobs=[KnobSetting("fake.tile", 8)])
    write_winner(conv_graph(), b, "E", knobs=[KnobSetting("fake.tile", 16)])
    assert len(merge_files([a, b], out).conflicts) == 1


def test_merge_into_one_of_its_inputs(files: tuple[Path, Path]) -> None:
    a, b = files
    merge_files([a, b], a)
    assert _engines(a) == ["CONV_B", "MM_A", "PW_B"]


def test_merge_with_batch_wildcard_collapses_batch_sizes(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    write_winner(conv_graph(n=1), a, "N1")
    write_winner(conv_graph(n=8), a, "N8")
    out = tmp_path / "o.json"
    report = merge_files([a], out, wildcard_batch=True)
    doc = json.loads(out.read_text())
    assert [e["engine_name"] for e in doc["engine_overrides"]] == ["N8"]
    # X's batch only: W's dim 0 is the output channels K, not a batch
    assert [t["dim"][0] for t in doc["engine_overrides"][0]["tensors"]] == [-1, 16]
    assert len(report.conflicts) == 1


@pytest.mark.parametrize(
    "content",
    [
        "{broken",
        json.dumps({"engine_overrides": []}),
        json.dumps({"version": 2, "engine_overrides": [3]}),
    ],
)
def test_merge_refuses_bad_inputs_and_writes_nothing(
    files: tuple[Path, Path], tmp_path: Path, content: str
) -> None:
    a, _ = files
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "o.json"
    with pytest.raises(ConfigFileError):
        merge_files([a, bad], out)
    assert not out.exists()


def test_merge_needs_inputs(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="no input"):
        merge_files([], tmp_path / "o.json")


def test_describe_file_rows(files: tuple[Path, Path]) -> None:
    _, b = files
    rows = describe_file(b)
    assert [r.op for r in rows] == ["conv_fprop", "pointwise", "matmul"]
    assert rows[0].tensors == "x[2,8,8,8]/[512,64,8,1] w[16,8,3,3]/[72,9,3,1]"
    assert rows[1].criteria == "pointwise_mode=RELU_FWD"
    assert rows[0].min_time_ms == pytest.approx(0.041)
    assert rows[0].strategy == "run_until_stable"
    assert rows[0].as_dict()["engine_name"] == "CONV_B"


def test_describe_legacy_file_and_wildcards(tmp_path: Path) -> None:
    p = tmp_path / "v1.json"
    p.write_text(
        json.dumps(
            {
                "engine_overrides": [
                    {
                        "op": "conv_fprop",
                        "engine_name": "E",
                        "tensors": [{"dim": [-1, 3]}, {"dim": [1]}],
                    }
                ]
            }
        )
    )
    rows = describe_file(p)
    assert rows[0].tensors == "#0[*,3] #1[1]"
    assert rows[0].min_time_ms is None


# ---- CLI ------------------------------------------------------------------------------------


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


def test_cli_show(runner: CliRunner, files: tuple[Path, Path]) -> None:
    _, b = files
    res = runner.invoke(overrides_app, ["show", str(b)])
    assert res.exit_code == 0, res.output
    assert "version 2" in res.output
    assert "CONV_B" in res.output and "pointwise_mode=RELU_FWD" in res.output


def test_cli_show_unreadable_is_1_and_missing_is_2(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    res = runner.invoke(overrides_app, ["show", str(bad)])
    assert res.exit_code == 1
    assert "invalid JSON" in res.output
    assert runner.invoke(overrides_app, ["show", str(tmp_path / "missing.json")]).exit_code == 2


def test_cli_merge(runner: CliRunner, files: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = files
    out = tmp_path / "m.json"
    res = runner.invoke(overrides_app, ["merge", str(a), str(b), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 3 entries" in res.output
    assert "conflict" in res.output and "CONV_A" in res.output
    assert _engines(out) == ["CONV_B", "MM_A", "PW_B"]


def test_cli_merge_bad_input_is_1(
    runner: CliRunner, files: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = files
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"engine_overrides": []}))
    out = tmp_path / "m.json"
    res = runner.invoke(overrides_app, ["merge", str(a), str(legacy), "-o", str(out)])
    assert res.exit_code == 1
    assert "legacy v1" in res.output
    assert not out.exists()


def test_cli_usage_errors_are_2(
    runner: CliRunner, files: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = files
    assert runner.invoke(overrides_app, ["merge", str(a)]).exit_code == 2  # no -o
    res = runner.invoke(
        overrides_app, ["merge", str(a), "-o", str(tmp_path / "o.json"), "--wildcard", "hw"]
    )
    assert res.exit_code == 2
    # quoted as click quotes every other option it names ('--device', '-o' / '--output')
    assert "Invalid value for '--wildcard'" in " ".join(res.output.split())
    assert runner.invoke(overrides_app, ["frobnicate"]).exit_code == 2


def test_cli_merge_and_generalize_with_batch_wildcard(runner: CliRunner, tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    write_winner(conv_graph(n=1), a, "N1")
    write_winner(conv_graph(n=4), a, "N4")
    out = tmp_path / "m.json"
    res = runner.invoke(overrides_app, ["merge", str(a), "-o", str(out), "--wildcard", "batch"])
    assert res.exit_code == 0, res.output
    assert _engines(out) == ["N4"]
    res = runner.invoke(overrides_app, ["generalize", str(a)])
    assert res.exit_code == 0, res.output
    doc = json.loads(a.read_text())
    assert doc["engine_overrides"][0]["tensors"][0]["dim"][0] == -1


def test_mounted_under_the_real_entry_point(runner: CliRunner, files: tuple[Path, Path]) -> None:
    try:
        from dnntune.cli.app import app
    except ImportError:  # pragma: no cover - the CLI module is another part of the project
        pytest.skip("dnntune.cli.app not available")
    _, b = files
    res = runner.invoke(app, ["overrides", "show", str(b)])
    if res.exit_code == 2 and "overrides" in res.output and "No such command" in res.output:
        pytest.skip("overrides sub-app not mounted")
    assert res.exit_code == 0, res.output
    assert "CONV_B" in res.output


def _generalized_dims(tmp_path: Path, graph: dt.Graph) -> dict[str, list[int]]:
    path = tmp_path / f"{graph.name}.json"
    write_winner(graph, path, "E")
    merge_files([path], path, wildcard_batch=True)
    (entry,) = json.loads(path.read_text())["engine_overrides"]
    return {t["tensor_id"]: t["dim"] for t in entry["tensors"]}


def test_batch_wildcard_only_on_tensors_that_carry_the_batch(tmp_path: Path) -> None:
    assert _generalized_dims(tmp_path, conv_graph(n=2, k=64)) == {
        "x_tensor_uid": [-1, 8, 8, 8],
        "w_tensor_uid": [64, 8, 3, 3],
    }
    # a 2-D matmul: A's rows are the batch, B's dim 0 is K
    assert _generalized_dims(tmp_path, matmul_graph(m=4, k=8, n=16)) == {
        "a_tensor_uid": [-1, 8],
        "b_tensor_uid": [8, 16],
    }
    # layer norm: X only, never the scale or the bias
    assert _generalized_dims(tmp_path, layernorm_graph()) == {
        "x_tensor_uid": [-1, 32],
        "scale_tensor_uid": [1, 32],
        "bias_tensor_uid": [1, 32],
    }


def test_batched_matmul_b_and_broadcast_operands(tmp_path: Path) -> None:
    def batched_matmul(b_batch: int) -> dt.Graph:
        g = dt.Graph(name=f"bmm{b_batch}", io_data_type=dt.DataType.FLOAT)
        a = g.tensor(name="A", dims=[4, 2, 8])
        b = g.tensor(name="B", dims=[b_batch, 8, 3])
        g.matmul(a, b).set_output(True)
        g.validate()
        return g

    assert _generalized_dims(tmp_path, batched_matmul(4))["b_tensor_uid"] == [-1, 8, 3]
    assert _generalized_dims(tmp_path, batched_matmul(1))["b_tensor_uid"] == [1, 8, 3]

    def add(n: int, other: list[int]) -> dt.Graph:
        g = dt.Graph(name=f"add{n}_{len(other)}", io_data_type=dt.DataType.FLOAT)
        x = g.tensor(name="X", dims=[n, 4, 2, 2])
        y = g.tensor(name="Y", dims=other)
        g.pointwise(x, y, mode=dt.PointwiseMode.ADD).set_output(True)
        g.validate()
        return g

    full = _generalized_dims(tmp_path, add(2, [2, 4, 2, 2]))
    assert full == {"in_0_tensor_uid": [-1, 4, 2, 2], "in_1_tensor_uid": [-1, 4, 2, 2]}
    bias = _generalized_dims(tmp_path, add(1, [1, 4, 1, 1]))  # batch 1: the bias broadcasts
    assert bias == {"in_0_tensor_uid": [-1, 4, 2, 2], "in_1_tensor_uid": [1, 4, 1, 1]}


def test_generalized_conv_matches_any_batch_but_not_another_k(
    runner: CliRunner, tmp_path: Path
) -> None:
    """``overrides generalize``, then ``run`` on it: another N matches, another K does not."""
    from dnntune import testing
    from dnntune.cli.app import app

    overrides = tmp_path / "overrides.json"
    write_winner(conv_graph(n=2, k=64), overrides, testing.FAKE_ENGINE_C)
    res = runner.invoke(app, ["overrides", "generalize", str(overrides)])
    assert res.exit_code == 0, res.output
    other_batch, other_k = tmp_path / "n8_k64.json", tmp_path / "n2_k256.json"
    conv_graph(n=8, k=64).save(other_batch)
    conv_graph(n=2, k=256).save(other_k)
    report = tmp_path / "run.json"
    names = [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_B, testing.FAKE_ENGINE_C]
    with testing.fake_engines(names=names):
        res = runner.invoke(
            app,
            [
                "run",
                "-g",
                str(other_batch),
                str(other_k),
                "--iters",
                "1",
                "--warmup",
                "0",
                "--no-verify",
                "--json",
                str(report),
            ],
            env={"DNNTUNE_HEUR_CONFIG_PATH": str(overrides), "COLUMNS": "200"},
        )
    assert res.exit_code == 0, res.output
    batch_rec, k_rec = json.loads(report.read_text())
    assert batch_rec["plan"] == testing.FAKE_ENGINE_C
    assert batch_rec["policy"] == "SelectionHeuristic::Config"
    assert k_rec["plan"] == testing.FAKE_ENGINE_A  # the static order: K=256 is not K=64
    assert k_rec["policy"] != "SelectionHeuristic::Config"


def test_a_tuned_winner_is_placed_before_a_generalized_entry_that_would_shadow_it(
    tmp_path: Path,
) -> None:
    """First match wins: a winner written into (or merged with) a file whose generalized
    entry (batch -1) also matches its graph goes before that entry, so it is the one read."""
    from dnntune.overrides.match import find_match, graph_queries

    general = tmp_path / "general.json"
    write_winner(conv_graph(n=2), general, "GENERAL")
    merge_files([general], general, wildcard_batch=True)
    (tmp_path / "general_copy.json").write_text(general.read_text())
    exact = tmp_path / "exact.json"
    write_winner(conv_graph(n=4), exact, "TUNED")
    for path in (general, tmp_path / "merged.json"):
        if path == general:
            write_winner(conv_graph(n=4), general, "TUNED")  # what `dnntune tune -o` does
        else:
            merge_files([tmp_path / "general_copy.json", exact], path)
        assert _engines(path) == ["TUNED", "GENERAL"], path
        config = load_file(path)
        for n, engine in ((4, "TUNED"), (8, "GENERAL")):
            graph = conv_graph(n=n)
            match = find_match(config, graph_queries(graph))
            assert match is not None and match.entry.engine_name == engine


def test_covers_needs_a_wildcard_where_the_other_has_a_value() -> None:
    from dnntune.overrides.format import OverrideEntry, TensorPattern
    from dnntune.overrides.match import covers

    def entry(dim: tuple[int, ...], stride: tuple[int, ...] = ()) -> OverrideEntry:
        return OverrideEntry("matmul", "E", tensors=[TensorPattern("a_tensor_uid", dim, stride)])

    assert covers(entry((-1, 8)), entry((4, 8)))
    assert not covers(entry((4, 8)), entry((4, 8)))  # the same key: replaced, not shadowed
    assert not covers(entry((4, 8)), entry((-1, 8)))  # narrower
    assert not covers(entry((-1, 9)), entry((4, 8)))
    assert covers(entry((4, 8)), entry((4, 8), (8, 1)))  # no stride takes any
    assert not covers(entry((4, 8), (8, 1)), entry((4, 8)))
    assert covers(entry((4, 8), (-1, 1)), entry((4, 8), (8, 1)))


def test_cli_show_names_criteria_as_the_enum_members(runner: CliRunner, tmp_path: Path) -> None:
    """``pointwise_mode=25`` meant nothing to a reader; ``show`` names the member
    (``PointwiseMode.SWISH_FWD``) and leaves the file's integers alone. A value no member has
    (a hand-edited file) and a criterion dnntune does not know stay as written."""
    path = tmp_path / "o.json"
    tensors = [{"tensor_id": "in_0_tensor_uid", "dim": [4, 8], "stride": [8, 1]}]
    entries = [
        ("pointwise", {"pointwise_mode": 25}),
        ("layernorm", {"norm_fwd_phase": 2}),
        ("reduction", {"reduction_mode": 8}),
        ("resample", {"resample_mode": 3}),
        ("pointwise", {"pointwise_mode": 999}),
        ("matmul", {"tile_order": 4}),
    ]
    doc = {
        "version": 2,
        "engine_overrides": [
            {"op": op, "engine_name": "E", "criteria": crit, "tensors": tensors}
            for op, crit in entries
        ],
    }
    text = json.dumps(doc, indent=2)
    path.write_text(text)
    from dnntune.cli.app import app

    res = runner.invoke(app, ["overrides", "show", str(path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    for shown in (
        "pointwise_mode=SWISH_FWD",
        "norm_fwd_phase=TRAINING",
        "reduction_mode=AMAX",
        "resample_mode=AVGPOOL_EXCLUDE_PADDING",
        "pointwise_mode=999",
        "tile_order=4",
    ):
        assert shown in res.output, res.output
    assert "pointwise_mode=25" not in res.output
    assert path.read_text() == text  # the file format is unchanged: show only reads


def test_merge_conflicts_name_criteria_as_the_enum_members(
    runner: CliRunner, tmp_path: Path
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_winner(pointwise_graph(), a, "PW_A")
    write_winner(pointwise_graph(), b, "PW_B")
    from dnntune.cli.app import app

    out = tmp_path / "m.json"
    res = runner.invoke(
        app, ["overrides", "merge", str(a), str(b), "-o", str(out)], env={"COLUMNS": "250"}
    )
    assert res.exit_code == 0, res.output
    assert "pointwise{pointwise_mode=RELU_FWD}" in res.output
    assert json.loads(out.read_text())["engine_overrides"][0]["criteria"] == {"pointwise_mode": 20}
