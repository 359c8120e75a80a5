"""Attacks on planned replay's fast path (issue 14) that found bugs, each against values the
test computes itself (tests/test_replay_fast_path.py has the general harness)."""
from __future__ import annotations

import threading

import pytest

KiB = 1 << 10
STATS = ("allocation", "active", "allocated_bytes", "active_bytes", "requested_bytes")


class Books:
    """The reference count of the five stats the fast path books (all pools): current, peak,
    and the accumulated allocated / freed, from the test's own calls."""

    def __init__(self):
        self.v = {k: dict(current=0, peak=0, allocated=0, freed=0) for k in STATS}

    def _move(self, name, amount):
        s = self.v[name]
        s["current"] += amount
        if amount > 0:
            s["allocated"] += amount
        else:
            s["freed"] -= amount
        s["peak"] = max(s["peak"], s["current"])

    def alloc(self, requested):
        r = (requested + 63) // 64 * 64  # HostDevice: 64 B
        for name, x in (("allocation", 1), ("active", 1), ("allocated_bytes", r),
                        ("active_bytes", r), ("requested_bytes", requested)):
            self._move(name, x)

    def free(self, requested):
        r = (requested + 63) // 64 * 64
        for name, x in (("allocation", 1), ("active", 1), ("allocated_bytes", r),
                        ("active_bytes", r), ("requested_bytes", requested)):
            self._move(name, -x)

    def check(self, arena, where):
        s = arena.stats()
        for name in STATS:
            assert s[name]["all"] == self.v[name], (where, name)


def _read_stats(arena, ptrs):
    arena.stats()


def _read_block_size(arena, ptrs):
    arena.block_size(ptrs[-1])


def _read_invariants(arena, ptrs):
    arena.check_invariants()


def _read_from_thread(arena, ptrs):
    t = threading.Thread(target=arena.stats)
    t.start()
    t.join()


@pytest.mark.parametrize("read", [_read_stats, _read_block_size, _read_invariants, _read_from_thread],
                         ids=["stats", "block_size", "check_invariants", "other_thread"])
def test_a_flush_books_no_extra_allocation_or_free(C, read):
    """A read in the middle of a fast step flushes the fast path's live allocations into
    blocks. The accumulated counters (allocation.all.allocated / freed, bytes alike) must
    still count each allocation and free once: the flush took each live block off the books
    (a free) and booked it again (an allocation), so they came out one per live block too
    high."""
    arena = C.Arena(C.HostDevice(), plan_budget_seconds=0)
    books = Books()
    sizes = [4 * KiB, 8 * KiB + 5, 16 * KiB, 32 * KiB - 100]

    def step(mid_read=False):
        arena.begin_step(3)
        ptrs = []
        for size in sizes:
            ptrs.append(arena.allocate(size))
            books.alloc(size)
        arena.deallocate(ptrs[0])
        books.free(sizes[0])
        if mid_read:
            read(arena, ptrs)
            books.check(arena, "after the mid-step read")
        for p, size in zip(ptrs[1:], sizes[1:]):
            arena.deallocate(p)
            books.free(size)
        arena.end_step()

    for _ in range(5):
        step()
    fast = arena.stats()["renaissance"]["planned_fast_hits"]
    assert fast > 0, "the fast path served nothing: the test would not reach it"
    books.check(arena, "clean steps")
    step(mid_read=True)
    books.check(arena, "after the step with a read")
    step()
    books.check(arena, "after the next step")
    assert arena.stats()["renaissance"]["planned_fast_hits"] > fast
    arena.check_invariants()


def _disarm(arena):
    """Another thread's operation right after begin_step: the step takes the locked path."""
    t = threading.Thread(target=arena.stats)
    t.start()
    t.join()


def _flat(d, pre=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, pre + k + "."))
        else:
            out[pre + k] = v
    return out


# What the fast path is allowed to change, or cannot reproduce: its own counter, timings,
# same-address counts (the dynamic pool's ties between segments go by absolute address, which
# differs between two arenas), and the inactive-split books (see the xfail test below).
def _compared(key: str) -> bool:
    return not (key == "renaissance.planned_fast_hits" or "second" in key or "time" in key
                or key == "renaissance.last_step_same_address" or key.startswith("inactive_split"))


