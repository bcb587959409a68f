"""benchmarks/model_conformance.py on the CPU: random models through ``optimize`` against a
float64 copy of eager PyTorch, through the real entry point; a wrong layer and a wrong layout
are found, written to ``failures/`` and replayed; the generator draws valid, varied models."""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_helpers import REPO, run_benchmark
from torch import nn

sys.path.insert(0, str(REPO / "benchmarks"))

import _random_models
import model_conformance

import dnntune.torch as dtt
from dnntune.torch import _route_race, modules


def _results(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def test_models_pass_every_check_through_the_entry_point(tmp_path: Path) -> None:
    """Four models through the real entry point, on dnntune's kernel path (on the CPU,
    PyTorch's own op otherwise wins every layer)."""
    out = tmp_path / "run"
    result = run_benchmark(
        "model_conformance.py",
        *("--count", "4", "--seed", "12", "--kernel-path", "--policy", "heuristic"),
        *("--out", str(out)),
        out=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = _results(out)
    summary = data["summary"]
    assert summary["models"] == 4 and summary["wrong"] == summary["crash"] == 0
    assert summary["ok"] + summary["invalid"] == 4 and summary["ok"] >= 3
    # every condition ran on every valid model: 2 calls x 6 forwards, the input's gradient,
    # the train step's forward, and at least one parameter gradient
    for m in data["models"]:
        if m["status"] == "ok":
            assert m["checks"] >= 2 * 6 + 3, m
    assert "4 models" in result.stdout and "0 wrong, 0 crashed" in result.stdout
    assert not (out / "failures").exists()


def test_a_tuned_model_passes(tmp_path: Path) -> None:
    """``--policy tune``: the model's layers are tuned (a short budget) and still pass."""
    args = _args(tmp_path, "--policy", "tune", "--tune-budget-s", "0.5")
    result = model_conformance.check_model(13, args, tmp_path)  # a small CNN
    assert (result.status, result.policy, result.failed) == ("ok", "tune", [])


def test_transformers_module_forms_run_on_dnntune_and_pass(tmp_path: Path) -> None:
    """Seed 58 has transformers' RMSNorm and a gated MLP with its SiLU module: both norms run
    on dnntune's kernels (recognised: on dnntune, not PyTorch's forward) and every check
    passes."""
    case = _random_models.make_case(58, "cpu", torch.float32)
    assert "transformers_rms_norm" in case.desc and "MLP(gated transformers act" in case.desc
    args = _args(tmp_path, "--policy", "heuristic", "--kernel-path")
    result = model_conformance.check_model(58, args, tmp_path)
    assert (result.status, result.failed) == ("ok", [])
    # the input and output linears, the block's five and its two norms
    assert result.on_dnntune == 9


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    return model_conformance.parse_args(["--out", str(tmp_path / "out"), *argv])


def test_a_wrong_linear_is_found_written_and_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dnntune Linear 1 % off in eval mode fails its model's checks; the failure file names
    the checks, the first block whose output is wrong and the command that replays it, and the
    replay fails the same way."""

    def off_by_one_percent(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
        out = nn.Linear.forward(self, input)
        return out * 1.01 if not self.training else out

    monkeypatch.setattr(modules.DnnTuneLinear, "forward", off_by_one_percent)
    monkeypatch.setattr(modules.DnnTuneLinear, "fused_activation", lambda *a: None)
    monkeypatch.setattr(modules.DnnTuneLinear, "fused_tail", lambda *a, **k: None)
    seed = 0  # a transformer: a Linear in every block
    assert _random_models.make_case(seed, "cpu", torch.float32).desc.startswith("Transformer")
    args = _args(tmp_path, "--count", "1", "--seed", str(seed), "--policy", "heuristic")
    assert model_conformance.run(args) == 1
    failure = json.loads((tmp_path / "out" / "failures" / f"seed_{seed}.json").read_text())
    assert failure["status"] == "wrong"
    assert any(f.startswith("example (call 1): error") for f in failure["failed"])
    assert any(f.startswith("new_weights") for f in failure["failed"])
    # the first block whose output is wrong is named: the model's first Linear, "inp"
    first = next(f for f in failure["failed"] if f.startswith("example (call 1)"))
    assert "; first wrong: block inp: error" in first
    # and the kernels its checks built, one line per signature (its norms' and attention's:
    # the patched Linear runs PyTorch's op)
    line = re.compile(r"^[a-z_0-9]+ \[[\d, ]+\] \([\d, ]+\) torch\.\w+: \S+ \(.+\)$")
    assert failure["kernels"] and all(line.match(k) for k in failure["kernels"])
    assert any(k.startswith("rms_norm [") for k in failure["kernels"])
    assert not any(f.startswith("train") for f in failure["failed"])  # train mode is exact
    assert failure["replay"].startswith(f"python benchmarks/model_conformance.py --replay {seed}")
    replay = _args(tmp_path, "--replay", str(seed), "--policy", "heuristic")
    assert model_conformance.run(replay) == 1
    assert "wrong" in capsys.readouterr().err


def test_check_speed_optimizes_with_the_races_of_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--check-speed``: every model is optimized with the speed check, which installs the
    races of routes that its conditions' other inputs then run."""
    seen: list[bool] = []
    real = dtt.optimize

    def spy(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        report = real(model, *args, **kwargs)
        seen.extend([kwargs["check_speed"], _route_race.ROUTES in model.__dict__])
        return report

    monkeypatch.setattr(dtt, "optimize", spy)
    args = _args(tmp_path, "--count", "1", "--seed", "1", "--policy", "heuristic")
    assert model_conformance.run(args) == 0
    assert seen == [False, False]  # the CPU's default: no speed check without "auto"
    seen.clear()
    assert (
        model_conformance.run(_args(tmp_path, "--count", "1", "--seed", "1", "--check-speed")) == 0
    )
    assert seen == [True, True]


def test_a_wrong_training_gradient_fails_over_the_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bfloat16 a training step's gradients are judged over 8 draws: a dnntune Linear whose
    training forward is 5 % off is wrong on every draw, and its gradients fail."""

    def off_in_training(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
        out = nn.Linear.forward(self, input)
        return out * 1.05 if self.training else out

    monkeypatch.setattr(modules.DnnTuneLinear, "forward", off_in_training)
    monkeypatch.setattr(modules.DnnTuneLinear, "fused_activation", lambda *a: None)
    monkeypatch.setattr(modules.DnnTuneLinear, "fused_tail", lambda *a, **k: None)
    argv = ("--count", "1", "--seed", "0", "--policy", "heuristic", "--dtype", "bfloat16")
    assert model_conformance.run(_args(tmp_path, *argv)) == 1
    failure = json.loads((tmp_path / "out" / "failures" / "seed_0.json").read_text())
    grads = [f for f in failure["failed"] if f.startswith("train grad")]
    assert grads and all("median of 8 draws" in f for f in grads)
    assert not any(f.startswith("example") for f in failure["failed"])  # eval mode is exact


def test_a_layout_unlike_eagers_fails() -> None:
    """Values right, strides not eager's: a check fails (a layout that differs makes the next
    op copy); the strides of a dim of one element are not compared."""
    eager = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    ours = eager.contiguous()
    why = model_conformance.compare(ours, eager, eager.double(), "x")
    assert why is not None and "strides" in why
    one = torch.randn(4, 1, 1, 1)
    assert model_conformance.compare(one, one.as_strided(one.shape, (1, 4, 4, 4)), one, "x") is None


def test_errors_are_judged_against_eagers_own() -> None:
    """An error up to 4 times eager's own against the exact answer passes, or the dtype's
    floor; beyond both, or NaN, fails."""
    exact = torch.linspace(-2, 2, 50, dtype=torch.float64)
    eager = (exact + 0.01).float()
    assert model_conformance.compare((exact + 0.03).float(), eager, exact, "y") is None
    assert model_conformance.compare((exact + 0.05).float(), eager, exact, "y") is not None
    exact_eager = exact.float()
    assert model_conformance.compare((exact + 1e-3).float(), exact_eager, exact, "y") is None
    nan = exact_eager.clone()
    nan[3] = float("nan")
    assert model_conformance.compare(nan, exact_eager, exact, "y") is not None


def test_reduced_precision_gradients_are_judged_over_draws() -> None:
    """Over several draws the median or the mean of the largest errors is judged: one draw
    where a flipped ReLU gate puts a gradient-sized error into ours passes (the median), flips
    in about half the draws for both passes (the mean), an error on every draw fails both, and
    a NaN in one draw fails."""
    g = torch.Generator().manual_seed(0)
    exact = [torch.randn(64, generator=g, dtype=torch.float64) for _ in range(8)]
    eager = [(x + 0.01).bfloat16() for x in exact]

    def flipped(draws: list[int], values: list[torch.Tensor]) -> list[torch.Tensor]:
        out = [v.clone() for v in values]
        for i in draws:
            out[i][5] += 2.0  # one gate flipped the other way in draw i
        return out

    assert model_conformance.compare_draws(flipped([3], eager), eager, exact, "g") is None
    assert model_conformance.compare(flipped([3], eager)[3], eager[3], exact[3], "g") is not None
    deep_eager = flipped([1, 4, 7], eager)
    deep_ours = flipped([0, 2, 3, 5, 6], eager)  # medians 2.0 against 0.01: the mean passes
    assert model_conformance.compare_draws(deep_ours, deep_eager, exact, "g") is None
    assert model_conformance.compare_draws(deep_ours, eager, exact, "g") is not None
    off = [(x * 1.2).bfloat16() for x in exact]  # a wrong kernel: wrong on every draw
    why = model_conformance.compare_draws(off, eager, exact, "g")
    assert why is not None and "median of 8 draws" in why
    nan = [t.clone() for t in eager]
    nan[6][0] = float("nan")
    assert model_conformance.compare_draws(nan, eager, exact, "g") is not None


def test_eagers_error_is_taken_in_either_layout() -> None:
    """PyTorch's own error depends on the input's layout: an answer as far off as eager's on the
    other layout passes; without that answer it fails."""
    exact = torch.linspace(-2, 2, 50, dtype=torch.float64)
    eager = (exact + 0.001).float()
    ours = (exact + 0.02).float()
    assert model_conformance.compare(ours, eager, exact, "y") is not None
    other = (exact - 0.01).float()
    assert model_conformance.compare(ours, eager, exact, "y", also=other) is None


def test_the_generator_draws_valid_varied_models() -> None:
    """From one seed the same model; over 60 seeds both families, every block kind, both
    layouts; eager PyTorch runs all but a few of them."""
    descs = [_random_models.make_case(s, "cpu", torch.float32).desc for s in range(60)]
    again = [_random_models.make_case(s, "cpu", torch.float32).desc for s in range(60)]
    assert descs == again
    text = " ".join(descs)
    for word in (
        "CNN",
        "Transformer",
        "Residual",
        "SqueezeExcite",
        "Pool",
        "InPlaceResidual",
        "MBConv",
        "MLP(sequential)",
        "MHABlock",
        "TransformerEncoderLayer",
        "channels_last model",
        "channels_last input",
        "causal=True",
        "mask=bool",
        "MLP(gated)",
        "rms_norm",
        "transformers_rms_norm",
        "MLP(gated transformers act)",
        "sequential",
        "DenseConcat",
        "SharedConv",
        "hooked layer",
        "frozen backbone",
    ):
        assert word in text, word
    runs = [
        model_conformance._eager_runs(_random_models.make_case(s, "cpu", torch.float32), "cpu")
        for s in range(20)
    ]
    assert sum(runs) >= 18


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        model_conformance.parse_args(["--count", "0"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            model_conformance.parse_args(["--device", "cuda"])


def test_a_run_stopped_midway_keeps_the_models_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """results.json is written after every model: a run a timeout kills (the GPU's first zoo
    run, session 38) keeps what it checked."""
    checked = model_conformance.check_model

    def stopped_on_the_third(seed: int, *a: Any, **k: Any) -> Any:
        if seed == 14:
            raise KeyboardInterrupt  # what a timeout's signal does to the run
        return checked(seed, *a, **k)

    monkeypatch.setattr(model_conformance, "check_model", stopped_on_the_third)
    args = _args(tmp_path, "--count", "3", "--seed", "12", "--policy", "heuristic")
    args.out = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        model_conformance.run(args)
    data = _results(tmp_path / "run")
    assert [m["seed"] for m in data["models"]] == [12, 13]
    assert data["summary"]["models"] == 2
    assert not (tmp_path / "run" / "results.json.partial").exists()


@pytest.mark.parametrize(
    ("model_cl", "input_cl"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_the_onednn_twin_runs_in_nchw(model_cl: bool, input_cl: bool) -> None:
    """The copy of eager that trains with oneDNN (whose gradient error counts as eager's too)
    exists for every CPU layout, and runs NCHW: oneDNN's strided channels-last weight gradient
    is wrong (timm's ReXNet as a channels-last model had no twin and failed a gradient, session
    41)."""
    import _model_steps

    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.BatchNorm2d(4), nn.ReLU())
    fmt = torch.channels_last if model_cl else torch.contiguous_format
    conv = conv.to(memory_format=fmt)
    x = torch.randn(2, 3, 9, 9)
    if input_cl:
        x = x.contiguous(memory_format=torch.channels_last)
    case = _random_models.Case(0, conv, lambda b: x, 2, model_cl, input_cl, "conv")
    eager = copy.deepcopy(conv)
    models = _model_steps.Models(case, conv, eager, copy.deepcopy(conv).double())
    twin = models._onednn_twin(x)
    assert twin is not None and twin is not eager
    assert twin[0].weight.is_contiguous() and twin[0].weight.dtype == torch.float32
    assert _model_steps._twin_input(x).is_contiguous()
