"""What optimize() reports is what the model runs (new-user audit, session 17)."""

from __future__ import annotations

import copy
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dnntune.torch as dtt


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 4)).eval()


def _script(monkeypatch: pytest.MonkeyPatch, times: list[float]) -> None:
    optimize_module = sys.modules["dnntune.torch.optimize"]
    clock = iter(times)
    monkeypatch.setattr(optimize_module, "forward_ms", lambda module, inputs: next(clock))


def test_a_second_optimize_compares_with_and_reverts_to_pytorch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Optimized twice and slower the second time: the revert goes to PyTorch's own classes
    (it went back to the first optimize's classes, stripped of their state)."""
    model, x = _mlp(), torch.randn(2, 8)
    originals = [type(m) for m in model.modules()]
    dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=False)
    assert [type(m) for m in model.modules()] != originals
    _script(monkeypatch, [1.0, 2.0])  # eager, then optimized: slower
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=False)
    assert report.reverted
    assert [type(m) for m in model.modules()] == originals
    assert not any(k.startswith("_dnntune") for m in model.modules() for k in m.__dict__)


def test_a_reverted_report_says_the_model_runs_pytorch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, x = _mlp(), torch.randn(2, 8)
    _script(monkeypatch, [1.0, 2.0])
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=False)
    text = str(report)
    assert report.reverted and report.engines() == {}
    assert "module(s) tried on dnntune, the model runs PyTorch's own" in text
    assert "; reverted" in text
    assert "override file" not in text  # heuristic, no file: nothing was kept in one


def test_plans_of_another_model_are_not_reported(tmp_path: Path) -> None:
    """Two models with modules of the same names: the second's report lists only what its own
    modules ran (a process-wide table keyed by name carried the first one's over)."""
    first = nn.Sequential(nn.Linear(8, 4)).eval()
    dtt.optimize(first, (torch.randn(2, 8),), policy="heuristic", overrides=None)

    class Skips(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("0", nn.Linear(8, 4))
            self.used = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)  # "0" never runs

    second = Skips().eval()
    report = dtt.optimize(second, (torch.randn(2, 8),), policy="heuristic", overrides=None)
    assert "0" not in report.engines()  # the first model's "0" plans are not this one's
    assert "0: Linear -> PyTorch's own op (the example forward ran none" in str(report)


def test_a_training_model_lists_no_fusion_and_keeps_its_statistics() -> None:
    """In training mode a batch norm runs as PyTorch's (no fold, no fusion listed), and
    optimize's own example forward leaves its running statistics as they were."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = dtt.optimize(model, (torch.randn(2, 3, 8, 8),), policy="heuristic", overrides=None)
    assert report.fusions == [] and all(
        not r.fused and r.folded_into is None for r in report.swapped
    )
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_the_report_names_the_policy_in_force() -> None:
    dtt.configure(policy="heuristic")
    report = dtt.optimize(
        nn.Sequential(nn.Linear(8, 4)).eval(), (torch.randn(2, 8),), policy=None, overrides=None
    )
    assert report.policy == "heuristic" and "policy heuristic" in str(report)


def test_layers_whose_calls_all_ran_pytorchs_op_are_not_on_dnntune() -> None:
    """float64 is no type dnntune's plans take: every call ran PyTorch's op, and the report
    said "3 module(s) on dnntune", each "not run yet", with a fusion "0 + gelu" that never ran
    (new-user audit, session 18)."""
    layers = [nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4), nn.LayerNorm(4)]
    model = nn.Sequential(*layers).double().eval()
    x = torch.randn(8, 16, dtype=torch.float64)
    with pytest.warns(dtt.DnnTuneFallbackWarning):
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    text = str(report)
    assert "0 module(s) on dnntune" in text and "not run yet" not in text
    assert report.fusions == [] and report.engines() == {}
    assert text.count("PyTorch's own op (the example forward ran none of its calls") == 3
    same = nn.Sequential(*(m.float() for m in layers)).eval()  # float32: the same layers run
    report = dtt.optimize(same, (x.float(),), policy="heuristic", overrides=None, check_speed=False)
    assert "3 module(s) on dnntune" in str(report) and report.fusions == ["<root>: 0 + gelu"]


def _refine_puts_flagged_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward clock under which any layer on PyTorch's ops makes the forward faster: refine
    puts every group there."""
    from dnntune.torch._calls import PYTORCH_FLAG

    def clock(module: nn.Module, inputs: object) -> float:
        return 2.0 / (1 + sum(PYTORCH_FLAG in m.__dict__ for m in module.modules()))

    _script(monkeypatch, [])
    monkeypatch.setattr(sys.modules["dnntune.torch.optimize"], "forward_ms", clock)


