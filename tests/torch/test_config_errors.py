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
        ({"timed_iterations": "10"}, r"timed_iterations must be an integer, got '10'"),
        ({"warmup_iterations": 1.5}, r"warmup_iterations must be an integer, got 1.5"),
        ({"verify": "no"}, r"verify must be True or False, got 'no'"),
        ({"sweep": 1}, r"sweep must be True or False, got 1"),
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


def test_optimize_and_the_ops_name_arguments_of_the_wrong_kind() -> None:
    """A function instead of a module, example inputs that are no sequence, a float stride:
    what is wrong, not an internal AttributeError or "'float' object is not iterable"
    (new-user audit, session 18)."""
    x = torch.randn(2, 4)
    with pytest.raises(InvalidValueError, match=r"takes a torch.nn.Module, got function"):
        dtt.optimize(lambda t: t, (x,))  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"example_inputs must be a tuple .* got int"):
        dtt.optimize(torch.nn.Linear(4, 4), 5)  # type: ignore[arg-type]
    img, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with pytest.raises(TypeError, match=r"padding must be an int or a pair of ints, got 1.0"):
        dtt.conv2d(img, w, padding=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"kernel_size must be an int or a pair of ints"):
        dtt.max_pool2d(img, 1.5)  # type: ignore[arg-type]
    assert dtt.max_pool2d(img, torch.tensor(2)).shape == (1, 2, 2, 2)  # type: ignore[arg-type]
