"""Keyed steps (``step(key=...)``: one layout per kind of step) whose output
outlives the step and dies in the next step, of another key: a ``generate``
loop over prompts of a few lengths (``out = model.generate(...)`` replaces
the previous prompt's output inside the next step). The previous key's
output stands at its own layout's offsets while this key's step runs, so a
layout planned without it conflicts on every replay (HF GPT-2, keyed
``generate``: 27-29 conflicts in every replayed step of two of three keys,
re-planned every other step without effect). Plans have budget 0.
"""
from __future__ import annotations

import random

import pytest

from _aging import allocate_aging

KiB = 1 << 10


def _shape(rng: random.Random, scale: int):
    """A key's step: temporaries (size, lifetime in allocations) and the
    output's size; sizes grow with `scale` (the prompt length)."""
    temps = [(rng.randint(1, 16) * scale * KiB, rng.randint(0, 3)) for _ in range(rng.randint(6, 24))]
    return temps, rng.randint(1, 8) * scale * KiB


def _step(arena, key, shape, held):
    temps, out_size = shape
    arena.begin_step(key)
    pending = []
    half = len(temps) // 2
    for k, (size, life) in enumerate(temps):
        allocate_aging(arena, size, life, pending)
        if k == half:
            # The output, then the previous one (another key's) is dropped
            # (`out = generate(...)`), mid-step.
            out = arena.allocate(out_size)
            if held:
                arena.deallocate(held.pop())
            held.append(out)
    for _, p in pending:
        arena.deallocate(p)
    arena.end_step()


