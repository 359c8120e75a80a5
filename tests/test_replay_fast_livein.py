"""Planned replay's fast path over the previous step's live-ins (issue 14).

A step that keeps some outputs into the next one (logits, KV tensors, a loss) has them
standing in the territory when the next step begins; the plan puts that step's later
buffers over them, after the step frees them. Such a position is served by the fast path
once every live-in its range met when the step began has been freed by the step (without
a stream use: its range is then free territory again); before that, or when the live-in
was used on a side stream (its free leaves it pending), it takes the locked path.

Driven against the range model of ``replay_model`` on a SimDevice (seeded, budget-0 plans,
so the plan does not depend on the machine's load), with nothing read between operations
(a read flushes the fast path):

* every allocation is checked against the live and outstanding ranges (no overlap);
* stats and ``check_invariants()`` are checked after every step (``Model.check``);
* deviating steps free the previous step's outputs only after every allocation (``late``:
  the positions planned over them must not be handed out while they live) or use this
  step's outputs on a side stream before they are freed in the next step (``stream``);
* the other steps, once planned, are served wholly by the fast path: the locked path
  served every position over a live-in before this pass.
"""
from __future__ import annotations

import random

import pytest

from replay_model import KiB, make_step
from test_replay_fast_path import Model


def make_looped_step(rng: random.Random, n: int, outputs: int):
    """A step of ``n`` buffers (``make_step``) plus ``outputs`` kept into the next step,
    made at seeded points; the previous step's outputs are freed at seeded points of the
    first half. Returns (sizes, ops): ops are ``("a", i)``, ``("f", i)``, ``("o", j)`` (make
    output j) and ``("p", j)`` (free the previous step's output j)."""
    sizes, ops = make_step(rng, n)
    out_sizes = [512 * rng.randrange(8, 128) for _ in range(outputs)]
    for j in range(outputs):
        ops.insert(rng.randrange(len(ops) // 2, len(ops)), ("o", j))
    for j in range(outputs):
        ops.insert(rng.randrange(1, len(ops) // 2), ("p", j))
    return sizes + out_sizes, ops


def run_step(model: Model, sizes, ops, n: int, prev_out: list, key: int, deviation, side):
    arena = model.arena
    arena.begin_step(key)
    addr = [0] * n
    out = [0] * (len(sizes) - n)
    for op, i in ops:
        if op == "a":
            addr[i] = model.alloc(sizes[i])
        elif op == "f":
            model.free(addr[i])
        elif op == "o":
            out[i] = model.alloc(sizes[n + i])
        elif op == "p" and prev_out and deviation != "late":
            model.free(prev_out[i])
    if deviation == "late":
        for p in prev_out:
            model.free(p)
    if deviation == "stream":
        for p in out:  # used on the side stream; freed in the next step while it works
            model.dev.enqueue(side, 1)
            arena.record_stream(p, side)
    arena.end_step()
    return out


@pytest.mark.parametrize("seed", range(4))
def test_positions_over_freed_live_ins_take_the_fast_path_and_never_overlap(C, seed):
    rng = random.Random(7100 + seed)
    dev = C.SimDevice()
    side = dev.new_stream()
    arena = C.Arena(dev, plan_budget_seconds=0.0)
    model = Model(arena, dev)
    n = 150
    sizes, ops = make_looped_step(rng, n, outputs=4)
    schedule = ["late", "stream"] * 3
    rng.shuffle(schedule)
    prev_out: list = []
    previous = None
    history: list = []
    clean_steps = 0
    for step in range(36):
        deviation = schedule.pop() if step >= 8 and step % 4 == 0 and schedule else None
        before = arena.stats()["renaissance"]
        if previous == "stream":
            # The previous outputs were used on the side stream: freed while it works, so
            # their ranges stay outstanding until it completes.
            model.outstanding.extend((p, model.live[p][0], side, dev.enqueued(side), len(dev.waits()))
                                     for p in prev_out)
        out = run_step(model, sizes, ops, n, prev_out, 11, deviation, side)
        if previous == "stream":
            model.side_work_done()
        model.check()
        r = arena.stats()["renaissance"]
        d = {k: r[k] - before[k] for k in ("planned_requests", "planned_hits", "planned_fast_hits")}
        history.append(deviation)
        # Clean: no deviation in this step or the two before it (after a side-stream use
        # the next step frees pending blocks and conflicts, and the one after it begins
        # with the territory's epoch events outstanding: the fast path is not armed).
        if step >= 4 and not any(history[-3:]):
            assert r["last_step_hits"] == len(sizes), (step, r["last_step_hits"])
            assert d["planned_fast_hits"] == d["planned_hits"] == len(sizes), (step, d)
            clean_steps += 1
        prev_out, previous = out, deviation
    for p in prev_out:
        model.free(p)
    model.check()
    assert not model.live
    assert clean_steps >= 10, clean_steps
