"""Planned territory under concurrent and cross-stream use (issues 18, 11, 13):
per-stream territory, bounded growth, pending blocks, planning without the
arena's lock, demotion during a capture. SimDevice puts the GPU's progress
under the test's control."""
from __future__ import annotations

import random
import threading
import time

import pytest
from territory_scenarios import new_structures, random_step

MiB = 1 << 20


def covered(dev, stream: int, use: int, pos: int, since: int = 0) -> bool:
    """Was `stream` made to wait on an event of `use` covering position `pos`?"""
    return any(w.stream == stream and w.event_stream == use and w.event_position >= pos
               for w in dev.waits()[since:])


def test_step_keys_on_different_streams_never_share_memory_without_a_wait(C):
    # Issue 18.1: key 1 runs on stream 0, key 2 on s1; both are planned and
    # replayed while neither stream has run. Memory one stream still works on
    # must never be handed to the other without a wait on an event covering it.
    d = C.SimDevice()
    s1 = d.new_stream()
    a = C.Arena(d)
    freed = []  # (start, end, stream, its enqueued position at the free)
    for i in range(8):
        for key, st in ((1, 0), (2, s1)):
            a.begin_step(key)
            ps = []
            for _ in range(3):
                p = a.allocate(4 * MiB, st)
                for lo, hi, x, pos in freed:
                    if x != st and lo < p + 4 * MiB and p < hi and d.completed(x) < pos:
                        assert covered(d, st, x, pos), (i, key, "cross-stream reuse without a wait")
                d.enqueue(st, 1)
                ps.append(p)
            for p in ps:
                a.deallocate(p)
                freed.append((p, p + 4 * MiB, st, d.enqueued(st)))
            a.end_step()
    s = a.stats()["renaissance"]
    assert s["planned_steps"] >= 10          # both keys replayed ...
    assert s["last_step_hits"] == 3          # ... at their planned offsets
    a.check_invariants()


def test_territory_is_bounded_when_every_step_is_a_new_structure(C):
    # Issue 18.2, deterministic and scaled down: back-to-back steps, each a
    # new structure (a new plan), with tensors allocated between them. Before:
    # reserved climbed to 191 MiB for a 49 MiB allocated peak, and 178 MiB
    # stayed reserved after freeing everything and empty_cache(). Each
    # structure runs twice: a shape seen once is no longer planned after a
    # few such plans (the back-off, test_variant_backoff.py).
    a = C.Arena(C.HostDevice())
    run = new_structures(a, planning=True, steps=80, repeat=2)
    peak_reserved, between = run["peak_reserved"], run["between"]
    s = a.stats()
    assert s["renaissance"]["plans"] >= 30
    peak_allocated = s["allocated_bytes"]["all"]["peak"]
    assert peak_reserved <= 2 * peak_allocated, (peak_reserved / MiB, peak_allocated / MiB)
    for p in between:
        a.deallocate(p)
    a.empty_cache()                          # the territory is cache too
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    a.check_invariants()


