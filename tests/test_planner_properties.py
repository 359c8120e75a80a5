"""Property tests of the offline planner (validity, LOAD bound, budget), against references in this file.

For drawn instances (hypothesis): the plan is valid (no two buffers live at
once overlap in memory; checked here, not by the planner's own validate()),
it is at least the lower bound it reports, which is at least LOAD (computed
here), and at most best fit by decreasing size; on instances small enough to
brute-force, it is the optimum, and the reported lower bound never exceeds
it. Every plan here is stopped by the work count (``clock_seconds=inf``), so
the results are the same on a loaded machine; nothing here is timed.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_renaissance import _C
from torch_renaissance.synthetic import somas_graph, training_step, xla_buffers

NO_CLOCK = math.inf


def pieces(lo, up, period):
    if period and up > period:
        return [(lo, period), (0, up - period)]
    return [(lo, up)]


def meet(a, b, period):
    return any(x0 < y1 and y0 < x1 for x0, x1 in pieces(*a, period) for y0, y1 in pieces(*b, period))


def height_if_valid(sizes, lowers, uppers, offsets, period=0, fixed=()):
    """Asserts no two buffers (or a buffer and an obstacle) live at once overlap; returns the height."""
    items = list(zip(offsets, sizes, lowers, uppers)) + [tuple(f) for f in fixed]
    n = len(sizes)
    for i, (oi, si, li, ui) in enumerate(items):
        for j in range(i + 1, len(items)):
            if i >= n:
                break  # obstacle against obstacle: given, not planned
            oj, sj, lj, uj = items[j]
            if si and sj and meet((li, ui), (lj, uj), period):
                assert oi + si <= oj or oj + sj <= oi, f"{i} {items[i]} collides with {j} {items[j]}"
    return max([o + s for o, s, _, _ in items] or [0])


def load_ref(sizes, lowers, uppers, period=0, fixed=()):
    """LOAD by brute force: the most bytes live at any tick (overlapping obstacles count once)."""
    horizon = max([period, 1] + list(uppers) + [f[3] for f in fixed])
    best = 0
    for t in range(horizon):
        live = sum(s for s, lo, up in zip(sizes, lowers, uppers)
                   if any(a <= t < b for a, b in pieces(lo, up, period)))
        covered = set()
        for off, size, lo, up in fixed:
            if any(a <= t < b for a, b in pieces(lo, up, period)):
                covered.update(range(off, off + size))
        best = max(best, live + len(covered))
    return best


def optimum(sizes, lowers, uppers, period=0, fixed=()):
    """The smallest height of any valid plan, by brute force.

    Every valid plan can be pushed down into one that places the buffers, in
    the order of their offsets, each at the lowest offset clear of the
    obstacles and of the buffers before it (none moves up, so none collides):
    so the minimum over all orders of that placement is the optimum.
    """
    n = len(sizes)
    best = None
    for order in itertools.permutations(range(n)):
        placed = [tuple(f) for f in fixed]
        for i in order:
            if sizes[i] == 0:
                continue
            busy = sorted((o, o + s) for o, s, lo, up in placed
                          if meet((lowers[i], uppers[i]), (lo, up), period))
            off = 0
            for a, b in busy:
                if a >= off + sizes[i]:
                    break
                off = max(off, b)
            placed.append((off, sizes[i], lowers[i], uppers[i]))
        h = max([o + s for o, s, _, _ in placed] or [0])
        best = h if best is None else min(best, h)
    return best


@st.composite
def instances(draw, max_buffers, horizon=12, obstacles=True):
    """(sizes, lowers, uppers, period, fixed): buffers on a small clock, cyclic or not,
    sizes from a few multiples of 64 (ties and near-ties, as in real traces), and
    a few obstacles with gaps between them."""
    cyclic = draw(st.booleans())
    period = horizon if cyclic else 0
    n = draw(st.integers(1, max_buffers))
    sizes, lowers, uppers = [], [], []
    for _ in range(n):
        lo = draw(st.integers(0, horizon - 1))
        longest = horizon if cyclic else horizon - lo
        up = lo + draw(st.integers(1, longest))
        sizes.append(64 * draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16])))
        lowers.append(lo)
        uppers.append(up)
    fixed = []
    if obstacles:
        top = 0
        for _ in range(draw(st.integers(0, 2))):
            top += 64 * draw(st.integers(0, 4))
            size = 64 * draw(st.integers(1, 4))
            lo = draw(st.integers(0, horizon - 1))
            up = draw(st.integers(lo + 1, horizon))
            fixed.append((top, size, lo, up))
            top += size
    return sizes, lowers, uppers, period, fixed


def plan(inst, budget):
    sizes, lowers, uppers, period, fixed = inst
    return _C.plan(sizes, lowers, uppers, period, fixed, budget, clock_seconds=NO_CLOCK)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_buffers=6))
def test_small_instances_are_planned_optimally(inst):
    sizes, lowers, uppers, period, fixed = inst
    r = plan(inst, 0.05)
    h = height_if_valid(sizes, lowers, uppers, r["offsets"], period, fixed)
    assert r["size"] == h
    best = optimum(sizes, lowers, uppers, period, fixed)
    assert r["load"] == load_ref(sizes, lowers, uppers, period, fixed)
    assert r["load"] <= r["lower_bound"] <= best  # both bounds are valid
    assert h == best, (h, best, r["method"], r["stopped_by"])
    assert r["optimal"] == (h == r["lower_bound"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_buffers=60, horizon=30))
def test_plans_are_valid_between_the_bound_and_greedy(inst):
    sizes, lowers, uppers, period, fixed = inst
    r = plan(inst, 0.02)
    h = height_if_valid(sizes, lowers, uppers, r["offsets"], period, fixed)
    assert r["size"] == h
    assert load_ref(sizes, lowers, uppers, period, fixed) <= r["lower_bound"] <= h
    g = _C.greedy_by_size(sizes, lowers, uppers, period, fixed)
    assert h <= g["size"] == r["greedy_size"]


def check_large(sizes, lowers, uppers, offsets):
    """Validity of a plan of a few thousand buffers, vectorized: every pair live at once is disjoint."""
    s, lo, up, off = (np.asarray(x, dtype=np.int64) for x in (sizes, lowers, uppers, offsets))
    meet_t = (lo[:, None] < up[None, :]) & (lo[None, :] < up[:, None])
    meet_m = (off[:, None] < off[None, :] + s[None, :]) & (off[None, :] < off[:, None] + s[:, None])
    clash = meet_t & meet_m & (s[:, None] > 0) & (s[None, :] > 0)
    np.fill_diagonal(clash, False)
    bad = np.argwhere(clash)
    assert bad.size == 0, f"buffers {bad[0].tolist()} collide"
    return int((off + s).max())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([training_step, somas_graph, xla_buffers]), st.integers(0, 10_000))
def test_large_instances_take_the_peak_repair_and_stay_valid(gen, seed):
    # Past the search's size (1,500 buffers) without obstacles, the plan comes
    # from ruin and recreate and the peak repair by sub-search (sub-problems
    # clipped at the freed buffers' top and lifted to a floor): valid, between
    # LOAD and greedy.
    lt = gen(2000, seed)
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    r = _C.plan(sizes, lowers, uppers, 0, [], 0.05, clock_seconds=NO_CLOCK)
    h = check_large(sizes, lowers, uppers, r["offsets"])
    assert r["size"] == h and r["load"] <= h <= r["greedy_size"]


def test_peak_repair_improves_a_large_step_beyond_the_constructive_passes():
    # An 8,506-buffer training step (greedy +0.333% over LOAD) that no
    # constructive pass, the peak-first ones included, takes to LOAD: the
    # peak repair over windows of the column at the peak does, with the same
    # work count on any machine. (The step first used here, training_step(10_000,
    # 11), +0.255%, went from +0.165% by the peak repair to LOAD by a
    # peak-first pass.)
    lt = training_step(10_000, 12)
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    r = _C.plan(sizes, lowers, uppers, 0, [], 0.3, clock_seconds=NO_CLOCK)
    assert r["stopped_by"] in ("work", "bound")
    assert r["greedy_size"] - r["size"] > 0.0005 * r["load"], (r["size"], r["greedy_size"], r["load"])
    assert r["method"] == "peak_search"


def test_a_peak_first_pass_takes_a_large_step_to_load():
    # A 9,233-buffer training step, greedy +0.255% over LOAD: the passes that
    # interleave the peak's buffers with the others leave a hole at the peak,
    # the peak repair took it to +0.165% only; the pass that stacks the peak
    # tick's buffers first (by length), then places the others by size, is at
    # LOAD. LOAD here by a sweep over the lifetimes. At budget 0 (the
    # planner's floor) the peak-first passes do not run.
    lt = training_step(10_000, 11)
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    delta = np.zeros(max(uppers) + 1, dtype=np.int64)
    np.add.at(delta, lowers, sizes)
    np.add.at(delta, uppers, [-s for s in sizes])
    load = int(np.cumsum(delta).max())
    # On 2 threads the passes run on the second one, beside the improvement
    # phases; on 1, among the constructive passes. Either way the plan is the
    # same run to run with the clock off.
    for threads in (1, 2):
        r = _C.plan(sizes, lowers, uppers, 0, [], 0.3, clock_seconds=NO_CLOCK, threads=threads)
        assert check_large(sizes, lowers, uppers, r["offsets"]) == r["size"] == load == r["load"]
        assert r["method"] == "peak_first_by_length_then_size" and r["stopped_by"] == "bound", r["method"]
        assert r["greedy_size"] > load
        again = _C.plan(sizes, lowers, uppers, 0, [], 0.3, clock_seconds=NO_CLOCK, threads=threads)
        assert again["offsets"] == r["offsets"]
    floor = _C.plan(sizes, lowers, uppers, 0, [], 0.0, clock_seconds=NO_CLOCK)
    assert not floor["method"].startswith("peak_first") and floor["size"] > load


@pytest.mark.parametrize("gen", [somas_graph, xla_buffers])
def test_generators_are_seeded_and_well_formed(gen):
    a, b = gen(3000, 4), gen(3000, 4)
    assert a == b and a != gen(3000, 5)
    assert 0.85 * 3000 <= len(a) <= 1.15 * 3000
    assert all(s > 0 and 0 <= lo < up for s, lo, up in a)
    with pytest.raises(ValueError, match="buffers"):
        gen(999)
    with pytest.raises(ValueError, match="buffers"):
        gen(200_001)
