"""Side-stream memory on SimDevice: PyTorch's per-block events against region-level events.

A simulated training step (SimDevice: the GPU's progress is under the benchmark's control):
``blocks`` buffers of 4 MiB a step are allocated on the compute stream, used on a side stream
(a copy or a collective) and freed by the host at once, as after ``Tensor.record_stream``; the
device runs ``lead`` steps behind the host. Three schemes, each on a fresh arena, in one group:

* ``pytorch`` (the baseline): one event per (block, stream) recorded at free time and polled on
  every allocation, PyTorch's caching allocator's scheme (``c10/cuda/CUDACachingAllocator.cpp``:
  ``insert_events`` / ``process_events``), expressed with the arena's primitives (a boundary
  after every free and before every allocation);
* ``defer``: torch_renaissance's region-level events, one per (region, stream) at each step
  boundary; blocks wait until their event completes;
* ``wait``: the same events, but an allocation that finds no free block makes its stream wait
  for them on the device (stream-ordered reuse).

Timed: the whole simulation, per block. Recorded beside it (``extra_info``): peak reserved
MiB, events recorded and event queries.
"""
from __future__ import annotations

import pytest

from torch_renaissance import _C as C

MiB = 1 << 20
SCHEMES = ("pytorch", "defer", "wait")
LEADS = (0, 1, 2, 5, 10)  # host lead in steps; only 2 under --benchmark-disable


def simulate(scheme: str, lead: int, steps: int = 40, blocks: int = 32, size: int = 4 * MiB):
    """Runs the simulation; returns peak reserved MiB, events recorded, event queries."""
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
    arena.check_invariants()
    s = arena.stats()
    return {"peak_mib": s["reserved_bytes"]["all"]["peak"] / MiB, "events": dev.events_recorded,
            "queries": dev.event_queries}


@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_event_grouping(benchmark, per_op, scheme, lead):
    if benchmark.disabled and lead != 2:
        pytest.skip("one host lead when not timing")
    steps, blocks = (6, 8) if benchmark.disabled else (40, 32)
    benchmark.group = f"stream events on SimDevice ({steps} steps x {blocks} blocks, lead {lead})"
    result = benchmark(simulate, scheme, lead, steps, blocks)
    benchmark.extra_info.update(result)
    per_op(steps * blocks, "block", baseline=scheme == "pytorch")
    held = min(lead + 1, steps) * blocks * 4  # MiB: the blocks of the steps the side stream lags behind
    if scheme == "pytorch":
        assert result["events"] == steps * blocks  # one event per block
        assert result["peak_mib"] == held
    elif scheme == "defer":  # the same memory, far fewer events and queries
        ref = simulate("pytorch", lead, steps, blocks)
        assert result["peak_mib"] == held
        assert result["events"] < ref["events"] and result["queries"] < ref["queries"]
    else:  # the allocating stream waits on the device: one block is ever reserved
        assert result["peak_mib"] == 4
