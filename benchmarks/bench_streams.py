"""Side-stream memory: PyTorch's per-block events vs region-level events.

A simulated training step (SimDevice: the GPU's progress is under our
control): 32 buffers of 4 MiB are allocated on the compute stream, each is
also used on a side stream (a copy or a collective) and freed by the host
right away, as after ``Tensor.record_stream``. The device runs ``lead`` steps
behind the host (host lead time). Three schemes, each on a fresh arena:

* ``pytorch``: one event per (block, stream) recorded at free time and polled
  on every allocation — PyTorch's caching allocator's scheme
  (``c10/cuda/CUDACachingAllocator.cpp``: ``insert_events`` /
  ``process_events``), expressed with the arena's primitives (a boundary after
  every free and before every allocation);
* ``defer``: torch_renaissance's region-level events, one per (region, stream)
  at each step boundary; blocks wait until their event completes;
* ``wait``: the same events, but an allocation that finds no free block makes
  its stream wait for them on the device (stream-ordered reuse).

Printed: peak reserved (MiB), events recorded, event queries.
Run: ``python benchmarks/bench_streams.py``.
"""
from __future__ import annotations

import sys

from _common import git_rev, machine, table

MiB = 1 << 20


def simulate(C, scheme: str, lead: int, steps: int = 40, blocks: int = 32, size: int = 4 * MiB):
    dev = C.SimDevice()
    arena = C.Arena(dev, stream_policy="wait" if scheme == "wait" else "defer", planning=False)
    side = dev.new_stream()
    marks = []  # enqueued positions of (compute, side) at the end of each step
    for k in range(steps):
        if k - lead - 1 >= 0:  # the device finishes step k - lead - 1 by now
            c, s = marks[k - lead - 1]
            dev.advance(0, max(0, c - dev.completed(0)))
            dev.advance(side, max(0, s - dev.completed(side)))
        for _ in range(blocks):
            if scheme == "pytorch":
                arena.sync_point()          # poll every outstanding event
            p = arena.allocate(size, 0)
            dev.enqueue(0, 1)               # compute writes it
            dev.enqueue(side, 1)            # the side stream reads it
            arena.record_stream(p, side)
            arena.deallocate(p)
            if scheme == "pytorch":
                arena.sync_point()          # one event for this block, at free time
        if scheme != "pytorch":
            arena.sync_point()              # step boundary: one event per (region, stream)
        marks.append((dev.enqueued(0), dev.enqueued(side)))
    s = arena.stats()
    return {"peak_mib": s["reserved_bytes"]["all"]["peak"] / MiB, "events": dev.events_recorded,
            "queries": dev.event_queries}


def main() -> int:
    from torch_renaissance import _C as C

    rows = []
    for lead in (0, 1, 2, 5, 10):
        res = {sch: simulate(C, sch, lead) for sch in ("pytorch", "defer", "wait")}
        rows.append([str(lead)] + [f"{res[s]['peak_mib']:.0f}" for s in ("pytorch", "defer", "wait")]
                    + [str(res[s]["events"]) for s in ("pytorch", "defer", "wait")]
                    + [str(res[s]["queries"]) for s in ("pytorch", "defer", "wait")])
    print(f"Side-stream simulation (40 steps x 32 blocks x 4 MiB) — {machine()} — commit {git_rev()}")
    print(table(["host lead (steps)", "peak MiB: PyTorch scheme", "defer", "wait",
                 "events: PyTorch scheme", "defer", "wait", "queries: PyTorch scheme", "defer", "wait"],
                rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
