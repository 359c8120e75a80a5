"""Sharded tensors -> one :class:`~torch_renaissance.memory_plan.MemoryPlan` for all ranks.

A :class:`ShardedTensorSpec` says everything the layout depends on (global
shape, dtype, mesh shape, placements, gradient/communication dtypes, optimizer
state dtypes) and nothing rank-specific, so :func:`plan_sharded` builds the same
plan on every rank of a correct program. Regions, in layout order:

``params``
    one slot per tensor: the padded local shard (:func:`.placements.slot_shape`).
``grads``
    one slot per tensor that requires grad, same shape and dtype as its param slot.
``all_gather``
    one slot per parameter group whose placements shard over more than one rank:
    ``factor * sum(padded slot numel)`` elements of the all-gather dtype, the
    output buffer of FSDP2's per-group all-gather
    (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``,
    ``foreach_all_gather``).
``reduce_scatter``
    one slot per such group: ``factor * sum(padded slot numel)`` elements of the
    reduce dtype over the tensors that require grad, the reduce-scatter input of
    ``foreach_reduce``.
``optim.<state>``
    one region per optimizer state key (``exp_avg``, ``exp_avg_sq``, ...), one slot
    per tensor that has that state, padded like the param slot. These regions come
    last so a plan extended with optimizer state keeps every earlier offset.

Because ``params``, ``grads`` and same-dtype ``optim.*`` regions list the same
tensors in the same order with the same padded slot sizes, their slots sit at
the same offset relative to their region: one elementwise range operation over
the regions is an update of every tensor.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor.placement_types import Placement

from ..memory_plan import DEFAULT_ALIGNMENT, MemoryPlan
from .placements import (
    all_gather_factor,
    local_shape_and_offset,
    mesh_shape_of,
    normalize_placements,
    slot_shape,
)

__all__ = [
    "ALL_GATHER",
    "GRADS",
    "OPTIM_PREFIX",
    "PARAMS",
    "REDUCE_SCATTER",
    "ShardedTensorSpec",
    "optim_region",
    "plan_comm",
    "plan_dtensors",
    "plan_sharded",
]

PARAMS = "params"
GRADS = "grads"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
OPTIM_PREFIX = "optim."


def optim_region(state_key: str) -> str:
    """Region name for optimizer state ``state_key`` (``"optim.exp_avg"``)."""
    return OPTIM_PREFIX + state_key


@dataclasses.dataclass(frozen=True)
class ShardedTensorSpec:
    """Rank-independent description of one sharded tensor (usually a parameter).

    Attributes:
        name: unique name (a parameter FQN); the slot name in every region.
        global_shape: shape of the global (unsharded) tensor.
        dtype: dtype of the parameter and of its gradient.
        mesh_shape: shape of the device mesh it is placed on.
        placements: one DTensor placement per mesh dim (normalized on creation).
        requires_grad: whether it gets a ``grads`` slot and takes part in the
            reduce-scatter.
        group: parameter group (FSDP2: one ``fully_shard`` call) sharing one
            all-gather and one reduce-scatter buffer.
        all_gather_dtype: dtype it is all-gathered in (FSDP2 mixed precision
            ``param_dtype``); default ``dtype``.
        reduce_dtype: dtype its gradient is reduce-scattered in; default
            ``all_gather_dtype``.
        states: ``(key, dtype)`` of each optimizer state tensor shaped like the
            parameter (``("exp_avg", torch.float32)``, ...).
        gather_mesh_dims: mesh dims its all-gather/reduce-scatter runs over;
            default: every dim with a shard placement. FSDP2 + tensor parallel
            gathers over the data-parallel dims only (``(0,)`` on a
            ``(dp, tp)`` mesh) while the slot follows every placement.

    Raises:
        ValueError: if the placements cannot be planned (see
            :func:`~torch_renaissance.distributed.placements.normalize_placements`).
    """

    name: str
    global_shape: tuple[int, ...]
    dtype: torch.dtype
    mesh_shape: tuple[int, ...]
    placements: tuple[Placement, ...]
    requires_grad: bool = True
    group: str = ""
    all_gather_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    states: tuple[tuple[str, torch.dtype], ...] = ()
    gather_mesh_dims: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.global_shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"{self.name}: negative size in global shape {shape}")
        mesh_shape = mesh_shape_of(self.mesh_shape)
        placements = normalize_placements(
            self.placements, len(shape), len(mesh_shape), name=self.name
        )
        object.__setattr__(self, "global_shape", shape)
        object.__setattr__(self, "mesh_shape", mesh_shape)
        object.__setattr__(self, "placements", placements)
        object.__setattr__(self, "states", tuple((str(k), d) for k, d in self.states))
        if self.gather_mesh_dims is not None:
            dims = tuple(int(d) for d in self.gather_mesh_dims)
            if any(not 0 <= d < len(mesh_shape) for d in dims) or len(set(dims)) != len(dims):
                raise ValueError(
                    f"{self.name}: gather_mesh_dims {dims} are not distinct dims of a "
                    f"{len(mesh_shape)}-D mesh"
                )
            object.__setattr__(self, "gather_mesh_dims", dims)

    @classmethod
    def from_dtensor(
        cls,
        name: str,
        tensor: torch.Tensor,
        *,
        group: str = "",
        requires_grad: bool | None = None,
        states: Iterable[tuple[str, torch.dtype]] = (),
    ) -> "ShardedTensorSpec":
        """Spec of an existing DTensor, checking its local shard on this rank.

        Raises:
            ValueError: if the placements cannot be planned, or the local tensor
                on this rank is not the ``torch.chunk`` shard DTensor's rules give
                (an uneven split made with ``DTensor.from_local(..., shape=...)``).
        """
        from torch.distributed.tensor import DTensor

        if not isinstance(tensor, DTensor):
            raise ValueError(f"{name}: expected a DTensor, got {type(tensor).__name__}")
        spec = cls(
            name=name,
            global_shape=tuple(tensor.shape),
            dtype=tensor.dtype,
            mesh_shape=tuple(tensor.device_mesh.shape),
            placements=tuple(tensor.placements),
            requires_grad=tensor.requires_grad if requires_grad is None else requires_grad,
            group=group,
            states=tuple(states),
        )
        coordinate = tensor.device_mesh.get_coordinate()
        if coordinate is not None:
            expected = spec.local_shape(coordinate)
            actual = tuple(tensor._local_tensor.shape)
            if actual != expected:
                raise ValueError(
                    f"{name}: local shard {actual} at mesh coordinate {tuple(coordinate)} is "
                    f"not the torch.chunk split of {spec.global_shape} over "
                    f"{spec.placements} (expected {expected}); uneven non-chunk splits "
                    "cannot be planned"
                )
        return spec

    @property
    def slot_shape(self) -> tuple[int, ...]:
        """Padded local shape, the same on every rank."""
        return slot_shape(self.global_shape, self.mesh_shape, self.placements, name=self.name)

    @property
    def slot_numel(self) -> int:
        """Elements of :attr:`slot_shape`."""
        return math.prod(self.slot_shape)

    @property
    def slot_nbytes(self) -> int:
        """Bytes of the param slot (``slot_numel * dtype.itemsize``)."""
        return self.slot_numel * self.dtype.itemsize

    def local_shape(self, coordinate: Sequence[int]) -> tuple[int, ...]:
        """Unpadded local shape at a mesh coordinate."""
        return local_shape_and_offset(
            self.global_shape, self.mesh_shape, self.placements, coordinate, name=self.name
        )[0]

    @property
    def all_gather_factor(self) -> int:
        """Number of ranks an all-gather of this tensor concatenates."""
        if self.gather_mesh_dims is not None:
            return math.prod(self.mesh_shape[d] for d in self.gather_mesh_dims)
        return all_gather_factor(self.mesh_shape, self.placements)

    @property
    def effective_all_gather_dtype(self) -> torch.dtype:
        return self.all_gather_dtype or self.dtype

    @property
    def effective_reduce_dtype(self) -> torch.dtype:
        return self.reduce_dtype or self.effective_all_gather_dtype


def _group_buffer(
    specs: Sequence[ShardedTensorSpec], dtype_of, what: str
) -> tuple[tuple[int, ...], torch.dtype] | None:
    """Shape and dtype of one group's flat communication buffer (or None)."""
    if not specs:
        return None
    factors = {s.all_gather_factor for s in specs}
    if len(factors) != 1:
        raise ValueError(
            f"group {specs[0].group!r}: tensors shard over different numbers of ranks "
            f"({sorted(factors)}); one {what} buffer cannot serve them"
        )
    factor = factors.pop()
    if factor == 1:
        return None
    dtypes = {dtype_of(s) for s in specs}
    if len(dtypes) == 1:
        dtype = dtypes.pop()
        return (factor * sum(s.slot_numel for s in specs),), dtype
    # FSDP2 gathers mixed dtypes as bytes (``_get_all_gather_input_metadatas``).
    nbytes = sum(s.slot_numel * dtype_of(s).itemsize for s in specs)
    return (factor * nbytes,), torch.uint8


