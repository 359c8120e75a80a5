"""Memory under pressure (interior holes, recorded steps, the out-of-memory ladder,
completed stream work, pool geometry, the memory-fraction limit): the cases as the
bug reports gave them, and the fit guarantee as a hypothesis property.

The arena is driven through the bindings on ``HostDevice`` (64 KiB granules,
``csrc/core/host_device.h``) and ``SimDevice`` (2 MiB granules, like CUDA's
VMM); ``max_reserved_bytes`` stands in for the device's memory. Address
ranges cost no memory until mapped and the tests never touch the memory, so
multi-GiB limits run on a small machine.
"""
from __future__ import annotations

import textwrap
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_json

MiB = 1 << 20
GiB = 1 << 30
HOST_GRANULE = 64 << 10  # HostRanges::kHostGranularity
SIM_GRANULE = 2 << 20    # HostRanges::kDeviceGranularity


def cur(a, key="reserved_bytes"):
    return a.stats()[key]["all"]["current"]


def peak(a, key="reserved_bytes"):
    return a.stats()[key]["all"]["peak"]


def devices(C):
    return [("host", C.HostDevice, HOST_GRANULE), ("sim", C.SimDevice, SIM_GRANULE)]


# --- interior holes -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["host", "sim"])
def test_interior_holes_are_unmapped_by_empty_cache(C, kind):
    make = C.HostDevice if kind == "host" else C.SimDevice
    a = C.Arena(make(), max_reserved_bytes=1024 * MiB)
    xs = [a.allocate(16 * MiB) for _ in range(40)]
    for p in xs[::2]:
        a.deallocate(p)           # 320 MiB live, 320 MiB of holes
    a.empty_cache()
    # 16 MiB blocks are whole granules: nothing but the live bytes stays.
    assert cur(a) == 320 * MiB == cur(a, "allocated_bytes")
    big = a.allocate(512 * MiB)   # 320 + 512 <= 1024
    assert cur(a) == 832 * MiB
    a.check_invariants()
    # The holes are mapped again when they are used: the memory is writable.
    a.deallocate(big)
    again = [a.allocate(16 * MiB) for _ in range(20)]
    assert cur(a, "allocated_bytes") == 640 * MiB
    a.check_invariants()
    for p in again + xs[1::2]:
        a.deallocate(p)
    a.empty_cache()
    assert cur(a) == 0


def test_interior_holes_issue_repro_through_install():
    # The issue's own steps, through install() and torch.empty; the holes are
    # also written to once mapped again (a fault there would kill the child).
    out = run_json(textwrap.dedent("""
        import json, torch, torch_renaissance as tr
        MiB = 1 << 20
        tr.install("cpu", max_reserved_mb=1024)
        xs = [torch.empty(16 * MiB, dtype=torch.uint8) for _ in range(40)]
        for i in range(0, 40, 2):
            xs[i] = None
        tr.empty_cache()
        after = tr.memory_stats()["reserved_bytes.all.current"]
        y = torch.empty(512 * MiB, dtype=torch.uint8)
        y[::4096] = 1
        del y
        zs = [torch.full((16 * MiB,), 7, dtype=torch.uint8) for _ in range(20)]
        ok = all(int(z[::65536].sum()) == 7 * 256 for z in zs)
        print(json.dumps({"after": after, "ok": ok,
                          "ooms": tr.memory_stats()["num_ooms"]}))
    """))
    assert out == {"after": 320 * MiB, "ok": True, "ooms": 0}


def test_pytorch_35901_passes_in_the_default_configuration(C):
    # PyTorch #35901 with C = 4 GiB: allocate 0.4 C, free it; 200 x 16 MiB,
    # free every other one; allocate 0.4 C again.
    cap = 4 * GiB
    a = C.Arena(C.HostDevice(), max_reserved_bytes=cap)
    big = int(0.4 * cap)
    a.deallocate(a.allocate(big))
    xs = [a.allocate(16 * MiB) for _ in range(200)]
    for p in xs[::2]:
        a.deallocate(p)
    y = a.allocate(big)
    assert y
    assert peak(a) <= big + 100 * 16 * MiB + 64 * MiB
    s = a.stats()
    assert s["num_ooms"] == 0
    a.check_invariants()