@pytest.mark.parametrize("seed", range(3))
def test_fast_steps_book_what_the_locked_path_books(C, seed):
    """The same seeded operations (deviations: a smaller, a bigger request, a late free, an
    extra allocation, a second key) on two arenas, one of them made to take the locked path
    every step: every stat, read mid-step (a flush) and after each step, must be equal."""
    import random

    rng = random.Random(2000 + seed)
    n = rng.randrange(20, 50)
    sizes = [64 * rng.randrange(1, 3000) + rng.randrange(64) for _ in range(n)]
    ops, due = [], {}
    for i in range(n):
        ops.append(("a", i))
        due.setdefault(i + 1 + int(rng.expovariate(1 / 5)), []).append(i)
        ops.extend(("f", j) for j in due.pop(i, []))
    for t in sorted(due):
        ops.extend(("f", j) for j in due[t])
    fast, locked = (C.Arena(C.HostDevice(), plan_budget_seconds=0) for _ in range(2))  # budget 0: no clock, so both plan alike at any load
    for step in range(24):
        reads = {rng.randrange(len(ops)) for _ in range(2)} if step % 3 == 2 else set()
        deviate = step > 6 and step % 4 == 1
        target = rng.randrange(n)
        key = 1 if step < 10 or step % 5 else 2
        seen = []
        for arena in (fast, locked):
            arena.begin_step(key)
            if arena is locked:
                _disarm(arena)
            addr, late, got = {}, None, []
            for k, (op, i) in enumerate(ops):
                if op == "a":
                    size = sizes[i]
                    if deviate and i == target:
                        size = (size // 2 + 1, 2 * size + 64, size)[step % 3]
                        if step % 3 == 2:
                            arena.deallocate(arena.allocate(777))
                    addr[i] = arena.allocate(size)
                elif deviate and i == target and late is None:
                    late = addr[i]
                else:
                    arena.deallocate(addr[i])
                if k in reads:
                    got.append(_flat(arena.stats()))
            if late is not None:
                arena.deallocate(late)
            arena.end_step()
            got.append(_flat(arena.stats()))
            seen.append(got)
        for x, y in zip(*seen):
            diff = {k: (x[k], y[k]) for k in x if _compared(k) and x[k] != y[k]}
            assert not diff, (step, diff)
    assert _flat(fast.stats())["renaissance.planned_fast_hits"] > 0
    assert _flat(locked.stats())["renaissance.planned_fast_hits"] == 0
    fast.check_invariants()
    locked.check_invariants()


@pytest.mark.xfail(strict=True, reason=(
    "the fast path never changes the tiling, so the free split blocks a replayed step "
    "leaves between its live buffers are never booked: inactive_split / "
    "inactive_split_bytes peaks (and their accumulated counts) stay below what the locked "
    "path books for the same operations"))
def test_inactive_split_peak_of_a_fast_step_is_the_locked_paths(C):
    """a and b planned side by side, c in a's place: after a's free, [0, 64 KiB) is a free
    split block beside the live b (inactive_split >= 1), on either path."""
    def run(disarm):
        arena = C.Arena(C.HostDevice(), plan_budget_seconds=0)

        def step():
            arena.begin_step(1)
            if disarm:
                _disarm(arena)
            a = arena.allocate(64 * KiB)
            b = arena.allocate(64 * KiB)
            arena.deallocate(a)
            c = arena.allocate(32 * KiB)
            arena.deallocate(b)
            arena.deallocate(c)
            arena.end_step()

        for _ in range(4):
            step()
        arena.reset_peak_stats()
        step()
        s = arena.stats()
        return (s["inactive_split"]["all"]["peak"], s["inactive_split_bytes"]["all"]["peak"],
                s["renaissance"]["planned_fast_hits"])

    locked = run(disarm=True)
    assert locked[2] == 0 and locked[0] >= 1 and locked[1] >= 32 * KiB
    fast = run(disarm=False)
    assert fast[2] > 0, "the fast path served nothing"
    assert fast[:2] == locked[:2]
