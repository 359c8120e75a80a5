"""Model slots: many models on one device, one weight layout per architecture.

An inference service keeps many models on one device and brings them online,
offline and back as traffic shifts. Here every *architecture* gets a planned
weight layout - a :class:`~torch_renaissance.memory_plan.MemoryPlan` with one
region ``"weights"`` and one 256-byte-aligned slot per parameter and buffer -
and every model of that architecture lives in a **slot set**: one
materialization of that plan (one contiguous device tensor). Slot sets of one
architecture are interchangeable, so switching models is a copy into fixed
addresses: no allocation, no fragmentation, and a CUDA graph captured on a slot
set replays for any model later loaded into it.

Words (``docs/design.md``): *slot*, *region*, *plan*, *step*. Here also:

* **slot set**: one materialized weight plan of an architecture, with a module
  instance whose parameters and buffers are views into it;
* **loaded** model: its weights sit in a slot set; **offloaded** model: its
  weights sit in host memory (pinned on accelerators) and no slot set is held;
  :meth:`ModelSlots.get` brings it back.

The package, one concept a module (each states its invariants at its top):

* ``slots.py``: :class:`ModelSlots`, the facade (names, LRU, the lock);
* ``pool.py``: the slot-set pool and its capacity invariant (``capacity_bytes``
  bounds the bytes of all slot sets held, loaded or free; a model is never
  dropped to make room: eviction offloads it to host memory);
* ``weights.py``: weight layouts, validation before any copy, copies into a
  slot set;
* ``offload.py``: a model's weights to host memory and back;
* ``activations.py``: forwards as planned steps of the arena;
* ``records.py``: :class:`ArchitectureLayout` and the per-architecture and
  per-model records.

Activation memory: when torch_renaissance is installed for the device (with
planning on), :meth:`ModelSlots.register` runs the example forward inside
:func:`torch_renaissance.step` until the arena has recorded and planned it and
a step replays at stable addresses; every :meth:`ModelSlots.forward` is one
such step, so all models of an architecture share that activation plan
(``activations.py`` says how steps are keyed and serialized).

Sources: ``torch.nn.Module.state_dict`` / ``load_state_dict`` semantics for
keys (``torch/nn/modules/module.py``); staging through pinned memory on a copy
stream as in ``torch.utils.data``'s pin-memory thread and
:meth:`torch_renaissance.StreamManager.prefetch`.
"""
from __future__ import annotations

from torch_renaissance.model_slots.records import REGION, ArchitectureLayout, Weights
from torch_renaissance.model_slots.slots import ModelSlots

__all__ = ["ArchitectureLayout", "ModelSlots", "REGION", "Weights"]
