"""Buffers that cross the step boundary, on a HostDevice arena driven directly.

The ordinary loop ``out = model(x)`` keeps the previous step's output alive
until the new one exists: the output's lifetime is longer than one step (it
overlaps its own next instance). The arena must plan it (an alternating
layout: two offsets per slot, used by even and odd steps in turn) instead of
serving it from the dynamic pool next to the territory.

Each loop is generated from a seed (sizes of activations, output, batch);
the reference numbers (the live peak, LOAD) are computed here by a sweep over
the operations the test itself issues, independently of the arena.
"""
from __future__ import annotations

import random

import pytest

MiB = 1 << 20
KiB = 1 << 10


class _Loop:
    """A training-like step on the raw arena, with a reference count of live bytes.

    Per step: a new batch (the old one dropped after it, as ``x = next(it)``),
    forward activations, the output (``out = model(x)``: the old output dies
    only once the new one exists), a loss temporary, then backward (frees the
    activations, makes and frees gradient temporaries).
    """

    def __init__(self, C, rng: random.Random, keep_out=True, keep_batch=True, **arena_config):
        self.arena = C.Arena(C.HostDevice(), **arena_config)
        self.rng = rng
        self.keep_out, self.keep_batch = keep_out, keep_batch
        # Weights above 1 MiB (a smaller one would sit in a 2 MiB small-pool
        # segment of its own: PyTorch's pools, nothing to do with plans).
        self.weights_sizes = [rng.choice((2, 3, 4)) * MiB // 2 + MiB for _ in range(3)]
        self.acts = [rng.choice((1, 2, 3, 4)) * MiB for _ in range(rng.randint(3, 8))]
        self.out_size = rng.choice((4, 6, 8, 12)) * MiB
        self.batch_size = rng.choice((4, 64, 1024)) * KiB
        self.grad_tmp = max(self.acts) // 2
        self.live = 0      # reference: bytes live now (rounded sizes of what the test holds)
        self.peak = 0      # reference peak since the last reset
        self.weights = [self._alloc(s) for s in self.weights_sizes]
        self.out = self.batch = None

    def _alloc(self, n):
        p = self.arena.allocate(n)
        self.live += n
        self.peak = max(self.peak, self.live)
        return p

    def _free(self, p, n):
        self.arena.deallocate(p)
        self.live -= n

    def _forward(self):
        """The new batch (the previous one freed after it is made), then the activations."""
        batch = self._alloc(self.batch_size)
        if self.batch is not None:
            self._free(self.batch, self.batch_size)
        self.batch = batch
        return [self._alloc(s) for s in self.acts]

    def _new_output(self):
        out = self._alloc(self.out_size)
        if self.out is not None:
            self._free(self.out, self.out_size)
        self.out = out

    def _backward(self, acts):
        for p, s in reversed(list(zip(acts, self.acts))):
            g = self._alloc(self.grad_tmp)
            self._free(p, s)
            self._free(g, self.grad_tmp)

    def _drop_previous_output(self):
        """The previous step's output dies as the new one replaces it."""
        self._free(self.out, self.out_size)

    def step(self):
        a = self.arena
        a.begin_step()
        acts = self._forward()
        out = self._alloc(self.out_size)
        tmp = self._alloc(self.out_size)
        self._free(tmp, self.out_size)
        if self.out is not None:
            self._drop_previous_output()
        self.out = out
        self._backward(acts)
        if not self.keep_out:
            self._free(self.out, self.out_size)
            self.out = None
        if not self.keep_batch:
            self._free(self.batch, self.batch_size)
            self.batch = None
        a.end_step()
        a.check_invariants()

    def reset(self):
        self.arena.reset_peak_stats()
        self.peak = self.live


def _stats(arena):
    s = arena.stats()
    return s["allocated_bytes"]["all"]["peak"], s["reserved_bytes"]["all"]["peak"], s["renaissance"]


def _steady(loop, steady_steps):
    """Six steps (two recorded, the plan, first replays), the peaks reset, then
    ``steady_steps`` more; the stats of the steady part (see _stats)."""
    for _ in range(6):
        loop.step()
    loop.reset()
    for _ in range(steady_steps):
        loop.step()
    return _stats(loop.arena)


@pytest.mark.parametrize("seed", range(4))
def test_output_kept_across_the_boundary_is_planned(C, seed):
    loop = _Loop(C, random.Random(seed))
    alloc_peak, res_peak, r = _steady(loop, 6)
    # The reference count: every size here is a multiple of 512 B, so the
    # arena's rounded bytes equal the requested ones.
    assert alloc_peak == loop.peak
    # Every request of the steady steps is served where the plan says (the
    # output and the batch included; before the fix both went to the
    # dynamic pool), and at the address its phase had two steps earlier.
    assert r["last_step_hits"] == r["last_step_allocations"]
    assert r["last_step_same_address"] == r["last_step_comparable"] > 0
    assert r["phases"] == 2  # an alternating layout
    # Steady peak reserved at the live peak. Within 3%, not the 2%:
    # where the recorded step's output stands in the way of the first
    # replay it is pinned there (docs/design.md), which cost 2.3% in one of
    # these seeds (45 MiB for a 44 MiB peak, the planner's bound 44 MiB).
    assert res_peak <= 1.03 * alloc_peak, (res_peak / MiB, alloc_peak / MiB)


def test_output_kept_across_the_boundary_peak_matches_hand_count(C):
    rng = random.Random(0)
    loop = _Loop(C, rng)
    alloc_peak, res_peak, _ = _steady(loop, 4)
    # By hand: the peak is while the loss temporary is live: weights, every
    # activation, the old output, the new one and the temporary, the batch
    # (the old batch died before the activations were made).
    hand = sum(loop.weights_sizes) + sum(loop.acts) + 3 * loop.out_size + loop.batch_size
    assert alloc_peak == hand
    assert res_peak <= 1.03 * hand, (res_peak / MiB, hand / MiB)  # pins: see above


@pytest.mark.parametrize("seed", [12, 16, 21, 40])
def test_recorded_live_outs_in_the_way_cost_one_step_not_every_step(C, seed):
    # The recorded step's output stands where the dynamic pool put it, in
    # the way of what the plan's first replay places before it dies. Pinned
    # there, every later step paid for it: on these seeds (budget 0, greedy
    # plans, so the numbers do not depend on the machine) steady peak
    # reserved was 1.015-1.066 x the live peak, though the same problem
    # without pins plans to the live peak. Now the first replay gets a
    # bridge (planned around the recorded live-outs, its own live-outs where
    # the unpinned plan expects them), and the plan replays from the step
    # after: steady at the live peak (the reference count of this test), no
    # conflict, one plan, and the whole run no higher than the recorded
    # steps made it.
    loop = _Loop(C, random.Random(seed), plan_budget_seconds=0.0)
    loop.step()
    loop.step()  # the second recorded step; the plan is made at its end
    _, recorded_res_peak, _ = _stats(loop.arena)
    alloc_peak, res_peak, r = _steady(loop, 6)
    assert alloc_peak == loop.peak
    assert r["planned_conflicts"] == 0 and r["planned_misses"] == 0, r
    assert r["plans"] == 1 and r["phases"] == 2, r
    assert r["last_step_hits"] == r["last_step_allocations"]
    # Greedy plans are a 512 B-rounded step above the count at most.
    assert res_peak <= 1.005 * alloc_peak, (seed, res_peak / MiB, alloc_peak / MiB)
    whole = loop.arena.stats()["reserved_bytes"]["all"]
    assert whole["current"] <= res_peak
    assert recorded_res_peak >= max(res_peak, whole["current"])


def test_recorded_live_outs_in_the_way_of_both_output_positions_are_bridged(C):
    # Where the recorded output stands in the way of both of the plan's
    # output positions (the new output is born before it dies: HF GPT-2), no
    # bridge into the plan's phase 0 fits, and the live-outs were pinned where
    # the dynamic pool put them: every later step paid for the pins, 1.018-1.029
    # x the live peak on 5 of these seeds (budget 0), 4-12 MiB pinned on 22.
    # Now the bridge may hand over to the plan's phase 1 instead (its
    # live-outs at phase 0's positions), and a plan still pinned or over its
    # bound is planned once more from its first clean replay (a refine, kept
    # only when lower). No pins remain; steady peak reserved is the live peak
    # (the reference count) plus the plan's own gap over its bound (greedy
    # plans; the bound counts pins, so pins would show), no conflict, at most
    # one plan more, and the whole run no higher than the recorded steps.
    for seed in range(60):
        loop = _Loop(C, random.Random(seed), plan_budget_seconds=0.0)
        loop.step()
        loop.step()  # the plan is made at its end
        _, recorded_res_peak, _ = _stats(loop.arena)
        alloc_peak, res_peak, r = _steady(loop, 4)
        assert alloc_peak == loop.peak
        assert r["planned_conflicts"] == 0 and r["planned_misses"] == 0, (seed, r)
        assert r["plans"] <= 2 and r["pinned_bytes"] == 0, (seed, r)
        assert r["last_step_hits"] == r["last_step_allocations"]
        gap = r["plan_bytes"] - r["plan_bound_bytes"]
        assert res_peak <= 1.005 * alloc_peak + gap, (seed, res_peak / MiB, alloc_peak / MiB, gap / MiB)
        assert recorded_res_peak >= max(res_peak, loop.arena.stats()["reserved_bytes"]["all"]["current"]), seed


def test_without_cross_step_buffers_the_plan_is_unchanged(C):
    # The same loop with `del out, batch` at the step's end: one-phase layout,
    # steady reserved within 2% of the live peak (as before the change).
    loop = _Loop(C, random.Random(7), keep_out=False, keep_batch=False)
    alloc_peak, res_peak, r = _steady(loop, 4)
    assert alloc_peak == loop.peak
    assert r["last_step_hits"] == r["last_step_allocations"]
    assert r["last_step_same_address"] == r["last_step_comparable"]
    assert res_peak <= 1.02 * alloc_peak


def test_swapping_sizes_get_their_own_layouts_and_load_is_a_lower_bound(C):
    # Two temporaries whose sizes swap every step: 32 + 4 MiB, then 4 + 32 MiB.
    # Sharing one layout with max sizes would need 64 MiB; each step needs 36.
    arena = C.Arena(C.HostDevice())
    pairs = [(32 * MiB, 4 * MiB), (4 * MiB, 32 * MiB)]
    for i in range(12):
        if i == 6:
            arena.reset_peak_stats()
        arena.begin_step()
        a, b = pairs[i % 2]
        pa = arena.allocate(a)
        pb = arena.allocate(b)
        arena.deallocate(pa)
        arena.deallocate(pb)
        arena.end_step()
        arena.check_invariants()
    alloc_peak, res_peak, r = _stats(arena)
    assert alloc_peak == 36 * MiB
    assert res_peak <= 1.02 * 36 * MiB, res_peak / MiB
    # LOAD names the lower bound only: never above what a step has live.
    assert r["load_bytes"] <= 36 * MiB
    assert r["step_load_bytes"] == 36 * MiB
    assert r["layouts"] == 2
    assert r["last_step_hits"] == r["last_step_allocations"] == 2


class _GradLoop(_Loop):
    """``_Loop`` with gradients that cross the boundary too: made in backward,
    freed by the next step's ``zero_grad()``, which a seed puts before or
    after the new batch is made (``for x in data: opt.zero_grad(); ...``)."""

    def __init__(self, C, rng: random.Random):
        super().__init__(C, rng)
        self.zero_grad_first = rng.random() < 0.5
        self.grads = None

    def step(self):
        a = self.arena
        a.begin_step()
        if self.zero_grad_first:
            self._zero_grad()
        batch = self._alloc(self.batch_size)
        if not self.zero_grad_first:
            self._zero_grad()
        if self.batch is not None:
            self._free(self.batch, self.batch_size)
        self.batch = batch
        acts = [self._alloc(s) for s in self.acts]
        out = self._alloc(self.out_size)
        if self.out is not None:
            self._free(self.out, self.out_size)
        self.out = out
        for p, s in reversed(list(zip(acts, self.acts))):
            g = self._alloc(self.grad_tmp)
            self._free(p, s)
            self._free(g, self.grad_tmp)
        self.grads = [self._alloc(s) for s in self.weights_sizes]
        a.end_step()
        a.check_invariants()

    def _zero_grad(self):
        for p, s in zip(self.grads or (), self.weights_sizes):
            self._free(p, s)
        self.grads = None


@pytest.mark.parametrize("seed", range(24))
def test_first_replay_runs_into_no_recorded_live_out(C, seed):
    # The first replay starts while the recorded step's live-outs (output,
    # batch, gradients) still stand where the dynamic pool put them; those in
    # the way of what the plan places before they die are pinned there. Pins
    # move other buffers when the plan is made again around them, so the
    # check is repeated until nothing is in the way: before, a buffer moved
    # onto a live-out that had not been in the way (HF GPT-2's new logits on
    # the recorded ones), a conflict in the first replay.
    _assert_first_replays_clear(_GradLoop(C, random.Random(1000 + seed)))


def _assert_first_replays_clear(loop):
    """Eight steps of ``loop``: one plan, and a refine where the first was
    pinned or over its bound (docs/design.md: installed only when lower);
    neither's first replay runs into a live-out, and the last step is all
    hits."""
    for _ in range(8):
        loop.step()
    _, _, r = _stats(loop.arena)
    assert r["plans"] <= 2 and r["planned_steps"] == 6, r
    assert r["planned_conflicts"] == 0 and r["planned_misses"] == 0, r
    assert r["last_step_hits"] == r["last_step_allocations"]


class _MultiOutLoop(_Loop):
    """``_Loop`` whose output is several tensors (logits and a few cache-like
    tensors of 1-6 MiB, as HF models return), all replaced only once the new
    ones exist, a loss temporary the size of the first two, and gradients
    freed by the next step's ``zero_grad()``. More recorded live-outs stand
    in the first replay's way than in ``_GradLoop``, so pins take more than
    one round."""

    def __init__(self, C, rng: random.Random):
        super().__init__(C, rng)
        self.outs_sizes = [rng.choice((1, 2, 3, 4, 6)) * MiB for _ in range(rng.randint(2, 6))]
        self.outs = None
        self.grads = None

    def step(self):
        a = self.arena
        a.begin_step()
        for p, s in zip(self.grads or (), self.weights_sizes):
            self._free(p, s)
        self.grads = None
        acts = self._forward()
        outs = [self._alloc(s) for s in self.outs_sizes]
        old, self.outs = self.outs, outs
        loss_tmp = [self._alloc(s) for s in self.outs_sizes[:2]]
        for p, s in zip(old or (), self.outs_sizes):
            self._free(p, s)
        for p, s in zip(loss_tmp, self.outs_sizes[:2]):
            self._free(p, s)
        self._backward(acts)
        self.grads = [self._alloc(s) for s in self.weights_sizes]
        a.end_step()
        a.check_invariants()


@pytest.mark.parametrize("seed", range(40))
def test_pins_after_the_first_round_repair_the_plan_without_a_conflict(C, seed):
    # Pin rounds after the first repair the last plan (docs/design.md, "A plan
    # job's time"): only the buffers in the way of the new pins move, around
    # everything else kept where it was. On seeds 2, 10, 12, 13, 25, 26, 32
    # and 34 one or two repairs run. Whatever moves must still stay out of
    # every recorded live-out's way in the first replay, and the plan must be
    # valid (check_invariants after every step; replay places nothing over a
    # live block).
    _assert_first_replays_clear(_MultiOutLoop(C, random.Random(seed)))


class _JitterLoop(_Loop):
    """``_Loop`` with two equal temporaries in forward whose order of
    allocation and free varies from step to step, as two threads' scratch
    buffers of one parallel kernel do (HF Llama with two intra-op threads:
    four such 128 B pairs per step): ``seq`` (a freed before b is made),
    ``nested`` (b made and freed inside a's life) or ``cross`` (a freed
    between b's allocation and free). The size sequence is the same in every
    order; only the lifetimes differ."""

    PAIR = 64 * KiB

    def __init__(self, C, rng: random.Random, orders):
        # No search (budget 0): the plan depends on the steps alone, not on
        # the machine's load (a stopped search may or may not share a's
        # offset with b's).
        super().__init__(C, rng, plan_budget_seconds=0.0)
        self.orders = list(orders)  # one per step, from step 1

    def step(self):
        a = self.arena
        a.begin_step()
        acts = self._forward()
        order, n = self.orders.pop(0), self.PAIR
        pa = self._alloc(n)
        if order == "seq":
            self._free(pa, n)
            pb = self._alloc(n)
            self._free(pb, n)
        else:
            pb = self._alloc(n)
            first, second = (pb, pa) if order == "nested" else (pa, pb)
            self._free(first, n)
            self._free(second, n)
        self._new_output()
        self._backward(acts)
        a.end_step()
        a.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_replan_after_conflicts_replays_phase_0_first(C, seed):
    # Steps 1-3 free the pair in sequence (the plan gives a and b one offset),
    # steps 4 and 5 nest them: b conflicts with a in both, so the layout is
    # planned again at the end of step 5, a phase-0 step. That plan's first
    # replay must be its phase 0 (the step's live-outs stand where phase 0
    # put them, and the plan treats them as phase 1's, as after recording).
    # Before the fix step 6 replayed phase 1 and ran into the live-outs.
    rng = random.Random(2000 + seed)
    orders = ["seq"] * 3 + ["nested"] * 2 + [rng.choice(("seq", "nested", "cross")) for _ in range(7)]
    loop = _JitterLoop(C, random.Random(seed), orders)
    for _ in range(5):
        loop.step()
    _, _, r = _stats(loop.arena)
    assert r["plans"] == 2 and r["planned_conflicts"] == 2, r
    for _ in range(7):
        loop.step()
    _, _, r = _stats(loop.arena)
    # The re-plan merged the nested lifetimes: no order conflicts any more.
    assert r["plans"] == 2 and r["planned_conflicts"] == 2 and r["planned_misses"] == 0, r
    assert r["last_step_hits"] == r["last_step_allocations"]


@pytest.mark.parametrize("seed", range(6))
def test_lifetimes_seen_in_both_planned_steps_are_planned(C, seed):
    # Step 1 nests the pair, step 2 (the step the plan is made from) frees
    # it in sequence: a plan from step 2's lifetimes alone gives a and b one
    # offset, and every later step that overlaps them conflicts. The plan
    # takes each buffer's lifetime over both steps (same sizes): none does.
    rng = random.Random(3000 + seed)
    orders = ["nested", "seq"] + [rng.choice(("seq", "nested", "cross")) for _ in range(8)] + ["cross"]
    loop = _JitterLoop(C, random.Random(seed), orders)
    for _ in range(11):
        loop.step()
    _, _, r = _stats(loop.arena)
    assert r["plans"] == 1 and r["planned_steps"] == 9, r
    assert r["planned_conflicts"] == 0 and r["planned_misses"] == 0, r


class _KeptFirstLoop(_Loop):
    """``_Loop`` whose first step's output is kept for good, as ``torch.compile``
    keeps the outputs of its first (compiling) call: HF GPT-2 under inductor kept
    step 1's logits and 8 KV tensors all run long. The outputs of later steps
    die in the next step, as in eager mode. The plan is made from steps 1 and 2,
    where the output's previous instance never died, so it judged step 2's
    output persistent."""

    def __init__(self, C, rng: random.Random):
        super().__init__(C, rng, plan_budget_seconds=0.0)
        self.kept = None  # step 1's output: never freed

    def _drop_previous_output(self):
        if self.kept is None:
            self.kept = self.out  # the first output stays live
        else:
            self._free(self.out, self.out_size)


@pytest.mark.parametrize("seed", range(6))
def test_output_judged_persistent_by_the_first_steps_is_planned_once_it_dies(C, seed):
    # Before the fix the layout left the output to the dynamic pool for the
    # whole run (no conflict, no miss: nothing re-planned it), beside the
    # territory: per step one allocation missed the plan, and the steady
    # peak reserved held a dynamic-pool output next to the planned step.
    loop = _KeptFirstLoop(C, random.Random(4000 + seed))
    alloc_peak, res_peak, r = _steady(loop, 6)
    assert alloc_peak == loop.peak  # sizes are multiples of 512 B: rounded == requested
    # One re-plan, after the first replay that saw step 2's output die.
    assert r["plans"] == 2, r
    assert r["planned_conflicts"] == 0 and r["planned_misses"] == 0, r
    assert r["last_step_hits"] == r["last_step_allocations"], r
    assert r["phases"] == 2
    # The output is a planned slot now, in the territory (before: a block of
    # the dynamic pool, also counted as a hit).
    blocks = {b["address"]: b for seg in loop.arena.snapshot() for b in seg["blocks"]}
    assert blocks[loop.out]["planned"] and blocks[loop.out]["in_territory"], blocks[loop.out]
    assert not blocks[loop.kept]["planned"]
    # The reference peak: weights, the kept first output, every activation,
    # the old output, the new one and the temporary, the batch.
    hand = (sum(loop.weights_sizes) + sum(loop.acts) + 4 * loop.out_size + loop.batch_size)
    assert alloc_peak == hand
    # The kept output is an obstacle where recording put it, and the plan
    # goes around it (its bound proves what that position costs: 1.000-1.047
    # over these seeds, 1.087-1.230 before the fix).
    assert res_peak <= 1.05 * alloc_peak, (res_peak / MiB, alloc_peak / MiB)
    assert r["plan_bytes"] == r["plan_bound_bytes"] or res_peak <= 1.03 * alloc_peak, r
