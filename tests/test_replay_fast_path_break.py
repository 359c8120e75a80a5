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
    arena = C.Arena(C.HostDevice(), plan_budget_seconds=0.02)
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
