"""Memory under pressure (issue 11): peak reserved and out-of-memory, per scenario.

Scenarios (sizes as the issue gives them):

* ``holes``: limit 1024 MiB; 40 x 16 MiB, free every other one,
  ``empty_cache()``, then 512 MiB.
* ``35901``: PyTorch issue #35901 with C = 4 GiB: 0.4 C, freed; 200 x 16 MiB,
  every other one freed; 0.4 C again.
* ``35901x6``: the same as 6 steps with C = 8 GiB, everything freed at each
  step's end.
* ``pending``: a 1 MiB block used on a side stream (SimDevice), freed, the
  stream finished: the bytes still pending after the next 1 MiB request.

Columns: PyTorch's CPU allocator (a child process that touches every tensor;
its peak RSS above the RSS after ``import torch``; no limit applies to it, so
its OOM column is "-"); ours with the dynamic pool alone (``planning=False``);
ours planned (each scenario run as 6 steps of one key), each with the default
expandable segments and with fixed segments. Every column of ours repeats the
scenario 6 times in one arena (the dynamic one too, so that fragmentation
which only a repetition shows is seen on both sides) and reports the peak of
repetitions 1-2 / 3-6 (planned: recorded steps / steady steps). Ours runs on ``HostDevice`` through the bindings with
``max_reserved_bytes`` as the device's memory; its memory is never touched
(reserved bytes are the measure, as on a GPU).

Then item 5: the bundled GPT trained on lengths that grow every step with
``expandable_segments=False`` (``bench_territory.varlen_fixed``): the worst
step's peak reserved / peak allocated (steps 2-29) and the last step's, with
planning off and on.

Then the demo GPT's whole-run peak reserved / LOAD (recorded steps
included) and the steady one, from ``torch_renaissance.examples.train_gpt``.

Run: ``python benchmarks/bench_pressure.py [--no-pytorch] [--no-varlen] [--no-demo]``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

from _common import child_env, git_rev, last_result, machine, table

MiB = 1 << 20
GiB = 1 << 30


def holes(alloc, free, empty):
    xs = [alloc(16 * MiB) for _ in range(40)]
    for p in xs[::2]:
        free(p)
    empty()
    y = alloc(512 * MiB)
    free(y)
    for p in xs[1::2]:
        free(p)


def pt35901(cap):
    def run(alloc, free, empty):
        big = int(0.4 * cap)
        free(alloc(big))
        xs = [alloc(16 * MiB) for _ in range(200)]
        for p in xs[::2]:
            free(p)
        y = alloc(big)
        for p in xs[1::2]:
            free(p)
        free(y)
    return run


REPETITIONS = 6  # every column of ours runs each scenario 6 times in one arena

SCENARIOS = [
    ("holes (limit 1 GiB)", holes, 1 * GiB, 1),
    ("#35901 (C = 4 GiB)", pt35901(4 * GiB), 4 * GiB, 1),
    ("#35901 x 6 steps (C = 8 GiB)", pt35901(8 * GiB), 8 * GiB, 6),
]


def ours(fn, limit, steps, expandable, planning):
    from torch_renaissance import _C as C

    a = C.Arena(C.HostDevice(), max_reserved_bytes=limit, expandable_segments=expandable,
                planning=planning)
    peaks, oom = [], False
    try:
        for _ in range(REPETITIONS):
            a.reset_peak_stats()
            if planning:
                a.begin_step()
            fn(a.allocate, a.deallocate, a.empty_cache)
            if planning:
                a.end_step()
            peaks.append(a.stats()["reserved_bytes"]["all"]["peak"])
    except RuntimeError as e:  # torch.OutOfMemoryError
        if "out of memory" not in str(e):
            raise
        oom = True
        peaks.append(a.stats()["reserved_bytes"]["all"]["peak"])
    return {"peak": max(peaks), "recorded": max(peaks[:2]),
            "steady": max(peaks[2:]) if len(peaks) > 2 else None, "oom": oom}


PYTORCH_CHILD = textwrap.dedent("""
    import json, resource, sys, torch
    MiB = 1 << 20
    steps, which, cap = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    def alloc(n):
        t = torch.empty(n, dtype=torch.uint8)
        t.fill_(1)   # touched: resident
        return t
    live = {}
    def A(n):
        t = alloc(n); live[id(t)] = t; return id(t)
    def F(k):
        live.pop(k)
    sys.path.insert(0, "benchmarks")
    import bench_pressure as b
    fn = {"holes": b.holes, "35901": b.pt35901(cap)}[which]
    for _ in range(steps):
        fn(A, F, lambda: None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_rss_bytes": peak - base}))
""")


def pytorch(which, cap, steps):
    r = subprocess.run([sys.executable, "-c", PYTORCH_CHILD, str(steps), which, str(cap)],
                       capture_output=True, text=True, env=child_env())
    if r.returncode:
        print(r.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_rss_bytes"]


def pending_after_next_request(stream_idle_known=True):
    from torch_renaissance import _C as C

    d = C.SimDevice()
    s2 = d.new_stream()
    a = C.Arena(d)
    keep = a.allocate(256 << 10)
    p = a.allocate(256 << 10)
    a.record_stream(p, s2)
    d.enqueue(s2, 5)
    a.deallocate(p)
    d.run_all()
    q = a.allocate(256 << 10)
    s = a.stats()
    out = (s["renaissance"]["pending_bytes"]["current"], q == p, s["renaissance"]["event_queries"])
    a.deallocate(q)
    a.deallocate(keep)
    return out


def demo():
    cmd = [sys.executable, "-m", "torch_renaissance.examples.train_gpt", "--mode", "planned",
           "--steps", "20", "--batch", "8", "--seq", "128"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    return last_result(r.stdout)


def mib(n):
    return "n/a" if n is None else f"{n / MiB:,.0f}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--no-pytorch", action="store_true", help="skip PyTorch's CPU allocator")
    p.add_argument("--no-varlen", action="store_true", help="skip the growing-lengths GPT (item 5)")
    p.add_argument("--no-demo", action="store_true", help="skip the demo GPT")
    args = p.parse_args()
    print(f"machine: {machine()}; rev {git_rev()}\n")
    rows = []
    keys = {"holes (limit 1 GiB)": "holes"}
    for title, fn, limit, steps in SCENARIOS:
        which = keys.get(title, "35901")
        cap = limit
        pt = None if args.no_pytorch else pytorch(which, cap, steps)
        cells = [title, mib(pt)]
        for expandable in (True, False):
            dyn = ours(fn, limit, steps, expandable, planning=False)
            plan = ours(fn, limit, steps, expandable, planning=True)
            cells += [f"{mib(dyn['recorded'])} / {mib(dyn['steady'])}{' OOM' if dyn['oom'] else ''}",
                      f"{mib(plan['recorded'])} / {mib(plan['steady'])}{' OOM' if plan['oom'] else ''}"]
        rows.append(cells)
    print(f"Peak reserved (MiB), each scenario repeated {REPETITIONS} times in one arena: repetitions 1-2 / 3-6 "
          "(planned: recorded steps 0-1 / steady steps 2-5); n/a: the run raised before; OOM marks a run that raised")
    print(table(["scenario", "PyTorch CPU peak RSS", "ours dynamic", "ours planned",
                 "ours dynamic, fixed segs", "ours planned, fixed segs"], rows))
    pend, same, queries = pending_after_next_request()
    print(f"\npending: 1 MiB-class block freed with a finished side-stream use: {pend} bytes pending "
          f"after the next request (same block again: {same}; event/stream queries: {queries})")
    if not args.no_varlen:
        from bench_territory import varlen_fixed

        rows = [[name] + varlen_fixed(p) for name, p in (("planning off", False), ("planning on", True))]
        print("\ngrowing lengths, fixed segments (GPT, 30 steps): peak reserved / peak allocated")
        print(table(["", "worst step (2-29)", "last step"], rows))
    if not args.no_demo:
        res = demo()
        if res:
            print(f"\ndemo GPT (planned, 20 steps): whole-run peak reserved / LOAD "
                  f"{res.get('peak_reserved_over_load', 0):.3f}, steady "
                  f"{res.get('steady_peak_reserved_over_load', 0):.3f}")
        else:
            print("\ndemo GPT: failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
