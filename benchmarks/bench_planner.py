"""Planner quality and time: every reference trace in ../shared/data/traces and
seeded generated instances (torch_renaissance.synthetic: training steps, SOMAS-style
compiler graphs, XLA/IOPDDL-style buffers, MiniMalloc-style packed squares, and cyclic
two-phase steps of a loop that keeps its previous output, at 0.25 s (the step planner's
budget) and 1 s), against LOAD
and greedy by size (the TFLite/XLA baseline).

For each instance: buffers, LOAD, greedy by size, torch_renaissance's plan
(median of ``--repeats`` runs), PyTorch's recorded peak reserved (snapshots
with segment events), the median planning time, what stopped the search
(bound / work / clock / done) and the method. Budgets, as issue 12 sets
them: 1 s for snapshots, SOMAS, IOPDDL and synthetic steps, 2 s from 50,000
buffers up (target: +0.5% over LOAD within the budget); MiniMalloc A-E at 1 s (target
+2%) and at 10 s (target: height <= 1,048,576, MiniMalloc's capacity, or
LOAD). Then the wall-clock check: ``--wall-runs`` plans of a set of instances
at several budgets, the worst plan_seconds - budget (target <= 0.1 s), with
the machine's load average beside it (the machine is shared: wall times
depend on its load).

Run: ``python benchmarks/bench_planner.py [--repeats 3] [--wall-runs 20] [--quick]``.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import random
import statistics
import sys
import time

from _common import data_dir, git_rev, machine, table

from torch_renaissance import trace as T
from torch_renaissance.planner import plan_lifetimes, validate
from torch_renaissance import _C
from torch_renaissance.planner import PlanResult
from torch_renaissance.synthetic import (alternating_step, packed_square, somas_graph, training_step,
                                         xla_buffers)

#: Synthetic steps: (about how many buffers, seed). Sizes and seeds are in docs/benchmarks.md.
SYNTHETIC = [(1_000, 1), (3_000, 2), (10_000, 3), (30_000, 4), (100_000, 5), (10_000, 6),
             (30_000, 7)]
#: More generated instances, three kinds at 10k-60k buffers (issue 12: the sizes where the
#: improvement phases gave up): (generator, about how many buffers, seed).
GENERATED = [(g, n, seed) for g in (training_step, somas_graph, xla_buffers)
             for n, seed in ((10_000, 11), (30_000, 12), (60_000, 13))]
#: Cyclic two-phase instances (issue 12 / 16's planner's gap: an ordinary loop that keeps its
#: previous output, planned as an alternating layout of period 2T; alternating_step):
#: (about how many buffers, seed).
CYCLIC = [(1_000, 21), (2_000, 22), (3_000, 23), (5_000, 24), (8_000, 25)]
MINIMALLOC_CAPACITY = 1_048_576
#: Hard instances of MiniMalloc's family (packed_square: a 1,048,576 x 1,048,576 square cut
#: into rectangles, some removed; a plan at 1,048,576 exists): (buffers, seed). Planned as
#: MiniMalloc's A-E are (1 s, target +2%; 10 s).
PACKED = [(210, 1), (230, 2), (250, 3), (270, 4), (290, 5)]
#: Instance name -> period, for the cyclic ones (planned through the extension's cyclic API).
PERIODS = {}


def pct(n, load):
    return "n/a" if n is None else f"{100 * (n / load - 1):+.3f}%"


def instances(quick: bool, minimalloc_csv=()):
    """(name, kind, lifetimes, PyTorch peak reserved or None).

    ``minimalloc_csv``: more MiniMalloc-format CSV files (``id,lower,upper,size``; e.g. the
    rest of google/minimalloc's ``benchmarks/challenging`` from a checkout), measured as the
    shared MiniMalloc instances are (budgets 1 and 10 s, height vs 1,048,576 bytes).
    """
    root = data_dir() / "traces"
    out = []
    if root.is_dir():
        for f in sorted((root / "snapshots").glob("*.pickle")):
            tr = T.load_trace(f)
            out.append((f.stem, "snapshot", tr.lifetimes(), tr.pytorch_reserved_peak))
        for f in sorted((root / "dsa").glob("*.csv")):
            kind = "minimalloc" if f.name.startswith("minimalloc") else "dsa"
            out.append((f.stem, kind, T.load_trace(f).lifetimes(), None))
    else:
        print(f"reference traces not found at {root}; synthetic instances only", file=sys.stderr)
    for path in minimalloc_csv:
        f = pathlib.Path(path)
        out.append((f"minimalloc_{f.name.split('.')[0]}", "minimalloc", T.load_trace(f).lifetimes(), None))
    for n, seed in SYNTHETIC[:3] if quick else SYNTHETIC:
        lt = training_step(n, seed)
        out.append((f"synthetic_{n // 1000}k_s{seed} ({len(lt)})", "synthetic", lt, None))
    for gen, n, seed in GENERATED[:1] if quick else GENERATED:
        lt = gen(n, seed)
        out.append((f"{gen.__name__}_{n // 1000}k_s{seed} ({len(lt)})", "generated", lt, None))
    for n, seed in PACKED[:1] if quick else PACKED:
        out.append((f"packed_square_{n}_s{seed}", "minimalloc", packed_square(n, seed)[0], None))
    for n, seed in CYCLIC[:2] if quick else CYCLIC:
        lt, period = alternating_step(n, seed)
        name = f"alternating_step_{n // 1000}k_s{seed} ({len(lt)})"
        PERIODS[name] = period
        out.append((name, "cyclic", lt, None))
    return out


def dense_cyclic(buffers, period, seed):
    """Random cyclic lifetimes over a short period: each buffer overlaps about half of the
    others, millions of pairs for a few thousand buffers, the worst case of the search's setup
    (its overlap lists; a breaker's instance: 4,049 buffers over 22 ticks, whose setup took
    0.4 s). Returns (lifetimes, period)."""
    rng = random.Random(seed)
    out = []
    for _ in range(buffers):
        size = rng.choice([64, 256, 1024, rng.randint(1, 99_999)])
        lower = rng.randrange(period)
        out.append((size, lower, lower + 1 + rng.randrange(period)))
    return out, period


def plan_cyclic(lt, period, budget, clock):
    """plan_lifetimes for a cyclic instance (lifetimes that may wrap ``period``)."""
    cols = [list(c) for c in zip(*lt)]
    r = _C.plan(*cols, period, [], budget, clock_seconds=-1.0 if clock is None else clock)
    err = _C.validate(*cols, list(r["offsets"]), period, [])
    assert not err, f"invalid plan: {err}"
    return PlanResult(list(r["offsets"]), r["size"], r["load"], r["greedy_size"] or None,
                      r["seconds"], r["method"], r["lower_bound"], r["optimal"], r["stopped_by"])


def run(lt, budget, repeats, clock, period=0):
    results = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = (plan_cyclic(lt, period, budget, clock) if period else
               plan_lifetimes(lt, budget_seconds=budget, clock_seconds=clock))
        results.append((res, time.perf_counter() - t0))
    if not period:  # plan_cyclic checked its plans
        err = validate(lt, results[0][0].offsets)
        assert err is None, f"invalid plan: {err}"
    sizes = sorted(r.plan_bytes for r, _ in results)
    res = min(results, key=lambda rw: abs(rw[0].plan_bytes - sizes[len(sizes) // 2]))[0]
    return res, statistics.median(r.seconds for r, _ in results), \
        statistics.median(w for _, w in results), sizes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="plans per instance and budget (median)")
    ap.add_argument("--wall-runs", type=int, default=20, help="runs of the wall-clock check")
    ap.add_argument("--quick", action="store_true", help="fewer synthetic instances, 1 repeat")
    ap.add_argument("--wall-only", action="store_true", help="only the wall-clock check")
    ap.add_argument("--no-clock", action="store_true",
                    help="the work count alone stops the search (clock_seconds=inf): the plans an "
                         "idle reference machine gets, the same on any machine")
    ap.add_argument("--minimalloc-csv", nargs="*", default=[], metavar="CSV",
                    help="more MiniMalloc-format instances (id,lower,upper,size), e.g. the rest "
                         "of google/minimalloc's benchmarks/challenging (not in this repository)")
    args = ap.parse_args()
    clock = math.inf if args.no_clock else None
    repeats = 1 if args.quick else args.repeats
    load0 = os.getloadavg()
    rows = []
    worst = {"1s": 0.0, "gen": 0.0, "time_1s": 0.0, "mm1": 0.0, "mm1_cap": 0.0, "cyc": 0.0}
    mm_ok = []
    insts = instances(args.quick, args.minimalloc_csv)
    for name, kind, lt, reserved in [] if args.wall_only else insts:
        # Issue 12: 1 s; 2 s from 50,000 buffers up (target: 100k buffers in 2 s).
        budgets = ([1.0, 10.0] if kind == "minimalloc" else [0.25, 1.0] if kind == "cyclic"
                   else [2.0 if len(lt) > 50_000 else 1.0])
        for budget in budgets:
            res, secs, wall, sizes = run(lt, budget, repeats, clock, PERIODS.get(name, 0))
            load = res.load_bytes
            spread = "" if sizes[0] == sizes[-1] else f" ({pct(sizes[0], load)}..{pct(sizes[-1], load)})"
            rows.append([name, kind, str(len(lt)), f"{load / 2**20:,.1f} MiB",
                         pct(res.greedy_bytes, load), pct(res.plan_bytes, load) + spread,
                         "yes" if res.optimal else "", pct(reserved, load),
                         f"{secs:.2f} s ({budget:g})", res.stopped_by, res.method])
            print(f"  {name} @{budget:g}s: {pct(res.plan_bytes, load)} in {secs:.2f} s "
                  f"[{res.stopped_by}]", file=sys.stderr)
            if kind == "minimalloc":
                if budget == 1.0:
                    worst["mm1"] = max(worst["mm1"], res.plan_bytes / load)
                    worst["mm1_cap"] = max(worst["mm1_cap"],
                                           res.plan_bytes / max(MINIMALLOC_CAPACITY, load))
                else:
                    mm_ok.append((name, res.plan_bytes <= max(MINIMALLOC_CAPACITY, load)))
            elif kind == "cyclic" and budget < 1.0:
                worst["cyc"] = max(worst["cyc"], res.plan_bytes / load)
            else:
                # Recorded traces carry issue 12's target; generated instances are reported
                # beside them (LOAD is their only bound: how far from optimal they are is unknown).
                key = "1s" if kind in ("snapshot", "dsa") else "gen"
                worst[key] = max(worst[key], res.plan_bytes / load)
                worst["time_1s"] = max(worst["time_1s"], secs - budget + 1.0)
    print(f"Planner benchmark — {machine()} — commit {git_rev()}")
    print(f"load average at start {load0[0]:.1f} (1 min), {load0[1]:.1f} (5 min), at the end "
          f"{os.getloadavg()[0]:.1f}; median of {repeats} run(s)"
          + ("; no clock (work count only)" if args.no_clock else ""))
    print(table(["instance", "kind", "buffers", "LOAD", "greedy by size", "torch_renaissance",
                 "optimal", "PyTorch peak reserved", "time (budget)", "stopped by", "method"], rows))
    if not args.wall_only:
        print(f"\nworst plan/LOAD, snapshots+SOMAS+IOPDDL: {worst['1s']:.4f} (target 1.005); "
              f"synthetic+generated: {worst['gen']:.4f} (LOAD their only bound); worst time over "
              f"budget {worst['time_1s'] - 1:+.2f} s (budgets 1 s, 2 s from 50k buffers)")
        print(f"cyclic (alternating) steps at 0.25 s, the step planner's budget: worst plan/LOAD "
              f"{worst['cyc']:.4f}")
        print(f"MiniMalloc at 1 s: worst plan/LOAD {worst['mm1']:.4f}, worst plan/max({MINIMALLOC_CAPACITY:,}, "
              f"LOAD) {worst['mm1_cap']:.4f} (target 1.02); at 10 s, "
              f"height <= {MINIMALLOC_CAPACITY:,} or LOAD: "
              + ", ".join(f"{n} {'yes' if ok else 'NO'}" for n, ok in mm_ok))

    # The wall-clock promise: plan_seconds <= budget + 0.1 s, whatever the load.
    by_name = {name: lt for name, _, lt, _ in insts}
    picks = [n for n in by_name if n.startswith(("minimalloc_E", "iopddl_S_1", "gpt_ctx128",
                                                 "synthetic_100k"))]
    dense, dense_period = dense_cyclic(4049, 22, 5)
    picks.append("dense_cyclic_4k")
    over = []
    t_end = time.perf_counter()
    for k in range(0 if args.no_clock else args.wall_runs):
        name = picks[k % len(picks)] if picks else next(iter(by_name))
        budget = (0.25, 0.5, 1.0)[k % 3]
        if name == "dense_cyclic_4k":
            res = plan_cyclic(dense, dense_period, budget, None)
        else:
            res = plan_lifetimes(by_name[name], budget_seconds=budget)
        over.append((res.seconds - budget, name, budget, os.getloadavg()[0]))
    if over:
        for x in sorted(over, reverse=True)[:3]:
            print(f"  wall check: {x[1]} at {x[2]:g} s: plan_seconds - budget {x[0]:+.3f} s "
                  f"(load average {x[3]:.1f})", file=sys.stderr)
        o = max(over)
        print(f"\nwall clock: {sum(x[0] > 0.1 for x in over)} of {len(over)} runs over +0.1 s")
        print(f"\nwall clock: {len(over)} runs over {', '.join(picks)} at budgets 0.25/0.5/1 s "
              f"({time.perf_counter() - t_end:.0f} s); worst plan_seconds - budget "
              f"{o[0]:+.3f} s ({o[1]} at {o[2]:g} s, load average {o[3]:.1f}); median "
              f"{statistics.median(x[0] for x in over):+.3f} s (target <= +0.1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
