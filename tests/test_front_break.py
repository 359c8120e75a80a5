"""Adversarial use of the per-thread fronts' fast paths (issue 14, s10: the direct map from the
default stream's sizes to bins, and the inline ``front_allocate_direct`` /
``front_deallocate_direct``; docs/design.md "Per-thread fronts").

What tests/test_front_model.py does not reach:

* sizes at and around every rounding boundary (0, 1, unit - 1, unit, unit + 1, ..., 1 MiB - 1,
  1 MiB, 1 MiB + 1, 8 MiB +- 1) and impossible ones (2**62, 2**64 - 1) that must raise the
  documented error and leave the arena as it was;
* devices whose rounding unit is under 64 B (a ``SimDevice`` of alignment 1 or 16), where the
  direct map covers only the default stream's small sizes and the rest of that stream's keys
  take the probe window, so one stream's keys go both ways;
* double frees and interior pointers of blocks a front caches or serves, ``set_fronts``
  toggled, ``flush_cache`` / ``empty_cache`` / ``snapshot`` / ``largest_free_block`` /
  ``reset_peak_stats`` between any two operations, with the stats (current and peak) checked
  against the test's own count at every read;
* several Python threads at once (the bindings release the GIL), freeing each other's blocks,
  and threads that exit while their fronts hold cached blocks, with every live range checked
  against every other at each allocation.

A front whose direct map ignored the arena's unit (entries by 64 B, as ``bin_home`` hashes:
``unit_shift = 6``) passes tests/test_front_model.py (units of 64 and 512 B) and fails here: the
sim1 and sim16 state machines and the sim16 thread run (a bin holding a block of another size),
checked by hand on 40bf3a3 with that one line changed.
"""
from __future__ import annotations

import bisect
import ctypes
import queue
import random
import threading
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

KiB = 1 << 10
MiB = 1 << 20


def boundary_sizes(unit: int) -> list[int]:
    """Sizes at and around every rounding boundary the fronts care about."""
    out = {0, 1, 2, 63, 64, 65, 511, 512, 513}
    for base in (unit, 2 * unit, 3 * unit, 64 * unit, 4 * KiB, 64 * KiB, 256 * KiB, 262160,
                 512 * KiB, MiB, 8 * MiB):
        out.update({base - 1, base, base + 1})
    return sorted(x for x in out if x >= 0)


