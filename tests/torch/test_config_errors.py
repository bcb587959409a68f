"""Settings a user gets wrong are refused where they are given, and a call that dnntune cannot
run says why in its one warning (a new-user audit's findings, session 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dnntune.torch as dtt
from dnntune.errors import DnnTuneError, InvalidValueError
from dnntune.torch import runtime


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup_iterations": -5}, r"warmup_iterations must be >= 0, got -5"),
        ({"timed_iterations": 0}, r"timed_iterations must be >= 1, got 0"),
        ({"cache_size": 0}, r"cache_size must be >= 1"),
    ],
)
def test_bad_settings_are_refused_by_configure(kwargs: dict[str, int], match: str) -> None:
    before = dtt.configure()
    with pytest.raises(InvalidValueError, match=match):
        dtt.configure(**kwargs)  # type: ignore[arg-type]
    assert dtt.configure() == before  # nothing half-applied


def test_an_override_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match=r"is a folder; give the override file's path"):
        dtt.configure(overrides=tmp_path)


def test_the_fallback_warning_names_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object, **kwargs: object) -> object:
        raise DnnTuneError("the plan cache is on fire")

    monkeypatch.setattr(runtime, "kernel_for", fails)
    monkeypatch.setattr("dnntune.torch.functional.kernel_for", fails, raising=False)
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    cause = r"linear: dnntune cannot run it \(the plan cache is on fire\); using PyTorch's own op"
    with pytest.warns(dtt.DnnTuneFallbackWarning, match=cause):
        y = dtt.linear(x, w)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))


def test_one_example_input_may_be_given_bare(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 8)
    report = dtt.optimize(model, x, policy="heuristic", overrides=tmp_path / "o.json")
    assert report.swapped and report.swapped[0].plans  # planned up front, as with (x,)


def test_batch_norm_statistics_of_the_wrong_size_are_named() -> None:
    x = torch.randn(2, 8, 4, 4)
    with pytest.raises(ValueError, match="running_mean should contain 8 elements not 4"):
        dtt.batch_norm(x, torch.zeros(4), torch.ones(8))
