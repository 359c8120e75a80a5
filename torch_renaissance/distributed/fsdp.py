"""FSDP2 shim: put ``fully_shard``'s parameters, gradients, optimizer states and
communication buffers into one planned buffer that is laid out identically on
every rank.

How it fits FSDP2 (torch 2.13, ``torch/distributed/fsdp/_fully_shard/``):

* **Parameters.** Each ``FSDPParam`` keeps its padded local shard as a flat
  tensor ``_sharded_param_data`` and the unpadded shard as the first rows of it,
  ``sharded_param._local_tensor`` (``_fsdp_param.py``, ``_init_sharded_param``).
  Both tensors are re-pointed into the parameter's ``params`` slot with
  ``Tensor.set_`` (:meth:`MaterializedPlan.adopt`): values, shapes and every
  Python object (the ``nn.Parameter`` the optimizer holds, its DTensor local
  tensor) stay the same, only the storage moves. FSDP2's own re-padding check
  (``reset_sharded_param``, run at lazy init and after ``load_state_dict``)
  sees both tensors on one storage and leaves them alone.
* **Gradients.** After each reduce-scatter FSDP2 sets ``sharded_param.grad`` to a
  new DTensor viewing its reduce-scatter output, or adds into the existing grad
  when there is one (``_fsdp_collectives.py``, ``foreach_reduce``), and then
  calls the parameter's post-accumulate-grad hooks. The shim registers such a
  hook: it copies a new gradient into the ``grads`` slot and sets ``.grad`` to a
  persistent DTensor over that slot, so later accumulation (``zero_grad(
  set_to_none=False)``, gradient accumulation) happens in place. The copy runs
  on FSDP2's post-reduce stream, right after the reduce-scatter.
* **Optimizer states.** Tensors in ``optimizer.state[param]`` shaped like the
  parameter (Adam's ``exp_avg``/``exp_avg_sq``, SGD's ``momentum_buffer``) are
  adopted into ``optim.<key>`` slots; scalars such as Adam's ``step`` are left
  where the optimizer keeps them. If the state does not exist yet (the usual
  case before the first step), a one-shot step post-hook extends the plan after
  the first ``optimizer.step()``: the ``optim.*`` regions are appended (earlier
  offsets unchanged), the extended plan is checked across ranks and
  materialized, and every tensor moves to it.
* **All-gather and reduce-scatter buffers.** Each FSDP parameter group gets a
  custom ``AllGather``/``ReduceScatter`` comm (``_fsdp_api.py``) whose
  ``allocate`` returns the group's ``all_gather`` slot (the all-gather output,
  ``world x sum of padded shards``) and ``reduce_scatter`` slot (the
  reduce-scatter input). The reduce-scatter *output* is left to the allocator:
  with HSDP gradient accumulation FSDP2 keeps it across backward passes
  (``partial_reduce_output``), which a fixed slot would alias. A request that
  does not fit its slot falls back to ``torch.empty`` and is counted.
"""
from __future__ import annotations

import dataclasses
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
    plan_sharded,
)

__all__ = ["FSDPPlan", "plan_fsdp"]

_PLAN_ATTR = "_torch_renaissance_fsdp_plan"


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


