"""Seeded step sequences against the step end's bookkeeping (session 19: the previous trace
kept as ``prior``, traces recycled, the threads column kept only for other threads' entries,
the fast path's room reserved when armed).

Each seed draws 1-5 keys, each with 1-3 size programs (0-200 allocations, so steps of one key
change length), a key order, and whether a worker thread allocates inside the opener's steps.
Steps free most buffers as they go, keep one or two past their end (freed by the next step
after its first allocation: alternating layouts), sometimes end early, and sometimes read the
stats in the middle (a flush). After every step:

* no two live allocations overlap (the test's own map of live ranges, worker's included);
* ``check_invariants()`` holds;
* ``last_step()``'s entries are the opener's allocations of that step, in order, each at least
  the size asked for; with a worker, the worker's entries may stand between them (or be
  dropped as irregular work), but the opener's are all there, in order.
"""
from __future__ import annotations

import random
import threading

import pytest
from test_core import Reference  # live blocks by start; add() fails on any overlap


def _run(C, seed: int, steps: int) -> dict:
    rng = random.Random(seed)
    arena = C.Arena(C.HostDevice(), plan_budget_seconds=0)
    live_ranges = Reference()
    keys = rng.choice([1, 2, 3, 5])
    programs = {
        k: [[rng.choice([256, 512, 1000, 4096, 7000, 65536, 300000])
             for _ in range(rng.choice([0, 1, 3, 8, 20, 60, 200]))]
            for _ in range(rng.choice([1, 1, 2, 3]))]
        for k in range(1, keys + 1)
    }
    order = [rng.randint(1, keys) for _ in range(rng.randint(1, 7))]
    with_worker = rng.random() < 0.4
    carried = []
    for s in range(steps):
        k = order[s % len(order)] if rng.random() >= 0.05 else rng.randint(1, keys)
        variants = programs[k]
        sizes = variants[(s // len(order)) % len(variants)]
        if rng.random() < 0.03:
            sizes = sizes[:rng.randint(0, len(sizes))]  # a step that ends early
        worker_at = rng.randint(0, len(sizes)) if with_worker else -1
        arena.begin_step(k)
        opener, worker_blocks, live = [], [], []
        made = []  # every allocation of the step, in order: (address, size, whose)
        for i, n in enumerate(sizes):
            if i == worker_at:
                def work():
                    for _ in range(3):
                        p = arena.allocate(2048)
                        live_ranges.add(p, 2048)
                        worker_blocks.append(p)
                        made.append((p, 2048, "worker"))
                t = threading.Thread(target=work)
                t.start()
                t.join()
            p = arena.allocate(n)
            live_ranges.add(p, n)
            opener.append((p, n))
            made.append((p, n, "opener"))
            live.append(p)
            if i == 0:  # the previous step's kept buffers die after this step's first allocation
                for q in carried:
                    live_ranges.remove(q)
                    arena.deallocate(q)
                carried = []
            if rng.random() < 0.02:
                arena.stats()
            if rng.random() < 0.4:
                q = live.pop(rng.randrange(len(live)) if rng.random() < 0.3 else 0)
                live_ranges.remove(q)
                arena.deallocate(q)
        keep = live[-2:] if rng.random() < 0.6 else []
        for q in live:
            if q not in keep:
                live_ranges.remove(q)
                arena.deallocate(q)
        arena.end_step()
        carried += keep
        for q in worker_blocks:
            live_ranges.remove(q)
            arena.deallocate(q)
        arena.check_invariants()
        entries = arena.last_step()["entries"]
        if not with_worker:
            assert [e["address"] for e in entries] == [p for p, _ in opener], (seed, s)
            assert all(e["size"] >= n for e, (_, n) in zip(entries, opener)), (seed, s)
        else:
            # The entries are a subsequence of the step's allocations in the order they were
            # made (an address may come back within a step), holding all of the opener's.
            j, matched = 0, 0
            for e in entries:
                while j < len(made) and (made[j][0] != e["address"] or e["size"] < made[j][1]):
                    j += 1
                assert j < len(made), (seed, s, "an entry that is no allocation of the step")
                matched += made[j][2] == "opener"
                j += 1
            assert matched == len(opener), (seed, s, matched, len(opener))
    for q in carried:
        live_ranges.remove(q)
        arena.deallocate(q)
    arena.check_invariants()
    stats = arena.stats()
    assert stats["renaissance"]["steps"] == steps
    assert stats["allocated_bytes"]["all"]["current"] == 0
    return stats["renaissance"]


@pytest.mark.parametrize("seed", range(8))
def test_seeded_step_sequences_keep_traces_and_ranges_right(C, seed):
    r = _run(C, 1900 + seed, 150)
    # The plan counters agree with one another (the fast path's hits are booked at the
    # flush, the locked path's as they happen).
    assert r["planned_fast_hits"] <= r["planned_hits"] <= r["planned_requests"]
