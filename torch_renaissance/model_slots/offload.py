"""Offload: a loaded model's slot set copied to host memory, and back.

An **offloaded** model's weights sit in one host buffer with the slot set's
layout (pinned where the device has streams) and it holds no slot set;
:meth:`ModelSlots.get` reloads it into a free slot set of its architecture.
Eviction (``pool.py``) is an offload of the least recently used model.

Invariants:

* Offloading reads the slot set on the ``d2h`` stream after the compute
  stream's queued work, and waits for that copy before returning: the slot
  set goes back to the free list and may be overwritten at once.
* Reloading writes on the ``h2d`` stream after the compute stream's queued
  work; the compute stream waits for it before its next use, and the host
  buffer stays alive (``WeightCopies.pending``) until the copy is done.
* On the CPU both are plain synchronous copies.
"""
from __future__ import annotations

import torch

from torch_renaissance.memory_plan import MaterializedPlan
from torch_renaissance.model_slots.weights import WeightCopies

__all__ = ["copy_to_host", "copy_from_host"]


def copy_to_host(copies: WeightCopies, mat: MaterializedPlan) -> MaterializedPlan:
    """A host copy of slot set ``mat`` (same plan), complete when this returns."""
    plan = mat.plan
    pinned = not copies.plain
    buf = torch.empty(plan.nbytes, dtype=torch.uint8, pin_memory=pinned)
    with torch.no_grad():
        if pinned:
            sm = copies.streams
            with sm.on("d2h") as d2h:
                d2h.wait_stream(sm.stream("compute"))
                buf.copy_(mat.buffer, non_blocking=True)
            # The slot set is reused at once: its bytes must have been read.
            d2h.synchronize()
        else:
            buf.copy_(mat.buffer)
    return MaterializedPlan(plan, buf)


def copy_from_host(copies: WeightCopies, host: MaterializedPlan, mat: MaterializedPlan) -> None:
    """Copies an offloaded model's host buffer into slot set ``mat``."""
    with torch.no_grad():
        if copies.plain:
            mat.buffer.copy_(host.buffer)
        else:
            sm = copies.streams
            with sm.on("h2d") as h2d:
                h2d.wait_stream(sm.stream("compute"))
                mat.buffer.copy_(host.buffer, non_blocking=True)
                ev = torch.Event(device=copies.device)
                ev.record(h2d)
            copies.pending.append((ev, host.buffer))  # freed once the copy is done
            sm.handoff(mat.buffer, "compute", from_="h2d")
    copies.wait_pending(block=False)