@pytest.mark.parametrize("seed", range(6))
def test_keyed_steps_do_not_conflict_on_the_previous_keys_output(C, seed):
    rng = random.Random(seed)
    keys = [16, 64, 128]
    shapes = {k: _shape(rng, k // 16) for k in keys}
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    held = []
    per_round, plans = [], []
    for _ in range(18):
        before = arena.stats()["renaissance"]["planned_conflicts"]
        for k in keys:
            _step(arena, k, shapes[k], held)
        per_round.append(arena.stats()["renaissance"]["planned_conflicts"] - before)
        plans.append(arena.stats()["renaissance"]["plans"])
    r = arena.stats()["renaissance"]
    assert r["planned_steps"] >= 3 * 16, r      # every key replays from round 2 on
    # The first layouts are made while the other keys still record (their
    # outputs stand elsewhere then), so the first replays may conflict; the
    # re-plans see the outputs where their layouts put them, and then no
    # replay conflicts and nothing is re-planned any more. Before: the same
    # conflicts in every round (2-7 of them here) and a re-plan of each
    # conflicting key every other round, for good.
    assert per_round[-3:] == [0, 0, 0], per_round
    # The first replays (round 3: every key's layout exists) no longer
    # conflict: a key's output is in the way of the next key's plan at its
    # slot's offsets (its layout keeps it there), not only where it stood in
    # the recorded step the plan was made from. Before: 2-6 conflicts in
    # round 3 of each of 12 seeds; now none in 40.
    assert per_round[2] == 0, per_round
    assert plans[-1] == plans[-4], plans
    arena.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_serving_loop_steps_between_calls_do_not_conflict(C, seed):
    # `run --step-on serve`: each serve() call is a step of its own key, and
    # the code between calls is another (the step auto_steps keeps open). The
    # request made between calls (`ids = torch.randint(...)`) replaces the
    # previous one once it exists: an alternating layout of that key puts it
    # at one of two offsets in turn, and it is live through the next call.
    # A serve layout planned around one of the two offsets conflicted with
    # the request every other call (HF GPT-2, prompts of 16-128 tokens: 250
    # conflicts in 77 steps, 16 in many, the replay's conflict limit). The
    # request here is one size; requests of several sizes (variants of the
    # between-calls key that outgrow its slot and re-plan it) still conflict
    # now and then in this loop (not in the HF one).
    rng = random.Random(seed)
    temps = [(rng.randint(1, 32) * KiB, rng.randint(0, 4)) for _ in range(rng.randint(8, 30))]
    out_size = rng.randint(1, 4) * KiB
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    ids = result = None
    per_call = []
    for _ in range(24):
        arena.begin_step(0)                  # between calls
        new_ids = arena.allocate(64 * KiB)
        if ids is not None:
            arena.deallocate(ids)
        ids = new_ids
        if result is not None:
            arena.deallocate(result)     # the previous call's result, dropped
        arena.end_step()
        before = arena.stats()["renaissance"]["planned_conflicts"]
        arena.begin_step(1)                  # serve(ids)
        pending = []
        for size, life in temps:
            allocate_aging(arena, size, life, pending)
        result = arena.allocate(out_size)
        for _, p in pending:
            arena.deallocate(p)
        arena.end_step()
        per_call.append(arena.stats()["renaissance"]["planned_conflicts"] - before)
    r = arena.stats()["renaissance"]
    assert r["planned_steps"] >= 40, r
    # Before: conflicts in every seed (16-81 in 16 calls), for good.
    assert sum(per_call[6:]) == 0, per_call
    arena.check_invariants()


def test_another_threads_free_is_no_obstacle_of_the_plan(C):
    """A block another thread made during a recorded step and frees during a later step
    (a worker's buffer) is no other key's output: the plan made at the end of that step
    must not plan around it (it raised the plan from the step's 24 MiB to 78 MiB in the
    threads test of test_territory.py, intermittently)."""
    import threading

    MiB = 1 << 20
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)

    def on_thread(fn, *args):
        out = []
        t = threading.Thread(target=lambda: out.append(fn(*args)))
        t.start()
        t.join()
        return out[0] if out else None

    def step(n, worker=None):
        arena.begin_step()
        ps = [arena.allocate(MiB) for _ in range(n)]
        if worker is not None:
            worker()
        for p in ps:
            arena.deallocate(p)
        arena.end_step()

    held = []
    step(4, lambda: held.extend(on_thread(arena.allocate, 16 * MiB) for _ in range(3)))
    step(4)
    step(6)  # a new shape: recorded
    step(6, lambda: [on_thread(arena.deallocate, p) for p in held])  # planned here
    r = arena.stats()["renaissance"]
    assert r["plans"] >= 2, r
    assert r["step_load_bytes"] == 6 * MiB, r
    assert r["plan_bytes"] == 6 * MiB, r
    step(6)
    assert arena.stats()["renaissance"]["last_step_hits"] == 6
    arena.check_invariants()


@pytest.mark.parametrize("seed", range(8))
def test_serving_loop_with_requests_of_several_lengths_does_not_conflict(C, seed):
    # As above, with prompts of three lengths in turn (`run --step-on
    # generate` over prompts of 16/64/128 tokens): the request made between
    # calls and the call's temporaries scale with the length. The
    # between-calls key has a variant per length, and its (re-)plans put the
    # request where the call's layouts, planned before, had buffers: the
    # call conflicted with it (HF GPT-2: 9 conflicts in round 2, and the
    # same here in most seeds). Its plans now keep what lives across its end
    # above the layouts of the keys whose steps it lives through.
    rng = random.Random(seed)
    lengths = [1, 4, 8]
    temps = [(rng.randint(1, 32) * KiB, rng.randint(0, 4), rng.random() < 0.5)
             for _ in range(rng.randint(8, 30))]
    out_unit = rng.randint(1, 4) * KiB
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    ids = mask = result = None
    per_round = []
    for _ in range(8):
        conflicts = 0
        for n in lengths:
            arena.begin_step(0)                   # between calls
            new_ids = arena.allocate(16 * KiB * n)
            if ids is not None:
                arena.deallocate(ids)
                arena.deallocate(mask)
            ids, mask = new_ids, arena.allocate(16 * KiB * n)
            if result is not None:
                arena.deallocate(result)
            arena.end_step()
            before = arena.stats()["renaissance"]["planned_conflicts"]
            arena.begin_step(1)                   # generate(ids, mask)
            pending = []
            for size, life, scales in temps:
                allocate_aging(arena, size * (n if scales else 1), life, pending)
            result = arena.allocate(out_unit * n)
            for _, p in pending:
                arena.deallocate(p)
            arena.end_step()
            conflicts += arena.stats()["renaissance"]["planned_conflicts"] - before
        per_round.append(conflicts)
    r = arena.stats()["renaissance"]
    assert r["planned_steps"] >= 30, r
    assert sum(per_round[2:]) == 0, per_round
    for p in (ids, mask, result):
        arena.deallocate(p)
    arena.check_invariants()