def plan_sharded(
    specs: Sequence[ShardedTensorSpec],
    *,
    grads: bool = True,
    all_gather: bool = True,
    reduce_scatter: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
) -> MemoryPlan:
    """Build the finalized plan for ``specs`` (identical on every rank).

    Args:
        specs: the tensors, in layout order (names unique).
        grads: plan a ``grads`` region.
        all_gather: plan an ``all_gather`` region (one slot per group).
        reduce_scatter: plan a ``reduce_scatter`` region (one slot per group).
        alignment: slot/region alignment in bytes (default 256).

    Returns:
        A finalized :class:`~torch_renaissance.memory_plan.MemoryPlan` with the
        regions described in this module's docstring (empty regions omitted).

    Raises:
        ValueError: for duplicate names, or a group whose tensors shard over
            different rank counts or reduce in different dtypes.
    """
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"duplicate tensor name {s.name!r}")
        seen.add(s.name)

    plan = MemoryPlan(alignment=alignment)
    if specs:
        region = plan.add_region(PARAMS)
        for s in specs:
            region.add_slot(s.name, s.slot_shape, s.dtype)
    if grads and any(s.requires_grad for s in specs):
        region = plan.add_region(GRADS)
        for s in specs:
            if s.requires_grad:
                region.add_slot(s.name, s.slot_shape, s.dtype)

    groups: dict[str, list[ShardedTensorSpec]] = {}
    for s in specs:
        groups.setdefault(s.group, []).append(s)
    if all_gather:
        for group, members in groups.items():
            buf = _group_buffer(members, lambda s: s.effective_all_gather_dtype, "all-gather")
            if buf is not None:
                plan.add_slot(ALL_GATHER, group, *buf)
    if reduce_scatter:
        for group, members in groups.items():
            trainable = [s for s in members if s.requires_grad]
            reduce_dtypes = {s.effective_reduce_dtype for s in trainable}
            if len(reduce_dtypes) > 1:
                raise ValueError(
                    f"group {group!r}: gradients reduce in different dtypes "
                    f"{sorted(str(d) for d in reduce_dtypes)}; FSDP2 needs one"
                )
            buf = _group_buffer(trainable, lambda s: s.effective_reduce_dtype, "reduce-scatter")
            if buf is not None:
                plan.add_slot(REDUCE_SCATTER, group, *buf)

    keys: list[str] = []
    for s in specs:
        for key, _ in s.states:
            if key not in keys:
                keys.append(key)
    for key in keys:
        region = plan.add_region(optim_region(key))
        for s in specs:
            for k, dtype in s.states:
                if k == key:
                    region.add_slot(s.name, s.slot_shape, dtype)
    return plan.finalize()