def _prefix_view(
    storage: MaterializedPlan, region: str, name: str, shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """A contiguous ``shape`` view over the first bytes of a slot."""
    nbytes = math.prod(shape) * dtype.itemsize
    return storage.slot_bytes(region, name)[:nbytes].view(dtype).view(shape)


class _Entry:
    """One FSDP2 parameter and what the plan attached to it."""

    def __init__(self, name: str, fsdp_param: Any, spec: ShardedTensorSpec) -> None:
        self.name = name
        self.fsdp_param = fsdp_param
        self.spec = spec
        self.grad: torch.Tensor | None = None  # persistent DTensor over the grads slot
        self.hook: Any = None

    @property
    def param(self) -> nn.Parameter:
        return self.fsdp_param.sharded_param


class _PlannedAllGather:
    """Mixin for FSDP2's default all-gather whose output is the group's slot."""

    def __init__(self, owner: "FSDPPlan", group: str) -> None:
        super().__init__()
        self._owner = weakref.ref(owner)
        self._group = group

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        owner = self._owner()
        numel = math.prod(int(s) for s in size)
        if owner is not None:
            view = owner._comm_view(ALL_GATHER, self._group, numel, dtype, device)
            if view is not None:
                return view.view(*size)
            owner.stats["all_gather_fallbacks"] += 1
        return torch.empty(*size, dtype=dtype, device=device)


class _PlannedReduceScatter:
    """Mixin for FSDP2's default reduce-scatter whose input is the group's slot.

    ``foreach_reduce`` allocates the input, then the output, once per call; the
    first of each pair is served from the slot.
    """

    def __init__(self, owner: "FSDPPlan", group: str) -> None:
        super().__init__()
        self._owner = weakref.ref(owner)
        self._group = group
        self._next_is_input = True

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        is_input, self._next_is_input = self._next_is_input, not self._next_is_input
        owner = self._owner()
        if is_input and owner is not None:
            numel = math.prod(int(s) for s in size)
            view = owner._comm_view(REDUCE_SCATTER, self._group, numel, dtype, device)
            if view is not None:
                return view.view(*size)
            owner.stats["reduce_scatter_fallbacks"] += 1
        return torch.empty(*size, dtype=dtype, device=device)


class FSDPPlan:
    """The planned layout of an FSDP2 model on this rank; made by :func:`plan_fsdp`.

    Attributes:
        plan: the finalized :class:`~torch_renaissance.memory_plan.MemoryPlan`
            (identical on every rank).
        storage: the :class:`~torch_renaissance.memory_plan.MaterializedPlan`
            backing it (one flat ``uint8`` tensor).
        digest: sha256 of the plan, agreed by every rank.
        specs: the :class:`~torch_renaissance.distributed.ShardedTensorSpec` of
            each parameter, in layout order.
        stats: counters: ``all_gather_planned`` / ``all_gather_fallbacks``,
            ``reduce_scatter_planned`` / ``reduce_scatter_fallbacks`` (buffer
            requests served from / outside the plan), ``all_gather_nbytes``
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
        alignment: int,
    ) -> None:
        self._model = weakref.ref(model)
        self._entries = entries
        self._param_groups = groups
        self._optimizer = optimizer
        self._group = group
        self._comm_buffers = comm_buffers
        self._alignment = alignment
        self._device = entries[0].fsdp_param.device if entries else torch.device("cpu")
        self._comm_restore: list[tuple[Any, str, Any]] = []
        self._step_hook: Any = None
        self.stats: dict[str, int] = {
            "all_gather_planned": 0,
            "all_gather_fallbacks": 0,
            "all_gather_nbytes": 0,
            "reduce_scatter_planned": 0,
            "reduce_scatter_fallbacks": 0,
            "grad_copies": 0,
            "extensions": 0,
        }
        self.plan: MemoryPlan
        self.storage: MaterializedPlan
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
            name: ``"params"``, ``"grads"``, ``"all_gather"``, ``"reduce_scatter"``
                or ``"optim.<state>"``.
            dtype: view dtype; default: the region's dtype (``uint8`` if mixed).

        Returns:
            A 1-D tensor over ``[region.offset, region.end)`` of the plan buffer:
            every slot of the region plus the zero padding between slots (padded
            rows of uneven shards and alignment gaps).

        Example::

            >>> torch._foreach_mul_([plan.region_view("grads")], 0.5)
            >>> dist.all_reduce(plan.region_view("grads"))  # DDP-style, one call
        """
        return self.storage.region_view(name, dtype)

    def slot_view(self, region: str, name: str) -> torch.Tensor:
        """Typed view of one slot (padded local shape)."""
        return self.storage.slot_view(region, name)

    def all_gather_nbytes(self) -> dict[str, int]:
        """Planned all-gather output bytes per FSDP parameter group."""
        if ALL_GATHER not in self.plan:
            return {}
        return {s.name: s.nbytes for s in self.plan.region(ALL_GATHER)}

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

    def _build(self) -> tuple[MemoryPlan, str]:
        """Plan with the optimizer state that exists now; agree across ranks (collective)."""
        states = self._state_keys()
        specs = [dataclasses.replace(e.spec, states=states.get(e.name, ())) for e in self._entries]
        plan = plan_sharded(
            specs,
            all_gather=self._comm_buffers,
            reduce_scatter=self._comm_buffers,
            alignment=self._alignment,
        )
        digest = check_agreement(plan, self._group)
        for e, s in zip(self._entries, specs):
            e.spec = s
        return plan, digest

    def _install(self, plan: MemoryPlan, digest: str) -> None:
        """Materialize ``plan`` and move every planned tensor into it."""
        from torch.distributed.tensor import DTensor

        storage = plan.materialize(self._device)
        with torch.no_grad():
            for e in self._entries:
                fp = e.fsdp_param
                # Padded flat shard first (copies the zero padding), then the
                # unpadded local tensor over its first bytes.
                storage.adopt(PARAMS, e.name, fp._sharded_param_data)
                storage.adopt(PARAMS, e.name, fp.sharded_param._local_tensor)
                if e.spec.requires_grad:
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
                    storage.adopt(optim_region(key), e.name, local)
        self.plan, self.storage, self.digest = plan, storage, digest

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
        for e in self._entries:
            if e.spec.requires_grad:
                e.hook = e.param.register_post_accumulate_grad_hook(self._grad_hook(e))
        if not self._comm_buffers:
            return
        ag = self.plan.region(ALL_GATHER) if ALL_GATHER in self.plan else None
        rs = self.plan.region(REDUCE_SCATTER) if REDUCE_SCATTER in self.plan else None
        ag_cls = type("PlannedAllGather", (_PlannedAllGather, DefaultAllGather), {})
        rs_cls = type("PlannedReduceScatter", (_PlannedReduceScatter, DefaultReduceScatter), {})
        for name, pgs in self._param_groups.items():
            for pg in pgs:
                if ag is not None and name in ag:
                    self._comm_restore.append((pg, "_all_gather_comm", pg._all_gather_comm))
                    pg._all_gather_comm = ag_cls(self, name)
                if rs is not None and name in rs:
                    self._comm_restore.append((pg, "_reduce_scatter_comm", pg._reduce_scatter_comm))
                    pg._reduce_scatter_comm = rs_cls(self, name)

    def _comm_view(
        self, region: str, group: str, numel: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        slot = self.plan.slot(region, group)
        if dtype != slot.dtype or numel > slot.numel or not _same_device(device, self.storage.device):
            return None
        view = self.storage.slot_view(region, group)[:numel]
        if region == ALL_GATHER:
            self.stats["all_gather_planned"] += 1
            self.stats["all_gather_nbytes"] = numel * dtype.itemsize
        else:
            self.stats["reduce_scatter_planned"] += 1
        return view

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Build and agree first (a collective every rank enters, whatever its
        # local state), so all ranks take the same decision below.
        plan, digest = self._build()
        if not any(e.spec.states for e in self._entries):
            return  # no state anywhere yet (e.g. a skipped step): try again next step
        self._step_hook.remove()
        self._step_hook = None
        self._install(plan, digest)
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
            if getattr(fp, "is_dtensor", False):
                raise ValueError(
                    f"{name}: parameters that were DTensors before fully_shard "
                    "(FSDP2 with tensor/expert parallel) are not supported yet"
                )
            spec_info = fp._sharding_spec
            all_gather_dtype, reduce_dtype = _mp_dtypes(fp)
            spec = ShardedTensorSpec(
                name=name,
                global_shape=tuple(fp._orig_size),
                dtype=fp.sharded_param.dtype,
                mesh_shape=tuple(spec_info.mesh.shape),
                placements=tuple(spec_info.placements),
                requires_grad=fp.sharded_param.requires_grad,
                group=group,
                all_gather_dtype=all_gather_dtype,
                reduce_dtype=reduce_dtype,
            )
            # The plan must describe exactly what FSDP2 allocated.
            if spec.slot_shape != tuple(fp.padded_sharded_param_size):
                raise ValueError(
                    f"{name}: FSDP2 padded shard {tuple(fp.padded_sharded_param_size)} != "
                    f"planned slot {spec.slot_shape} for {spec.global_shape} over "
                    f"{spec.placements}"
                )
            coordinate = spec_info.mesh.get_coordinate()
            if coordinate is not None and spec.local_shape(coordinate) != tuple(fp.sharded_size):
                raise ValueError(
                    f"{name}: FSDP2 local shard {tuple(fp.sharded_size)} is not the "
                    f"torch.chunk split {spec.local_shape(coordinate)}; cannot be planned"
                )
            if fp._sharded_param_data.numel() != spec.slot_numel:
                raise ValueError(f"{name}: unexpected FSDP2 sharded data size")
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
    alignment: int = DEFAULT_ALIGNMENT,
) -> FSDPPlan:
    """Plan and place an FSDP2 model's memory, identically on every rank.

    Call it on every rank, after ``fully_shard`` has been applied to all modules
    (and after the optimizer is built, if it is passed), before or after the
    first forward. It is a collective over ``group``.

    Builds one :class:`~torch_renaissance.memory_plan.MemoryPlan` with regions
    ``params``, ``grads``, ``all_gather``, ``reduce_scatter`` (when
    ``comm_buffers``) and ``optim.<state>`` (when the optimizer state exists; if
    not, after the first ``optimizer.step()``), checks with one collective that
    every rank has the same plan, allocates it as one buffer on the parameters'
    device and moves the tensors into their slots without changing their values
    or the Python objects FSDP2 and the optimizer hold. Training is unchanged.

    Args:
        model: the root module, with ``fully_shard`` applied.
        optimizer: optional optimizer over the model's parameters; its
            parameter-shaped state tensors are placed in ``optim.<key>`` regions.
        group: process group for the agreement check; default: the world group.
        comm_buffers: also plan FSDP2's per-group all-gather output and
            reduce-scatter input buffers and serve them from the plan. Costs one
            buffer per parameter group for the whole run (about twice the
            unsharded model size in total), in exchange for stable addresses.
        alignment: slot alignment in bytes (default 256).

    Returns:
        An :class:`FSDPPlan` (``region_view``, ``slot_view``, ``digest``, ``stats``,
        ``remove``). It is also stored on ``model``.

    Raises:
        ValueError: on every rank, if some parameter cannot be planned (the
            message names it and the reason: CPU offload, FSDP2 + TP DTensor
            parameters, non-``torch.chunk`` splits, ``_StridedShard``).
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
    fsdp_plan = FSDPPlan(model, entries, groups, optimizer, group, comm_buffers, alignment)
    plan, digest = fsdp_plan._build()
    fsdp_plan._install(plan, digest)
    fsdp_plan._attach(DefaultAllGather, DefaultReduceScatter)
    if optimizer is not None and not any(e.spec.states for e in entries):
        fsdp_plan._step_hook = optimizer.register_step_post_hook(fsdp_plan._on_step)
    setattr(model, _PLAN_ATTR, fsdp_plan)
    return fsdp_plan
