"""An optimized model's forwards race dnntune's route against PyTorch's own forward, per set of
input shapes (and as one while those keep changing), and run the faster
(``torch/_route_race.py``); PyTorch's route runs every module dnntune put in place as the class
it stands in for (``_support.pytorch_route``)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dnntune.torch as dtt
from dnntune.torch import _route_race, routing
from dnntune.torch import functional as dtf
from dnntune.torch._support import own_recording, pytorch_route


class _Clock:
    """A stand-in for ``time.perf_counter`` that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _race(monkeypatch: pytest.MonkeyPatch) -> tuple[_route_race.Race, _Clock]:
    clock = _Clock()
    monkeypatch.setattr(_route_race.time, "perf_counter", clock)
    return _route_race.Race(nn.Linear(2, 2), "these input shapes"), clock


def _timed_forwards(
    race: _route_race.Race, clock: _Clock, seconds: dict[bool, list[float]]
) -> list[bool]:
    """Race forwards until the choice, each taking the next of its route's ``seconds``; the
    routes taken (True: PyTorch's)."""
    routes = []
    while race.pytorch_chosen is None:
        pytorch = race.next_is_pytorch()
        routes.append(pytorch)
        took = seconds[pytorch].pop(0)
        race.run(pytorch, lambda took=took: clock.advance(took))  # type: ignore[misc]
    return routes


def test_the_routes_alternate_then_the_lower_median_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    race, clock = _race(monkeypatch)
    samples = _route_race.SAMPLES
    # PyTorch's first forward is the slowest of all (a cold start): the median does not mind
    seconds = {False: [2.0] * samples, True: [9.0] + [1.0] * (samples - 1)}
    assert _timed_forwards(race, clock, seconds) == [False, True] * samples
    assert race.pytorch_chosen is True
    # PyTorch's route from now on, untimed, until it has run RACE_AGAIN_AFTER forwards
    again = _route_race.RACE_AGAIN_AFTER
    assert all(race.next_is_pytorch() for _ in range(again - 1)) and not race.over
    race.next_is_pytorch()
    assert race.over
    before = clock.now
    race.run(True, lambda: clock.advance(5.0))
    assert race.times[1] == [9.0] + [1.0] * (samples - 1)
    assert clock.now == before + 5.0


def test_dnntune_route_stays_where_it_is_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    race, clock = _race(monkeypatch)
    samples = _route_race.SAMPLES
    seconds = {False: [1.0] * samples, True: [1.5] * samples}
    _timed_forwards(race, clock, seconds)
    assert race.pytorch_chosen is False
    assert not any(race.next_is_pytorch() for _ in range(100))


@pytest.mark.parametrize(("faster_by", "dnntune_kept"), [(0.01, False), (0.05, True)])
def test_dnntunes_route_is_kept_only_where_it_is_faster_beyond_noise(
    monkeypatch: pytest.MonkeyPatch, faster_by: float, dnntune_kept: bool
) -> None:
    """Within the speed check's noise tolerance the doubt goes to PyTorch's route, as
    ``"auto"`` keeps dnntune's forward only where it is faster beyond it."""
    from dnntune.torch.speed import TOLERANCE

    assert 0.01 < TOLERANCE < 0.05
    race, clock = _race(monkeypatch)
    samples = _route_race.SAMPLES
    seconds = {False: [1.0] * samples, True: [1.0 + faster_by] * samples}
    _timed_forwards(race, clock, seconds)
    assert race.pytorch_chosen is not dnntune_kept


def test_a_race_on_the_cpu_reads_the_host_clock_alone() -> None:
    assert _route_race.Race(nn.Linear(2, 2), "these").device is None
    assert _route_race.Race(nn.ReLU(), "these").device is None  # nothing to read a device from


@pytest.mark.gpu
def test_a_race_on_cuda_waits_for_the_device() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    race = _route_race.Race(nn.Linear(2, 2).cuda(), "these")
    assert race.device == torch.device("cuda", torch.cuda.current_device())