def test_a_second_optimize_decides_refine_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first optimize's refine put a layer on PyTorch's ops; a second optimize without
    refine kept it there, untuned, and reported it as a fallback ("see the fallback warning")
    though none was given (new-user audit, session 19)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    _refine_puts_flagged_first(monkeypatch)
    first = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert all(r.pytorch for r in first.swapped)
    _script(monkeypatch, [1.0, 1.0])  # the conftest's neutral clock again
    again = dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=False)
    assert all(r.plans and not r.pytorch for r in again.swapped)
    assert "fallback warning" not in str(again) and "2 module(s) on dnntune" in str(again)
    assert not any("_dnntune_pytorch" in m.__dict__ for m in model.modules())


def test_a_batch_norm_folded_into_a_layer_on_pytorchs_ops_is_not_counted_on_dnntune(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    _refine_puts_flagged_first(monkeypatch)
    report = dtt.optimize(model, (torch.randn(2, 3, 8, 8),), policy="heuristic", overrides=None)
    assert report.swapped[0].pytorch and report.swapped[1].folded_into == "0"
    text = str(report)
    assert "0 module(s) on dnntune" in text and report.engines() == {}
    assert "1: BatchNorm2d -> folded into 0 (runs in its PyTorch op)" in text


def test_a_batch_norm_folded_into_a_conv_that_ran_pytorchs_op_is_not_counted_on_dnntune() -> None:
    """float64: the conv ran PyTorch's op, and the report said "1 module(s) on dnntune", the
    batch norm "folded into 0 (runs in its graph)" (new-user audit, session 19)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with pytest.warns(dtt.DnnTuneFallbackWarning):
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    text = str(report)
    assert "0 module(s) on dnntune" in text and report.engines() == {}
    assert "1: BatchNorm2d -> folded into 0 (runs in its PyTorch op)" in text


@pytest.mark.parametrize(
    ("padding", "named"),
    [
        # a string padding runs on dnntune (test_string_padding), not with another mode
        ({"padding": "same", "padding_mode": "circular"}, "padding_mode='circular' is not"),
        ({"padding": 1, "padding_mode": "reflect"}, "padding_mode='reflect' is not supported"),
    ],
)
def test_a_conv_whose_padding_dnntune_does_not_model_gives_the_fallback_warning(
    padding: dict[str, Any], named: str
) -> None:
    """Its forward ran PyTorch's with no warning, while the report said "see the fallback
    warning" and the docs list a conv's ``padding_mode`` among the warned fallbacks (new-user
    audit, session 19; ``padding="same"`` itself runs on dnntune since)."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, **padding), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(2, 4, 8, 8)
    ref = copy.deepcopy(model)
    with pytest.warns(dtt.DnnTuneFallbackWarning, match=named):
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    assert "0: Conv2d -> PyTorch's own op" in str(report)
    # the batch norm runs on its own (the report said it was folded into the conv)
    assert "1: BatchNorm2d -> TORCH_ENGINE" in str(report) and report.fusions == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason, not on every call
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x))


def test_a_batch_norm_on_batch_statistics_is_not_reported_as_a_fallback() -> None:
    """A batch norm in training mode (or keeping no running statistics) runs PyTorch's op by
    design, with no warning; the report said "see the fallback warning", and in eval mode that
    the one without statistics was folded into its conv (new-user audit, session 19)."""
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
    )
    model[3].track_running_stats, model[3].running_mean, model[3].running_var = False, None, None
    report = dtt.optimize(model, (torch.randn(2, 3, 8, 8),), policy="heuristic", overrides=None)
    text = str(report)
    assert "fallback warning" not in text
    assert "1: BatchNorm2d -> PyTorch's own op (it normalises with the batch's statistics" in text
    assert "3: BatchNorm2d -> PyTorch's own op (it normalises with the batch's statistics" in text
    assert "2 module(s) on dnntune" in text
    model.eval()  # the statistics-free one still normalises with the batch's
    report = dtt.optimize(model, (torch.randn(2, 3, 8, 8),), policy="heuristic", overrides=None)
    text = str(report)
    assert "fallback warning" not in text and "3: BatchNorm2d -> PyTorch's own op (it" in text
    # it runs apart from its conv: no fold listed (the report said "2 + 3", "folded into 2")
    assert report.fusions == ["<root>: 0 + 1"] and "2: Conv2d -> TORCH_ENGINE" in text


