"""DTensor placements and FSDP2 parameters mapped onto planned slots, one layout for all ranks.

Layers (each module uses only those above it):

* :mod:`.placements` -- placements -> every rank's local shape and global offset
  (DTensor's ``torch.chunk`` rules), slot shape (FSDP2's padding);
* :mod:`.sharded_plan` -- :class:`ShardedTensorSpec` list -> one
  :class:`~torch_renaissance.memory_plan.MemoryPlan` (``params``, ``grads``,
  ``all_gather``, ``reduce_scatter``, ``optim.<state>`` regions), and the
  per-group communication buffers (:func:`plan_comm`);
* :mod:`.agreement` -- one collective to check every rank holds the same plan;
* :mod:`.fsdp` -- :func:`plan_fsdp`: place an FSDP2 model's tensors in the plan.

Only ``torch`` is needed (not the compiled ``torch_renaissance._C``); the plan's
buffer comes from whatever allocator is installed for the device.
"""
from __future__ import annotations

from .agreement import PlanMismatchError, check_agreement
from .fsdp import FSDPPlan, plan_fsdp
from .placements import (
    ShardLayout,
    all_gather_factor,
    local_shape_and_offset,
    normalize_placements,
    shard_layouts,
    slot_nbytes,
    slot_shape,
)
from .sharded_plan import (
    ALL_GATHER,
    GRADS,
    PARAMS,
    REDUCE_SCATTER,
    ShardedTensorSpec,
    optim_region,
    plan_comm,
    plan_dtensors,
    plan_sharded,
)

__all__ = [
    "ALL_GATHER",
    "FSDPPlan",
    "GRADS",
    "PARAMS",
    "PlanMismatchError",
    "REDUCE_SCATTER",
    "ShardLayout",
    "ShardedTensorSpec",
    "all_gather_factor",
    "check_agreement",
    "local_shape_and_offset",
    "normalize_placements",
    "optim_region",
    "plan_comm",
    "plan_dtensors",
    "plan_fsdp",
    "plan_sharded",
    "shard_layouts",
    "slot_nbytes",
    "slot_shape",
]
