"""The multi-process harness fails cleanly: rank tracebacks reach the parent, hangs time out."""
from __future__ import annotations

import time

import pytest

from . import _tasks_harness as tasks
from ._harness import WorkerError, WorkerPool


def test_results_come_back_in_rank_order(world2):
    assert world2.run(tasks.echo, 7) == [(0, 2, 7), (1, 2, 7)]


def test_exception_on_one_rank_fails_fast_with_its_traceback():
    pool = WorkerPool(2)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            pool.run(tasks.fail_on_rank1, timeout=60)
        elapsed = time.monotonic() - start
        text = str(info.value)
        assert "--- rank 1 ---" in text and "deliberate failure on rank 1" in text
        assert "Traceback" in text and "fail_on_rank1" in text
        assert "ranks [0] did not answer" in text  # rank 0 was stuck in the barrier
        assert elapsed < 30
        assert not pool.alive
    finally:
        pool.kill()


def test_hang_times_out_and_kills_the_pool():
    pool = WorkerPool(2)
    try:
        with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not finish within 2 s"):
            pool.run(tasks.sleep_forever, timeout=2)
        assert not pool.alive
        assert not any(p.is_alive() for p in pool._procs)
    finally:
        pool.kill()
