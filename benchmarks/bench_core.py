"""The core's allocate+free hot path against malloc/free, in one run.

Compiles ``benchmarks/cpp/arena_bench.cpp`` with the core sources (g++ -O2)
and prints ns per allocate+free pair for 512 B, 64 KiB and 4 MiB, next to
glibc's malloc/free of the same sizes. Run: ``python benchmarks/bench_core.py``.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile

from _common import REPO, git_rev, machine, table

CORE = ["arena", "step_planner", "stream_events", "stats", "host_device", "sim_device"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        exe = f"{tmp}/arena_bench"
        srcs = [str(REPO / "benchmarks/cpp/arena_bench.cpp")]
        srcs += [str(REPO / f"csrc/core/{n}.cpp") for n in CORE]
        srcs += sorted(str(p) for p in (REPO / "csrc/core").glob("planner*.cpp"))
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{REPO / 'csrc'}", *srcs, "-o", exe], check=True)
        out = subprocess.run([exe, sys.argv[1] if len(sys.argv) > 1 else "2000000"], check=True,
                             capture_output=True, text=True).stdout.split()
    rows = []
    for line in out[1:]:
        size, arena, mall = line.split(",")
        n = int(size)
        label = f"{n} B" if n < 1024 else (f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB")
        rows.append([label, f"{float(arena):.1f}", f"{float(mall):.1f}"])
    print(f"Core hot path — {machine()} — commit {git_rev()}")
    print(table(["size", "torch_renaissance arena (ns/pair)", "glibc malloc+free (ns/pair)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
