"""The arena's free cache (issue 14 item 2): freed blocks kept per (stream,
size, pool) for O(1) reuse, in front of the best-fit index.

What must hold whatever the cache does (csrc/core/arena.h, "Free cache"):
no block is handed out twice, stats equal a reference model kept by the test
at every step (the cache's blocks are accounted as freed), check_invariants()
holds with the cache full and after a flush, blocks with stream uses never
enter it, it never serves another stream, and the fit guarantee of issue 11
holds with the cache filled by other threads (test_pressure.py runs the
hypothesis property with the cache too).
"""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KiB = 1 << 10
MiB = 1 << 20
UNIT = 64  # HostDevice alignment
SIZES = [1, 64, 100, 512, 4 * KiB, 64 * KiB, 100 * KiB, 1 * MiB, 1 * MiB + 1, 3 * MiB]


def rounded(n: int) -> int:
    return -(-n // UNIT) * UNIT


class Model:
    """Reference stats: current and peak of allocated bytes, requested bytes
    and the allocation count, from the sizes the test asked for."""

    def __init__(self):
        self.live: dict[int, int] = {}  # pointer -> requested bytes
        self.peak = {"allocated_bytes": 0, "requested_bytes": 0, "allocation": 0}

    def current(self) -> dict:
        return {"allocated_bytes": sum(rounded(n) for n in self.live.values()),
                "requested_bytes": sum(self.live.values()),
                "allocation": len(self.live)}

    def alloc(self, p: int, n: int) -> None:
        for q, m in self.live.items():  # never handed out twice: no overlap with a live block
            assert p + rounded(n) <= q or q + rounded(m) <= p, (hex(p), n, hex(q), m)
        self.live[p] = n
        for k, v in self.current().items():
            self.peak[k] = max(self.peak[k], v)

    def reset_peak(self) -> None:
        self.peak = self.current()

    def check(self, a) -> None:
        s = a.stats()
        for k, v in self.current().items():
            assert s[k]["all"]["current"] == v, (k, s[k]["all"], v)
            assert s[k]["all"]["peak"] == self.peak[k], (k, s[k]["all"], self.peak[k])
        # No stream uses: active is allocated.
        assert s["active_bytes"]["all"]["current"] == self.current()["allocated_bytes"]


def test_a_freed_block_is_reused_from_the_cache(C):
    a = C.Arena(C.HostDevice(), planning=False)
    keep = a.allocate(512)  # a neighbour, so that the freed block stays split
    p = a.allocate(512)
    a.deallocate(p)
    assert (a.cached_blocks, a.cached_bytes) == (1, 512)
    a.check_invariants()  # with the cache holding a block
    assert a.allocate(512) == p  # taken back in O(1)
    assert a.cached_blocks == 0
    a.deallocate(p)
    with pytest.raises(ValueError, match="double free"):
        a.deallocate(p)  # a cached block is not live
    with pytest.raises(ValueError):
        a.block_size(p)
    a.flush_cache()
    assert (a.cached_blocks, a.cached_bytes) == (0, 0)
    a.check_invariants()
    a.deallocate(keep)
    a.check_invariants()


def test_snapshot_flushes_the_cache(C):
    """stats(), a snapshot and cacheInfo's largest free block show free
    memory merged, as without the cache: the read flushes it."""
    a = C.Arena(C.HostDevice(), planning=False)
    ps = [a.allocate(4 * KiB) for _ in range(3)]
    a.deallocate(ps[1])
    a.deallocate(ps[2])
    assert a.cached_blocks == 2
    a.check_invariants()  # counts each cached block as an inactive split block of its own
    blocks = [b for seg in a.snapshot() for b in seg["blocks"]]
    assert a.cached_blocks == 0
    assert [b["state"] for b in blocks] == ["active_allocated", "inactive"]  # merged with the tail
    a.deallocate(ps[0])
    ps = [a.allocate(4 * KiB) for _ in range(3)]
    a.deallocate(ps[1])
    assert a.cached_blocks == 1
    s = a.stats()  # flushes too: inactive_split as merged (the freed block and the tail)
    assert a.cached_blocks == 0
    assert s["inactive_split"]["all"]["current"] == 2
    a.deallocate(ps[2])
    assert a.cached_blocks == 1
    assert a.largest_free_block() > 4 * KiB  # merged with the tail
    assert a.cached_blocks == 0
    a.deallocate(ps[0])
    a.check_invariants()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(SIZES)),
    st.tuples(st.just("free"), st.integers(0, 10**6)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("reset_peak"), st.just(0)),
    st.tuples(st.just("empty"), st.just(0)),
    st.tuples(st.just("step"), st.just(0)),
    st.tuples(st.just("check"), st.just(0)),
), min_size=1, max_size=80), expandable=st.booleans())
def test_stats_equal_the_reference_model(C, ops, expandable):
    """One thread: no pointer is live twice, check_invariants() holds after
    every operation (cache full or not), and at every "check" (stats() flushes
    the cache, so checks come between runs of operations that use it) the
    stats equal the model's current and peak values."""
    a = C.Arena(C.HostDevice(), expandable_segments=expandable, plan_budget_seconds=0.01)
    m = Model()
    in_step = False
    for op, arg in ops:
        if op == "alloc":
            m.alloc(a.allocate(arg), arg)
        elif op == "free" and m.live:
            p = sorted(m.live)[arg % len(m.live)]
            del m.live[p]
            a.deallocate(p)
        elif op == "flush":
            a.flush_cache()
            assert a.cached_blocks == 0
        elif op == "reset_peak":
            a.reset_peak_stats()
            m.reset_peak()
        elif op == "empty":
            a.empty_cache()
            assert a.cached_blocks == 0
        elif op == "step":
            (a.end_step if in_step else a.begin_step)()
            in_step = not in_step
            assert a.cached_blocks == 0  # every step boundary flushes
        elif op == "check":
            m.check(a)
            assert a.cached_blocks == 0
        if in_step:
            assert a.cached_blocks == 0  # nothing enters the cache inside a step
        a.check_invariants()
    for p in list(m.live):
        del m.live[p]
        a.deallocate(p)
    m.check(a)
    a.flush_cache()
    a.check_invariants()


