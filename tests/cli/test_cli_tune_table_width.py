"""``dnntune tune``'s table fits the width of piped output (a CI log): it was cropped at 160
columns, last column first, when a row held a torch.compile winner, a plan with knobs as the
runner-up and a busy-CPU decision (session 20's fresh-clone run)."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from dnntune.cli import _output, tune_view
from dnntune.rfc import AutotuneResult


def _row(name: str, decision: str, busy: bool) -> SimpleNamespace:
    w = AutotuneResult(engine_name="TORCH_COMPILE_ENGINE", plan_name="TORCH_COMPILE_ENGINE")
    r = AutotuneResult(
        engine_name="TORCH_ENGINE", plan_name="TORCH_ENGINE[torch.intermediate_type=io]"
    )
    w.succeeded = r.succeeded = True
    return SimpleNamespace(
        graph_name=name, source=f"{name}.json", tried=[w, r], ok=True, winner=w,
        chosen_plan=w.plan_name, winner_plan=w.plan_name, runner_up=r, margin=0.876,
        same_as_heuristic=False,
        heuristic_plan="TORCH_ENGINE", chosen_time_ms=0.0664, speedup=1.89,
        kept_heuristic=False, confirmation=None, decision=decision, timed_while_busy=busy,
        cpu_wait_share=0.27 if busy else 0.0, tuning_time_ms=15340.0,
        cost={"skipped_budget": 2}, break_even_calls=29101, results=[w, r],
    )  # fmt: skip


def test_the_summary_table_is_not_cropped_when_piped() -> None:
    rows = [
        _row("mobilenetv2_block2_depthwise3x3_s2_relu6", "winner_is_default", True),
        _row("resnet50_stem_maxpool3x3_s2", "confirmed", False),
    ]
    out = io.StringIO()
    Console(file=out, width=_output._PIPE_WIDTH).print(tune_view._summary_table(rows, "cpu"))  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()[1:]  # below the title
    assert lines and all(line.rstrip()[-1] in "┓┃┩│┘" for line in lines), "\n".join(lines)
    assert "29,101" in out.getvalue()  # the last column, whole


def test_a_runner_up_that_was_not_slower_reads_tie_not_a_negative_margin() -> None:
    """The ranking may keep its winner within noise of a runner-up that the paired rounds
    read faster (its decision time, or the cheaper build among equals): the table printed
    "-35.5%" as that runner-up's margin (new-user audit, session 55)."""
    rows = [_row("kept", "winner_is_default", True), _row("ahead", "confirmed", False)]
    rows[0].margin = -0.355
    out = io.StringIO()
    Console(file=out, width=250).print(tune_view._summary_table(rows, "cpu"))  # type: ignore[arg-type]
    text = out.getvalue()
    assert "-35.5%" not in text and "tie" in text and "87.6%" in text
