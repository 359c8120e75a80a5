"""Steps whose shapes never repeat (a random graph per step, a length never
seen twice): after a few plans that no later step replayed, a new shape is
planned only once it is seen a second time (StepPlanner::kBackoffPlans,
docs/design.md "Shapes that never repeat"). Work is counted in plans, not
wall time, and plans have budget 0, so the counts do not depend on the
machine.
"""
from __future__ import annotations

import random

import pytest

from _aging import allocate_aging

KiB = 1 << 10
BACKOFF_PLANS = 4  # StepPlanner::kBackoffPlans


def _shape(rng: random.Random):
    """A step's allocations: (size, free after k more allocations or None:
    kept to the next step); a count and sizes that differ per call."""
    n = rng.randint(6, 40)
    return [(rng.randint(1, 64) * 4 * KiB, rng.choice((None, 0, 1, 2, 3))) for _ in range(n)]


def _step(arena, shape, kept):
    arena.begin_step()
    for p in kept:
        arena.deallocate(p)
    kept.clear()
    pending = []  # (allocations left before the free, pointer)
    for size, after in shape:
        p = allocate_aging(arena, size, after, pending)
        if after is None:
            kept.append(p)
    for _, p in pending:
        arena.deallocate(p)
    arena.end_step()


@pytest.mark.parametrize("seed", range(6))
def test_shapes_that_never_repeat_stop_being_planned(C, seed):
    rng = random.Random(seed)
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    kept = []
    steps = 40
    for _ in range(steps):
        _step(arena, _shape(rng), kept)
    r = arena.stats()["renaissance"]
    # Every step of a new shape used to be planned (39 plans: each at the
    # full budget on real models, 2.9-4.3x slower than the plain allocator).
    assert r["plans"] == BACKOFF_PLANS, r
    arena.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_a_shape_that_repeats_is_planned_again_after_the_back_off(C, seed):
    rng = random.Random(seed + 50)
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    kept = []
    for _ in range(20):  # into the back-off
        _step(arena, _shape(rng), kept)
    assert arena.stats()["renaissance"]["plans"] == BACKOFF_PLANS
    a = _shape(rng)
    _step(arena, a, kept)   # first sighting: served dynamically, remembered
    assert arena.stats()["renaissance"]["plans"] == BACKOFF_PLANS
    _step(arena, a, kept)   # second: planned
    assert arena.stats()["renaissance"]["plans"] == BACKOFF_PLANS + 1
    before = arena.stats()["renaissance"]
    _step(arena, a, kept)   # third: replayed from the plan
    r = arena.stats()["renaissance"]
    assert r["planned_hits"] - before["planned_hits"] == len(a), r
    assert r["planned_misses"] == before["planned_misses"]
    # A replay ends the back-off: the next new shapes are planned at once again.
    for k in range(BACKOFF_PLANS):
        _step(arena, _shape(rng), kept)
        assert arena.stats()["renaissance"]["plans"] == BACKOFF_PLANS + 2 + k
    arena.check_invariants()
