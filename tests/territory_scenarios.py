"""Scenarios shared by tests/test_territory.py and the benchmarks that measure
the same cases at larger sizes (benchmarks/bench_territory.py,
benchmarks/bench_plan_lock.py). Each drives a core ``_C.Arena`` through the
bindings; sizes in bytes, seeded, so one seed always gives one sequence."""
from __future__ import annotations

import random

MiB = 1 << 20


def random_step(arena, n: int, seed: int, *, begin: bool = True) -> None:
    """``n`` allocations of 64 KiB - 8 MiB whose frees interleave, all freed at
    the end; opens a step first when ``begin`` (same seed: same sizes)."""
    rng = random.Random(seed)
    if begin:
        arena.begin_step()
    live = []
    for _ in range(n):
        live.append(arena.allocate(rng.randint(1, 128) * 64 * 1024))
        while live and rng.random() < 0.45:
            arena.deallocate(live.pop(rng.randrange(len(live))))
    for p in live:
        arena.deallocate(p)


def new_structures(arena, planning: bool, steps: int = 40, seed: int = 0, repeat: int = 1) -> dict:
    """Back-to-back steps that are each a new structure (4-30 blocks of 1-8 MiB,
    at most 4 live), with 2 tensors of 1-4 MiB allocated between steps and kept
    for a few (at most 6 live). With ``repeat`` > 1 each structure runs that
    many steps in a row (the planner plans a shape that never repeats only
    after a few: StepPlanner::kBackoffPlans). Returns the highest reserved bytes
    seen between steps, the number of steps run, and the tensors still live
    between steps (the caller frees them)."""
    rnd = random.Random(seed)
    between: list[int] = []
    top = 0
    shape_seed = 0
    for k in range(steps):
        if k % repeat == 0:
            shape_seed = rnd.randrange(1 << 30)
        shape = random.Random(shape_seed)
        if planning:
            arena.begin_step()
        live = []
        for _ in range(shape.randint(4, 30)):
            live.append(arena.allocate(shape.randint(1, 8) * MiB))
            if len(live) > 3:
                arena.deallocate(live.pop(shape.randrange(len(live))))
        for p in live:
            arena.deallocate(p)
        if planning:
            arena.end_step()
        for _ in range(2):
            between.append(arena.allocate(rnd.randint(1, 4) * MiB))
        while len(between) > 6:
            arena.deallocate(between.pop(rnd.randrange(len(between))))
        top = max(top, arena.stats()["reserved_bytes"]["all"]["current"])
    return {"peak_reserved": top, "between": between}