class _Block(nn.Module):
    """torchvision's ``relu(bn(conv(x)))`` and a ``gelu(fc(h))`` in a forward of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return torch.nn.functional.gelu(self.fc(h))


def test_a_fusion_whose_layer_has_a_users_hook_is_not_listed(tmp_path: Path) -> None:
    """A hook of the user's (feature extraction, Grad-CAM) makes a fused call run its modules
    one by one, but the report listed the fusion, and named the batch norm both folded into
    its conv and on a plan of its own (new-user audit)."""
    seq = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64, 4),
        nn.GELU(),
    ).eval()
    feats: list[torch.Tensor] = []
    seq[1].register_forward_hook(lambda m, a, out: feats.append(out))
    seq[4].register_forward_pre_hook(lambda m, a: None)
    report = dtt.optimize(
        seq, (torch.randn(2, 3, 4, 4),), policy="heuristic", overrides=tmp_path / "a.json"
    )
    assert report.fusions == [] and len(feats) == 1
    by_name = {r.name: r for r in report.swapped}
    assert by_name["1"].folded_into is None and by_name["1"].plans
    assert by_name["0"].fused == [] and "fused:" not in str(report)

    block = _Block().eval()
    block.conv.register_forward_hook(lambda m, a, out: feats.append(out))
    report = dtt.optimize(block, (torch.randn(2, 4, 4, 4),), policy="heuristic", overrides=None)
    assert report.fusions == ["<root>: fc + gelu"]  # the unhooked one still runs fused
    assert {r.name: r.folded_into for r in report.swapped}["bn"] is None
    # the hook removed: the fusion runs, and a later optimize lists it
    block.conv._forward_hooks.clear()
    report = dtt.optimize(block, (torch.randn(2, 4, 4, 4),), policy="heuristic", overrides=None)
    assert sorted(report.fusions) == ["<root>: conv + bn + relu", "<root>: fc + gelu"]


def test_a_layer_that_ran_pytorchs_op_quietly_is_not_sent_to_a_fallback_warning() -> None:
    """Optimized under autocast (or on an empty batch), a layer runs PyTorch's op on an expected
    route, with no warning: its report line said "see the fallback warning" (new-user audit)."""
    model = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            report = dtt.optimize(model, (torch.randn(2, 8),), policy="heuristic", overrides=None)
    line = next(line for line in str(report).splitlines() if line.startswith("  0: Linear"))
    assert "under autocast" in line and "see the fallback warning" not in line


def test_a_frozen_conv_and_batch_norm_in_a_training_model_list_their_fold() -> None:
    """Fine-tuning with the stem frozen: the model trains, its conv and batch norm are in eval
    mode (frozen statistics). The fused call runs on those layers' own flags, so the fold runs;
    the report filtered fusions by their parent's flag, so it listed none and said the batch
    norm ran PyTorch's op, "see the fallback warning", where none came (new-user audit)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    model.train()
    model[0].eval()
    model[1].eval()
    x = torch.randn(2, 3, 6, 6)
    ref = copy.deepcopy(model)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    text = str(report)
    assert report.fusions == ["<root>: 0 + 1 + relu"], report.fusions
    assert "fallback warning" not in text
    assert "1: BatchNorm2d -> folded into 0" in text
    torch.testing.assert_close(model(x), ref(x))
    model[1].train()  # now the batch norm normalises with the batch's statistics: no fold
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert report.fusions == [] and "fallback warning" not in str(report)


