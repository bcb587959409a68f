"""The checks around every CUDA-graph recording (``dnntune.torch._capture``), on the CPU: the
sync-debug warm-up refuses a forward that waits for the device, or reports it to a recording
that goes ahead anyway; the debug mode is restored."""

from __future__ import annotations

import warnings

import pytest
import torch

from dnntune.torch._capture import NotCapturable, warm_up


@pytest.fixture
def debug_modes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    modes: list[object] = [0]
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: modes[-1])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    return modes


def test_warm_up_runs_every_call_and_only_the_last_under_the_debug_mode(
    debug_modes: list[object],
) -> None:
    seen: list[object] = []
    warm_up(3, lambda: seen.append(debug_modes[-1]))
    assert seen == [0, 0, "warn"]
    assert debug_modes[-1] == 0  # put back


def test_warm_up_refuses_a_forward_that_waits_for_the_device(debug_modes: list[object]) -> None:
    def forward() -> None:
        if debug_modes[-1] == "warn":  # what PyTorch's sync debug mode does on .item()
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    with pytest.raises(NotCapturable, match="waits for the device"):
        warm_up(2, forward)
    assert debug_modes[-1] == 0


def test_warm_up_can_report_a_sync_instead_of_refusing(debug_modes: list[object]) -> None:
    """For a recording that goes ahead anyway (the forward may wait only when not recorded):
    what the debug mode said comes back, and its warning is not passed on."""

    def forward() -> None:
        if debug_modes[-1] == "warn":
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sync = warm_up(2, forward, refuse_syncs=False)
    assert sync is not None and "synchronizing" in sync
    assert warm_up(2, lambda: None, refuse_syncs=False) is None
    assert debug_modes[-1] == 0


def test_warm_up_passes_the_forwards_own_warnings_on(debug_modes: list[object]) -> None:
    def forward() -> None:
        warnings.warn("the model's own warning", UserWarning, stacklevel=1)

    with pytest.warns(UserWarning, match="the model's own warning"):
        warm_up(1, forward)  # not a refusal, and not swallowed
    assert debug_modes[-1] == 0


def test_warm_up_restores_the_debug_mode_when_the_forward_raises(
    debug_modes: list[object],
) -> None:
    def forward() -> None:
        if debug_modes[-1] == "warn":
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        warm_up(2, forward)
    assert debug_modes[-1] == 0


def test_aliased_parameters_share_storage_take_the_gradients_and_are_put_back() -> None:
    from torch import nn

    from dnntune.torch._train_graphs import aliased_parameters

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    net[2].weight = net[0].weight  # tied: one alias for both places
    params = [p for p in net.parameters() if p.requires_grad]
    originals = {name: p for name, p in net.named_parameters()}
    x = torch.randn(3, 4)
    want = torch.autograd.grad(net(x).square().sum(), params)
    with aliased_parameters(net, params) as aliases:
        pairs = zip(aliases, params, strict=True)
        assert all(a is not p and a.data_ptr() == p.data_ptr() for a, p in pairs)
        assert net[2].weight is net[0].weight is aliases[0]
        got = torch.autograd.grad(net(x).square().sum(), aliases)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert dict(net.named_parameters()) == originals  # every slot holds its parameter again
    assert all(p.grad is None for p in params)  # the real parameters were never differentiated
