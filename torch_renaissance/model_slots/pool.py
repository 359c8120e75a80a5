"""The slot-set pool: every slot set a ModelSlots holds, within ``capacity_bytes``.

A **slot set** is one materialization of an architecture's weight plan (one
contiguous device tensor) with a module instance whose parameters and buffers
are views into it. Slot sets of one architecture are interchangeable.

Capacity invariant: ``held_bytes`` - the bytes of every slot set held, loaded
or free - is at most ``capacity_bytes`` (when not ``None``) whenever a method
returns. To make room for a new slot set the pool first releases free slot
sets of *other* architectures (they hold no model), then evicts the least
recently used models through its owner (an eviction offloads a model to host
memory: a model is never dropped); with eviction off it checks that the
loaded slot sets leave room before changing anything, and raises
``torch.OutOfMemoryError`` otherwise.

Other invariants:

* A slot set keeps its addresses until :meth:`SlotSetPool.release`, the only
  place its memory goes back to the allocator. Unloading, offloading and
  evicting put it on its architecture's free list (``Arch.free``, a subset of
  ``Arch.sets``), and the next load of that architecture takes it from there
  (last in, first out) without allocating. Releases happen only to make room
  for another architecture, or by ``ModelSlots.release_free``.
* Memory placed while no step plan exists (slot sets) is an obstacle for
  later step plans; activation territory may lie above earlier slot sets,
  which is why slot sets are kept on free lists rather than freed.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch
from torch import nn

from torch_renaissance.memory_plan import MaterializedPlan
from torch_renaissance.model_slots import weights
from torch_renaissance.model_slots.records import Arch

__all__ = ["SlotSet", "SlotSetPool"]


class SlotSet:
    """One materialized weight plan and the module instance viewing it."""

    __slots__ = ("arch", "mat", "module")

    def __init__(self, arch: Arch, mat: MaterializedPlan, module: Optional[nn.Module]) -> None:
        self.arch = arch
        self.mat = mat
        self.module = module


class SlotSetPool:
    """The slot sets of every architecture of one ModelSlots (see the module docstring).

    Args:
        device: where slot sets are made.
        capacity_bytes: bound on ``held_bytes``, or ``None``.
        evict: whether :meth:`acquire` may evict models to make room.
        archs: the owner's architectures by name (read, not changed).
    """

    def __init__(self, device: torch.device, capacity_bytes: Optional[int], evict: bool,
                 archs: Mapping[str, Arch]) -> None:
        self.device = device
        self.capacity_bytes = capacity_bytes
        self.evict = evict
        self._archs = archs
        self.held_bytes = 0

    def in_use_bytes(self) -> int:
        """Bytes of the slot sets that hold a model."""
        return sum(a.layout.weight_bytes * (len(a.sets) - len(a.free)) for a in self._archs.values())

    def acquire(self, arch: Arch, evict_lru: Callable[[], bool],
                with_module: bool = True) -> SlotSet:
        """A free slot set of ``arch``: reused, or made within ``capacity_bytes``.

        Order when a new one would exceed the capacity: release free slot sets
        of other architectures (they hold no model), then ``evict_lru()``
        (offloads the least recently used model, putting its slot set on its
        architecture's free list; False when no model is loaded); a model of
        ``arch`` evicted on the way gives its slot set directly. Checks that
        the capacity can be met before changing anything when eviction is off.

        Raises:
            torch.OutOfMemoryError: no room (the message names the
                architecture, the bytes needed and the bytes free).
        """
        if arch.free:
            return arch.free.pop()
        need = arch.layout.weight_bytes
        cap = self.capacity_bytes
        if cap is not None and self.held_bytes + need > cap:
            in_use = self.in_use_bytes()
            if need > cap or (not self.evict and in_use + need > cap):
                self._oom(arch, need, cap - in_use,
                          "eviction is off" if not self.evict else "it exceeds capacity_bytes")
            while self.held_bytes + need > cap:
                # 1. Free slot sets of other architectures hold no model: release them.
                victim = next((a for a in self._archs.values() if a is not arch and a.free), None)
                if victim is not None:
                    self.release(victim.free.pop())
                    continue
                # 2. Offload the least recently used model.
                if not evict_lru():
                    self._oom(arch, need, cap - self.in_use_bytes(), "nothing left to evict")
                if arch.free:  # it was of this architecture: take its slot set
                    return arch.free.pop()
        mat = arch.layout.plan.materialize(self.device)
        weights.write_fixed(arch, mat)
        s = SlotSet(arch, mat, weights.instance(arch, mat) if with_module else None)
        arch.sets.append(s)
        self.held_bytes += need
        return s

    def release(self, s: SlotSet) -> None:
        """Hands a free slot set back to the allocator."""
        arch = s.arch
        if s in arch.free:
            arch.free.remove(s)
        arch.sets.remove(s)
        self.held_bytes -= s.mat.plan.nbytes
        s.module = None
        s.mat = None

    def release_free(self, arch: Arch) -> int:
        """Releases every free slot set of ``arch``; returns the bytes released."""
        n = 0
        while arch.free:
            s = arch.free.pop()
            n += s.mat.plan.nbytes
            self.release(s)
        return n

    def _oom(self, arch: Arch, need: int, free: int, why: str) -> Any:
        raise torch.OutOfMemoryError(
            f"ModelSlots: cannot place a slot set of architecture {arch.layout.name!r}: it needs "
            f"{need} bytes and {max(free, 0)} bytes are free of capacity_bytes={self.capacity_bytes} "
            f"({why}); unload or offload a model, or raise capacity_bytes")