class _SharedConv(nn.Module):
    """One conv in two Sequentials: alone in ``a``, with a batch norm and ReLU in ``b``."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv2d(3, 3, 3, padding=1)
        self.a = nn.Sequential(conv)
        self.b = nn.Sequential(conv, nn.BatchNorm2d(3), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_a_module_in_two_places_is_named_by_its_first_name() -> None:
    """A conv shared by two Sequentials: its row is ``a.0`` (``named_modules()``'s name), and
    the batch norm folded into it at ``b.0`` said "folded into b.0", a name with no row; the
    row did not list the fusion, and ``report.fusions`` left out the fusion that ran (new-user
    audit)."""
    model = _SharedConv().eval()
    report = dtt.optimize(
        model, (torch.randn(2, 3, 8, 8),), policy="heuristic", overrides=None, check_speed=False
    )
    conv, bn = report.swapped
    assert (conv.name, conv.also, conv.fused) == (
        "a.0",
        ["b.0"],
        ["b.1 (batchnorm, folded)", "b.2 (relu)"],
    )
    assert (bn.name, bn.also, bn.folded_into) == ("b.1", [], "a.0")
    assert report.fusions == ["b: 0 + 1 + relu"]
    text = str(report)
    assert "a.0 (also at b.0): Conv2d + b.1 (batchnorm, folded) + b.2 (relu) -> " in text
    assert "b.1: BatchNorm2d -> folded into a.0 (runs in its graph)" in text


def test_a_batch_norm_folded_into_a_shared_conv_on_pytorchs_op_is_not_counted() -> None:
    """float64: the shared conv ran PyTorch's op; the report looked for the batch norm's conv
    under ``b.0``, found no row, and counted the batch norm on dnntune."""
    model = _SharedConv().double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with pytest.warns(dtt.DnnTuneFallbackWarning):
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, check_speed=False)
    text = str(report)
    assert "0 module(s) on dnntune" in text and report.engines() == {}
    assert "b.1: BatchNorm2d -> folded into a.0 (runs in its PyTorch op)" in text


def test_a_reverted_report_lists_no_fusion_as_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reverted, the model runs PyTorch's own forward: no fusion runs, so none is listed in
    ``report.fusions`` or as a ``fused:`` line (a new-user audit read "fused: 0: 0 + 1 + relu"
    under "the model runs PyTorch's own"); the row still says what was tried."""
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 2),
    ).eval()
    x = torch.randn(2, 3, 6, 6)
    _script(monkeypatch, [1.0, 2.0])  # eager, then optimized: slower
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=False)
    text = str(report)
    assert report.reverted and report.fusions == []
    assert "fused:" not in text
    assert "0.0: Conv2d + 0.1 (batchnorm, folded) + 0.2 (relu) -> tried" in text


@pytest.mark.parametrize("waited", [0.9, 0.0])
def test_a_report_timed_on_a_busy_cpu_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, waited: float
) -> None:
    """optimize's keep-or-revert choices rest on forwards timed side by side: on a CPU busy
    with other processes those time the scheduler as much as the model, and the choices went
    either way from run to run (new-user audit). The report says so, from the process's wait
    for a core over the timing (here scripted: 90 % of the wall time, or none); an idle CPU adds
    no line."""
    from dnntune.measure import contention

    def meter(pid: int | None = None) -> float:
        return time.perf_counter() * waited

    monkeypatch.setattr(contention, "run_queue_wait_s", meter)
    model, x = _mlp(), torch.randn(2, 8)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    share = report.cpu_wait_share
    assert share is not None
    # the meter's and the clock's readings are apart by what the scheduler leaves between them
    # (on a busy CI machine 90 % read as 91 %)
    assert share == pytest.approx(waited, abs=0.05)
    assert report.cpu_busy is (waited > 0)
    said = f"timed while the CPU was busy (this process waited for a core {share:.0%} of the time)"
    assert (said in str(report)) is (waited > 0), str(report)


@pytest.mark.parametrize("padding_mask", [False, True])
def test_the_example_forward_takes_the_path_the_models_forward_takes(padding_mask: bool) -> None:
    """PyTorch's nn.TransformerEncoderLayer runs its fused native kernel in an inference
    forward unless one of its modules has a forward hook. optimize's example forward attributed
    plans to modules through such hooks, so it took the layer-by-layer path the model never
    takes after optimize: the report listed 8 modules on dnntune that the forward never calls,
    and with a padding mask (nested tensors between the layers) it warned that layer_norm and
    linear ran PyTorch's op on nested tensors (new-user audit)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=padding_mask).eval()
    x = torch.randn(3, 10, 32)
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[1:, 7:] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error", dtt.DnnTuneFallbackWarning)
        warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)
        report = dtt.optimize(
            model,
            (x,),
            policy="heuristic",
            overrides=None,
            example_kwargs={"src_key_padding_mask": mask} if padding_mask else None,
        )
    text = str(report)
    assert "0 module(s) on dnntune" in text, text
    assert text.count("PyTorch's own op (the example forward ran none of its calls") == 8
    # the layers a forward that wants gradients does call are attributed as before
    linear = nn.Sequential(nn.Linear(8, 8)).eval()
    report = dtt.optimize(linear, (torch.randn(2, 8),), policy="heuristic", overrides=None)
    assert "1 module(s) on dnntune" in str(report)


@pytest.mark.parametrize("refine", [False, True])
def test_a_reverted_report_says_after_refine_only_where_refine_ran(
    monkeypatch: pytest.MonkeyPatch, refine: bool
) -> None:
    """optimize(..., refine=False) reverted: the report said "still slower than PyTorch's
    forward after refine", and no refine had run (new-user audit)."""
    model, x = _mlp(), torch.randn(2, 8)
    _script(monkeypatch, [1.0] + [2.0] * 40)  # eager, then any forward with dnntune: slower
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None, refine=refine)
    assert report.reverted and bool(report.refined) is refine
    said = "reverted: still slower than PyTorch's forward after refine; the model runs"
    assert (said in str(report)) is refine, str(report)
    if not refine:
        assert "reverted: still slower than PyTorch's forward; the model runs" in str(report)


