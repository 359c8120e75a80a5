"""The arena's contract, run against every kind of arena (as RMM runs one suite
against every memory resource): {HostDevice, SimDevice} x {expandable, fixed
segments} x {planning on, off} x {stream policy defer, wait} = 16 arenas.

Each arena is driven by the reference-model fuzz of ``tests/arena_fuzz.py``
(disjoint live ranges, exact stats, intact bytes, stream ordering) with
``check_invariants()`` every 100 operations, and by the contract's fixed
cases: zero bytes, alignment, bad pointers, impossible sizes, peak resets,
empty_cache, and planned steps (replayed at the same addresses when planning
is on; never planned when it is off)."""
from __future__ import annotations

import itertools

import pytest
import torch

from arena_fuzz import Fuzz

MiB = 1 << 20
COMBOS = list(itertools.product(("host", "sim"), (True, False), (True, False), ("defer", "wait")))


def _id(combo) -> str:
    device, expandable, planning, policy = combo
    return (f"{device}-{'expandable' if expandable else 'fixed'}-"
            f"{'planning' if planning else 'unplanned'}-{policy}")


class Subject:
    """One arena of the contract and what the tests need to know about it."""

    def __init__(self, C, device: str, expandable: bool, planning: bool, policy: str):
        self.C, self.kind, self.expandable, self.planning, self.policy = (
            C, device, expandable, planning, policy)
        self.device = C.HostDevice() if device == "host" else C.SimDevice()
        if device == "sim":
            self.device.set_address_ranges(expandable)
        self.alignment = 64 if device == "host" else 512
        self.arena = C.Arena(self.device, expandable_segments=expandable, planning=planning,
                             stream_policy=policy, plan_budget_seconds=0.0)

    def current(self, stat: str = "allocated_bytes") -> int:
        return self.arena.stats()[stat]["all"]["current"]


@pytest.fixture(params=COMBOS, ids=[_id(c) for c in COMBOS])
def combo(request):
    return request.param


@pytest.fixture
def subject(C, combo):
    s = Subject(C, *combo)
    yield s
    s.arena.check_invariants()  # whatever the test did, the arena is consistent


def test_the_suite_covers_all_sixteen_arenas():
    assert len(set(COMBOS)) == 16


def test_fuzz_against_the_reference_model(C, combo):
    device, expandable, planning, policy = combo
    f = Fuzz(C, seed=100 + COMBOS.index(combo), policy=policy, expandable=expandable,
             device=device, planning=planning)
    f.run(700, check_every=100)
    s = f.arena.stats()
    r = s["renaissance"]
    assert s["allocated_bytes"]["all"]["current"] == f.allocated
    assert f.steps >= 10  # the run had marked steps of several keys
    if planning:
        assert r["steps"] == f.steps, r
        assert r["plans"] >= 1 and r["planned_steps"] >= 1 and r["planned_hits"] >= 1, r
    else:
        assert r["steps"] == 0 and r["plans"] == 0 and r["planned_steps"] == 0, r
        assert r["planned_requests"] == 0 and r["planned_hits"] == 0, r


def test_zero_bytes_is_null_and_changes_nothing(subject):
    before = subject.arena.stats()
    assert subject.arena.allocate(0) == 0
    assert subject.arena.stats() == before


def test_blocks_are_aligned_disjoint_and_counted(subject):
    a = subject.arena
    sizes = [1, 63, 64, 511, 513, 4096, 1 << 20, (1 << 20) + 1, 3 * MiB + 7, 12 * MiB]
    ptrs = [a.allocate(n) for n in sizes]
    spans = []
    for p, n in zip(ptrs, sizes):
        size = a.block_size(p)
        assert p % subject.alignment == 0 and size % subject.alignment == 0
        assert n <= size
        spans.append((p, p + size))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert subject.current() == sum(e - s for s, e in spans)
    assert subject.current("allocation") == len(sizes)
    assert subject.current("requested_bytes") == sum(sizes)
    for p in ptrs:
        a.deallocate(p)
    assert subject.current() == 0 and subject.current("allocation") == 0