THREADS = 4


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plans=st.lists(st.lists(st.tuples(st.sampled_from(["alloc", "free", "give"]),
                                         st.sampled_from(SIZES[:8])),
                               min_size=1, max_size=60),
                      min_size=THREADS, max_size=THREADS),
       lockstep=st.booleans())
def test_threads_never_get_one_block_twice(C, plans, lockstep):
    """THREADS threads allocate, free their own blocks and free blocks other
    threads handed over ("give"), on one arena at once (the bindings release
    the GIL around each call). The model checks every pointer against every
    live block when it is returned (a thread removes a block from the model
    before it frees it, so a legal reuse is never flagged). With `lockstep`
    the threads take turns, so the order of operations is known and the
    peaks are exact too; free-running, the current values are exact once
    all threads have joined."""
    a = C.Arena(C.HostDevice(), planning=False)
    m = Model()
    lock = threading.Lock()
    handed: list[int] = []  # blocks given to any other thread to free
    turn = threading.Condition()
    state = {"turn": 0}
    errors: list[BaseException] = []
    longest = max(len(p) for p in plans)

    def worker(t: int) -> None:
        mine: list[int] = []
        try:
            for k in range(longest):
                if lockstep:
                    with turn:
                        turn.wait_for(lambda: state["turn"] >= k * THREADS + t)  # past it: a thread failed
                if k < len(plans[t]):
                    op, size = plans[t][k]
                    if op == "alloc":
                        p = a.allocate(size)
                        with lock:
                            m.alloc(p, size)
                        mine.append(p)
                    elif mine or (op == "free" and handed):
                        with lock:
                            if op == "give" and mine:
                                handed.append(mine.pop())
                                p = None
                            elif handed and (op == "free" or not mine):
                                p = handed.pop()
                            else:
                                p = mine.pop()
                            if p is not None:
                                del m.live[p]
                        if p is not None:
                            a.deallocate(p)
                if lockstep:
                    with turn:
                        state["turn"] += 1
                        turn.notify_all()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            if lockstep:
                with turn:
                    state["turn"] = 1 << 30
                    turn.notify_all()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    if lockstep:
        m.check(a)  # current and peak values
    else:
        cur = m.current()
        s = a.stats()
        for k, v in cur.items():
            assert s[k]["all"]["current"] == v
            assert s[k]["all"]["peak"] >= m.peak[k]
    a.check_invariants()
    for p in list(m.live):
        a.deallocate(p)
    a.flush_cache()
    a.check_invariants()
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0