def test_fixed_segments_give_back_wholly_free_segments_only(C):
    # Fixed segments cannot return part of a segment: the holes between live
    # 16 MiB segments are whole segments and go back; nothing else can.
    a = C.Arena(C.HostDevice(), expandable_segments=False, max_reserved_bytes=1024 * MiB)
    xs = [a.allocate(16 * MiB) for _ in range(40)]  # >= 10 MiB: one segment each
    for p in xs[::2]:
        a.deallocate(p)
    a.empty_cache()
    assert cur(a) == 320 * MiB
    a.allocate(512 * MiB)
    a.check_invariants()


# --- recorded steps -------------------------------------------------------------------


def _step_35901(a, cap, n=200, size=16 * MiB):
    big = int(0.4 * cap)
    a.deallocate(a.allocate(big))
    xs = [a.allocate(size) for _ in range(n)]
    for p in xs[::2]:
        a.deallocate(p)
    y = a.allocate(big)
    for p in xs[1::2]:
        a.deallocate(p)
    a.deallocate(y)


def test_recorded_steps_peak_near_the_planned_steady_state(C):
    # The #35901 scenario as 6 steps with C = 8 GiB: steps 0 and 1 are served
    # by the dynamic pool (recorded), steps 2.. replay the plan.
    cap = 8 * GiB
    a = C.Arena(C.HostDevice(), max_reserved_bytes=cap)
    peaks = []
    for _ in range(6):
        a.reset_peak_stats()
        a.begin_step()
        _step_35901(a, cap)
        a.end_step()
        peaks.append(peak(a))
    r = a.stats()["renaissance"]
    assert r["planned_steps"] >= 3 and r["planned_hits"] > 0
    load = int(0.4 * cap) + 100 * 16 * MiB   # live at the second big allocation
    steady = max(peaks[3:])
    assert steady <= 1.01 * load
    assert max(peaks[:2]) <= 1.10 * steady, (peaks, steady)
    assert a.stats()["num_ooms"] == 0


def test_recorded_steps_peak_near_the_planned_steady_state_fixed_segments(C):
    # The same with expandable_segments=False. Step 0's 16 MiB requests used
    # to split the cached 0.4 C segment (PyTorch's best fit does too): the
    # second 0.4 C then needed a segment of its own, 6,554 MiB against a
    # steady state of 4,877 (1.34x). Under a limit the large cached segment is
    # not split for a small request and is given back before a growth raises
    # the peak, so the recorded steps hold what the planned ones do.
    cap = 8 * GiB
    a = C.Arena(C.HostDevice(), expandable_segments=False, max_reserved_bytes=cap)
    peaks = []
    for _ in range(6):
        a.reset_peak_stats()
        a.begin_step()
        _step_35901(a, cap)
        a.end_step()
        peaks.append(peak(a))
    r = a.stats()["renaissance"]
    assert r["planned_steps"] >= 3 and r["planned_hits"] > 0
    load = int(0.4 * cap) + 100 * 16 * MiB
    steady = max(peaks[3:])
    assert steady <= 1.01 * load + 2 * MiB, (peaks, load)   # the territory is 2 MiB-rounded
    assert max(peaks[:2]) <= 1.10 * steady, (peaks, steady)
    assert a.stats()["num_ooms"] == 0
    a.check_invariants()


def test_fixed_segments_reuse_after_the_pattern_repeats_under_a_limit(C):
    # planning=False, fixed segments: the #35901 pattern twice in one arena.
    # The second time used to OOM (the 16 MiB requests split the cached
    # 0.4 C segment, and the split one could not be given back).
    cap = 4 * GiB
    a = C.Arena(C.HostDevice(), expandable_segments=False, max_reserved_bytes=cap, planning=False)
    for _ in range(2):
        a.reset_peak_stats()
        _step_35901(a, cap)
        assert peak(a) <= int(0.4 * cap) + 100 * 16 * MiB + 64 * MiB
    assert a.stats()["num_ooms"] == 0
    a.check_invariants()