class Ranges:
    """Live ranges of one arena, sorted by start: an allocation that overlaps one fails."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: dict[int, int] = {}

    def add(self, p: int, n: int) -> None:
        assert p % 1 == 0 and n > 0
        i = bisect.bisect_left(self.starts, p)
        if i < len(self.starts):
            assert self.starts[i] >= p + n, f"{p:#x}+{n} overlaps the live block at {self.starts[i]:#x}"
        if i > 0:
            q = self.starts[i - 1]
            assert self.ends[q] <= p, f"{p:#x}+{n} overlaps the live block at {q:#x}"
        self.starts.insert(i, p)
        self.ends[p] = p + n

    def remove(self, p: int) -> None:
        self.starts.pop(bisect.bisect_left(self.starts, p))
        del self.ends[p]


DEVICES = {
    "host": lambda C: (C.HostDevice(), [0]),
    "sim512": lambda C: (lambda d: (d, [0, d.new_stream()]))(C.SimDevice()),
    # A unit under 64 B: the default stream's keys of 16,385 units and more take the probe
    # window, the smaller ones the direct map.
    "sim16": lambda C: (lambda d: (d, [0, d.new_stream()]))(C.SimDevice(0, 16)),
    "sim1": lambda C: (C.SimDevice(0, 1), [0]),
}


def make_machine(C, device: str):
    class FrontBreak(RuleBasedStateMachine):
        """One thread, one arena: every operation against a model of live blocks and stats."""

        @initialize()
        def setup(self):
            dev, self.streams = DEVICES[device](C)
            self.dev = dev
            self.a = C.Arena(dev, planning=False, expandable_segments=device != "sim1")
            self.unit = self.a.rounding
            self.sizes = boundary_sizes(self.unit)
            self.live: dict[int, tuple[int, int, int, int]] = {}  # ptr -> (block, requested, stream, byte)
            self.freed: list[int] = []  # pointers freed and not handed out since
            self.ranges = Ranges()
            self.peak = [0, 0, 0]

        def current(self):
            return [len(self.live), sum(v[0] for v in self.live.values()),
                    sum(v[1] for v in self.live.values())]

        def _alloc(self, n: int, stream: int):
            before = self.current()
            p = self.a.allocate(n, stream)
            if n == 0:
                assert p == 0
                return
            assert p != 0 and p % min(self.unit, 64) == 0, p
            b = self.a.block_size(p)
            assert b >= -(-n // self.unit) * self.unit, (n, b)
            self.ranges.add(p, b)
            assert p not in self.live
            byte = (p >> 6) & 0xFF or 1
            ctypes.memset(p, byte, min(b, 64))
            self.live[p] = (b, n, stream, byte)
            if p in self.freed:
                self.freed.remove(p)
            assert self.current()[0] == before[0] + 1
            self.peak = [max(x, y) for x, y in zip(self.peak, self.current())]

        @rule(k=st.integers(0, 10 ** 6), stream_i=st.integers(0, 3))
        def allocate_boundary(self, k, stream_i):
            n = self.sizes[k % len(self.sizes)]
            self._alloc(n, self.streams[stream_i % len(self.streams)])

        @rule(k=st.integers(0, 7), d=st.sampled_from([-1, 0, 0, 0, 1]), stream_i=st.integers(0, 3))
        def allocate_cycling(self, k, d, stream_i):
            # Few blocks a size, many sizes: bins change keys all the time.
            n = max(1, (k + 1) * 3 * self.unit + 17 * k * self.unit + d)
            self._alloc(n, self.streams[stream_i % len(self.streams)])

        @rule(m=st.integers(1, 5), d=st.sampled_from([-1, 0, 1]), stream_i=st.integers(0, 3),
              keep=st.booleans())
        def churn_adjacent(self, m, d, stream_i, keep):
            # Adjacent rounded sizes (m units, +- 1 byte) are distinct keys: allocated and
            # freed at once, each becomes a front bin's key next to the others'.
            stream = self.streams[stream_i % len(self.streams)]
            self._alloc(max(1, m * self.unit + d), stream)
            if not keep:
                self.free(0, lifo=True)

        @rule(n=st.sampled_from([1 << 62, (1 << 64) - 1, 1 << 63]))
        def allocate_impossible(self, n):
            import torch

            s = self.a.stats()["allocated_bytes"]["all"]["current"]
            with pytest.raises(torch.OutOfMemoryError):
                self.a.allocate(n)
            assert self.a.stats()["allocated_bytes"]["all"]["current"] == s

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 10 ** 6), lifo=st.booleans())
        def free(self, i, lifo):
            ptrs = list(self.live)
            p = ptrs[-1] if lifo else ptrs[i % len(ptrs)]
            b, n, stream, byte = self.live.pop(p)
            assert ctypes.string_at(p, min(b, 64)) == bytes([byte]) * min(b, 64), "overwritten"
            self.ranges.remove(p)
            self.a.deallocate(p)
            self.freed.append(p)

        @precondition(lambda self: self.freed)
        @rule(i=st.integers(0, 10 ** 6))
        def double_free(self, i):
            p = self.freed[i % len(self.freed)]
            if p in self.live:
                return
            with pytest.raises(C.InvalidPointerError):
                self.a.deallocate(p)
            with pytest.raises(C.InvalidPointerError):
                self.a.block_size(p)

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 10 ** 6))
        def interior_free(self, i):
            ptrs = list(self.live)
            p = ptrs[i % len(ptrs)]
            if self.live[p][0] <= 1:
                return
            with pytest.raises(C.InvalidPointerError):
                self.a.deallocate(p + 1)

        @precondition(lambda self: self.live and len(self.streams) > 1)
        @rule(i=st.integers(0, 10 ** 6), run=st.booleans())
        def record_stream(self, i, run):
            # A stream use: the block stops being held by a front, and its free waits.
            ptrs = list(self.live)
            p = ptrs[i % len(ptrs)]
            other = self.streams[1] if self.live[p][2] == 0 else 0
            self.a.record_stream(p, other)
            if run:
                self.dev.run_all()

        @rule(on=st.booleans())
        def set_fronts(self, on):
            self.a.set_fronts(on)

        @rule(which=st.sampled_from(["flush", "empty", "snapshot", "largest", "reset_peak",
                                     "check"]))
        def read_or_release(self, which):
            a = self.a
            if which == "flush":
                a.flush_cache()
            elif which == "empty":
                a.empty_cache()
            elif which == "snapshot":
                live = {blk["address"]: blk["size"] for seg in a.snapshot() for blk in seg["blocks"]
                        if blk["state"] == "active_allocated"}
                assert live == {p: v[0] for p, v in self.live.items()}
            elif which == "largest":
                a.largest_free_block()
            elif which == "reset_peak":
                a.reset_peak_stats()
                self.peak = self.current()
            else:
                a.check_invariants()

        @invariant()
        def stats_exact(self):
            if not hasattr(self, "a"):
                return
            self.a.check_invariants()  # without a fold: the fronts' bins and direct maps as they are
            s = self.a.stats()
            cur = self.current()
            for k, name in enumerate(["allocation", "allocated_bytes", "requested_bytes"]):
                assert s[name]["all"]["current"] == cur[k], (name, s[name]["all"], cur[k])
                assert s[name]["all"]["peak"] == self.peak[k], (name, s[name]["all"], self.peak[k])

        def teardown(self):
            if not hasattr(self, "a"):
                return
            self.a.check_invariants()
            for p in list(self.live):
                self.a.deallocate(p)
            self.a.flush_cache()
            self.a.check_invariants()
            assert self.a.stats()["allocation"]["all"]["current"] == 0

    return FrontBreak


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_front_fast_paths_against_a_model(C, device):
    machine = make_machine(C, device)
    machine.TestCase.settings = settings(max_examples=25, stateful_step_count=60, deadline=None,
                                         derandomize=True,
                                         suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()


def run_threads(C, dev, streams, seed, threads=4, rounds=6, ops=150, exiters=2):
    """``threads`` Python threads allocate (boundary sizes and a few hot ones), free their own
    blocks and blocks other threads gave them, on one arena; ``exiters`` more threads fill
    their fronts and exit while the others run. The main thread, meanwhile, runs
    check_invariants / flush_cache / empty_cache / snapshot / stats; after each round every
    thread waits at a barrier and the stats are compared with the test's count."""
    a = C.Arena(dev, planning=False)
    unit = a.rounding
    sizes = [n for n in boundary_sizes(unit) if 0 < n <= 8 * MiB + 1]
    hot = [512, 4 * KiB, 64 * KiB, MiB, 3 * unit, 7 * unit + 1]
    lock = threading.Lock()
    ranges = Ranges()
    live: dict[int, tuple[int, int]] = {}  # ptr -> (block bytes, requested)
    inboxes = [queue.SimpleQueue() for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def take(p):
        with lock:
            ranges.remove(p)
            del live[p]

    def put(p, n, b):
        with lock:
            ranges.add(p, b)
            live[p] = (b, n)

    def worker(t):
        rng = random.Random(seed * 100 + t)
        mine: list[int] = []
        try:
            for r in range(rounds):
                for _ in range(ops):
                    x = rng.random()
                    if x < 0.5 or not mine:
                        n = rng.choice(hot) if rng.random() < 0.6 else rng.choice(sizes)
                        p = a.allocate(n, rng.choice(streams))
                        put(p, n, a.block_size(p))
                        mine.append(p)
                    elif x < 0.85:
                        p = mine.pop(rng.randrange(len(mine)) if rng.random() < 0.3 else -1)
                        take(p)
                        a.deallocate(p)
                    else:
                        inboxes[rng.randrange(threads)].put(mine.pop())
                    while True:
                        try:
                            p = inboxes[t].get_nowait()
                        except queue.Empty:
                            break
                        take(p)
                        a.deallocate(p)
                barrier.wait(timeout=120)  # the main thread checks
                barrier.wait(timeout=120)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            barrier.abort()
        finally:
            for p in mine:
                inboxes[(t + 1) % threads].put(p)

    def exiter(t):
        rng = random.Random(seed * 1000 + t)
        try:
            got = []
            for _ in range(40):
                n = rng.choice(hot)
                p = a.allocate(n)
                put(p, n, a.block_size(p))
                got.append(p)
            for p in got:  # into this thread's front: cached when the thread exits
                take(p)
                a.deallocate(p)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ws = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    xs = [threading.Thread(target=exiter, args=(t,)) for t in range(exiters)]
    for th in ws + xs:
        th.start()
    rng = random.Random(seed)
    try:
        for r in range(rounds):
            while (barrier.n_waiting < threads or any(x.is_alive() for x in xs)) and not errors:
                op = rng.choice(["check", "flush", "empty", "snapshot", "stats", "largest",
                                 "fronts"])
                if op == "fronts":
                    a.set_fronts(rng.random() < 0.7)  # off: folded while the workers run
                elif op == "check":
                    a.check_invariants()
                elif op == "flush":
                    a.flush_cache()
                elif op == "empty":
                    a.empty_cache()
                elif op == "snapshot":
                    a.snapshot()
                elif op == "stats":
                    a.stats()
                else:
                    a.largest_free_block()
            if errors:
                break
            a.set_fronts(True)
            barrier.wait(timeout=120)
            # Every worker waits: the arena is still.
            s = a.stats()
            with lock:
                cur = [len(live), sum(v[0] for v in live.values()), sum(v[1] for v in live.values())]
            for k, name in enumerate(["allocation", "allocated_bytes", "requested_bytes"]):
                assert s[name]["all"]["current"] == cur[k], (r, name, s[name]["all"], cur[k])
            a.check_invariants()
            barrier.wait(timeout=120)
    except BaseException:
        barrier.abort()
        raise
    finally:
        for th in ws + xs:
            th.join(timeout=120)
    if errors:
        raise errors[0]
    # What the workers left in their inboxes.
    for q in inboxes:
        while True:
            try:
                p = q.get_nowait()
            except queue.Empty:
                break
            take(p)
            a.deallocate(p)
    assert not live
    # The workers' and exiters' fronts go back at their threads' exit (C++ thread-local
    # destructors, which run after Python's join() returns); the main thread may have one.
    for _ in range(1000):
        if a.front_count <= 1:
            break
        time.sleep(0.01)
    assert a.front_count <= 1
    a.check_invariants()
    a.flush_cache()
    s = a.stats()
    assert s["allocation"]["all"]["current"] == 0 and s["requested_bytes"]["all"]["current"] == 0
    a.check_invariants()


@pytest.mark.parametrize("device,seed", [("host", 1), ("sim512", 2), ("sim16", 3)])
def test_python_threads_share_an_arena(C, device, seed):
    dev, streams = DEVICES[device](C)
    run_threads(C, dev, streams, seed)


TORCH_THREADS = r'''
import json, queue, random, sys, threading
import torch
import torch_renaissance as tr
from torch_renaissance.installer import active_arena

tr.install("cpu", planning=False)
a = active_arena("cpu")
sizes = sorted({n for b in (1, 63, 64, 65, 4096, 65536, 1 << 20, 8 << 20) for n in (b - 1, b, b + 1) if n > 0})
T, OPS = 4, 300
boxes = [queue.SimpleQueue() for _ in range(T)]
errors = []

def check(t):
    x, v = t
    assert bool((x == v).all()), "a live tensor's bytes changed"

def worker(k):
    rng = random.Random(k)
    mine = []
    try:
        for i in range(OPS):
            r = rng.random()
            if r < 0.5 or not mine:
                v = rng.randrange(256)
                x = torch.full((rng.choice(sizes),), v, dtype=torch.uint8)
                mine.append((x, v))
            elif r < 0.8:
                check(mine.pop(rng.randrange(len(mine))))
            else:
                boxes[rng.randrange(T)].put(mine.pop())
            while True:
                try:
                    check(boxes[k].get_nowait())  # freed by this thread: another's front may hold it
                except queue.Empty:
                    break
            if i % 50 == 0:
                for t in mine:
                    check(t)
    except BaseException as e:
        errors.append(repr(e))
    finally:
        for t in mine:
            check(t)

ths = [threading.Thread(target=worker, args=(k,)) for k in range(T)]
for t in ths: t.start()
for _ in range(20):
    a.check_invariants(); a.stats(); a.flush_cache()
for t in ths: t.join()
for b in boxes:
    while True:
        try: check(b.get_nowait())
        except queue.Empty: break
a.check_invariants()
oom = None
try:
    torch.empty(1 << 62, dtype=torch.uint8)
except torch.OutOfMemoryError as e:
    oom = str(e)[:80]
a.check_invariants()
y = torch.ones(1 << 20)
print(json.dumps({"errors": errors, "oom": oom, "ok": float(y.sum())}))
'''


def test_torch_cpu_tensors_on_threads_under_install():
    """Under ``tr.install("cpu")`` every CPU tensor comes from the arena (through
    ``Arena::allocate(n, 0)``, so the fronts' direct path): four Python threads create
    boundary-sized tensors, keep them, free them, and hand them to each other to free; every
    tensor still holds its own bytes when freed, and an impossible size raises
    ``torch.OutOfMemoryError`` with the arena intact."""
    from conftest import run_json

    out = run_json(TORCH_THREADS, timeout=120)
    assert out["errors"] == []
    assert out["oom"] and "out of memory" in out["oom"]
    assert out["ok"] == float(1 << 20)


@pytest.mark.parametrize("alignment,seed", [(16, 1), (512, 2)])
def test_eight_cpp_threads_on_units_of_16_and_512(C, alignment, seed):
    """``stress_threads`` (8 C++ threads at once, no GIL: the fronts' fast paths really run
    side by side, with cross-thread frees and thread 0 checking invariants meanwhile) on a
    SimDevice of 16 B units, where the default stream's keys use both the direct map and the
    probe window, and of 512 B units; tests/test_free_cache.py runs it on HostDevice only. (Not
    on 1 B units: the loop writes an 8-byte tag into every block, so a 1-byte request's block
    is too small for it.)"""
    a = C.Arena(C.SimDevice(0, alignment), planning=False)
    allocs, requested, given = C.stress_threads(a, 8, 1500, seed)
    assert given > 0
    a.check_invariants()
    s = a.stats()
    assert s["allocation"]["all"]["current"] == 0 and s["requested_bytes"]["all"]["current"] == 0
    assert s["allocation"]["all"]["allocated"] == allocs
    assert s["requested_bytes"]["all"]["allocated"] == requested
    for _ in range(1000):  # the workers' fronts go back at their exit
        if a.front_count == 0:
            break
        time.sleep(0.01)
    assert a.front_count == 0