def test_blocks_with_stream_uses_never_enter_the_cache(C):
    dev = C.SimDevice()
    a = C.Arena(dev, planning=False)
    side = dev.new_stream()
    keep = a.allocate(512 * KiB)
    p = a.allocate(512 * KiB)
    a.record_stream(p, side)
    dev.enqueue(side, 1)  # the side stream's work on p is not done
    a.deallocate(p)
    assert a.cached_blocks == 0
    assert a.stats()["renaissance"]["pending_bytes"]["current"] == 512 * KiB
    q = a.allocate(512 * KiB)
    assert q != p  # p waits on the side stream
    a.check_invariants()
    for x in (q, keep):
        a.deallocate(x)
    dev.run_all()
    a.empty_cache()
    a.check_invariants()


def test_the_cache_never_serves_another_stream(C):
    dev = C.SimDevice()
    a = C.Arena(dev, planning=False)
    s1 = dev.new_stream()
    keep0 = a.allocate(64 * KiB, 0)
    p = a.allocate(64 * KiB, 0)
    w = a.allocate(64 * KiB, s1)  # the peak is set here: what follows raises no peak
    a.deallocate(w)
    a.deallocate(p)
    assert a.cached_blocks == 2
    q = a.allocate(64 * KiB, s1)  # same size, other stream: not from stream 0's cache
    assert q == w and a.cached_blocks == 1
    r = a.allocate(64 * KiB, 0)
    assert r == p
    for x in (q, r, keep0):
        a.deallocate(x)
    a.flush_cache()
    a.check_invariants()


@pytest.mark.parametrize("expandable", [True, False])
def test_fit_guarantee_with_the_cache_filled_on_other_threads(C, expandable):
    """Four threads, one after another (so the outcome is known), allocate 8
    blocks of their own size and free them into their fronts, and stay alive
    (a thread's exit gives its front back); with those bytes still reserved,
    a request that fits in the limit minus the live bytes must succeed: the
    out-of-memory ladder folds every thread's front before it gives memory
    back."""
    limit = 24 * MiB
    a = C.Arena(C.HostDevice(), max_reserved_bytes=limit, expandable_segments=expandable,
                planning=False)
    keep = a.allocate(64)  # the one live block
    filled = [threading.Event() for _ in range(4)]
    done = threading.Event()
    errors: list[BaseException] = []

    def fill(t: int) -> None:
        try:
            if t:
                filled[t - 1].wait()
            size = (t + 1) * 128 * KiB
            ps = [a.allocate(size) for _ in range(8)]
            for p in ps:
                a.deallocate(p)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        filled[t].set()
        done.wait()

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    try:
        filled[3].wait()
        assert not errors, errors
        # Each thread's first allocation raised the peak, which folded the
        # fronts before it: the last thread's blocks are what is cached.
        assert (a.cached_blocks, a.cached_bytes) == (8, 8 * 512 * KiB)
        assert a.front_count == 5  # four threads and this one
        a.check_invariants()  # reads the fronts without folding them
        assert a.cached_blocks == 8
        big = 22 * MiB
        # What the fronts cache is reserved: big fits only once it goes back.
        assert a.cached_bytes + 64 + big > limit
        p = a.allocate(big)
        assert a.cached_blocks == 0
        a.check_invariants()
        a.deallocate(p)
    finally:
        done.set()
        for th in threads:
            th.join()
    a.deallocate(keep)
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    a.check_invariants()