def plan_comm(
    specs: Sequence[ShardedTensorSpec], *, alignment: int = DEFAULT_ALIGNMENT
) -> MemoryPlan:
    """The communication buffers of each parameter group (identical on every rank).

    Regions ``all_gather`` and ``reduce_scatter`` with one slot per group, as
    :func:`plan_sharded` would add them; meant to describe and agree on the
    buffers, not to be materialized as one buffer
    (:func:`~torch_renaissance.distributed.plan_fsdp` serves them from slots
    shared by groups of one size).
    """
    plan = plan_sharded(specs, grads=False, alignment=alignment)
    out = MemoryPlan(alignment=alignment)
    for region in (ALL_GATHER, REDUCE_SCATTER):
        if region in plan:
            for slot in plan.region(region):
                out.add_slot(region, slot.name, slot.shape, slot.dtype, slot.nbytes)
    return out.finalize()


def plan_dtensors(
    tensors: Mapping[str, torch.Tensor],
    *,
    group: dist.ProcessGroup | None = None,
    check: bool = True,
    **plan_kwargs: Any,
) -> MemoryPlan:
    """Plan a set of DTensors (e.g. ``dict(model.named_parameters())``) on every rank.

    A collective over ``group`` when ``check`` is true: a rank whose tensors
    cannot be planned does not raise alone; every rank raises the same
    ``ValueError`` (see :func:`~torch_renaissance.distributed.check_agreement`).

    Args:
        tensors: name -> DTensor, in layout order.
        group: process group for the agreement check (default: world).
        check: run the agreement check (needs an initialized process group
            with more than one rank to communicate).
        **plan_kwargs: passed to :func:`plan_sharded`.

    Returns:
        The finalized plan, identical on every rank.

    Raises:
        ValueError: on every rank, naming the tensor and the reason, if some
            tensor cannot be planned on some rank.
        PlanMismatchError: on every rank, if the plans differ.
    """
    from .agreement import check_agreement

    error = None
    plan = None
    try:
        specs = [ShardedTensorSpec.from_dtensor(n, t) for n, t in tensors.items()]
        plan = plan_sharded(specs, **plan_kwargs)
    except ValueError as exc:
        if not check:
            raise
        error = str(exc)
    if check:
        check_agreement(plan, group, error=error)
    assert plan is not None
    return plan
