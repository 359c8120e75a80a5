"""Snapshot loading: the safe unpickler beside plain ``pickle.load`` on the shared snapshots.

Per file (``../shared/data/traces/snapshots``, or ``$TORCH_RENAISSANCE_DATA``): the best of
``--repeat`` runs, in CPU time of this process (``time.process_time``, steadier than wall
time on a shared machine), of

* ``pickle.loads`` (the baseline: what an unsafe loader would take),
* ``safe_unpickle`` (our loader: structure scan + restricted unpickler), with the scan in C
  (``trace._pickle_scan``) and, for comparison, with the scan in Python
  (``check_pickle_structure_py``, the fallback when the C module is not built),

and the ratio of each to ``pickle.loads``. Target: the safe loader within 3x of
``pickle.loads``.

Run: ``python benchmarks/bench_snapshot_load.py [--repeat N]``.
"""
from __future__ import annotations

import argparse
import pickle
import sys
import time

from _common import data_dir, machine, table

from torch_renaissance.trace import safe_pickle


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv[1:])
    folder = data_dir() / "traces" / "snapshots"
    files = sorted(folder.glob("*.pickle"))
    if not files:
        print(f"no snapshots in {folder}", file=sys.stderr)
        return 1
    if safe_pickle._scan is None:
        print("trace._pickle_scan is not built: only the Python scan is measured",
              file=sys.stderr)
    rows = []
    for path in files:
        data = path.read_bytes()
        base = _best(lambda: pickle.loads(data), args.repeat)
        ours = _best(lambda: safe_pickle.safe_unpickle(path), args.repeat)
        saved = safe_pickle._scan
        safe_pickle._scan = None
        try:
            py = _best(lambda: safe_pickle.safe_unpickle(path), max(1, args.repeat // 2))
        finally:
            safe_pickle._scan = saved
        rows.append([path.name, f"{len(data) / 2**20:.2f}", f"{base * 1e3:.1f}",
                     f"{ours * 1e3:.1f}", f"{ours / base:.2f} x", f"{py * 1e3:.0f}",
                     f"{py / base:.1f} x"])
    print(f"Machine: {machine()}\n")
    print(table(["snapshot", "MiB", "pickle.loads ms", "safe_unpickle (C scan) ms",
                 "vs pickle", "safe_unpickle (Python scan) ms", "vs pickle"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
