"""An allocation's latency on another thread while a step is planned.

``end_step()`` plans the step it ends (``csrc/core/step_planner.cpp``). The
planner used to run under the arena's lock, so every other thread's
allocation (a DataLoader's pin-memory thread; on a GPU the autograd engine's
threads) waited for the whole plan budget. Now the planner runs without the
lock, on a snapshot of the trace, and only installing the result takes it.

The workload: a step of ``n`` buffers with random sizes (64 KiB - 8 MiB) and
interleaved lifetimes (seeded), recorded twice so that the second
``end_step()`` plans it with ``plan_budget_seconds``; meanwhile a second
thread allocates and frees 4 KiB in a loop and times each pair. Printed: the
planning time (``end_step``'s wall time: what a blocked allocation waited
before), the other thread's worst and 99th-percentile latency during it, and
how many pairs it completed meanwhile, and as a noise floor the worst
latency of a pure-Python operation on that thread in the same situation (on a
loaded 2-core machine the scheduler alone stalls a thread for tens of ms).
Target: worst <= 1 ms where the machine's noise floor allows it.

Run: ``python benchmarks/bench_plan_lock.py [--buffers N] [--budget S]``.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import threading
import time

from _common import git_rev, machine, table

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from territory_scenarios import random_step  # noqa: E402  (the test's step, larger)

MiB = 1 << 20


def measure(C, n: int, budget: float, seed: int = 0, control: bool = False) -> dict:
    """Plans one step while another thread allocates; returns the latencies (s).

    ``control``: the other thread runs a pure-Python operation of similar cost
    instead (no arena call): the machine's scheduling noise floor."""
    arena = C.Arena(C.HostDevice(), plan_budget_seconds=budget)
    random_step(arena, n, seed)
    arena.end_step()
    random_step(arena, n, seed)           # same sizes: its end plans the step
    stop = threading.Event()
    started = threading.Event()
    lat: list[tuple[float, float]] = []   # (start, seconds) of each allocate+free pair

    def other() -> None:
        started.set()
        while not stop.is_set():
            t0 = time.perf_counter()
            if control:
                sum(range(8))
            else:
                p = arena.allocate(4096)
                arena.deallocate(p)
            lat.append((t0, time.perf_counter() - t0))

    th = threading.Thread(target=other)
    th.start()
    started.wait()
    time.sleep(0.05)
    t0 = time.perf_counter()
    arena.end_step()
    t1 = time.perf_counter()
    time.sleep(0.05)
    stop.set()
    th.join()
    during = sorted(d for s, d in lat if t0 <= s + d and s <= t1)
    plans = arena.stats()["renaissance"]["plans"]
    return {"plan_s": t1 - t0, "plans": plans, "pairs": len(during),
            "worst_s": during[-1] if during else t1 - t0,
            "p99_s": during[int(0.99 * (len(during) - 1))] if during else t1 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buffers", type=int, default=1200)
    ap.add_argument("--budget", type=float, default=0.25, help="plan_budget_seconds")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from torch_renaissance import _C as C

    # The process's first plan on a fresh thread pays one-time costs (an
    # allocation on another thread then stalled for most of it, with or
    # without the lock); warm up once so the rows show the steady state.
    measure(C, 200, 0.0, seed=99)
    rows = []
    for seed in range(args.repeat):
        r = measure(C, args.buffers, args.budget, seed)
        c = measure(C, args.buffers, args.budget, seed, control=True)
        assert r["plans"] == 1, r
        rows.append([str(seed), f"{r['plan_s'] * 1e3:.1f}", f"{r['worst_s'] * 1e3:.3f}",
                     f"{r['p99_s'] * 1e3:.3f}", str(r["pairs"]), f"{c['worst_s'] * 1e3:.3f}"])
    print(f"# allocation latency on another thread during planning ({args.buffers} buffers, "
          f"budget {args.budget} s); {machine()}; {git_rev()}")
    print(table(["seed", "planning (end_step) ms", "worst alloc+free ms", "p99 ms",
                 "pairs during planning", "noise floor: worst pure-Python op ms"], rows))


if __name__ == "__main__":
    main()
