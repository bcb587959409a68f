"""``dnntune bench -o``: what the results file may replace, checked before any graph runs."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import BENCH_FAST, bench_graph_file, invoke

from dnntune import testing

FAST = BENCH_FAST
_graph_file = bench_graph_file
_invoke = invoke


def test_a_folder_given_to_output_suggests_a_results_file_name(tmp_path: Path) -> None:
    """The suggestion was overrides.json, the name of tune's file, not of bench results."""
    folder = tmp_path / "out.json"
    folder.mkdir()
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        result = _invoke(["bench", "-g", str(_graph_file(tmp_path)), *FAST, "-o", str(folder)])
    assert result.exit_code == 2, result.output
    output = result.output.replace("\n", "")
    assert "is a directory" in output and str(folder / "results.json") in output
    assert "overrides.json" not in output


def test_output_never_replaces_a_file_of_another_kind(tmp_path: Path) -> None:
    """An engine-override file, a graph not being benchmarked and another program's CSV were
    replaced by the results, silently and with exit 0."""
    graph = _graph_file(tmp_path)
    overrides = tmp_path / "overrides.json"
    overrides.write_text('{"version": 2, "engine_overrides": []}')
    other_graph = _graph_file(tmp_path, "other")
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    for path in (overrides, other_graph, data):
        before = path.read_text()
        with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
            result = _invoke(["bench", "-g", str(graph), *FAST, "-o", str(path)])
        assert result.exit_code == 2, result.output
        output = result.output.replace("\n", "")
        assert "is not a dnntune bench results file" in output
        assert f"results{path.suffix}" in output
        assert path.read_text() == before


def test_output_replaces_its_own_results_and_empty_files(tmp_path: Path) -> None:
    """Running the same command again rewrites the results it wrote (JSON and CSV)."""
    graph = _graph_file(tmp_path)
    empty = tmp_path / "empty.json"
    empty.write_text("")
    for path in (tmp_path / "r.json", tmp_path / "r.csv", empty):
        for _ in range(2):
            with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
                result = _invoke(["bench", "-g", str(graph), *FAST, "-o", str(path)])
            assert result.exit_code == 0, result.output
        assert "FAKE_ENGINE_C" in path.read_text()


def test_a_results_file_in_a_graph_folder_is_left_out_and_named_when_given(
    tmp_path: Path,
) -> None:
    """A second run over a folder where the first wrote its results read that file as a
    graph: 'name: required field missing', which says nothing of what the file is. A folder
    now leaves it out (session 55); named as a graph, it is said to be none."""
    folder = tmp_path / "graphs"
    folder.mkdir()
    _graph_file(folder)
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        first = _invoke(["bench", "-g", str(folder), *FAST, "-o", str(folder / "r.json")])
        assert first.exit_code == 0, first.output
        again = _invoke(["bench", "-g", str(folder), *FAST, "-o", str(tmp_path / "r2.json")])
        assert again.exit_code == 0, again.output
        assert "r.json" not in "".join(again.output.split())
        named = _invoke(
            ["bench", "-g", str(folder / "r.json"), *FAST, "-o", str(tmp_path / "r3.json")]
        )
    assert named.exit_code == 1, named.output
    # the line is wider than the 200 columns of piped output where pytest's folder is long
    # (pytest-10 and up): a wrap drops the space it breaks at, so words are compared unspaced
    output = "".join(named.output.split())
    for said in (
        "r.json: error: a `dnntune bench` results file, not a graph",
        "give -g graph files or their folders",
    ):
        assert "".join(said.split()) in output


def test_an_upper_case_suffix_names_the_same_format(tmp_path: Path) -> None:
    """``-o results.CSV`` was refused ('must end in .json or .csv'), and a file written as
    RESULTS.Csv would have held JSON."""
    graph = _graph_file(tmp_path)
    for name in ("r.CSV", "r.Json"):
        with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
            result = _invoke(["bench", "-g", str(graph), *FAST, "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    assert (tmp_path / "r.CSV").read_text().startswith("graph")
    assert (tmp_path / "r.Json").read_text().startswith("{")


def test_a_run_results_file_or_tune_report_given_as_a_graph_is_named(tmp_path: Path) -> None:
    """``bench -g r.json`` on what ``run --json`` or ``tune --report`` wrote read only 'a graph
    document must be a JSON object, got list', where validate, run and tune name the file."""
    graph = _graph_file(tmp_path)
    run_json, report = tmp_path / "r.json", tmp_path / "t.json"
    with testing.fake_engines(names=[testing.FAKE_ENGINE_C]):
        ran = _invoke(
            ["run", "-g", str(graph), "--warmup", "0", "--iters", "1", "--json", str(run_json)]
        )
        assert ran.exit_code == 0, ran.output
        tuned = _invoke(
            ["tune", "-g", str(graph), "--report", str(report), "-o", str(tmp_path / "o.json")]
        )
        assert tuned.exit_code == 0, tuned.output
        for path, said in (
            (run_json, "a `dnntune run --json` results file, not a graph"),
            (report, "a `dnntune tune --report` file, not a graph"),
        ):
            validated = _invoke(["validate", "-g", str(path)])
            benched = _invoke(["bench", "-g", str(path), *FAST])
            assert benched.exit_code == 1, benched.output
            output, expected = "".join(benched.output.split()), "".join(validated.output.split())
            assert "".join(f"{path.name}: error: {said}".split()) in output
            assert "".join(said.split()) in expected  # the words validate uses
            assert "mustbeaJSONobject" not in output
