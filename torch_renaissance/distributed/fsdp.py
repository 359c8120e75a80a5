"""FSDP2 shim: put ``fully_shard``'s sharded parameters and optimizer states into
one planned buffer that is laid out identically on every rank, and serve FSDP2's
all-gather and reduce-scatter buffers from slots shared across parameter groups.

Memory contract: between steps the process holds what plain FSDP2 holds (the
sharded parameters, the optimizer state and, when the caller keeps them, the
sharded gradients) and nothing else; during a step no more than plain FSDP2.

How it fits FSDP2 (torch 2.13, ``torch/distributed/fsdp/_fully_shard/``):

* **Parameters.** Each ``FSDPParam`` keeps its padded local shard as a flat
  tensor ``_sharded_param_data`` and the unpadded shard as the first rows of it,
  ``sharded_param._local_tensor`` (``_fsdp_param.py``, ``_init_sharded_param``).
  Both are *views* of one padded tensor; ``Tensor.set_`` on a view leaves its
  ``_base`` (and so the old storage) alive, so the base is re-pointed into the
  parameter's ``params`` slot first, then both views
  (:meth:`MaterializedPlan.adopt`). Values, shapes and every Python object (the
  ``nn.Parameter`` the optimizer holds, its DTensor local tensor) stay the same,
  only the storage moves, and FSDP2's original shard memory is freed. FSDP2's
  re-padding check (``reset_sharded_param``, run at lazy init and after
  ``load_state_dict``) sees the tensors on one storage and leaves them alone.
* **Gradients.** By default they stay FSDP2's: after each reduce-scatter FSDP2
  sets ``sharded_param.grad`` to a view of the reduce-scatter output (or adds
  into the existing grad), so ``zero_grad(set_to_none=True)`` frees them as in
  plain FSDP2. With ``grads=True`` the plan also has a contiguous ``grads``
  region (for one-call range operations over every gradient): a
  post-accumulate-grad hook copies each new gradient into its slot and sets
  ``.grad`` to a DTensor over it, so later accumulation happens in place. That
  region is held for the whole run (one sharded model of bytes).
* **Optimizer states.** Tensors in ``optimizer.state[param]`` shaped like the
  parameter (Adam's ``exp_avg``/``exp_avg_sq``, SGD's ``momentum_buffer``) are
  adopted into ``optim.<key>`` slots; scalars such as Adam's ``step`` are left
  where the optimizer keeps them. If the state does not exist yet (the usual
  case before the first step), a one-shot step post-hook extends the plan after
  the first ``optimizer.step()``: the ``optim.*`` regions are appended (earlier
  offsets unchanged), the extended plan is checked across ranks and
  materialized, and every tensor moves to it; the first buffer is freed.
* **All-gather and reduce-scatter buffers.** Each FSDP parameter group gets a
  custom ``AllGather``/``ReduceScatter`` comm (``_fsdp_api.py``) whose
  ``allocate`` hands out the all-gather output (``world x sum of padded
  shards``) and the reduce-scatter input from a :class:`_SlotPool`: one slot
  per buffer size (the repeated blocks of a model share one), reused by the
  next group as soon as the previous occupant's *content* is dead, and given
  back to the allocator as soon as no tensor FSDP2 holds lies on it. Nothing of
  it is held between steps, and at every moment it holds at most the bytes
  plain FSDP2 holds for these buffers (see ``docs/design.md``). The
  reduce-scatter *output* is left to FSDP2: it becomes the gradients (and with
  HSDP gradient accumulation FSDP2 keeps it across backward passes,
  ``partial_reduce_output``). A request that does not fit its group's planned
  size or dtype falls back to ``torch.empty`` and is counted.
* **Tensor parallel.** Parameters that were DTensors before ``fully_shard``
  (``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``, then
  ``fully_shard`` over the data-parallel mesh) are planned from FSDP2's composed
  placements on the ``(dp, tp)`` mesh, e.g. ``(_StridedShard(0, k), Shard(0))``
  or ``(Shard(0), Shard(1))``: the slot is the largest rank's shard and the
  communication buffers are sized over the data-parallel dims only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..memory_plan import DEFAULT_ALIGNMENT, MaterializedPlan, MemoryPlan
from .agreement import check_agreement
from .sharded_plan import (
    ALL_GATHER,
    GRADS,
    PARAMS,
    REDUCE_SCATTER,
    ShardedTensorSpec,
    optim_region,
    plan_comm,
    plan_sharded,
)

__all__ = ["FSDPPlan", "plan_fsdp"]

_PLAN_ATTR = "_torch_renaissance_fsdp_plan"

#: Default slot alignment on the CPU, in bytes: the block alignment of
#: torch_renaissance's CPU allocator (``docs/design.md``, invariants).
CPU_ALIGNMENT = 64


def _fsdp_internals():
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import CPUOffloadPolicy
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            DefaultAllGather,
            DefaultReduceScatter,
        )
    except ImportError as exc:  # pragma: no cover - torch without FSDP2
        raise RuntimeError(f"plan_fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard): {exc}")
    return FSDPModule, CPUOffloadPolicy, DefaultAllGather, DefaultReduceScatter


def _mp_dtypes(fsdp_param: Any) -> tuple[torch.dtype, torch.dtype]:
    """All-gather and reduce dtypes, as ``FSDPParam.init_dtype_attrs`` sets them."""
    orig = fsdp_param.sharded_param.dtype
    mp = fsdp_param.mp_policy
    param_dtype, reduce_dtype = mp.param_dtype, mp.reduce_dtype
    if reduce_dtype == param_dtype:
        reduce_dtype = None
    if param_dtype == orig or not orig.is_floating_point:
        param_dtype = None
    all_gather = param_dtype or orig
    return all_gather, reduce_dtype or all_gather


def _same_device(a: torch.device | str, b: torch.device) -> bool:
    a = torch.device(a)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _alias(storage: torch.UntypedStorage, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor over ``storage`` at byte ``offset`` that is *not* a view.

    FSDP2's views of it keep it (not a larger buffer) as their ``_base``, so it
    dies exactly when FSDP2 drops every tensor over it, and ``set_`` moves it
    without leaving an old storage behind.
    """
    t = torch.empty(0, dtype=dtype, device=storage.device)
    return t.set_(storage, offset // dtype.itemsize, torch.Size(shape))


def _prefix_view(
    storage: MaterializedPlan, region: str, name: str, shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """A contiguous ``shape`` tensor over the first bytes of a slot (not a view)."""
    start, _ = storage.plan.slot_range(region, name)
    return _alias(storage.buffer.untyped_storage(), storage.buffer.storage_offset() + start,
                  shape, dtype)


def _adopt_with_base(storage: MaterializedPlan, region: str, name: str, t: torch.Tensor) -> None:
    """Adopt ``t`` and, first, the tensor it is a view of (so the old storage dies).

    Only a base that starts at ``t``'s first byte, is contiguous and fits the
    slot is moved (FSDP2's padded shard: ``_sharded_param_data`` is
    ``padded.view(-1)``, the local tensor ``padded.narrow(0, 0, n)``).
    """
    base = t._base
    if (
        base is not None
        and type(base) in (torch.Tensor, nn.Parameter)
        and base.data_ptr() == t.data_ptr()
        and base.dtype == t.dtype
        and base.is_contiguous()
        and base.numel() * base.element_size() <= storage.plan.slot(region, name).nbytes
    ):
        storage.adopt(region, name, base)
    storage.adopt(region, name, t)


class _Entry:
    """One FSDP2 parameter and what the plan attached to it."""

    def __init__(self, name: str, fsdp_param: Any, spec: ShardedTensorSpec) -> None:
        self.name = name
        self.fsdp_param = fsdp_param
        self.spec = spec
        self.grad: torch.Tensor | None = None  # grads=True: persistent DTensor over the slot
        self.hook: Any = None

    @property
    def param(self) -> nn.Parameter:
        return self.fsdp_param.sharded_param


class _Slot:
    """One shared communication buffer: a size, and the tensors handed out over it.

    The slot holds no memory itself: its storage lives as long as some tensor
    handed out over it (FSDP2 holds those), so an idle slot costs nothing.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.occupants: list[tuple[weakref.ref, Any]] = []  # (tensor, content-live probe)

    def prune(self) -> None:
        self.occupants = [(r, probe) for r, probe in self.occupants if r() is not None]

    def busy(self) -> bool:
        """Whether some occupant's content is still needed."""
        self.prune()
        return any(probe(r()) for r, probe in self.occupants)

    def storage(self) -> torch.UntypedStorage | None:
        """The memory still held by an occupant (reused instead of a new allocation)."""
        for r, _ in self.occupants:
            t = r()
            if t is not None:
                return t.untyped_storage()
        return None


class _SlotPool:
    """Slots for one kind of FSDP2 buffer (all-gather outputs or reduce-scatter inputs).

    A request of ``nbytes`` gets a slot of exactly that size whose previous
    occupant's content is dead; it reuses the occupant's memory while FSDP2
    still holds it, or allocates when the slot is idle. Requests of one size
    class (FSDP2 groups of the same shape) so share one buffer in turn. When
    every slot of the size is busy a new one is added (two all-gather outputs
    overlap in FSDP2's forward prefetch on a GPU).

    Content lifetime: on a GPU FSDP2's own references are the only safe end
    (its streams wait on the copy-out / reduce-scatter events before it drops
    them), so an occupant is live while referenced. On the CPU every
    collective and copy is synchronous: an all-gather output is dead once its
    group has copied it out (``FSDPParamGroup._all_gather_result`` no longer
    holds it) and a reduce-scatter input once the collective returned; FSDP2
    keeps those references only to delay a caching allocator's reuse.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.slots: dict[int, list[_Slot]] = {}
        self.max_slots = 0

    def take(self, nbytes: int, shape, dtype: torch.dtype, probe) -> tuple[torch.Tensor, bool]:
        """A tensor of ``shape``/``dtype`` in a free slot of ``nbytes``; and whether
        it reused memory still held for an earlier occupant."""
        slots = self.slots.setdefault(nbytes, [])
        slot = next((s for s in slots if not s.busy()), None)
        if slot is None:
            slot = _Slot(nbytes)
            slots.append(slot)
            self.max_slots = max(self.max_slots, sum(len(v) for v in self.slots.values()))
        storage = slot.storage()
        shared = storage is not None
        if storage is None:
            storage = torch.empty(nbytes, dtype=torch.uint8, device=self.device).untyped_storage()
        t = _alias(storage, 0, shape, dtype)
        slot.occupants.append((weakref.ref(t), probe))
        return t, shared

    def held_nbytes(self) -> int:
        """Bytes of the slots some tensor still lies on."""
        total = 0
        for nbytes, slots in self.slots.items():
            for s in slots:
                s.prune()
                total += nbytes if s.occupants else 0
        return total


class _PlannedAllGather:
    """Mixin for FSDP2's default all-gather whose output comes from the slot pool."""

    def __init__(self, owner: "FSDPPlan", group: str, param_group: Any) -> None:
        super().__init__()
        self._owner = weakref.ref(owner)
        self._group = group
        self._param_group = weakref.ref(param_group)

    def _content_live(self, t: torch.Tensor | None) -> bool:
        if t is None:
            return False
        if t.device.type != "cpu":
            return True  # referenced: FSDP2's stream protocol decides (see _SlotPool)
        pg = self._param_group()
        result = getattr(pg, "_all_gather_result", None) if pg is not None else None
        return result is not None and result.all_gather_output is t

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        owner = self._owner()
        if owner is not None:
            t = owner._comm_take(ALL_GATHER, self._group, size, dtype, device, self._content_live)
            if t is not None:
                return t
        return torch.empty(*size, dtype=dtype, device=device)


class _PlannedReduceScatter:
    """Mixin for FSDP2's default reduce-scatter whose input comes from the slot pool.

    ``foreach_reduce`` allocates the input, then the output, once per call; the
    first of each pair is served from the pool.
    """

    def __init__(self, owner: "FSDPPlan", group: str) -> None:
        super().__init__()
        self._owner = weakref.ref(owner)
        self._group = group
        self._next_is_input = True

    def _content_live(self, t: torch.Tensor | None) -> bool:
        if t is None:
            return False
        if t.device.type != "cpu":
            return True
        return not getattr(t, "_torch_renaissance_reduced", False)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        is_input, self._next_is_input = self._next_is_input, not self._next_is_input
        owner = self._owner()
        if is_input and owner is not None:
            t = owner._comm_take(REDUCE_SCATTER, self._group, size, dtype, device,
                                 self._content_live)
            if t is not None:
                return t
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        work = super().__call__(output_tensor, input_tensor, group, op, async_op)
        if not async_op and input_tensor.device.type == "cpu":
            # Synchronous on the CPU: the input's content is consumed.
            input_tensor._torch_renaissance_reduced = True
        return work


class FSDPPlan:
    """The planned layout of an FSDP2 model on this rank; made by :func:`plan_fsdp`.

    Attributes:
        plan: the finalized :class:`~torch_renaissance.memory_plan.MemoryPlan`
            of the memory held for the whole run (``params``, ``grads`` when
            planned, ``optim.<state>``), identical on every rank.
        storage: the :class:`~torch_renaissance.memory_plan.MaterializedPlan`
            backing it (one flat ``uint8`` tensor).
        comm_plan: a finalized plan with regions ``all_gather`` and
            ``reduce_scatter``, one slot per parameter group (its buffer size
            and dtype), identical on every rank; never materialized as one
            buffer: the groups' buffers are served from shared slots, one per
            size, only while FSDP2 uses them (``None`` without comm buffers).
        digest: sha256 of :attr:`plan` and :attr:`comm_plan`, agreed by every rank.
        specs: the :class:`~torch_renaissance.distributed.ShardedTensorSpec` of
            each parameter, in layout order.
        stats: counters: ``all_gather_planned`` / ``all_gather_fallbacks``,
            ``reduce_scatter_planned`` / ``reduce_scatter_fallbacks`` (buffer
            requests served from / outside the slots), ``all_gather_shared`` /
            ``reduce_scatter_shared`` (requests served from memory still held
            for the previous occupant of the slot: an allocation plain FSDP2
            makes and the plan does not), ``all_gather_slots`` /
            ``reduce_scatter_slots`` (slots created), ``all_gather_nbytes``
            (bytes of the last planned all-gather output), ``grad_copies``
            (gradients copied into the grads region), ``extensions`` (plan
            rebuilt with optimizer state).
    """

    def __init__(
        self,
        model: nn.Module,
        entries: list[_Entry],
        groups: dict[str, list[Any]],
        optimizer: torch.optim.Optimizer | None,
        group: dist.ProcessGroup | None,
        comm_buffers: bool,
        grads: bool,
        alignment: int,
    ) -> None:
        self._model = weakref.ref(model)
        self._entries = entries
        self._param_groups = groups
        self._optimizer = optimizer
        self._group = group
        self._comm_buffers = comm_buffers
        self._grads = grads
        self._alignment = alignment
        self._device = entries[0].fsdp_param.device if entries else torch.device("cpu")
        self._comm_restore: list[tuple[Any, str, Any]] = []
        self._step_hook: Any = None
        self._pools = {ALL_GATHER: _SlotPool(self._device), REDUCE_SCATTER: _SlotPool(self._device)}
        self.stats: dict[str, int] = {
            "all_gather_planned": 0,
            "all_gather_fallbacks": 0,
            "all_gather_shared": 0,
            "all_gather_slots": 0,
            "all_gather_nbytes": 0,
            "reduce_scatter_planned": 0,
            "reduce_scatter_fallbacks": 0,
            "reduce_scatter_shared": 0,
            "reduce_scatter_slots": 0,
            "grad_copies": 0,
            "extensions": 0,
        }
        self.plan: MemoryPlan
        self.storage: MaterializedPlan
        self.comm_plan: MemoryPlan | None = None
        self.digest: str

    # -- public ------------------------------------------------------------------

    @property
    def specs(self) -> tuple[ShardedTensorSpec, ...]:
        """The parameters' specs, in layout order."""
        return tuple(e.spec for e in self._entries)

    @property
    def param_names(self) -> tuple[str, ...]:
        """Planned parameter FQNs, in layout order."""
        return tuple(e.name for e in self._entries)

    @property
    def optimizer_state_pending(self) -> bool:
        """True until optimizer state has been placed (deferred to the first step)."""
        return self._step_hook is not None

    def region_view(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """One flat tensor over a whole region, for range operations.

        Args:
            name: ``"params"``, ``"grads"`` (with ``plan_fsdp(..., grads=True)``)
                or ``"optim.<state>"``.
            dtype: view dtype; default: the region's dtype (``uint8`` if mixed).

        Returns:
            A 1-D tensor over ``[region.offset, region.end)`` of the plan buffer:
            every slot of the region plus the zero padding between slots (padded
            rows of uneven shards and alignment gaps).

        Example::

            >>> torch._foreach_mul_([plan.region_view("grads")], 0.5)
            >>> dist.all_reduce(plan.region_view("grads"))  # DDP-style, one call

        Raises:
            KeyError: for a region the plan does not have (``"grads"`` needs
                ``plan_fsdp(..., grads=True)``).
        """
        if name == GRADS and not self._grads:
            raise KeyError(
                "plan has no 'grads' region: gradients stay FSDP2's unless "
                "plan_fsdp(..., grads=True) is given"
            )
        return self.storage.region_view(name, dtype)

    def slot_view(self, region: str, name: str) -> torch.Tensor:
        """Typed view of one slot (padded local shape)."""
        return self.storage.slot_view(region, name)

    def all_gather_nbytes(self) -> dict[str, int]:
        """Planned all-gather output bytes per FSDP parameter group."""
        if self.comm_plan is None or ALL_GATHER not in self.comm_plan:
            return {}
        return {s.name: s.nbytes for s in self.comm_plan.region(ALL_GATHER)}

    def comm_held_nbytes(self) -> int:
        """Bytes of communication slots that some tensor lies on right now
        (0 between steps: nothing of them is held)."""
        return sum(p.held_nbytes() for p in self._pools.values())

    def remove(self) -> None:
        """Remove the gradient hooks, the step hook and the planned comms.

        Tensors stay where they are (in :attr:`storage`); FSDP2 goes back to its
        default all-gather/reduce-scatter and to fresh gradient tensors.
        """
        for e in self._entries:
            if e.hook is not None:
                e.hook.remove()
                e.hook = None
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        for obj, attr, value in self._comm_restore:
            setattr(obj, attr, value)
        self._comm_restore.clear()
        model = self._model()
        if model is not None and getattr(model, _PLAN_ATTR, None) is self:
            delattr(model, _PLAN_ATTR)

    def __repr__(self) -> str:
        return f"FSDPPlan({len(self._entries)} params, {self.plan!r})"

    # -- building ----------------------------------------------------------------

    def _state_keys(self) -> dict[str, tuple[tuple[str, torch.dtype], ...]]:
        """Per parameter, the optimizer state tensors shaped like it."""
        out: dict[str, tuple[tuple[str, torch.dtype], ...]] = {}
        opt = self._optimizer
        if opt is None:
            return out
        for e in self._entries:
            state = opt.state.get(e.param)
            if not state:
                continue
            keys = []
            for key in sorted(state):  # sorted: independent of insertion order
                value = state[key]
                if self._placeable_state(e, value):
                    keys.append((str(key), value.dtype))
            if keys:
                out[e.name] = tuple(keys)
        return out

    @staticmethod
    def _placeable_state(e: _Entry, value: Any) -> bool:
        from torch.distributed.tensor import DTensor

        if isinstance(value, DTensor):
            local = value._local_tensor
            return (
                tuple(value.shape) == tuple(e.param.shape)
                and tuple(local.shape) == tuple(e.fsdp_param.sharded_size)
                and local.device == e.fsdp_param.device
                and local.is_contiguous()
            )
        return (
            type(value) is torch.Tensor
            and tuple(value.shape) == tuple(e.fsdp_param.sharded_size)
            and value.device == e.fsdp_param.device
            and value.is_contiguous()
            and value.dim() > 0
        )

    def _build(self) -> tuple[MemoryPlan, MemoryPlan | None, str]:
        """Plan with the optimizer state that exists now; agree across ranks (collective)."""
        states = self._state_keys()
        specs = [dataclasses.replace(e.spec, states=states.get(e.name, ())) for e in self._entries]
        plan = plan_sharded(
            specs, grads=self._grads, all_gather=False, reduce_scatter=False,
            alignment=self._alignment,
        )
        comm = None
        if self._comm_buffers:
            comm = plan_comm(specs, alignment=self._alignment)
        digest = check_agreement(plan, self._group)
        if comm is not None:
            digest = hashlib.sha256((digest + check_agreement(comm, self._group)).encode()).hexdigest()
        for e, s in zip(self._entries, specs):
            e.spec = s
        return plan, comm, digest

    def _install(self, plan: MemoryPlan, comm: MemoryPlan | None, digest: str) -> None:
        """Materialize ``plan`` and move every planned tensor into it."""
        from torch.distributed.tensor import DTensor

        storage = plan.materialize(self._device)
        with torch.no_grad():
            for e in self._entries:
                fp = e.fsdp_param
                # Padded flat shard first (copies the zero padding), then the
                # unpadded local tensor over its first bytes; their common base
                # moves with them so FSDP2's first shard memory is freed.
                _adopt_with_base(storage, PARAMS, e.name, fp._sharded_param_data)
                _adopt_with_base(storage, PARAMS, e.name, fp.sharded_param._local_tensor)
                if self._grads and e.spec.requires_grad:
                    if e.grad is None:
                        local = _prefix_view(storage, GRADS, e.name, fp.sharded_size, e.spec.dtype)
                        e.grad = fp.to_sharded_dtensor(local)
                    else:
                        storage.adopt(GRADS, e.name, e.grad._local_tensor)
                    current = e.param.grad
                    if current is not None and current is not e.grad:
                        src = current._local_tensor if isinstance(current, DTensor) else current
                        e.grad._local_tensor.copy_(src)
                        e.param.grad = e.grad
                for key, _ in e.spec.states:
                    value = self._optimizer.state[e.param][key]  # type: ignore[union-attr]
                    local = value._local_tensor if isinstance(value, DTensor) else value
                    _adopt_with_base(storage, optim_region(key), e.name, local)
        self.plan, self.storage, self.comm_plan, self.digest = plan, storage, comm, digest

    def _grad_hook(self, e: _Entry):
        from torch.distributed.tensor import DTensor

        def hook(param: torch.Tensor) -> None:
            grad = param.grad
            if grad is None or grad is e.grad:
                return  # accumulated in place (or nothing to do)
            src = grad._local_tensor if isinstance(grad, DTensor) else grad
            with torch.no_grad():
                e.grad._local_tensor.copy_(src)  # type: ignore[union-attr]
            param.grad = e.grad
            self.stats["grad_copies"] += 1

        return hook

    def _attach(self, DefaultAllGather: type, DefaultReduceScatter: type) -> None:
        if self._grads:
            for e in self._entries:
                if e.spec.requires_grad:
                    e.hook = e.param.register_post_accumulate_grad_hook(self._grad_hook(e))
        if self.comm_plan is None:
            return
        comm = self.comm_plan
        ag = comm.region(ALL_GATHER) if ALL_GATHER in comm else None
        rs = comm.region(REDUCE_SCATTER) if REDUCE_SCATTER in comm else None
        ag_cls = type("PlannedAllGather", (_PlannedAllGather, DefaultAllGather), {})
        rs_cls = type("PlannedReduceScatter", (_PlannedReduceScatter, DefaultReduceScatter), {})
        for name, pgs in self._param_groups.items():
            for pg in pgs:
                if ag is not None and name in ag:
                    self._comm_restore.append((pg, "_all_gather_comm", pg._all_gather_comm))
                    pg._all_gather_comm = ag_cls(self, name, pg)
                if rs is not None and name in rs:
                    self._comm_restore.append((pg, "_reduce_scatter_comm", pg._reduce_scatter_comm))
                    pg._reduce_scatter_comm = rs_cls(self, name)

    def _comm_take(
        self, region: str, group: str, size, dtype: torch.dtype, device: torch.device, probe
    ) -> torch.Tensor | None:
        """A buffer for ``group`` from the shared slots, or None (caller falls back)."""
        kind = "all_gather" if region == ALL_GATHER else "reduce_scatter"
        shape = tuple(int(s) for s in size)
        numel = math.prod(shape)
        slot = self.comm_plan.slot(region, group) if self.comm_plan is not None else None
        if (
            slot is None
            or dtype != slot.dtype
            or numel > slot.numel
            or not _same_device(device, self._device)
        ):
            self.stats[f"{kind}_fallbacks"] += 1
            return None
        pool = self._pools[region]
        t, shared = pool.take(slot.nbytes, shape, dtype, probe)
        self.stats[f"{kind}_planned"] += 1
        self.stats[f"{kind}_shared"] += int(shared)
        self.stats[f"{kind}_slots"] = sum(len(v) for v in pool.slots.values())
        if region == ALL_GATHER:
            self.stats["all_gather_nbytes"] = numel * dtype.itemsize
        return t

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Build and agree first (a collective every rank enters, whatever its
        # local state), so all ranks take the same decision below.
        plan, comm, digest = self._build()
        if not any(e.spec.states for e in self._entries):
            return  # no state anywhere yet (e.g. a skipped step): try again next step
        self._step_hook.remove()
        self._step_hook = None
        self._install(plan, comm, digest)
        self.stats["extensions"] += 1


def _iter_param_groups(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """``(group name, FSDPParamGroup)`` in module order (the layout order)."""
    FSDPModule = _fsdp_internals()[0]
    for fqn, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = list(getattr(state, "_fsdp_param_groups", None) or [])
        if not groups and getattr(state, "_fsdp_param_group", None) is not None:
            groups = [state._fsdp_param_group]  # pragma: no cover - older torch
        for i, pg in enumerate(groups):
            name = fqn or "<root>"
            yield (name if len(groups) == 1 else f"{name}#{i}"), pg


def _collect(model: nn.Module) -> tuple[list[_Entry], dict[str, list[Any]]]:
    _, CPUOffloadPolicy, _, _ = _fsdp_internals()
    names = {id(p): n for n, p in model.named_parameters()}
    entries: list[_Entry] = []
    groups: dict[str, list[Any]] = {}
    devices = set()
    for group, pg in _iter_param_groups(model):
        groups.setdefault(group, []).append(pg)
        for fp in pg.fsdp_params:
            name = names.get(id(fp.sharded_param))
            if name is None:
                raise ValueError(
                    f"an FSDP2 parameter of group {group!r} ({fp!r}) is not a parameter of "
                    "the model; call plan_fsdp on the root module"
                )
            if getattr(fp, "offload_to_cpu", False):
                raise ValueError(
                    f"{name}: CPUOffloadPolicy is not supported (the sharded parameter "
                    "lives in host memory that FSDP2 manages)"
                )
            is_tp = bool(getattr(fp, "is_dtensor", False))
            if is_tp and getattr(fp.mesh_info, "is_spmd_mesh", False):
                raise ValueError(
                    f"{name}: a DTensor parameter on the mesh passed to fully_shard (SPMD "
                    "mesh) is not supported; shard it over a separate tensor-parallel mesh"
                )
            spec_info = fp._sharding_spec
            all_gather_dtype, reduce_dtype = _mp_dtypes(fp)
            gather_dims = None
            global_shape = tuple(fp._orig_size)
            if is_tp:
                # FSDP2 shards the tensor-parallel local tensor over the data-
                # parallel dims of the (dp..., tp...) mesh it concatenated.
                global_shape = tuple(spec_info.tensor_meta.shape)
                gather_dims = (int(getattr(fp.mesh_info, "shard_mesh_dim", 0)),)
            spec = ShardedTensorSpec(
                name=name,
                global_shape=global_shape,
                dtype=fp.sharded_param.dtype,
                mesh_shape=tuple(spec_info.mesh.shape),
                placements=tuple(spec_info.placements),
                requires_grad=fp.sharded_param.requires_grad,
                group=group,
                all_gather_dtype=all_gather_dtype,
                reduce_dtype=reduce_dtype,
                gather_mesh_dims=gather_dims,
            )
            # The plan must describe exactly what FSDP2 allocated (with tensor
            # parallel over an uneven split, a rank's padded shard may be
            # smaller than the slot, which holds the largest rank's).
            padded = tuple(fp.padded_sharded_param_size)
            fits = (
                all(a <= b for a, b in zip(padded, spec.slot_shape)) and len(padded) == len(spec.slot_shape)
                if is_tp else padded == spec.slot_shape
            )
            if not fits:
                raise ValueError(
                    f"{name}: FSDP2 padded shard {padded} != "
                    f"planned slot {spec.slot_shape} for {spec.global_shape} over "
                    f"{spec.placements}"
                )
            coordinate = spec_info.mesh.get_coordinate()
            if coordinate is not None and spec.local_shape(coordinate) != tuple(fp.sharded_size):
                raise ValueError(
                    f"{name}: FSDP2 local shard {tuple(fp.sharded_size)} is not the "
                    f"torch.chunk split {spec.local_shape(coordinate)}; cannot be planned"
                )
            if fp._sharded_param_data.numel() != math.prod(padded):
                raise ValueError(f"{name}: unexpected FSDP2 sharded data size")
            shard_world = getattr(fp.mesh_info, "shard_mesh_size", None)
            if shard_world is not None and spec.all_gather_factor != shard_world:
                raise ValueError(
                    f"{name}: all-gather over {spec.all_gather_factor} ranks planned, FSDP2 "
                    f"shards over {shard_world}"
                )
            devices.add(fp.device)
            entries.append(_Entry(name, fp, spec))
    if len(devices) > 1:
        raise ValueError(f"FSDP2 parameters on several devices {sorted(map(str, devices))}")
    return entries, groups


def plan_fsdp(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    comm_buffers: bool = True,
    grads: bool = False,
    alignment: int | None = None,
) -> FSDPPlan:
    """Plan and place an FSDP2 model's memory, identically on every rank.

    Call it on every rank, after ``fully_shard`` has been applied to all modules
    (and after the optimizer is built, if it is passed), before or after the
    first forward. It is a collective over ``group``.

    Builds one :class:`~torch_renaissance.memory_plan.MemoryPlan` with regions
    ``params``, ``grads`` (when ``grads``) and ``optim.<state>`` (when the
    optimizer state exists; if not, after the first ``optimizer.step()``),
    checks with a collective that every rank has the same plan, allocates it as
    one buffer on the parameters' device and moves the tensors into their slots
    without changing their values or the Python objects FSDP2 and the optimizer
    hold. With ``comm_buffers``, FSDP2's all-gather outputs and reduce-scatter
    inputs come from slots shared by the groups of one buffer size
    (:attr:`FSDPPlan.comm_plan`), held only while FSDP2 uses them. Training is
    unchanged (bit for bit), and memory is never above plain FSDP2's: between
    steps the process holds the sharded parameters, the optimizer state and the
    gradients the caller keeps (plus the grads region when ``grads``).

    Args:
        model: the root module, with ``fully_shard`` applied.
        optimizer: optional optimizer over the model's parameters; its
            parameter-shaped state tensors are placed in ``optim.<key>`` regions.
        group: process group for the agreement check; default: the world group.
        comm_buffers: serve FSDP2's all-gather outputs and reduce-scatter
            inputs from shared slots (one per buffer size; on the CPU the next
            group reuses a buffer whose content is consumed even while FSDP2
            still references it, so fewer bytes than plain FSDP2).
        grads: also keep a contiguous ``grads`` region (one call over every
            gradient: ``region_view("grads")``); each new gradient is copied
            into it. The region is held for the whole run: one sharded model
            of bytes more than plain FSDP2 between steps when gradients are
            set to ``None``.
        alignment: slot alignment in bytes; default: 64 on the CPU (the
            alignment torch_renaissance's CPU allocator gives every block), 256
            on other devices (PyTorch's CUDA caching allocator rounds blocks to
            512 B), so the plan is never larger than FSDP2's own allocations.

    Returns:
        An :class:`FSDPPlan` (``region_view``, ``slot_view``, ``digest``, ``stats``,
        ``remove``). It is also stored on ``model``.

    Raises:
        ValueError: on every rank, if some parameter cannot be planned (the
            message names it and the reason: CPU offload, DTensor parameters
            on the SPMD mesh given to ``fully_shard``, non-``torch.chunk``
            splits, a ``_StridedShard`` that is not FSDP2 over tensor parallel).
        PlanMismatchError: on every rank, if the ranks' plans differ (names the
            first differing slot).
        RuntimeError: if the model is already planned.
    """
    _, _, DefaultAllGather, DefaultReduceScatter = _fsdp_internals()
    if getattr(model, _PLAN_ATTR, None) is not None:
        raise RuntimeError("model already has an FSDPPlan; call its remove() first")
    error: str | None = None
    entries: list[_Entry] = []
    groups: dict[str, list[Any]] = {}
    try:
        entries, groups = _collect(model)
    except ValueError as exc:
        error = str(exc)
    if error is not None:
        # Let every rank raise together instead of leaving peers in a collective.
        check_agreement(None, group, error=error)
    if not entries:
        raise ValueError("model has no FSDP2 parameters; apply fully_shard first")
    # Only groups still on FSDP2's default comms get planned buffers.
    if comm_buffers:
        for pgs in groups.values():
            for pg in pgs:
                if type(pg._all_gather_comm) is not DefaultAllGather or (
                    type(pg._reduce_scatter_comm) is not DefaultReduceScatter
                ):
                    comm_buffers = False  # same decision on every rank (same program)
    if alignment is None:
        alignment = CPU_ALIGNMENT if entries[0].fsdp_param.device.type == "cpu" else DEFAULT_ALIGNMENT
    fsdp_plan = FSDPPlan(model, entries, groups, optimizer, group, comm_buffers, grads, alignment)
    plan, comm, digest = fsdp_plan._build()
    fsdp_plan._install(plan, comm, digest)
    fsdp_plan._attach(DefaultAllGather, DefaultReduceScatter)
    if optimizer is not None and not any(e.spec.states for e in entries):
        fsdp_plan._step_hook = optimizer.register_step_post_hook(fsdp_plan._on_step)
    setattr(model, _PLAN_ATTR, fsdp_plan)
    return fsdp_plan