def test_oom_is_still_raised_when_nothing_can_be_freed(C):
    a = C.Arena(C.HostDevice(), max_reserved_bytes=8 * MiB, planning=False)
    p = a.allocate(512)
    a.deallocate(p)
    assert a.cached_blocks == 1
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(9 * MiB)
    assert a.cached_blocks == 0
    a.check_invariants()


@pytest.mark.parametrize("expandable", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_threaded_stress_keeps_every_invariant(C, expandable, seed):
    """Four C++ threads at once (no GIL), 3,000 seeded operations each:
    allocate (mostly sizes the fronts serve), free their own blocks, give
    blocks to another thread to free (a free of a block another thread's
    front holds), with thread 0 checking the invariants while the others run.
    The loop itself checks that no block is handed out while a live block
    overlaps it and that no live block was overwritten. Afterwards every
    thread has exited (its front given back), nothing is live, the
    cumulative counts equal the loop's own, and the invariants hold."""
    a = C.Arena(C.HostDevice(), expandable_segments=expandable, planning=False)
    allocs, requested, given = C.stress_threads(a, 4, 3000, seed)
    assert given > 0  # cross-thread frees happened
    assert a.front_count == 0  # every worker's front went back at its exit
    a.check_invariants()
    s = a.stats()
    assert s["allocation"]["all"]["current"] == 0
    assert s["allocated_bytes"]["all"]["current"] == 0
    assert s["requested_bytes"]["all"]["current"] == 0
    assert s["allocation"]["all"]["allocated"] == allocs
    assert s["allocation"]["all"]["freed"] == allocs
    assert s["requested_bytes"]["all"]["allocated"] == requested
    assert s["requested_bytes"]["all"]["freed"] == requested
    assert s["active_bytes"]["all"]["current"] == 0
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    a.check_invariants()


def test_a_thread_exit_gives_its_front_back(C):
    """A C++ thread (joined, so its thread-local destructors have run) that
    freed blocks into its front leaves nothing cached and no front behind;
    stats equal a fresh count."""
    a = C.Arena(C.HostDevice(), planning=False)
    C.bench_pairs(a, 512, 100, 2)  # two threads, each with a front of its own
    assert a.front_count == 0
    assert a.cached_blocks == 0
    a.check_invariants()
    s = a.stats()
    assert s["allocation"]["all"]["allocated"] == 200
    assert s["allocation"]["all"]["current"] == 0
    assert s["allocation"]["all"]["peak"] in (1, 2)  # the two threads overlap or not


def test_a_front_books_a_smaller_request_exactly(C):
    """A thread's front hands a cached block to a request of the same rounded
    size only within the block's booked requested bytes, and a fold books
    the smaller request: requested bytes (current, peak, cumulative) are
    exactly what they would be without the front (hand-computed here)."""
    a = C.Arena(C.HostDevice(), planning=False)
    keep = a.allocate(512)
    p = a.allocate(512)
    a.deallocate(p)  # into this thread's front
    assert a.cached_blocks == 1
    q = a.allocate(500)  # 500 <= 512 booked, same rounded size: the front's block
    assert q == p and a.cached_blocks == 0
    a.check_invariants()  # checks the true values, without folding
    s = a.stats()["requested_bytes"]["all"]  # folds
    assert (s["current"], s["peak"], s["allocated"], s["freed"]) == (1012, 1024, 1524, 512)
    a.deallocate(q)  # still held by the front after the fold: cached again, booked 500
    assert a.cached_blocks == 1
    r = a.allocate(510)  # more than the 500 booked: not served by the front
    s = a.stats()["requested_bytes"]["all"]
    assert (s["current"], s["peak"], s["allocated"], s["freed"]) == (1022, 1024, 2034, 1012)
    assert a.stats()["allocated_bytes"]["all"]["peak"] == 1024
    for x in (r, keep):
        a.deallocate(x)
    a.check_invariants()
