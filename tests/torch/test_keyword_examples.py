"""optimize(..., example_kwargs=...): the example forward's keyword arguments reach every forward
optimize runs (planning and tuning, the speed check, refine, the side-by-side re-time, the
CUDA-graph path), a keyword-only forward works, and a bad example_kwargs is named."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import dnntune.torch as dtt
from dnntune.errors import InvalidValueError
from dnntune.torch import runtime


class Masked(nn.Module):
    """A forward with a required keyword-only argument: a call without it raises TypeError.
    ``seen`` (a list: optimize does not put lists back) records each call's mask shape."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 8)
        self.seen: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        self.seen.append(tuple(mask.shape))
        return self.head(self.norm(self.proj(x)) * mask)


class KeywordsOnly(nn.Module):
    """A forward that takes keyword arguments only, as a Hugging Face model is called."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, *, pixels: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv(pixels).mean(dim=(2, 3))
        if bias is not None:
            h = h + bias
        return self.fc(h)


def _planned(report: dtt.OptimizeReport) -> dict[str, list[str]]:
    return {r.name: list(r.plans) for r in report.swapped}


@pytest.mark.parametrize("policy", ["heuristic", "tune"])
@pytest.mark.parametrize("cuda_graph", [False, True, "auto"])
def test_keyword_only_argument_reaches_every_example_forward(
    tmp_path: Path, policy: str, cuda_graph: bool | str
) -> None:
    torch.manual_seed(0)
    model = Masked().eval()
    x, mask = torch.randn(4, 16), (torch.rand(4, 32) > 0.5).float()
    with torch.no_grad():
        want = model(x, mask=mask)
    model.seen.clear()
    before = runtime.runtime_stats.autotune_calls
    report = dtt.optimize(
        model,
        (x,),
        example_kwargs={"mask": mask},
        policy=policy,  # type: ignore[arg-type]
        overrides=tmp_path / "o.json",
        cuda_graph=cuda_graph,  # type: ignore[arg-type]
    )
    # optimize ran the forward (a call without the mask would have raised TypeError)
    assert model.seen and set(model.seen) == {(4, 32)}
    assert report.example_ran and not report.reverted
    plans = _planned(report)
    assert set(plans) == {"proj", "norm", "head"}
    assert all(plans.values()), plans  # every layer planned in the example forward
    if policy == "tune":
        assert report.autotune_calls > 0 and runtime.runtime_stats.autotune_calls > before
        assert (tmp_path / "o.json").exists()
    with torch.no_grad():
        torch.testing.assert_close(model(x, mask=mask), want, rtol=1e-4, atol=1e-4)
    assert type(model.proj) is not nn.Linear  # swapped for dnntune's


def test_real_clocks_refine_and_side_by_side_pass_the_keywords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the real clocks (conftest pins them to fixed figures), the speed check, refine and
    the side-by-side re-time each run the forward with the keyword argument."""
    from dnntune.torch import speed

    optimize_module = sys.modules["dnntune.torch.optimize"]
    monkeypatch.setattr(optimize_module, "forward_ms", speed.forward_ms)
    monkeypatch.setattr(optimize_module, "paired_forward_ms", optimize_module.__dict__["_paired"])
    model = Masked().eval()
    x, mask = torch.randn(2, 16), torch.ones(2, 32)
    with torch.no_grad():
        want = model(x, mask=mask)
    report = dtt.optimize(
        model, (x,), example_kwargs={"mask": mask}, policy="heuristic", overrides=None
    )
    assert report.eager_forward_ms is not None and report.eager_forward_ms > 0
    assert report.forward_ms is not None and report.forward_ms > 0
    assert report.side_by_side and report.refined  # refine timed its groups
    assert len(model.seen) > 10 and set(model.seen) == {(2, 32)}
    with torch.no_grad():
        torch.testing.assert_close(model(x, mask=mask), want, rtol=1e-4, atol=1e-4)


def test_example_kwargs_is_keyword_only_and_the_positions_stay(tmp_path: Path) -> None:
    """optimize(model, inputs, policy, overrides, ...) still means what it meant: the new
    parameter takes no position, and cannot be given one."""
    model = Masked().eval()
    x, mask = torch.randn(2, 16), torch.ones(2, 32)
    report = dtt.optimize(
        model, (x,), "heuristic", tmp_path / "o.json", False, example_kwargs={"mask": mask}
    )
    assert report.policy == "heuristic" and report.overrides == str(tmp_path / "o.json")
    assert all(r.plans for r in report.swapped)
    params = inspect.signature(dtt.optimize).parameters
    assert list(params)[:3] == ["module", "example_inputs", "policy"]
    assert params["example_kwargs"].kind is inspect.Parameter.KEYWORD_ONLY


