"""cuDNN plan builds in worker processes, for the many-plan builds of a tune.

cuDNN compiles the kernel of a runtime-fused plan (a norm's, a pointwise chain's) while its
frontend holds the GIL (nvidia-cudnn-frontend 1.16 releases it in no build method: session 25's
reading of its binary), so Python threads cannot build plans side by side; a tune of the example
rmsnorm built its 23 plans one after another for 7-18 s on the H200. Processes can: each builds
some of the plans, the plan store (:mod:`~dnntune.providers.cudnn.plan_store`) keeps them, and
this process then loads each in about 16 ms instead of building it.

:func:`build_ahead` is what ``CudnnEngine.precompile`` calls with the plan indices a tune will
build, and what cuDNN's own search (``global.benchmarking=1``, EXHAUSTIVE's priming) calls with
every candidate before it builds them all. It builds the first index here and times it; only
when the rest would take longer than :data:`MIN_SERIAL_S` at that pace does it hand them to
worker processes. A worker is a
``python -c`` process of its own (one JSON task per line on its stdin, one reply per line: not
``multiprocessing``, whose spawned children import the caller's main script again), kept until
it has been idle for :data:`IDLE_S`, so a run over many graphs starts it once (a worker's start,
importing PyTorch and making a CUDA context, costs seconds). Each worker rebuilds the graph from
its JSON, lowers
it as this process does (same graph key and uids, so the same store keys), and builds its
indices. Nothing here is needed for a correct result: a plan a worker did not store (a failed
build, a name that differs, a crashed or hung worker) is built here as before, and a plan that
fails in a worker fails again, and is reported, in its own build.

Off where the plan store is off (``DNNTUNE_DISABLE_CACHE``, a shared cache folder: there is no
way back for a worker's plan), and with ``DNNTUNE_CUDNN_BUILD_PROCESSES=0``; that variable also
sets the number of workers (default: half the CPU cores, at most 8).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dnntune import settings

if TYPE_CHECKING:
    from dnntune.graph.ir import OpGraph
    from dnntune.providers.cudnn.problem import CudnnProblem

__all__ = ["MIN_SERIAL_S", "build_ahead", "build_in_worker", "serve", "worker_count"]

_log = logging.getLogger(__name__)

#: hand plans to workers only when building them here would take longer than this
MIN_SERIAL_S = 4.0
#: the longest a tune waits for its workers before it builds what is left itself
WAIT_S = 300.0
#: workers idle this long are ended (each holds a CUDA context: a few hundred MB of GPU memory)
IDLE_S = 60.0

_lock = threading.Lock()
_last_use = 0.0


def worker_count() -> int:
    """``DNNTUNE_CUDNN_BUILD_PROCESSES``, else half the CPU cores, at most 8, shared among the
    processes torchrun started on this host (``LOCAL_WORLD_SIZE``: each rank of a distributed
    tune gets its share); 0: off."""
    count = settings.cudnn_build_processes()
    if count is not None:
        return count
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, min(8, (os.cpu_count() or 2) // 2 // ranks))


def build_ahead(problem: CudnnProblem, graph: OpGraph, indices: Sequence[int]) -> int:
    """Build ``problem``'s plans ``indices`` ahead, in worker processes where that pays; the
    number of plans the workers stored. Never raises."""
    try:
        return _build_ahead(problem, graph, indices)
    except Exception as exc:  # best effort: every plan is built in its own compile anyway
        _log.info("cuDNN: no parallel build (%s: %s)", type(exc).__name__, exc)
        return 0


def _build_ahead(problem: CudnnProblem, graph: OpGraph, indices: Sequence[int]) -> int:
    todo = [i for i in dict.fromkeys(indices) if problem.needs_build(i)]
    workers = worker_count()
    if len(todo) < 3 or workers < 2 or not problem.stores_plans:
        return 0
    start = time.perf_counter()
    try:
        problem.build(todo[0])
    except Exception:  # not buildable: no pace to go by
        return 0
    pace = time.perf_counter() - start
    rest = [i for i in todo[1:] if problem.needs_build(i)]
    if problem.loaded(todo[0]) or pace * len(rest) < MIN_SERIAL_S:
        return 0  # loaded from the store, or fast enough here
    workers = min(workers, len(rest))
    names = {i: problem.name_at(i) for i in rest}
    _log.info(
        "cuDNN: building %d plans of graph %s in %d processes (about %.1f s each here)",
        len(rest),
        getattr(graph, "name", ""),
        workers,
        pace,
    )
    base = {
        "graph": _graph_json(graph),
        "device": problem.device_index,
        "heur_mode": problem.heur_mode,
        "notes": list(problem.excluded_notes),
    }
    replies = _run_tasks(workers, [dict(base, index=i) for i in rest])
    stored = 0
    for index in rest:
        reply = replies.get(index)
        if reply is not None and reply.get("error") is None and reply.get("name") == names[index]:
            stored += 1
        else:
            _log.debug("cuDNN: plan %d not built in a worker: %s", index, reply)
    _log.info("cuDNN: %d of %d plans built in worker processes", stored, len(rest))
    return stored


def build_in_worker(
    text: str, device_index: int, heur_mode: str, notes: tuple[str, ...], index: int
) -> tuple[int, str, str | None]:
    """In a worker: lower the graph of JSON ``text`` and build (and so store) plan ``index``;
    the index, the plan's name here, and an error (None: built or already stored)."""
    import torch

    from dnntune.graph.ir import OpGraph
    from dnntune.graph.json_format import graph_from_json_text
    from dnntune.providers.cudnn.problem import get_problem

    graph = graph_from_json_text(text, OpGraph)  # validated
    with torch.cuda.device(device_index):
        problem = get_problem(graph, device_index, heur_mode, tuple(notes))
        name = problem.name_at(index)
        try:
            problem.build(index)
        except Exception as exc:
            return index, name, f"{type(exc).__name__}: {exc}"
    return index, name, None


