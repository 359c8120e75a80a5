"""Issue 11's leftovers found by a tester: the obstacle accounting of
``plan_over_step_load_and_obstacles`` and two bad-input holes of the
Python-facing ``_C.Arena`` (step nesting, unknown SimDevice streams)."""
from __future__ import annotations

import pytest

MiB = 1 << 20


def _renaissance(a):
    return a.stats()["renaissance"]


# --- obstacle accounting --------------------------------------------------------------


def test_obstacles_above_the_territory_do_not_count(C):
    # By hand, in the stream's large expandable segment (HostDevice, 64 B units):
    #   [0, 4 MiB) `low`, live for good        -> an obstacle under the plan
    #   [4, 20 MiB) free (a freed 16 MiB block)
    #   [20, 22 MiB) `high`, live for good     -> above the plan: not in its way
    # Each step: x and y, 8 MiB each, live together (step LOAD 16 MiB). The
    # plan puts them at 4 and 12 MiB: top 20 MiB, and the obstacles under it
    # are `low` alone, so plan / (step LOAD + obstacles) = 20 / (16 + 4) = 1.
    a = C.Arena(C.HostDevice())
    low = a.allocate(4 * MiB)
    gap = a.allocate(16 * MiB)
    high = a.allocate(2 * MiB)
    a.deallocate(gap)
    for _ in range(4):
        a.begin_step()
        x = a.allocate(8 * MiB)
        y = a.allocate(8 * MiB)
        a.deallocate(x)
        a.deallocate(y)
        a.end_step()
    r = _renaissance(a)
    assert r["plans"] >= 1 and r["last_step_hits"] == 2
    assert r["plan_bytes"] == 20 * MiB
    assert r["step_load_bytes"] == 16 * MiB
    assert r["obstacle_bytes"] == 4 * MiB          # was 6 MiB: `high` counted too
    # torch_renaissance.stats' plan_over_step_load_and_obstacles (was 20 / 22)
    assert r["plan_bytes"] / (r["step_load_bytes"] + r["obstacle_bytes"]) == 1.0
    a.deallocate(low)
    a.deallocate(high)
    a.check_invariants()


# --- step nesting on the Python-facing Arena ------------------------------------------


def _planned_once(C):
    a = C.Arena(C.HostDevice())
    keep = a.allocate(3 * MiB)
    for _ in range(3):
        a.begin_step()
        p = a.allocate(2 * MiB)
        a.deallocate(p)
        a.end_step()
    return a, keep


def test_end_step_without_begin_is_an_error_that_changes_nothing(C):
    a, keep = _planned_once(C)
    before = (a.stats(), a.last_step())
    with pytest.raises(RuntimeError, match=r"end_step\(\) without an open step"):
        a.end_step()
    assert (a.stats(), a.last_step()) == before   # no boundary, no step counted
    assert not a.in_step
    # The arena goes on as before: the next step still replays the plan.
    a.begin_step()
    p = a.allocate(2 * MiB)
    a.deallocate(p)
    a.end_step()
    assert _renaissance(a)["last_step_hits"] == 1
    a.deallocate(keep)
    a.check_invariants()


def test_begin_step_twice_is_an_error_that_keeps_the_open_step(C):
    a, keep = _planned_once(C)
    steps = _renaissance(a)["steps"]
    a.begin_step()
    p = a.allocate(2 * MiB)
    with pytest.raises(RuntimeError, match=r"begin_step\(\) while a step is already open"):
        a.begin_step()
    with pytest.raises(RuntimeError, match="already open"):
        a.begin_step(7)   # another key: the same error
    assert a.in_step
    assert _renaissance(a)["steps"] == steps   # the open step was not ended
    a.deallocate(p)
    a.end_step()                               # it ends once, with its allocation
    r = _renaissance(a)
    assert r["steps"] == steps + 1 and r["last_step_allocations"] == 1 and r["last_step_hits"] == 1
    assert len(a.last_step()["entries"]) == 1
    a.deallocate(keep)
    a.check_invariants()


def test_step_marks_without_planning_stay_no_ops(C):
    # planning=False keeps no step: begin is a no-op and end a sync point, so
    # neither can lose anything and neither raises (documented in arena.h).
    a = C.Arena(C.HostDevice(), planning=False)
    a.end_step()
    a.begin_step()
    a.begin_step()
    assert not a.in_step
    a.end_step()


# --- unknown SimDevice streams --------------------------------------------------------


@pytest.mark.parametrize("in_step", [False, True])
def test_allocation_on_an_unknown_sim_stream_is_an_error(C, in_step):
    d = C.SimDevice()
    s1 = d.new_stream()                       # streams 0 and 1 exist
    a = C.Arena(d)
    keep = a.allocate(1 * MiB, s1)            # a known side stream is fine
    if in_step:
        a.begin_step()
    before = a.stats()
    for bad in (2, 5, 1 << 40):
        with pytest.raises(ValueError, match=f"stream {bad}, which sim does not have"):
            a.allocate(1 * MiB, bad)
    assert a.stats() == before               # nothing was allocated or counted
    if in_step:
        a.end_step()
        assert a.last_step()["entries"] == []   # the refused requests are not in the trace
    a.deallocate(keep)
    a.check_invariants()
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0