def test_bad_pointers_raise_and_change_nothing(subject):
    a, C = subject.arena, subject.C
    p = a.allocate(1000)
    before = a.stats()
    for bad in (p + subject.alignment, p + 1, 0x10, p + (1 << 40)):
        with pytest.raises(C.InvalidPointerError):
            a.deallocate(bad)
    assert a.stats() == before
    a.deallocate(p)
    after_free = a.stats()
    with pytest.raises(C.InvalidPointerError):
        a.deallocate(p)  # double free
    assert a.stats() == after_free


def test_an_impossible_size_is_out_of_memory(subject):
    a = subject.arena
    keep = a.allocate(4096)
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(1 << 62)
    s = a.stats()
    assert s["num_ooms"] == 1
    assert s["allocated_bytes"]["all"]["current"] == a.block_size(keep)
    a.deallocate(keep)


def test_resetting_peaks_keeps_current_values(subject):
    a = subject.arena
    p, q = a.allocate(3 * MiB), a.allocate(5000)
    a.deallocate(p)
    s = a.stats()
    peak = s["allocated_bytes"]["all"]["peak"]
    assert peak >= s["allocated_bytes"]["all"]["current"] + 3 * MiB
    a.reset_peak_stats()
    t = a.stats()
    for key in ("allocated_bytes", "reserved_bytes", "allocation", "segment", "active_bytes"):
        assert t[key]["all"]["current"] == s[key]["all"]["current"], key
        assert t[key]["all"]["peak"] == t[key]["all"]["current"], key
    a.deallocate(q)


def test_empty_cache_returns_what_is_free(subject):
    a = subject.arena
    ptrs = [a.allocate(n) for n in (700, 2 * MiB, 9 * MiB, 30 * MiB)]
    assert subject.current("reserved_bytes") > 0
    for p in ptrs:
        a.deallocate(p)
    a.empty_cache()
    assert subject.current("reserved_bytes") == 0 and subject.current("segment") == 0


def test_marked_steps_replay_when_planning(subject):
    a = subject.arena
    program = [(3 * MiB, 2), (4096, 1), (700, 3), (6 * MiB, 1), (100_000, 2)]  # (size, lifetime)
    addresses = []
    for _ in range(4):
        a.begin_step(1)
        live, got = [], []
        for j, (n, life) in enumerate(program):
            p = a.allocate(n)
            got.append(p)
            live.append((p, j + life))
            for q, t in [x for x in live if x[1] <= j]:
                live.remove((q, t))
                a.deallocate(q)
        for q, _ in live:
            a.deallocate(q)
        a.end_step()
        if subject.planning and not addresses:  # README: steps are counted from 1
            assert a.last_step()["step"] == 1 and a.stats()["renaissance"]["steps"] == 1
        addresses.append(got)
        assert subject.current() == 0
    r = a.stats()["renaissance"]
    if subject.planning:
        assert r["steps"] == 4, r
        assert r["plans"] >= 1 and r["planned_steps"] >= 2, r
        assert r["last_step_hits"] == len(program) and r["planned_misses"] == 0, r
        assert addresses[-1] == addresses[-2]  # replayed at the planned offsets
    else:
        assert r["steps"] == 0 and r["plans"] == 0 and r["planned_steps"] == 0, r
        assert r["planned_hits"] == 0, r


def test_the_debug_hook_checks_after_every_operation(C, subject):
    """TR_DEBUG=3 (``make test-debug``): check_invariants() runs after every
    public operation; a release build (level 0) compiles the hook out."""
    import os

    expected = os.environ.get("TR_EXPECT_DEBUG_LEVEL")
    if expected is not None:
        assert C.debug_level == int(expected)
    a = subject.arena
    before = C.debug_invariant_checks()
    ptrs = [a.allocate(n) for n in (100, 5000, 3 * MiB)]
    for p in ptrs:
        a.deallocate(p)
    a.empty_cache()
    checks = C.debug_invariant_checks() - before
    if C.debug_level >= 3:
        assert checks >= 7  # 3 allocations, 3 frees, 1 empty_cache
    else:
        assert checks == 0
