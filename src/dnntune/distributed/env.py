"""Who am I in a torchrun job: rank, world size, local rank, device, and the process group.

The default group uses NCCL when every rank has its own GPU and gloo otherwise. Python objects
(reports, results) travel over a separate gloo group so that their collectives honour the
timeout on every backend: a rank that dies makes the others fail with a clear message instead
of hanging.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from dnntune.errors import InvalidValueError

__all__ = ["DistContext", "exit_rank", "init_distributed", "launched_by_torchrun", "used_a_group"]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0


def launched_by_torchrun() -> bool:
    """True when RANK and WORLD_SIZE are set (torchrun, or any launcher that sets them)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


_used_a_group = False


def used_a_group() -> bool:
    """True once this process joined a job of more than one rank (see :func:`exit_rank`)."""
    return _used_a_group


def exit_rank(code: int) -> None:
    """Leave a rank of a torchrun job: flush, run the exit handlers, then end the process.

    A process that joined a gloo group can abort while the interpreter shuts down ("terminate
    called without an active exception", SIGABRT, seen on a 2-core CI machine): gloo's C++
    worker threads still hold objects whose release needs the GIL, which the finalizing
    interpreter no longer hands out. Everything a rank must do before it ends is done by then
    (the output is written, the peers passed the closing barrier), so this skips only the
    interpreter's teardown: the exit handlers (compile pools, temporary folders) still run.
    """
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - the handlers a normal exit runs first
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to lose
                stream.flush()
        logging.shutdown()
        os._exit(code)


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: str
    backend: str
    timeout_s: float
    object_group: Any = None
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, payload: Any) -> list[Any]:
        """Every rank's payload, in rank order (pickled by torch.distributed over gloo)."""
        import torch.distributed as dist

        if self.world_size == 1:
            return [payload]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, payload, group=self.object_group)
        return out

    def broadcast(self, payload: Any, src: int = 0) -> Any:
        import torch.distributed as dist

        if self.world_size == 1:
            return payload
        box = [payload]
        dist.broadcast_object_list(box, src=src, group=self.object_group)
        return box[0]

    def close(self, *, wait_for_peers: bool = True) -> None:
        """Leave the job. With ``wait_for_peers`` every rank first waits for the others (a rank
        that tears its group down while a peer still talks to it can abort the peer at exit:
        "terminate called without an active exception"); leave it off after a failed
        collective, when a peer may be dead."""
        import torch.distributed as dist

        if not (self.owns_group and dist.is_initialized()):
            return
        if wait_for_peers and self.world_size > 1:
            try:
                dist.barrier(group=self.object_group)
            except Exception as exc:  # a peer died at the very end: still tear down our side
                _log.debug("distributed: closing barrier failed: %s", exc)
        dist.destroy_process_group()


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise InvalidValueError(f"--distributed: {name} is not set; launch with torchrun")
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidValueError(f"--distributed: {name}={value!r} is not an integer") from None


def init_distributed(
    device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DistContext:
    """Join the torchrun job (or a one-process world when not launched by torchrun).

    Args:
        device: "cpu", "cuda" or None (cuda when available). With cuda each rank uses GPU
            ``LOCAL_RANK``.
        timeout_s: limit for every collective; a rank that never answers fails the others.
    """
    import torch
    import torch.distributed as dist

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    joined = dist.is_available() and dist.is_initialized()
    if not joined and not launched_by_torchrun():
        return DistContext(0, 1, 0, device if device != "cuda" else "cuda:0", "none", timeout_s)
    if joined:  # the caller's own process group (init_process_group with explicit ranks)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if not 0 <= rank < world:
            raise InvalidValueError(
                f"--distributed: RANK {rank} is not below WORLD_SIZE {world}; launch with "
                "torchrun, which sets them"
            )
    local_rank = _env_int("LOCAL_RANK", 0)
    dev = device
    backend = "gloo"
    if device.startswith("cuda"):
        if torch.cuda.device_count() <= local_rank:
            raise InvalidValueError(
                f"--distributed: LOCAL_RANK {local_rank} has no GPU ({torch.cuda.device_count()} "
                "visible); use --nproc-per-node <= the GPU count or --device cpu"
            )
        torch.cuda.set_device(local_rank)
        dev = f"cuda:{local_rank}"
        backend = "nccl"
    timeout = _dt.timedelta(seconds=timeout_s)
    owns = False
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend=backend, timeout=timeout)
        except Exception as exc:  # no rendezvous: a usage error, not an internal one
            raise InvalidValueError(
                f"--distributed: rank {rank} of {world} could not join the other ranks "
                f"({type(exc).__name__}: {exc}); launch with torchrun (it sets MASTER_ADDR, "
                "MASTER_PORT, RANK and WORLD_SIZE for every rank), or unset RANK and "
                "WORLD_SIZE to tune in one process"
            ) from None
        owns = True
    global _used_a_group
    _used_a_group = _used_a_group or world > 1
    group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    _log.info("distributed: rank %d/%d on %s (%s)", rank, world, dev, backend)
    return DistContext(rank, world, local_rank, dev, backend, timeout_s, group, owns)
