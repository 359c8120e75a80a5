"""Planner quality and time over every reference trace in ../shared/data/traces.

For each instance: buffers, LOAD, greedy by size (the TFLite/XLA baseline),
torch_renaissance's plan, PyTorch's recorded peak reserved (snapshots with
segment events), planning time. Budgets: 1 s (snapshots, SOMAS, IOPDDL) and
5 s (MiniMalloc A-E), the issue's targets. Run: ``python benchmarks/bench_planner.py``.
"""
from __future__ import annotations

import sys
import time

from _common import data_dir, git_rev, machine, table

from torch_renaissance import trace as T
from torch_renaissance.planner import plan_trace, validate


def pct(n, load):
    return "n/a" if n is None else f"{100 * (n / load - 1):+.3f}%"


def main() -> int:
    root = data_dir() / "traces"
    if not root.is_dir():
        print(f"reference traces not found at {root}; nothing to do")
        return 0
    files = sorted((root / "snapshots").glob("*.pickle")) + sorted((root / "dsa").glob("*.csv"))
    rows = []
    worst = {"1s": 0.0, "mm": 0.0}
    for f in files:
        tr = T.load_trace(f)
        mm = f.name.startswith("minimalloc")
        budget = 5.0 if mm else 1.0
        t0 = time.perf_counter()
        res = plan_trace(tr, budget_seconds=budget)
        wall = time.perf_counter() - t0
        err = validate(tr.lifetimes(), res.offsets)
        assert err is None, f"{f.name}: invalid plan: {err}"
        ratio = res.plan_bytes / res.load_bytes
        key = "mm" if mm else "1s"
        worst[key] = max(worst[key], ratio)
        rows.append([f.stem, str(len(tr)), f"{res.load_bytes / 2**20:,.1f} MiB",
                     pct(res.greedy_bytes, res.load_bytes), pct(res.plan_bytes, res.load_bytes),
                     pct(tr.pytorch_reserved_peak, res.load_bytes), f"{wall:.2f} s ({budget:g})",
                     res.method])
        print(f"  {f.name}: {pct(res.plan_bytes, res.load_bytes)} in {wall:.2f} s", file=sys.stderr)
    print(f"Planner benchmark — {machine()} — commit {git_rev()}")
    print(table(["instance", "buffers", "LOAD", "greedy by size", "torch_renaissance",
                 "PyTorch peak reserved", "time (budget)", "method"], rows))
    print(f"\nworst plan/LOAD: snapshots+SOMAS+IOPDDL {worst['1s']:.4f} (target 1.005), "
          f"MiniMalloc {worst['mm']:.4f} (target 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