class _Block(nn.Module):
    """Attention over the tokens given (a new key length whenever the length changes), with a
    layer norm and a residual add dnntune fuses into the projection."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        h = self.qkv(self.norm(x)).view(b, s, 3, self.heads, c // self.heads)
        q, k, v = h.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, c)) + x


class _Convs(nn.Module):
    """Every kind of module dnntune puts in place: a conv with a batch norm and ReLU folded
    (a fused Sequential), a residual add (a rewritten traced forward), pooling (a routed
    function), a layer norm, an RMS norm and linear layers (stand-in classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.norm = nn.LayerNorm(8)
        self.rms = nn.RMSNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = F.relu(self.bn(self.conv(x)) + x)
        x = self.pool(x).mean((2, 3))
        return self.fc(self.rms(self.norm(x)))


_OPS = ("conv2d", "linear", "layer_norm", "rms_norm", "batch_norm", "max_pool2d")


@pytest.fixture
def dnntune_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The dnntune ops called (by name), as the stand-ins and routers call them."""
    calls: list[str] = []
    for name in (*_OPS, "scaled_dot_product_attention"):
        op = getattr(dtf, name)

        def spy(*args: object, _op: object = op, _name: str = name, **kwargs: object) -> object:
            calls.append(_name)
            return _op(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(dtf, name, spy)
    yield calls


def _optimized(
    tmp_path: Path, model: nn.Module, x: torch.Tensor, race: bool = True, recheck: bool = False
) -> nn.Module:
    """``model`` optimized on ``x`` (heuristic plans, no timing), its forwards raced as
    ``optimize``'s speed check would have them raced: the example left out (``decided``), as
    for a replayed example, or (``recheck``) as for an uncaptured one, raced after a while."""
    optimized = copy.deepcopy(model)
    dtt.optimize(
        optimized,
        (x,),
        policy="heuristic",
        overrides=tmp_path / "ov.json",
        cuda_graph=False,
        check_speed=False,
        revert_if_slower=False,
    )
    assert _route_race.ROUTES not in optimized.__dict__  # no speed check: no race
    if race:
        optimized.__dict__[_route_race.ROUTES] = routes = _route_race.Routes()
        routes.decided(optimized, (x,), {}, recheck=recheck)
    return optimized


def test_pytorchs_route_runs_every_module_as_its_own_class(
    tmp_path: Path, dnntune_calls: list[str]
) -> None:
    torch.manual_seed(0)
    ref = _Convs().eval()
    x = torch.randn(2, 3, 8, 8)
    model = _optimized(tmp_path, ref, x)
    with torch.no_grad():
        want = ref(x)
        dnntune_calls.clear()
        model(x)
        assert set(dnntune_calls) >= {"conv2d", "linear", "layer_norm", "rms_norm"}
        dnntune_calls.clear()
        pytorch_route.on = True
        try:
            got = model(x)
        finally:
            pytorch_route.on = False
    assert dnntune_calls == []
    assert torch.equal(got, want)  # PyTorch's code, so eager's numbers to the bit


def _router(model: nn.Module, ref: nn.Module, dnntune_calls: list[str]) -> Callable[[int], str]:
    def route(n: int) -> str:
        """The route of one forward of ``model`` on ``n`` tokens, its numbers checked."""
        x = torch.randn(1, n, 32)
        dnntune_calls.clear()
        with torch.no_grad():
            got, want = model(x), ref(x)
        if dnntune_calls:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            return "dnntune"
        assert torch.equal(got, want)  # PyTorch's code: eager's numbers to the bit
        return "pytorch"

    return route


def _block_router(tmp_path: Path, dnntune_calls: list[str]) -> Callable[[int], str]:
    """:func:`_router` of a :class:`_Block` optimized on 8 tokens."""
    torch.manual_seed(0)
    ref = _Block().eval()
    return _router(_optimized(tmp_path, ref, torch.randn(1, 8, 32)), ref, dnntune_calls)


@pytest.fixture
def pytorch_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Races of two forwards a side, which PyTorch's route wins (equal medians): the wiring
    tested with the choice fixed (the choice itself is tested above)."""
    monkeypatch.setattr(_route_race, "SAMPLES", 2)
    monkeypatch.setattr(_route_race.statistics, "median", lambda times: len(times))


@pytest.mark.usefixtures("pytorch_wins")
def test_each_set_of_input_shapes_races_once_the_example_not_at_all(
    tmp_path: Path, dnntune_calls: list[str]
) -> None:
    route = _block_router(tmp_path, dnntune_calls)
    assert [route(8) for _ in range(3)] == ["dnntune"] * 3  # optimize's example: decided
    assert [route(12) for _ in range(6)] == ["dnntune", "pytorch"] * 2 + ["pytorch"] * 2
    assert [route(8) for _ in range(2)] == ["dnntune"] * 2
    assert [route(12) for _ in range(2)] == ["pytorch"] * 2  # chosen, kept


@pytest.mark.usefixtures("pytorch_wins")
def test_an_uncaptured_example_keeps_optimizes_choice_then_races(
    tmp_path: Path, dnntune_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_route_race, "RECHECK_AFTER", 3)
    torch.manual_seed(0)
    ref = _Block().eval()
    model = _optimized(tmp_path, ref, torch.randn(1, 8, 32), recheck=True)
    route = _router(model, ref, dnntune_calls)
    assert [route(8) for _ in range(3)] == ["dnntune"] * 3  # optimize's choice
    # then the example's shapes race as any others, and PyTorch's route wins here
    assert [route(8) for _ in range(6)] == ["dnntune", "pytorch"] * 2 + ["pytorch"] * 2


@pytest.mark.usefixtures("pytorch_wins")
def test_input_shapes_that_keep_changing_race_as_one_until_they_settle(
    tmp_path: Path, dnntune_calls: list[str]
) -> None:
    route = _block_router(tmp_path, dnntune_calls)
    length = iter(range(9, 100))
    after = _route_race.CHANGING_AFTER
    # the first lengths: each a new race's first forward (dnntune's)
    assert [route(next(length)) for _ in range(after - 1)] == ["dnntune"] * (after - 1)
    # then one race for them all: two forwards a side, then PyTorch's
    routes = [route(next(length)) for _ in range(6)]
    assert routes == ["dnntune", "pytorch"] * 2 + ["pytorch"] * 2
    # one length again and again: the race goes on until three forwards in a row were alike,
    # then that length races on its own
    settled = _route_race.SETTLED_AFTER
    routes = [route(40) for _ in range(settled + 5)]
    assert routes == ["pytorch"] * settled + ["dnntune", "pytorch"] * 2 + ["pytorch"]


def test_optimize_races_other_inputs_than_its_example_where_it_timed_both(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 8, 32)
    timed = copy.deepcopy(_Block().eval())
    report = dtt.optimize(timed, (x,), overrides=tmp_path / "a.json", revert_if_slower=False)
    assert report.races and "other input shapes: their first forwards race" in str(report)
    routes = timed.__dict__[_route_race.ROUTES]
    # the example, uncaptured (no CUDA graph on the CPU): optimize's choice, rechecked later
    example = routes.race_for(timed, (x,), {})
    assert example is not None and example.pytorch_chosen is False
    assert example.since == _route_race.RACE_AGAIN_AFTER - _route_race.RECHECK_AFTER
    assert routes.race_for(timed, (torch.randn(2, 8, 32),), {}) is not None
    untimed = copy.deepcopy(_Block().eval())
    report = dtt.optimize(untimed, (x,), overrides=tmp_path / "b.json", check_speed=False)
    assert _route_race.ROUTES not in untimed.__dict__ and not report.races


def test_what_optimize_does_after_its_last_forward_never_fails_a_replays_check(
    tmp_path: Path,
) -> None:
    """A CUDA graph recorded in ``optimize``'s last forwards snapshots the modules' Python
    state; what ``optimize`` does after them (its race of routes, put back values) must leave
    that snapshot unchanged, or the user's first call records every graph again (session 52:
    the race's attribute was read as one added, found by test_cuda_graphs on an H100)."""
    from dnntune.torch._recorded import PlainState

    torch.manual_seed(0)
    x = torch.randn(1, 8, 32)
    model = copy.deepcopy(_Block().eval())
    snapshots: list[PlainState] = []
    model.register_forward_hook(lambda m, args, out: snapshots.append(PlainState(m)))
    report = dtt.optimize(model, (x,), overrides=tmp_path / "a.json", revert_if_slower=False)
    assert report.races and _route_race.ROUTES in model.__dict__  # added after the forwards
    assert snapshots and snapshots[-1].unchanged(), snapshots[-1].changed()


def test_routes_race_while_the_input_shapes_change_and_end_once_they_settle() -> None:
    routes, model = _route_race.Routes(), nn.Linear(2, 2)

    def race_for(*args: object, **kwargs: object) -> _route_race.Race | None:
        return routes.race_for(model, args, kwargs)

    first = race_for(torch.zeros(1, 1), mask=torch.ones(1, 4), cache=object())
    assert first is not None and race_for(torch.zeros(1, 1), mask=torch.ones(1, 4)) is not first
    changing = race_for(torch.zeros(1, 1), mask=torch.ones(1, 6), cache=object())
    assert changing is routes.changing is not None  # three in a row, each unlike the last
    for _ in range(_route_race.SETTLED_AFTER - 1):  # alike, but not for long enough yet
        assert race_for(torch.zeros(1, 1), mask=torch.ones(1, 6), cache=object()) is changing
    own = race_for(torch.zeros(1, 1), mask=torch.ones(1, 6), cache=object())
    assert own is not changing and routes.changing is None
    # plain values and sequences count as they are; other objects by their type
    shapes = _route_race._shapes
    assert shapes((1, None), {"flag": True}) != shapes((2, None), {"flag": True})
    assert shapes(([torch.zeros(2)],), {}) != shapes(([torch.zeros(3)],), {})
    assert shapes((object(),), {}) == shapes((object(),), {})


def test_shapes_met_before_keep_their_own_race_amid_changing_ones() -> None:
    # generate(): each call's prompt, then decode steps given a mask one token longer each
    routes, model = _route_race.Routes(), nn.Linear(2, 2)

    def race_for(length: int) -> _route_race.Race | None:
        return routes.race_for(model, (torch.zeros(1, 1),), {"mask": torch.ones(1, length)})

    prompt = race_for(128)
    assert prompt is not None
    steps = [race_for(n) for n in range(129, 140)]
    assert routes.changing is not None and steps[-1] is routes.changing
    assert race_for(128) is prompt  # the next call's prompt: its own race, not the steps'
    assert race_for(129) is steps[0] is not routes.changing  # met before, raced on its own
    assert race_for(200) is routes.changing  # a new length amid them races with the rest


def test_a_chosen_route_races_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_route_race, "RACE_AGAIN_AFTER", 5)
    routes, model = _route_race.Routes(), nn.Linear(2, 2)
    race = routes.race_for(model, (torch.zeros(3),), {})
    assert race is not None
    race.pytorch_chosen = True
    for _ in range(5):
        assert routes.race_for(model, (torch.zeros(3),), {}) is race
        race.next_is_pytorch()
    again = routes.race_for(model, (torch.zeros(3),), {})
    assert again is not None and again is not race and again.pytorch_chosen is None


