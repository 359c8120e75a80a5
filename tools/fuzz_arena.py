"""The long run of the arena's differential fuzz (tests/arena_fuzz.py).

Runs seeded fuzz campaigns of the core arena on a SimDevice against the
reference model (disjoint live ranges, exact stats, intact byte patterns,
stream ordering, planned steps of several keys and streams), for each stream
policy and segment mode, and prints one line per campaign. Exits 1 at the
first violation, printing it with its seed so that it can be replayed.

Run: ``python tools/fuzz_arena.py [--ops N] [--seeds K] [--first S]``.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from arena_fuzz import Fuzz, Violation  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=200_000, help="operations per campaign")
    ap.add_argument("--seeds", type=int, default=4, help="campaigns per configuration")
    ap.add_argument("--first", type=int, default=0, help="first seed")
    args = ap.parse_args()
    from torch_renaissance import _C as C

    total = 0
    for seed in range(args.first, args.first + args.seeds):
        for policy in ("defer", "wait"):
            for expandable in (True, False):
                t0 = time.perf_counter()
                f = Fuzz(C, seed, policy=policy, expandable=expandable)
                try:
                    f.run(args.ops)
                except Violation as e:
                    print(f"seed {seed} policy {policy} expandable {expandable}: VIOLATION {e}")
                    return 1
                s = f.arena.stats()["renaissance"]
                total += f.ops
                print(f"seed {seed} policy {policy:5s} expandable {expandable!s:5s}: {f.ops} ops ok "
                      f"({s['plans']} plans, {s['planned_steps']} planned steps, "
                      f"{time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"{total} operations, no violation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
