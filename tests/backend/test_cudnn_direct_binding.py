"""Which call a bound cuDNN plan runs (providers/cudnn/plan.py), on the CPU with a fake frontend:
the direct call where one can be made, made once per order of the items and shared by ``bind``
and ``bind_pointers``, and the frontend's execute where none can."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fake_cudnn import make_cudnn_plan


class FakeDirect:
    """``direct_call``'s stand-in: records the layouts it is asked for and every call."""

    def __init__(self) -> None:
        self.made: list[tuple[Any, ...]] = []
        self.calls: list[tuple[Any, int, int]] = []

    def __call__(
        self, blob: bytes | None, handle: int, keys: Any, constants: Any, workspace: int
    ) -> Any:
        self.made.append((blob, handle, tuple(keys), dict(constants), workspace))
        return lambda items, ws, h: self.calls.append((items, ws, h))


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> FakeDirect:
    from dnntune.providers.cudnn import plan as cudnn_plan

    fake = FakeDirect()
    monkeypatch.setattr(cudnn_plan, "direct_call", fake)
    monkeypatch.setattr(torch.cuda, "device", lambda index: _Null())
    return fake


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_bind_and_bind_pointers_share_one_direct_call_per_order(
    direct: FakeDirect, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, frontend = make_cudnn_plan(monkeypatch, workspace_size=0)
    plan._problem.serialized = lambda index: b"blob"
    x, w, y = torch.ones(4), torch.ones(4), torch.zeros(4)
    bound = plan.bind([1, 2, 3])
    pointers = plan.bind_pointers([1, 2, 3])
    assert len(direct.made) == 1  # one plan made from JSON for both
    blob, handle, keys, constants, _ = direct.made[0]
    assert (blob, handle, keys, constants) == (b"blob", 99, (1, 2, 3), {7: 4242})
    bound([x, w, y], None)
    pointers((x.data_ptr(), w.data_ptr(), y.data_ptr()), None)
    assert [c[1:] for c in direct.calls] == [(0, 99), (0, 99)]
    assert not frontend.packs  # the frontend's execute never ran
    plan.bind([3, 2, 1, 8])  # another order (and a uid the plan does not take): another call
    assert direct.made[-1][2] == (3, 2, 1, None) and len(direct.made) == 2


def test_without_a_direct_call_the_frontend_executes(
    direct: FakeDirect, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, frontend = make_cudnn_plan(monkeypatch, workspace_size=0)
    # the fake problem has no serialization: no direct call is made, the frontend runs
    x, w, y = torch.ones(4), torch.full((4,), 2.0), torch.zeros(4)
    frontend.register(x, w, y)
    plan.bind([1, 2, 3])([x, w, y], None)
    assert not direct.made and len(frontend.packs) == 1
    assert torch.equal(y, torch.full((4,), 3.0))