def test_forgetting_old_races_keeps_optimizes_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_route_race, "KEPT", 3)
    routes, model = _route_race.Routes(), nn.Linear(2, 2)
    routes.decided(model, (torch.zeros(1),), {})
    # each set of shapes twice in a row, so none counts as shapes that keep changing
    raced = [routes.race_for(model, (torch.zeros(n),), {}) for n in (2, 2, 3, 3)]
    assert None not in raced and raced[0] is raced[1] and routes.changing is None
    for n in (4, 4, 5, 5):  # past KEPT sets of shapes: the races are forgotten
        routes.race_for(model, (torch.zeros(n),), {})
    assert routes.race_for(model, (torch.zeros(2),), {}) is not raced[0]
    assert routes.race_for(model, (torch.zeros(1),), {}) is None  # still optimize's choice


def test_training_and_recordings_run_on_dnntunes_route_unraced(tmp_path: Path) -> None:
    model = _optimized(tmp_path, _Block().eval(), torch.randn(1, 8, 32))
    assert not routing.unraced(model)
    model.train()
    assert routing.unraced(model)  # the races time inference
    model.eval()
    token = own_recording.set(True)  # dnntune records the model as a CUDA graph
    try:
        assert routing.unraced(model)
    finally:
        own_recording.reset(token)