KiB = 1 << 10


def _varlen_fixed(C, planning, steps=30):
    """A training loop whose lengths grow every step (every step a new plan),
    on fixed segments: small parameters and optimizer state made once (the
    state under the persistent hint, as the torch glue marks optimizer
    steps), gradients kept from one step to the next, activations and
    temporaries that grow with the length (all at most 1 MiB: small pool).
    Returns, per step, (peak reserved, peak allocated, the large pool's peak
    reserved, the small pool's, plan_bytes), and what stays reserved once
    everything is freed and the cache emptied."""
    a = C.Arena(C.HostDevice(), expandable_segments=False, planning=planning,
                plan_budget_ms=10)  # 20-buffer plans: a short budget keeps the test fast
    params = [a.allocate((64 << (k % 3)) * KiB) for k in range(12)]
    state, grads, rows = [], [], []
    for i in range(steps):
        n = i + 1
        a.reset_peak_stats()
        a.begin_step()
        for g in grads:
            a.deallocate(g)
        grads, acts = [], []
        for k in range(10):  # forward
            acts.append(a.allocate((48 + 8 * k) * KiB * n // 4 + 4 * KiB))
            a.deallocate(a.allocate(96 * KiB * n // 3 + 8 * KiB))
        for k in range(10):  # backward
            t = a.allocate(40 * KiB * n // 2 + 8 * KiB)
            grads.append(a.allocate(128 * KiB))
            a.deallocate(t)
            a.deallocate(acts.pop())
        if i == 0:  # the optimizer's first step makes its state
            a.set_persistent_hint(True)
            state = [a.allocate(128 * KiB) for _ in range(24)]
            a.set_persistent_hint(False)
        a.end_step()
        s = a.stats()
        rows.append((s["reserved_bytes"]["all"]["peak"], s["allocated_bytes"]["all"]["peak"],
                     s["reserved_bytes"]["large_pool"]["peak"], s["reserved_bytes"]["small_pool"]["peak"],
                     s["renaissance"]["plan_bytes"]))
    a.check_invariants()
    for p in params + state + grads:
        a.deallocate(p)
    a.empty_cache()
    return rows, a.stats()["reserved_bytes"]["all"]["current"]


def test_outgrown_territory_goes_back_with_fixed_segments(C):
    # Issue 11 item 5: with fixed segments every step of this loop outgrows
    # its layout and re-plans. The territory used to be a segment of at least
    # min_large_alloc (10 MiB for plans of 1.3-7 MiB), and the one a step
    # outgrew stayed beside the next (worst step 2.95x peak allocated; 1.35x
    # with planning off). Now the large pool holds one segment, the
    # territory, sized to the plan in 2 MiB steps (1.5x the old one when
    # outgrown), and planning adds nothing to the small pool.
    off, left_off = _varlen_fixed(C, planning=False)
    on, left_on = _varlen_fixed(C, planning=True)
    two = 2 * MiB
    for i, ((_, _, large, small, plan), (_, _, large_off, small_off, _)) in enumerate(zip(on, off)):
        assert large_off == 0
        # The territory's segment, and no second one beside it.
        assert large <= -(-(plan * 3 // 2) // two) * two, (i, large, plan)
        assert small <= small_off, (i, small, small_off)
    assert left_on == left_off == 0
    # Not met (reported): planning on is still above planning off in this
    # loop, by the territory itself (its steps all diverge, so the dynamic
    # pool serves them beside it): the worst step is 1.97x against 1.35x.
    worst_on = max(r / p for r, p, *_ in on[2:])
    worst_off = max(r / p for r, p, *_ in off[2:])
    assert worst_on <= worst_off + max(large for _, _, large, _, _ in on) / min(p for _, p, *_ in on)


def test_oom_in_a_recorded_step_leaves_the_next_step_able_to_plan(C):
    a = C.Arena(C.HostDevice(), max_reserved_bytes=256 * MiB)
    a.begin_step()
    keep = [a.allocate(64 * MiB) for _ in range(3)]
    retries = a.stats()["num_alloc_retries"]
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        a.allocate(128 * MiB)       # 192 + 128 > 256: the ladder runs once, then raises
    s = a.stats()
    assert s["num_alloc_retries"] == retries + 1 and s["num_ooms"] == 1
    for p in keep:
        a.deallocate(p)
    a.end_step()
    for _ in range(3):  # the same step without the failure: recorded, then planned
        a.begin_step()
        ps = [a.allocate(64 * MiB) for _ in range(3)]
        for p in ps:
            a.deallocate(p)
        a.end_step()
    r = a.stats()["renaissance"]
    assert r["plans"] >= 1 and r["planned_steps"] >= 1 and r["last_step_hits"] == 3
    a.check_invariants()


# --- one out-of-memory ladder per failed request --------------------------------------


def test_one_ladder_per_failed_request(C):
    d = C.SimDevice()
    s1 = d.new_stream()
    a = C.Arena(d, max_reserved_bytes=64 * MiB)
    p = a.allocate(32 * MiB)
    a.record_stream(p, s1)
    d.enqueue(s1, 10)        # s1 still works on p when it is freed
    a.deallocate(p)
    before = a.stats()
    syncs = d.host_synchronizations
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(128 * MiB)
    s = a.stats()
    assert s["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert s["num_ooms"] == before["num_ooms"] + 1
    assert d.host_synchronizations == syncs + 1   # the pending use, waited for once
    assert s["num_sync_all_streams"] == before["num_sync_all_streams"] + 1
    a.check_invariants()


# --- completed stream work noticed on allocation --------------------------------------


def test_completed_stream_work_is_noticed_by_the_next_allocation(C):
    d = C.SimDevice()
    s2 = d.new_stream()
    a = C.Arena(d)
    keep = a.allocate(256 << 10)
    p = a.allocate(256 << 10)       # the 2 MiB granule has 1.5 MiB free after p
    a.record_stream(p, s2)
    d.enqueue(s2, 5)
    a.deallocate(p)
    d.run_all()                     # s2 finished
    q = a.allocate(256 << 10)
    assert q == p                   # the same block again, not the free room after it
    assert a.stats()["renaissance"]["pending_bytes"]["current"] == 0
    a.deallocate(q)
    a.deallocate(keep)
    a.check_invariants()


# --- pool geometry and impossible requests --------------------------------------------


def test_inconsistent_geometry_is_a_value_error(C):
    with pytest.raises(ValueError, match="large_segment"):
        C.Arena(C.HostDevice(), expandable_segments=False, large_segment=4 * MiB)


@pytest.mark.parametrize("size", [5 * MiB, 9 * MiB + 1, 10 * MiB, 33 * MiB])
def test_fixed_segments_always_hold_the_request(C, size):
    a = C.Arena(C.HostDevice(), expandable_segments=False, large_segment=10 * MiB)
    p = a.allocate(size)
    seg = [g for g in a.snapshot() if any(b["address"] == p for b in g["blocks"])][0]
    assert seg["total_size"] >= size
    a.deallocate(p)
    a.check_invariants()


@pytest.mark.parametrize("kind", ["host", "sim"])
def test_a_request_over_ram_and_swap_is_refused_even_with_a_free_tail(C, kind):
    import os

    make = C.HostDevice if kind == "host" else C.SimDevice
    a = C.Arena(make())
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    swap = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SwapTotal:"):
                swap = int(line.split()[1]) * 1024
    limit = total + swap
    # A big block freed: its granules stay cached in the free tail.
    a.deallocate(a.allocate(256 * MiB))
    with pytest.raises(torch.OutOfMemoryError, match="RAM \\+ swap"):
        a.allocate(int(1.5 * limit))
    with pytest.raises(torch.OutOfMemoryError):
        a.allocate(limit + 1)
    assert cur(a, "allocated_bytes") == 0
    a.check_invariants()


# --- stats before install ------------------------------------------------------------


def test_stats_calls_before_install_are_no_ops():
    out = run_json(textwrap.dedent("""
        import json, torch_renaissance as tr
        tr.empty_cache(); tr.reset_peak_memory_stats(); tr.reset_accumulated_memory_stats()
        tr.empty_cache("cpu"); tr.reset_peak_memory_stats("cpu"); tr.reset_accumulated_memory_stats("cuda")
        s = tr.memory_stats()
        bad = {k: v for k, v in s.items() if v != 0 and k != "max_split_size"}
        try:
            tr.memory_stats("meta")
            meta = "no error"
        except RuntimeError as e:
            meta = "meta" in str(e)
        print(json.dumps({"n": len(s), "bad": bad, "split": s["max_split_size"],
                          "allocated": tr.memory_allocated("cpu"), "meta": meta,
                          "same_keys": None}))
    """))
    assert out["bad"] == {} and out["allocated"] == 0 and out["meta"] is True
    assert out["split"] == -1  # PyTorch's value for "no max_split_size"
    assert out["n"] > 100


# --- the fit guarantee ----------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 24 * MiB)),
        st.tuples(st.just("alloc"), st.integers(1, 256 << 10)),
        st.tuples(st.just("free"), st.integers(0, 10**6)),
        st.tuples(st.just("step"), st.integers(0, 1)),
        st.tuples(st.just("empty"), st.just(0)),
    ),
    min_size=1, max_size=60)


def _footprint(a, live, gran, territory=False):
    """Bytes of the granules the live blocks touch (and, with ``territory``,
    the planned territory's granules), computed from the pointers and sizes
    the test holds and the segment bases the snapshot reports."""
    segs = sorted((g["address"], g["plan_top"]) for g in a.snapshot())
    touched = set()
    for p, size in live.items():
        # A segment of the snapshot may be one mapped run of a larger
        # expandable segment; a run starts on a granule of its segment.
        base = max(b for b, _ in segs if b <= p)
        first = (p - base) // gran
        last = (p + size - 1 - base) // gran
        touched.update((base, i) for i in range(first, last + 1))
    if territory:
        for base, top in segs:
            touched.update((base, i) for i in range(-(-top // gran)))
    return len(touched) * gran


def _held_segments(a):
    """Bytes of the fixed segments that hold a live block or planned territory."""
    return sum(g["total_size"] for g in a.snapshot()
               if g["plan_top"] or any(b["state"] != "inactive" for b in g["blocks"]))


def _fill_caches(a, fill, limit):
    """Four threads, one after another, allocate their share of ``fill`` (sizes, at most half
    the limit in all) and free it: the arena's free cache keeps those blocks."""
    budget = limit // 2
    shares = [[n for n in fill[t::4]] for t in range(4)]

    def run(sizes):
        nonlocal budget
        ps = []
        for n in sizes:
            if n > budget:
                continue
            budget -= n
            ps.append(a.allocate(n))
        for p in ps:
            a.deallocate(p)

    for sizes in shares:
        th = threading.Thread(target=run, args=(sizes,))
        th.start()
        th.join()


def _run_fit(C, ops, expandable, limit, fill=()):
    a = C.Arena(C.HostDevice(), max_reserved_bytes=limit, expandable_segments=expandable)
    _fill_caches(a, fill, limit)
    unit = 64  # HostDevice alignment
    gran = HOST_GRANULE
    live = {}  # pointer -> rounded size, kept by the test
    in_step = False
    for op, arg in ops:
        if op == "alloc":
            rounded = -(-arg // unit) * unit
            if expandable:
                # The ladder gives territory and every free granule back:
                # what stays is the granules live blocks touch.
                fits = -(-rounded // gran) * gran <= limit - _footprint(a, live, gran)
            else:
                # What the ladder cannot give back: segments holding a live
                # block. A new segment is 2 MiB for the small pool (PyTorch's
                # kSmallBuffer), else at least the request.
                held = sum(g["total_size"] for g in a.snapshot()
                           if any(b["state"] != "inactive" for b in g["blocks"]))
                need = 2 * MiB if rounded <= MiB else rounded
                fits = need <= limit - held
            try:
                p = a.allocate(arg)
            except torch.OutOfMemoryError:
                assert not fits, (arg, sorted(live.values()))
                continue
            live[p] = rounded
        elif op == "free" and live:
            p = sorted(live)[arg % len(live)]
            del live[p]
            a.deallocate(p)
        elif op == "step":
            if in_step:
                a.end_step()
            else:
                a.begin_step(arg)
            in_step = not in_step
        elif op == "empty":
            a.empty_cache()
        a.check_invariants()
        assert cur(a) <= limit
    if in_step:
        a.end_step()
    a.empty_cache()
    if expandable:
        assert cur(a) == _footprint(a, live, gran, territory=True)
    else:
        assert cur(a) == _held_segments(a)
    for p in live:
        a.deallocate(p)
    a.check_invariants()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS, limit_mib=st.integers(8, 96))
def test_fit_guarantee_expandable(C, ops, limit_mib):
    """Expandable segments: a request succeeds whenever its size, rounded up
    to the granule, is at most the limit minus the live blocks' footprint
    (the granules they touch), inside or outside recorded and planned steps
    (the ladder releases planned territory too); after empty_cache() reserved
    is exactly the granules of the live blocks and of the planned territory
    (with nothing live and no plan: 0)."""
    _run_fit(C, ops, True, limit_mib * MiB)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS, limit_mib=st.integers(8, 96))
def test_fit_guarantee_fixed_segments(C, ops, limit_mib):
    """Fixed segments (cudaMalloc'd memory cannot be returned in parts): as
    PyTorch's allocator guarantees, a request succeeds whenever its rounded
    size is at most the limit minus the segments that hold a live block (the
    ladder returns every other segment and a new one of exactly the request
    is the last resort); after empty_cache() reserved is exactly those
    segments."""
    _run_fit(C, ops, False, limit_mib * MiB)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS, limit_mib=st.integers(8, 96), fill=st.lists(st.integers(1, 1 << 20), max_size=48),
       expandable=st.booleans())
def test_fit_guarantee_with_caches_filled_on_other_threads(C, ops, limit_mib, fill, expandable):
    """The same guarantees with the arena's free cache first filled by four other threads
    (blocks up to 1 MiB, allocated and freed there, still reserved): the out-of-memory ladder
    flushes the cache before it gives memory back (issue 14)."""
    _run_fit(C, ops, expandable, limit_mib * MiB, fill)


@pytest.mark.parametrize("size", [2 * MiB, 5 * MiB])
def test_a_shared_segment_size_the_device_cannot_hold_falls_back_to_the_request(C, size):
    # large_segment may be set up to 2**40; a request below min_large_alloc that
    # fits on the device is served (a segment of its own size) rather than an OOM
    # because the shared segment does not fit.
    a = C.Arena(C.SimDevice(capacity_bytes=64 * MiB), expandable_segments=False,
                large_segment=128 * MiB)
    p = a.allocate(size)
    seg = [g for g in a.snapshot() if any(b["address"] == p for b in g["blocks"])][0]
    assert size <= seg["total_size"] <= size + 2 * MiB
    a.deallocate(p)
    a.check_invariants()
    # Where the shared segment fits it is still made, and shared.
    b = C.Arena(C.SimDevice(capacity_bytes=256 * MiB), expandable_segments=False,
                large_segment=128 * MiB)
    q1, q2 = b.allocate(size), b.allocate(size)
    segs = [g for g in b.snapshot() if g["total_size"] == 128 * MiB]
    assert len(segs) == 1 and {q1, q2} <= {x["address"] for x in segs[0]["blocks"]}
