"""What autotune() checks before it spends any time: config, workspace, path, writer.

Each check raises the RFC's error (InvalidValueError, BadStateError, ConfigFileError) with what
was wrong and what to do, before a single candidate is compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dnntune.autotune.plan_set import PlanSet
from dnntune.errors import BadStateError, InvalidValueError
from dnntune.overrides import writer
from dnntune.overrides.store import check_writable
from dnntune.rfc import AutotuneConfig, AutotuneStorageConfig

if TYPE_CHECKING:
    pass

__all__ = ["check_config", "check_workspace", "detect_path", "writer_available"]


def check_config(config: AutotuneConfig | None) -> AutotuneConfig:
    if config is None:
        return AutotuneConfig()
    if not isinstance(config, AutotuneConfig):
        raise InvalidValueError(f"config must be an AutotuneConfig, got {type(config).__name__}")
    config.validate()
    return config


def check_workspace(workspace: Any, workspace_size: int | None) -> int:
    """Validate the workspace arguments; returns the workspace's size in bytes (0 if None)."""
    if workspace_size is not None and (
        isinstance(workspace_size, bool) or not isinstance(workspace_size, int)
    ):
        raise InvalidValueError(f"workspace_size must be an int (bytes), got {workspace_size!r}")
    if workspace_size is not None and workspace_size < 0:
        raise InvalidValueError(f"workspace_size must be >= 0, got {workspace_size}")
    if workspace is None:
        if workspace_size:
            raise InvalidValueError(
                f"workspace is None but workspace_size is {workspace_size} bytes; allocate "
                f"torch.empty({workspace_size}, dtype=torch.uint8, device=...) or pass 0"
            )
        return 0
    try:
        have = int(workspace.numel()) * int(workspace.element_size())
    except AttributeError:
        raise InvalidValueError(
            "workspace must be a torch tensor (torch.uint8) or None, got "
            f"{type(workspace).__name__}"
        ) from None
    if workspace_size is not None and have < workspace_size:
        raise InvalidValueError(
            f"workspace holds {have} bytes, less than workspace_size {workspace_size}"
        )
    return have


def detect_path(plan_set: PlanSet, workspace_size: int | None) -> tuple[Any, Any]:
    specs, plans = plan_set.specs, plan_set.plans
    has_specs = specs is not None and len(specs) > 0
    has_plans = plans is not None and plans.count > 0
    if has_specs and has_plans:
        raise BadStateError(
            "autotune: the graph has both plan specs and execution plans; the plan-spec and "
            "compiled-plan paths are mutually exclusive on one Graph"
        )
    if not has_specs and not has_plans:
        raise BadStateError(
            "autotune: no autotuning candidates: add plan specs (add_all_engines(), "
            "add_engine_*()) or build plans (create_execution_plans() + build_plans(ALL)) first"
        )
    if has_specs and workspace_size is None:
        raise BadStateError(
            "autotune: the compiled-plan form (workspace_size=None) needs compiled plans, but "
            "the graph has plan specs; pass workspace_size=get_estimated_max_workspace_size()"
        )
    if has_plans:
        assert plans is not None
        plans.check_current()
        if not any(e.plan is not None for e in plans.entries):
            raise BadStateError(
                "autotune: no compiled plans: call build_plans(BuildPlanPolicy.ALL) after "
                "create_execution_plans()"
            )
        return None, plans
    return specs, None


def writer_available(storage: AutotuneStorageConfig) -> None:
    """Refuse now, before any tuning, a config file the writer would refuse at the end: an
    unwritable path, or (when appending) a file the reader rejects (issue 26: the CLI checked
    this up front, the library only after tuning)."""
    if not isinstance(storage, AutotuneStorageConfig):
        raise InvalidValueError(
            "autotune: storage_config must be an AutotuneStorageConfig (e.g. "
            f"AutotuneStorageConfig(file_path='overrides.json')), got {type(storage).__name__} "
            f"{storage!r}"
        )
    storage.validate()
    if not storage.file_path:
        return
    check_writable(storage.file_path)
    if not storage.delete_all_existing_file_content:
        writer.check_appendable(storage.file_path)