def test_a_forward_of_keyword_arguments_only(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = KeywordsOnly().eval()
    pixels, bias = torch.randn(2, 3, 8, 8), torch.randn(2, 8)
    with torch.no_grad():
        want = model(pixels=pixels, bias=bias)
    report = dtt.optimize(
        model,
        example_kwargs={"pixels": pixels, "bias": bias},
        policy="heuristic",
        overrides=tmp_path / "o.json",
    )
    plans = _planned(report)
    assert set(plans) == {"conv", "fc"} and all(plans.values()), plans
    assert report.example_ran
    with torch.no_grad():
        torch.testing.assert_close(model(pixels=pixels, bias=bias), want, rtol=1e-4, atol=1e-4)


def test_without_any_example_nothing_is_planned_up_front(tmp_path: Path) -> None:
    """The contrast of the test above: no example, no example forward (the layers are
    swapped, and planned at their first call)."""
    report = dtt.optimize(KeywordsOnly().eval(), policy="heuristic", overrides=None)
    assert not report.example_ran
    assert {r.name for r in report.swapped} == {"conv", "fc"}
    assert not any(r.plans for r in report.swapped)


def test_a_keyword_tensor_the_forward_writes_is_put_back() -> None:
    """Keyword tensors are example inputs like the positional ones: written in place by
    optimize's own forwards, they are put back by value."""

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, *, steps: torch.Tensor) -> torch.Tensor:
            steps.add_(1)
            return self.fc(x)

    steps = torch.zeros(1)
    dtt.optimize(
        Counting().eval(),
        (torch.randn(2, 4),),
        example_kwargs={"steps": steps},
        policy="heuristic",
        overrides=None,
    )
    assert steps.item() == 0.0


def test_an_error_of_the_example_forward_names_the_keyword_inputs() -> None:
    model = Masked().eval()
    with pytest.raises(RuntimeError) as info:
        dtt.optimize(
            model,
            (torch.randn(2, 16),),
            example_kwargs={"mask": torch.ones(2, 5)},  # the wrong width
            policy="heuristic",
            overrides=None,
        )
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "example_inputs (Tensor[2, 16] float32 cpu)" in notes
    assert "example_kwargs (mask=Tensor[2, 5] float32 cpu)" in notes
    assert "**example_kwargs" in notes and "left as it was" in notes
    assert type(model.proj) is nn.Linear  # left as it was


@pytest.mark.parametrize(
    ("example_kwargs", "match"),
    [
        ([("mask", 1)], r"example_kwargs=\.\.\.\) must be a mapping .* got list"),
        (torch.ones(2), r"example_kwargs=\.\.\.\) must be a mapping .* got Tensor"),
        ({0: torch.ones(2)}, r"every key must be the name \(a str\) .* got 0 \(int\)"),
    ],
)
def test_bad_example_kwargs_are_named(example_kwargs: object, match: str) -> None:
    model = Masked().eval()
    with pytest.raises(InvalidValueError, match=match) as info:
        dtt.optimize(
            model,
            (torch.randn(2, 16),),
            example_kwargs=example_kwargs,  # type: ignore[arg-type]
            policy="heuristic",
            overrides=None,
        )
    assert "example_inputs" in str(info.value)  # what to do instead
    assert type(model.proj) is nn.Linear and not model.seen  # nothing ran, nothing changed


def test_the_example_helpers_see_keyword_tensors() -> None:
    from dnntune.torch._example import Example, as_example
    from dnntune.torch.graph_choice import can_choose

    a, b, c = torch.zeros(1), torch.ones(2), torch.ones(3)
    example = Example((a,), {"mask": b, "extra": {"nested": [c]}, "flag": True})
    assert [t.shape for t in example.tensors()] == [a.shape, b.shape, c.shape]
    assert not example.is_cuda and not can_choose(nn.Linear(1, 1).eval(), example, True)
    assert as_example((a,)) == Example((a,), {})
    assert as_example(example) is example
    line = example.describe()
    assert "example_inputs (Tensor[1] float32 cpu)" in line
    assert "mask=Tensor[2] float32 cpu" in line and "flag=bool" in line


class PureMasked(nn.Module):
    """:class:`Masked` without the record of calls: a forward a CUDA graph can replay (Masked's
    list grows on every call, so a recording of it is refused, as it must be)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.proj(x)) * mask)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [True, "auto"])
def test_keyword_tensors_on_cuda_are_recorded_and_follow_new_values(
    tmp_path: Path, cuda_graph: bool | str
) -> None:
    """On CUDA, a forward recorded with a keyword tensor replays with each call's keyword
    values (copied into the recording's buffers, not the example's baked in), and a new
    keyword shape records again rather than replaying the old one. (``auto`` may keep
    PyTorch's forward for so small a model: its outputs are checked all the same.)"""
    from dnntune.torch.cuda_graphs import graphs_of

    torch.manual_seed(0)
    model = PureMasked().cuda().eval()
    plain = PureMasked().cuda().eval()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(4, 16, device="cuda")
    mask = (torch.rand(4, 32, device="cuda") > 0.5).float()
    report = dtt.optimize(
        model,
        (x,),
        example_kwargs={"mask": mask},
        policy="heuristic",
        overrides=tmp_path / "o.json",
        cuda_graph=cuda_graph,  # type: ignore[arg-type]
    )
    assert report.example_ran
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16, device="cuda")
            mask = (torch.rand(4, 32, device="cuda") > 0.5).float()
            got = model(x, mask=mask)
            torch.testing.assert_close(got, plain(x, mask=mask), rtol=1e-3, atol=1e-3)
        if cuda_graph is True:
            state = graphs_of(model)
            assert state.records >= 1 and state.replays >= 3
            records = state.records
            wide = torch.randn(6, 16, device="cuda")
            wide_mask = torch.ones(6, 32, device="cuda")
            got = model(wide, mask=wide_mask)
            torch.testing.assert_close(got, plain(wide, mask=wide_mask), rtol=1e-3, atol=1e-3)
            assert state.records == records + 1