@pytest.mark.parametrize("obstacle_mib", [2, 6])
def test_a_layout_planned_around_an_obstacle_comes_down_once_it_dies(C, obstacle_mib):
    # A block allocated between the recorded steps lands in the segment the
    # territory takes, so the first plan goes around it: the step's 8 x 3 MiB
    # over (24 + obstacle) MiB. Once it has died the layout is re-planned to
    # the step's own 24 MiB and the territory comes down. Before, only
    # obstacles of at least an eighth of the top were worth a re-plan: the
    # 2 MiB one (2 x 8 < 26) held the layout at 26 MiB for good (and, with
    # other threads' blocks scattered up the segment, 61 MiB for a 24 MiB step).
    a = C.Arena(C.HostDevice(), plan_budget_seconds=0.02)
    step = 24 * MiB
    x = None
    tops = []
    for i in range(8):
        a.begin_step()
        ps = [a.allocate(step // 8) for _ in range(8)]
        for p in ps:
            a.deallocate(p)
        a.end_step()
        if i == 0:
            x = a.allocate(obstacle_mib * MiB)
        if i == 3:
            a.deallocate(x)
        tops.append(a.stats()["renaissance"]["plan_bytes"])
    assert tops[1] == step + obstacle_mib * MiB, [t / MiB for t in tops]   # around it
    assert tops[-1] == step, [t / MiB for t in tops]
    s = a.stats()
    assert s["reserved_bytes"]["all"]["current"] == step
    assert s["renaissance"]["plans"] == 2
    a.check_invariants()


def test_territory_is_bounded_while_other_threads_allocate_during_steps(C):
    # Issue 18.2 as reported: four threads allocate and free while a fifth
    # runs steps. Before: reserved 2.4 GiB after 10 steps and 35.7 GiB after
    # 110 for <= 0.5 GiB allocated. The step thread sleeps between its
    # allocations, so the other threads' work always lands inside its steps.
    # Only allocations at the same positions in two steps of a key (per
    # thread) are planned, so the layout is the step's own 8 x 3 MiB: the
    # other threads' allocations are no part of the step (not counted, not
    # planned), and what they held in the way of the first plan does not hold
    # the territory up once it has died. Without the rule every allocation
    # made while the step is open is one of its entries (the counts below);
    # with the rule alone (the other threads' blocks in the territory's
    # segment, no re-plan once they died) the layout was 95 MiB for this
    # 24 MiB step and reserved 186-210 MiB in 6 runs.
    a = C.Arena(C.HostDevice(), plan_budget_seconds=0.02)
    stop = threading.Event()
    step_bytes, per_thread_live, other_bytes = 24 * MiB, 6, 4 * MiB
    errors: list[BaseException] = []

    def other(seed: int) -> None:
        rng = random.Random(seed)
        live: list[int] = []
        try:
            while not stop.is_set():
                live.append(a.allocate(rng.randint(1, 64) * (other_bytes // 64)))
                if len(live) > per_thread_live or rng.random() < 0.5:
                    a.deallocate(live.pop(rng.randrange(len(live))))
        except BaseException as exc:  # noqa: B036 - reported by the test thread
            errors.append(exc)
        finally:
            for p in live:
                a.deallocate(p)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    peak_reserved, counts = 0, []
    try:
        for i in range(60):
            a.begin_step()
            ps = []
            for _ in range(8):
                ps.append(a.allocate(step_bytes // 8))
                time.sleep(0.0005)           # the GIL goes to the other threads
            for p in ps:
                a.deallocate(p)
            a.end_step()
            s = a.stats()
            peak_reserved = max(peak_reserved, s["reserved_bytes"]["all"]["current"])
            counts.append(s["renaissance"]["last_step_allocations"])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    r = a.stats()["renaissance"]
    # From the second step on (compared with the first), a step is its own 8 allocations.
    assert counts[1:] == [8] * 59, counts
    assert r["step_load_bytes"] == step_bytes
    # The layout comes down to the step's own once the other threads' blocks
    # that stood in its segment at the first plan have died: to 24 MiB, or
    # within a sixteenth of it (a smaller cost is not worth a re-plan). Before
    # (an eighth of the top in obstacle bytes): 48.9 MiB on CI, 61 MiB in 1 of
    # 8 runs beside two busy loops.
    assert r["plan_bytes"] * 15 < step_bytes * 16, r
    assert r["last_step_hits"] == 8
    most_live = step_bytes + 4 * (per_thread_live + 1) * other_bytes
    # Measured on 2 cores (load 6-9), 136 MiB live at most: 126-138 MiB, and
    # 121-135 MiB with planning off (the other threads' own fragmentation).
    assert peak_reserved <= 1.5 * most_live, (peak_reserved / MiB, most_live / MiB)
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0
    a.check_invariants()


@pytest.mark.parametrize("finished", [True, False])
def test_block_pending_at_the_steps_end_does_not_grow_the_layout(C, finished):
    # Issue 11.3: a 118 MiB buffer used on a side stream that finishes right
    # after end_step gave a 236 MiB plan that empty_cache never returned.
    d = C.SimDevice()
    side = d.new_stream()
    a = C.Arena(d)
    big = 118 * MiB
    prev = None  # (address, side position) of the last step's big buffer
    reserved = []
    for i in range(6):
        w0 = len(d.waits())
        a.begin_step()
        x = a.allocate(big)
        if prev and not finished and x < prev[0] + big and prev[0] < x + big:
            # Still pending where the plan puts it: the placement waited on
            # the epoch event, on the device (or the slot fell back).
            assert d.completed(side) >= prev[1] or covered(d, 0, side, prev[1], w0), i
        pos = d.enqueue(side, 1)
        a.record_stream(x, side)
        y = a.allocate(2 * MiB)
        a.deallocate(y)
        a.deallocate(x)
        a.end_step()
        prev = (x, pos)
        if finished:
            d.run_all()                      # the side stream ends right after end_step
        s = a.stats()
        reserved.append(s["reserved_bytes"]["all"]["current"])
        if i >= 1:
            assert s["renaissance"]["plan_bytes"] <= big + 2 * MiB, (i, s["renaissance"]["plan_bytes"])
    if finished:
        assert max(reserved[1:]) <= big + 4 * MiB, reserved
    else:
        # The recorded step held both buffers (one pending, as PyTorch would);
        # the replayed ones wait on the device instead and do not grow.
        assert max(reserved[2:]) <= reserved[1] <= 2 * big + 4 * MiB, reserved
    assert d.host_synchronizations == 0
    d.run_all()
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    a.check_invariants()


def test_other_threads_allocate_while_a_step_is_planned(C):
    # Issue 18.3: end_step() planned with the arena's lock held, so another
    # thread's allocation waited for the whole plan budget. With a budget of
    # 1.5 s the planner runs for most of it; the other thread must complete
    # allocations all through that window, not once it is over.
    warm = C.Arena(C.HostDevice(), plan_budget_seconds=0.0)
    random_step(warm, 200, 1); warm.end_step(); random_step(warm, 200, 1); warm.end_step()

    def planning_window(n: int, seed: int):
        a = C.Arena(C.HostDevice(), plan_budget_seconds=1.5)
        random_step(a, n, seed)
        a.end_step()
        random_step(a, n, seed)              # same sizes: its end plans it
        done: list[float] = []               # completion times of the other thread's pairs
        stop = threading.Event()

        def other() -> None:
            while not stop.is_set():
                p = a.allocate(4096)
                a.deallocate(p)
                done.append(time.perf_counter())

        th = threading.Thread(target=other)
        th.start()
        while not done:
            time.sleep(0.001)
        t0 = time.perf_counter()
        a.end_step()
        t1 = time.perf_counter()
        stop.set()
        th.join()
        assert a.stats()["renaissance"]["plans"] == 1
        a.check_invariants()
        return t0, t1, done

    # The planner may reach its bound early on a step and leave no window to
    # observe: take larger steps until a plan runs for over 0.5 s.
    for n, seed in ((1200, 0), (2400, 1), (4800, 2)):
        t0, t1, done = planning_window(n, seed)
        if t1 - t0 > 0.5:
            break
    assert t1 - t0 > 0.5, "every plan was too quick to show anything; use a harder step"
    # Pairs completed in each third of the planning window (a blocked thread
    # completes none until the lock is released at the end).
    thirds = [sum(1 for t in done if t0 + k * (t1 - t0) / 3 <= t < t0 + (k + 1) * (t1 - t0) / 3)
              for k in range(3)]
    assert min(thirds) >= 10, thirds


def test_demotion_during_a_capture_waits_for_the_side_stream(C):
    # Issue 13.4: territory demoted inside a capture (here: empty_cache in the
    # window) skipped the epoch-event wait, so a dynamic allocation got memory
    # a side stream still reads.
    d = C.SimDevice()
    side = d.new_stream()
    a = C.Arena(d)

    def step():
        a.begin_step()
        ps = [a.allocate(4 * MiB) for _ in range(3)]
        pos = d.enqueue(side, 1)
        for p in ps:
            a.record_stream(p, side)
        for p in ps:
            a.deallocate(p)
        a.end_step()
        return ps, pos

    for _ in range(3):
        step()
        d.run_all()
    ps, pos = step()                         # the side stream is kept busy
    assert d.completed(side) < pos
    a.set_capturing(True)
    w0 = len(d.waits())
    a.empty_cache()                          # would hand the territory back
    for _ in range(3):
        q = a.allocate(4 * MiB)
        for p in ps:
            if q < p + 4 * MiB and p < q + 4 * MiB:
                assert d.completed(side) >= pos or covered(d, 0, side, pos, w0), "reused in capture"
    a.set_capturing(False)                   # the postponed demotion happens now
    assert d.completed(side) >= pos          # after waiting for the side stream
    a.empty_cache()
    a.check_invariants()
