"""A replay whose step keeps its buffers live where the plan put others (the
caller deviates from the recorded lifetimes): the first conflicts are served by
the dynamic pool one by one; once they pile up the rest of the step is served
dynamically, with the territory handed back, instead of trying (and failing)
every planned slot."""
from __future__ import annotations

import pytest

SIZE = 4096
N = 100


def _recorded(C):
    a = C.Arena(C.HostDevice())
    for _ in range(2):  # two recorded steps: allocate, free, 100 times (one slot reused)
        a.begin_step()
        for _ in range(N):
            a.deallocate(a.allocate(SIZE))
        a.end_step()
    return a


def test_a_replay_that_keeps_everything_live_stops_conflicting(C):
    a = _recorded(C)
    a.begin_step()
    held = [a.allocate(SIZE) for _ in range(N)]  # all live at once: every slot after the first is taken
    r = a.stats()["renaissance"]
    # The plan puts all 100 at one offset: the first is a hit, 2..17 conflict (16, the limit,
    # at more than one conflict per 8 hits), then the rest of the step is not replayed.
    assert r["planned_hits"] == 1 and r["planned_conflicts"] == 16, r
    assert len({p for p in held}) == N
    ends = sorted((p, p + a.block_size(p)) for p in held)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:]))  # disjoint
    for p in held:
        a.deallocate(p)
    a.end_step()
    a.check_invariants()
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0


def test_a_replay_that_follows_the_plan_is_not_cut(C):
    a = _recorded(C)
    for _ in range(3):
        a.begin_step()
        for _ in range(N):
            a.deallocate(a.allocate(SIZE))
        a.end_step()
    r = a.stats()["renaissance"]
    assert r["planned_conflicts"] == 0 and r["planned_hits"] == 3 * N, r
