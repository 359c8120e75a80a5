"""What :class:`~torch_renaissance.model_slots.ModelSlots` knows of each
architecture and each model: the planned layout, the per-architecture state
(template module, slot names, slot sets held and free), and the counters.

Invariants (kept by the modules that change these records):

* ``Arch.free`` is a subset of ``Arch.sets``; a slot set on ``free`` holds no
  model (``pool.py``).
* A ``Model`` has exactly one of ``slot_set`` (loaded) and ``host``
  (offloaded) set (``slots.py``, ``offload.py``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from torch_renaissance.memory_plan import MaterializedPlan, MemoryPlan

__all__ = ["REGION", "Weights", "ArchitectureLayout", "Counters", "Arch", "Model"]

# The one region of every weight plan.
REGION = "weights"

# What load() and swap() take: a state_dict or a module of the architecture.
Weights = Union[Mapping[str, torch.Tensor], nn.Module]


@dataclasses.dataclass(frozen=True)
class ArchitectureLayout:
    """What :meth:`ModelSlots.register` planned for one architecture.

    Attributes:
        name: the architecture's name.
        plan: the finalized weight plan (region ``"weights"``, one slot per
            parameter and buffer, in ``named_parameters`` then
            ``named_buffers`` order; tied tensors share one slot).
        weight_bytes: bytes of one slot set (``plan.nbytes``, alignment padding
            included).
        tensor_bytes: bytes of the parameters and buffers themselves.
        keys: the ``state_dict`` keys a model of this architecture must give.
        activation_bytes: bytes of the arena's planned territory that one
            forward of the example inputs occupies (the union of the address
            ranges of the replayed step's allocations), or ``None`` when the
            arena does not plan steps on this device.
        activation_load_bytes: LOAD of that step (``renaissance.step_load_bytes``:
            the peak of live bytes, the lower bound for any plan), or ``None``.
        activation_planned: whether the last measured step replayed every
            allocation at its planned offset.
    """

    name: str
    plan: MemoryPlan
    weight_bytes: int
    tensor_bytes: int
    keys: Tuple[str, ...]
    activation_bytes: Optional[int]
    activation_load_bytes: Optional[int]
    activation_planned: bool


@dataclasses.dataclass
class Counters:
    """Loads, swaps, reloads, offloads, evictions, forwards and switch times
    (seconds, host clock) of one architecture or one model."""

    loads: int = 0
    swaps: int = 0
    reloads: int = 0
    offloads: int = 0
    evictions: int = 0
    forwards: int = 0
    switch_seconds: float = 0.0
    switches: int = 0
    last_switch_seconds: Optional[float] = None

    def switched(self, seconds: float) -> None:
        self.switches += 1
        self.switch_seconds += seconds
        self.last_switch_seconds = seconds

    def as_dict(self) -> Dict[str, Any]:
        return {
            "loads": self.loads, "swaps": self.swaps, "reloads": self.reloads,
            "offloads": self.offloads, "evictions": self.evictions, "forwards": self.forwards,
            "switches": self.switches,
            "mean_switch_seconds": self.switch_seconds / self.switches if self.switches else None,
            "last_switch_seconds": self.last_switch_seconds,
        }


class Arch:
    """One registered architecture: its layout, template and slot sets."""

    def __init__(self, layout: ArchitectureLayout, template: nn.Module, alias: Dict[str, str],
                 key_slot: Dict[str, str], fixed: Dict[str, bytes]) -> None:
        self.layout = layout
        self.template = template          # the module on the meta device
        self.alias = alias                # every parameter/buffer name -> slot name
        self.key_slot = key_slot          # state_dict key -> slot name
        self.fixed = fixed                # non-persistent buffers: slot name -> bytes
        self.sets: List[Any] = []         # every slot set held (pool.SlotSet)
        self.free: List[Any] = []         # held, no model in it (LIFO)
        self.staging: Optional[MaterializedPlan] = None  # pinned host copy of the layout
        self.staging_event: Any = None    # the last copy out of `staging`
        self.counters = Counters()
        self.persistent_slots = len(set(key_slot.values()))


class Model:
    """One model: its architecture and where its weights are."""

    def __init__(self, name: str, arch: Arch) -> None:
        self.name = name
        self.arch = arch
        self.slot_set: Any = None                     # pool.SlotSet while loaded
        self.host: Optional[MaterializedPlan] = None  # offloaded weights
        self.counters = Counters()