def _graph_json(graph: OpGraph) -> str:
    import json

    from dnntune.graph.json_writer import graph_to_dict

    return json.dumps(graph_to_dict(graph), allow_nan=False)


class _Worker:
    """One build process: a task per line on its stdin, a reply per line on its stdout."""

    def __init__(self) -> None:
        env = dict(os.environ)
        paths = [p for p in sys.path if p]  # where this process found dnntune and torch
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        quiet = not _log.isEnabledFor(logging.DEBUG)  # the engines' output shows with -vv
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_MAIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            env=env,
            text=True,
        )

    def ask(self, task: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the build process ended (exit code {self.proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdout is not None:
                self.proc.stdout.close()


#: a worker's program: its replies go to a copy of stdout; anything else it prints, to stderr
_WORKER_MAIN = (
    "import os, sys\n"
    "reply = os.fdopen(os.dup(1), 'w')\n"
    "os.dup2(2, 1)\n"
    "from dnntune.providers.cudnn.parallel_build import serve\n"
    "serve(sys.stdin, reply)\n"
)


def serve(tasks: Any, replies: Any) -> None:
    """A worker's loop: one JSON task per line in, one JSON reply per line out, until EOF."""
    for line in tasks:
        task = json.loads(line)
        try:
            index, name, error = build_in_worker(
                task["graph"],
                task["device"],
                task["heur_mode"],
                tuple(task["notes"]),
                task["index"],
            )
        except Exception as exc:
            index, name, error = task.get("index"), None, f"{type(exc).__name__}: {exc}"
        replies.write(json.dumps({"index": index, "name": name, "error": error}) + "\n")
        replies.flush()


_workers: list[_Worker] = []


def _run_tasks(count: int, tasks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each task on one of ``count`` workers (started as needed, kept for later graphs), each
    worker taking the next task when it is done; the replies by plan index. A worker that fails
    is ended (its task gets no reply) and the others go on."""
    global _last_use
    with _lock:
        while len(_workers) < count:
            _workers.append(_Worker())
        crew = list(_workers[:count])
        _last_use = time.monotonic()
    queue = list(reversed(tasks))
    replies: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + WAIT_S

    def work(worker: _Worker) -> None:
        while time.monotonic() < deadline:
            with _lock:
                if not queue:
                    return
                task = queue.pop()
            try:
                reply = worker.ask(task)
            except Exception as exc:  # a crashed worker: the rest is built elsewhere
                _log.info("cuDNN: a build process failed (%s: %s)", type(exc).__name__, exc)
                _retire(worker)
                return
            replies[int(task["index"])] = reply

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in crew]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 1.0)
    for t, w in zip(threads, crew, strict=True):
        if t.is_alive():  # past the deadline (a hung build): end it; its plan is built here
            w.proc.kill()
            _retire(w)
    _release_later()
    return replies


def _retire(worker: _Worker) -> None:
    with _lock:
        if worker in _workers:
            _workers.remove(worker)
    worker.close()


def _release_later() -> None:
    """End the workers once they have been idle for :data:`IDLE_S`."""
    global _last_use
    _last_use = stamp = time.monotonic()

    def release() -> None:
        if _last_use == stamp:
            _end_workers()

    timer = threading.Timer(IDLE_S, release)
    timer.daemon = True
    timer.start()


def _end_workers() -> None:
    with _lock:
        crew = list(_workers)
        _workers.clear()
    for worker in crew:
        worker.close()


atexit.register(_end_workers)