def test_an_optimize_under_autocast_says_why_its_layers_ran_pytorchs_ops() -> None:
    """Called inside torch.autocast (an AMP inference script), optimize's example forward ran
    every linear and conv on PyTorch's ops, planned none, and the report listed them with the
    generic reasons ("not called, under autocast or torch.compile, ..."), no word of what to do
    (new-user audit)."""
    model, x = _mlp(), torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert any(n.startswith("optimize ran under torch.autocast") for n in report.notes)
    assert "note: optimize ran under torch.autocast" in str(report)
    plain = dtt.optimize(_mlp(), (x,), policy="heuristic", overrides=None)
    assert not any("autocast" in n for n in plain.notes)


def test_cached_from_an_override_file_that_does_not_exist_says_so(tmp_path: Path) -> None:
    """``policy="cached"`` with a mistyped override path read as an empty file: every layer
    took the heuristics' plan and the report said nothing of it (new-user audit, session 55).
    A file that exists, or another policy, gets no such note."""
    x = torch.randn(2, 8)
    missing = tmp_path / "typo_overrides.json"
    report = dtt.optimize(_mlp(), (x,), policy="cached", overrides=missing)
    assert f"note: policy='cached' runs the choices a tune stored in {missing}" in str(report)
    assert "does not exist" in str(report) and not missing.exists()
    written = tmp_path / "ov.json"
    dtt.optimize(_mlp(), (x,), policy="tune", overrides=written, time_budget_s=5)
    assert written.exists()
    for policy, path in (("cached", written), ("heuristic", missing)):
        again = dtt.optimize(_mlp(), (x,), policy=policy, overrides=path)  # type: ignore[arg-type]
        assert not any("does not exist" in n for n in again.notes)


def test_lazy_modules_that_have_not_run_are_named_with_what_to_do() -> None:
    """A lazy model optimized before its first forward: its lazy layers run PyTorch's ops
    (they become their classes at that forward, after the swaps), and the report said only
    "0 module(s) on dnntune" (new-user audit, session 55)."""
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(4)).eval()
    x = torch.randn(2, 8)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert "note: 2 lazy module(s) (0, 2) had not run a forward yet" in str(report)
    ready = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(4)).eval()
    ready(x)  # materialized: swapped, no note
    again = dtt.optimize(ready, (x,), policy="heuristic", overrides=None)
    assert not any("lazy" in n for n in again.notes)


def test_parametrized_layers_are_named_with_what_to_do() -> None:
    """weight_norm and spectral_norm give a layer a class of PyTorch's making
    (``ParametrizedConv2d``), which optimize does not swap: the report listed the other layers
    and said nothing of these (new-user audit)."""
    model = nn.Sequential(
        nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 4, 3)),
        nn.Flatten(),
        nn.utils.parametrizations.spectral_norm(nn.Linear(16, 4)),
        nn.Linear(4, 2),
    ).eval()
    x = torch.randn(2, 3, 4, 4)
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    note = "note: 2 layer(s) with a parametrized weight (0, 2: weight_norm, spectral_norm"
    assert note in str(report)
    assert [r.name for r in report.swapped] == ["3"]
    for i in (0, 2):
        nn.utils.parametrize.remove_parametrizations(model[i], "weight")
    again = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert not any("parametrized" in n for n in again.notes)
    assert sorted(r.name for r in again.swapped) == ["0", "2", "3"]
