"""Run a function on N gloo ranks (CPU processes) and get each rank's result.

A :class:`WorkerPool` starts ``world_size`` spawned processes once, joins them
into one gloo process group (rendezvous through a ``TCPStore`` the parent owns
on 127.0.0.1 with an OS-chosen port, so there is no free-port race), and then
runs tasks: ``pool.run(fn, *args)`` calls ``fn(rank, world_size, *args)`` on every
rank and returns the list of results in rank order.

Failure handling, so a test fails instead of hanging:

* an exception on any rank is re-raised in the parent as :class:`WorkerError`
  carrying every failing rank's traceback;
* after the first failure the other ranks get a short grace period (they may be
  stuck in a collective the failing rank never joined); then the pool is killed;
* a task that exceeds its timeout kills the pool and raises ``TimeoutError``
  naming the ranks that did not answer;
* a killed pool is replaced by a fresh one on the next :func:`get_pool`.

``fn`` must be a module-level function of a file; workers load that file by
path (no dependence on how pytest named the test module). A pool made with
``allocator="cpu"`` installs torch_renaissance's allocator in every rank
before its first tensor, so tasks can read ``torch_renaissance.memory_allocated``.
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import queue
import sys
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLOO_TIMEOUT_S = 45
DEFAULT_TASK_TIMEOUT_S = 120.0
FAILURE_GRACE_S = 5.0


class WorkerError(AssertionError):
    """A task raised on one or more ranks; the message holds their tracebacks."""


def _load(path: str, cache: dict[str, Any]):
    mod = cache.get(path)
    if mod is None:
        name = "_tr_dist_task_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        cache[path] = mod
    return mod


def _worker(rank: int, world: int, port: int, tasks, results, allocator=None) -> None:
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if allocator is not None:
            import torch_renaissance

            torch_renaissance.install(allocator)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                              timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    except BaseException:
        results.put((-1, rank, False, traceback.format_exc()))
        return
    results.put((-1, rank, True, None))
    modules: dict[str, Any] = {}
    while True:
        task = tasks.get()
        if task is None:
            break
        task_id, path, fn_name, args = task
        try:
            fn = getattr(_load(path, modules), fn_name)
            out = (task_id, rank, True, fn(rank, world, *args))
        except BaseException:
            out = (task_id, rank, False, traceback.format_exc())
        results.put(out)
    try:
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        pass


class WorkerPool:
    """``world_size`` gloo ranks that run tasks until closed or killed."""

    def __init__(self, world_size: int, start_timeout: float = 120.0,
                 allocator: str | None = None) -> None:
        import torch.distributed as dist

        self.world_size = world_size
        self.alive = False
        self._store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                                    wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._procs = [
            ctx.Process(target=_worker, args=(r, world_size, self._store.port, self._tasks[r], self._results,
                                              allocator),
                        daemon=True, name=f"tr-dist-rank{r}")
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self._next_id = 0
        started = self._collect(-1, start_timeout)
        self.alive = True
        del started

    def _collect(self, task_id: int, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        first_error_at = 0.0
        while len(results) + len(errors) < self.world_size:
            now = time.monotonic()
            if errors:
                deadline = min(deadline, first_error_at + FAILURE_GRACE_S)
            if now >= deadline:
                self.kill()
                missing = sorted(set(range(self.world_size)) - set(results) - set(errors))
                if errors:
                    raise WorkerError(self._format(errors, missing))
                raise TimeoutError(
                    f"ranks {missing} did not finish within {timeout:.0f} s "
                    f"(finished: {sorted(results)}); pool killed"
                )
            try:
                tid, rank, ok, payload = self._results.get(timeout=min(0.5, deadline - now))
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()
                        and r not in results and r not in errors]
                if dead:
                    if not errors:
                        first_error_at = time.monotonic()
                    errors.update({r: f"process exited with code {self._procs[r].exitcode}" for r in dead})
                continue
            if tid != task_id:
                continue  # a late answer from an earlier, failed task
            if ok:
                results[rank] = payload
            else:
                if not errors:
                    first_error_at = time.monotonic()
                errors[rank] = payload
        if errors:
            self.kill()
            raise WorkerError(self._format(errors, []))
        return [results[r] for r in range(self.world_size)]

    @staticmethod
    def _format(errors: dict[int, str], missing: list[int]) -> str:
        parts = [f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items())]
        if missing:
            parts.append(f"--- ranks {missing} did not answer (likely blocked in a collective) ---")
        return "task failed on rank(s) " + str(sorted(errors)) + "\n" + "\n".join(parts)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TASK_TIMEOUT_S) -> list[Any]:
        """Run ``fn(rank, world_size, *args)`` on every rank; results in rank order."""
        if not self.alive:
            raise RuntimeError("worker pool is not running")
        path = os.path.abspath(sys.modules[fn.__module__].__file__)
        self._next_id += 1
        for q in self._tasks:
            q.put((self._next_id, path, fn.__name__, args))
        return self._collect(self._next_id, timeout)

    def close(self) -> None:
        if self.alive:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
        self.kill()

    def kill(self) -> None:
        self.alive = False
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=5)


_POOLS: dict[tuple[int, str | None], WorkerPool] = {}


def get_pool(world_size: int, allocator: str | None = None) -> WorkerPool:
    """A running pool of ``world_size`` ranks (started on first use, restarted if killed).

    ``allocator``: ``"cpu"`` for ranks with torch_renaissance's allocator installed.
    """
    key = (world_size, allocator)
    pool = _POOLS.get(key)
    if pool is None or not pool.alive:
        pool = _POOLS[key] = WorkerPool(world_size, allocator=allocator)
    return pool


def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