def test_a_choice_of_dnntunes_route_is_timed_again_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A race that chose dnntune's route on its first forwards races again after
    RECHECK_AFTER forwards; that second race's choice holds RACE_AGAIN_AFTER forwards (session
    53, H100: the race of generate()'s decode steps read dnntune's route 10 % faster on its
    first forwards, and the optimized model then ran 0.86x eager per token)."""
    monkeypatch.setattr(_route_race, "RECHECK_AFTER", 3)
    routes, model = _route_race.Routes(), nn.Linear(2, 2)
    clock = _Clock()
    monkeypatch.setattr(_route_race.time, "perf_counter", clock)
    x = (torch.zeros(3),)

    def race_until_chosen(dnntune_s: float, pytorch_s: float) -> _route_race.Race:
        race = routes.race_for(model, x, {})
        assert race is not None and race.pytorch_chosen is None
        seconds = {
            False: [dnntune_s] * _route_race.SAMPLES,
            True: [pytorch_s] * _route_race.SAMPLES,
        }
        _timed_forwards(race, clock, seconds)
        return race

    first = race_until_chosen(1.0, 1.5)
    assert first.pytorch_chosen is False and first.provisional
    for _ in range(3):  # dnntune's route, RECHECK_AFTER forwards
        assert routes.race_for(model, x, {}) is first and not first.next_is_pytorch()
    # then they race again: this time PyTorch's route is faster, and it stays
    second = race_until_chosen(2.0, 1.5)
    assert second is not first and second.confirms and second.pytorch_chosen is True
    assert not second.provisional and not second.over
    # once PyTorch's choice has run RACE_AGAIN_AFTER forwards they race again; a choice of
    # dnntune's route is then provisional again, and a confirmation of it holds as long
    monkeypatch.setattr(_route_race, "RACE_AGAIN_AFTER", 8)
    second.since = 8
    third = race_until_chosen(1.0, 1.5)
    assert third.provisional
    for _ in range(3):
        third.next_is_pytorch()
    fourth = race_until_chosen(1.0, 1.5)
    assert fourth.confirms and fourth.pytorch_chosen is False and not fourth.provisional
    assert fourth.since == 0


def test_the_changing_shapes_race_confirms_a_choice_of_dnntunes_route_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_route_race, "RECHECK_AFTER", 2)
    routes, model = _route_race.Routes(), nn.Linear(2, 2)
    clock = _Clock()
    monkeypatch.setattr(_route_race.time, "perf_counter", clock)
    length = iter(range(1, 1000))

    def race_for() -> _route_race.Race | None:
        return routes.race_for(model, (torch.zeros(1, next(length)),), {})

    for _ in range(_route_race.CHANGING_AFTER):
        race_for()
    changing = routes.changing
    assert changing is not None
    samples = _route_race.SAMPLES
    _timed_forwards(changing, clock, {False: [1.0] * samples, True: [1.5] * samples})
    assert changing.provisional
    for _ in range(2):
        assert race_for() is changing
        changing.next_is_pytorch()
    again = race_for()
    assert again is routes.changing and again is not changing and again.confirms
