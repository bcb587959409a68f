"""A cuDNN plan on the CPU for the bound-path tests: a fake frontend graph that resolves the
addresses it is given back to the CPU tensors living there (y = x + w), as cuDNN would read
them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch


class FakeFrontendGraph:
    """cuDNN's ``_execute_plan_at_index`` on CPU: y = x + w at the addresses it is given."""

    def __init__(self) -> None:
        self.live: dict[int, torch.Tensor] = {}
        self.packs: list[dict[int, int]] = []
        #: the workspace address of each call
        self.workspaces: list[int] = []

    def register(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self.live[t.data_ptr()] = t

    def _execute_plan_at_index(
        self, pack: dict[int, int], workspace: int, index: int, handle: int
    ) -> None:
        self.packs.append(pack)
        self.workspaces.append(workspace)
        x, w, y = (self.live[pack[u]] for u in (1, 2, 3))
        torch.add(x, w, out=y)


class FakeProblem:
    def __init__(self, graph: FakeFrontendGraph) -> None:
        self.graph = graph
        self.io_uids = (1, 2, 3)
        self.scalar_pointers = {7: 4242}
        self.device_index = 0
        #: what a plan needs to stage misaligned tensors (none here: every tensor is aligned)
        self.lowered = SimpleNamespace(spans={}, outputs=frozenset({3}))

    def runner(self, index: int) -> tuple[Any, int]:
        """As CudnnProblem.runner for a plan built in this graph (none loaded from a store)."""
        return self.graph._execute_plan_at_index, index


def make_cudnn_plan(
    monkeypatch: pytest.MonkeyPatch, workspace_size: int = 0
) -> tuple[Any, FakeFrontendGraph]:
    """A CudnnPlan whose frontend graph is ``FakeFrontendGraph`` (returned beside it), needing
    ``workspace_size`` bytes of workspace."""
    from dnntune.providers.cudnn import engine as cudnn_engine
    from dnntune.providers.cudnn import plan as cudnn_plan

    monkeypatch.setattr(cudnn_plan, "raw_stream_getter", lambda: lambda device: 0)
    monkeypatch.setattr(cudnn_plan, "current_stream_ptr", lambda device: 0)
    monkeypatch.setattr(cudnn_plan, "cudnn_handle", lambda device, stream: 99)
    frontend = FakeFrontendGraph()
    plan = cudnn_plan.CudnnPlan(
        cudnn_engine.CudnnEngine(),
        (),
        FakeProblem(frontend),  # type: ignore[arg-type]
        0,
        workspace_size,
        {},
    )
    return plan, frontend
