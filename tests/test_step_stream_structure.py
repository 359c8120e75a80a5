"""A step's structure includes each allocation's stream (issue 14's step end).

``StepPlanner::same_structure`` decides whether a replayed step's misses count
against its layout (enough of them give the layout up). Since session 18 it
answers from two flags when it can: the layout's slots are all on one stream,
and the step's entries are all on one stream (kept as entries are recorded).
These loops check the answer where the flags could mislead: every entry on
another stream than the layout's, and entries that start on the layout's
stream and then switch. Either must leave the layout alone: the main-stream
steps after them replay in full. Hand-made steps on ``SimDevice`` with
budget-0 plans, so the counts do not depend on the machine.
"""
from __future__ import annotations

import pytest

KiB = 1 << 10


def _loop(C, pattern):
    dev = C.SimDevice()
    side = dev.new_stream()
    arena = C.Arena(dev, plan_budget_seconds=0.0)
    sizes = [64 * KiB * (1 + i % 7) for i in range(24)]

    def step(streams):
        arena.begin_step()
        ptrs = [arena.allocate(s, st) for s, st in zip(sizes, streams)]
        for p in ptrs:
            arena.deallocate(p)
        arena.end_step()
        r = arena.stats()["renaissance"]
        return r["last_step_hits"], r["last_step_allocations"]

    main = [0] * len(sizes)
    other = pattern(side, len(sizes))
    hits = [step(main) for _ in range(4)]
    assert hits[2:] == [(24, 24), (24, 24)]  # recorded twice, then replayed in full
    # More such steps than the give-up window (8 steps) holds. Each misses the
    # plan at its first request on the side stream (the rest of the step runs
    # dynamically), so none is a full replay.
    others = [step(other) for _ in range(10)]
    first_side = other.index(next(s for s in other if s != 0))
    assert others == [(first_side, 24)] * 10
    assert [step(main) for _ in range(2)] == [(24, 24), (24, 24)]
    r = arena.stats()["renaissance"]
    assert (r["give_ups"], r["plans"], r["layouts"]) == (0, 1, 1)
    arena.check_invariants()


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param(lambda side, n: [side] * n, id="all-on-another-stream"),
        # The first entry on the layout's stream, the others alternating.
        pytest.param(lambda side, n: [0 if i % 2 == 0 else side for i in range(n)], id="first-on-the-layouts-stream"),
        pytest.param(lambda side, n: [0] * (n - 1) + [side], id="last-on-another-stream"),
    ],
)
def test_steps_on_other_streams_leave_the_layout(C, pattern):
    _loop(C, pattern)
