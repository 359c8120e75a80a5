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

Invariants kept here:

* Weights are validated (keys, shapes, dtypes) before a byte is copied, so a
  failed :meth:`~ModelSlots.load` / :meth:`~ModelSlots.swap` leaves every slot
  set and every model as it was.
* A slot set, once made, keeps its addresses until it is released; unloading,
  offloading and evicting put it on its architecture's free list, and the next
  load of that architecture takes it from there (last in, first out) without
  allocating. Slot sets are released (memory handed back to the allocator)
  only to make room for another architecture under ``capacity_bytes``, or by
  :meth:`~ModelSlots.release_free`.
* ``capacity_bytes`` bounds the bytes of all slot sets held (loaded or free).
  A model is never dropped to make room: eviction offloads it to host memory.

Activation memory: when torch_renaissance is installed for the device (with
planning on), :meth:`ModelSlots.register` runs the example forward inside
:func:`torch_renaissance.step` until the arena has recorded and planned it and
a step replays at stable addresses; every :meth:`ModelSlots.forward` is one
such step, so all models of an architecture share that activation plan. Each
architecture's forwards are steps of their own key (``step(key=...)``), so
the arena plans and matches them apart. The arena has one open step at a time, so
forwards are serialized by a lock (one forward at a time, all architectures
together). Each architecture (each input shape) is one variant of the arena:
keep ``max_variants`` (default 8) at least that many, or the least recently
used architecture is recorded and planned again when it comes back. Memory
placed while no step plan exists (slot sets) is an obstacle for later plans;
activation territory may lie above earlier slot sets, which is why slot sets
are kept on free lists rather than freed.

Sources: ``torch.nn.Module.state_dict`` / ``load_state_dict`` semantics for
keys (``torch/nn/modules/module.py``); staging through pinned memory on a copy
stream as in ``torch.utils.data``'s pin-memory thread and
:meth:`torch_renaissance.StreamManager.prefetch`.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from torch_renaissance.memory_plan import MaterializedPlan, MemoryPlan, dtype_name, format_shape

__all__ = ["ArchitectureLayout", "ModelSlots"]

REGION = "weights"

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


class _SlotSet:
    """One materialized weight plan and the module instance viewing it."""

    __slots__ = ("arch", "mat", "module")

    def __init__(self, arch: "_Arch", mat: MaterializedPlan, module: nn.Module) -> None:
        self.arch = arch
        self.mat = mat
        self.module = module


@dataclasses.dataclass
class _Counters:
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


class _Arch:
    def __init__(self, layout: ArchitectureLayout, template: nn.Module, alias: Dict[str, str],
                 key_slot: Dict[str, str], fixed: Dict[str, bytes]) -> None:
        self.layout = layout
        self.template = template          # the module on the meta device
        self.alias = alias                # every parameter/buffer name -> slot name
        self.key_slot = key_slot          # state_dict key -> slot name
        self.fixed = fixed                # non-persistent buffers: slot name -> bytes
        self.sets: List[_SlotSet] = []    # every slot set held
        self.free: List[_SlotSet] = []    # held, no model in it (LIFO)
        self.staging: Optional[MaterializedPlan] = None  # pinned host copy of the layout
        self.staging_event: Any = None    # the last copy out of `staging`
        self.counters = _Counters()
        self.persistent_slots = len(set(key_slot.values()))


class _Model:
    def __init__(self, name: str, arch: _Arch) -> None:
        self.name = name
        self.arch = arch
        self.slot_set: Optional[_SlotSet] = None
        self.host: Optional[MaterializedPlan] = None  # offloaded weights
        self.counters = _Counters()


class ModelSlots:
    """Many models on one device in planned, per-architecture slot sets.

    Example::

        slots = ModelSlots("cuda", capacity_bytes=40 << 30)
        slots.register("mlp", lambda: MLP(), (torch.randn(16, 64),))
        slots.load("mlp-v1", "mlp", state_dict)      # weights -> a slot set
        y = slots.forward("mlp-v1", x)               # one planned step
        slots.swap("mlp-v1", new_state_dict)         # same addresses
        slots.unload("mlp-v1")                       # slot set back to the free list
        slots.load("mlp-v2", "mlp", other)           # reuses it: no allocation

    Args:
        device: where slot sets live (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
            ``torch.device``).
        capacity_bytes: bound on the bytes of all slot sets held (loaded or
            free), or ``None`` for no bound.
        evict: when a new slot set would exceed ``capacity_bytes``, offload the
            least recently used models (``True``), or raise
            ``torch.OutOfMemoryError`` (``False``).

    Raises:
        ValueError: a negative ``capacity_bytes``.
    """

    def __init__(self, device: Any = "cpu", capacity_bytes: Optional[int] = None, *,
                 evict: bool = True) -> None:
        dev = torch.device(device)
        if dev.type != "cpu" and dev.index is None:
            dev = torch.device(dev.type, torch.accelerator.current_device_index())
        if capacity_bytes is not None and int(capacity_bytes) < 0:
            raise ValueError(f"capacity_bytes must be >= 0 or None, got {capacity_bytes}")
        self.device = dev
        self.capacity_bytes = None if capacity_bytes is None else int(capacity_bytes)
        self.evict = bool(evict)
        self._archs: Dict[str, _Arch] = {}
        self._models: Dict[str, _Model] = {}
        self._lru: "OrderedDict[str, None]" = OrderedDict()  # loaded models, least recent first
        self._held = 0
        self._lock = threading.RLock()
        self._pending: List[Tuple[Any, Any]] = []  # (event, host buffer) of copies in flight
        self._streams = None
        if dev.type != "cpu":
            from torch_renaissance.streams import StreamManager

            self._streams = StreamManager(dev)

    # -- architectures ------------------------------------------------------------

    def register(self, arch_name: str, module_factory: Callable[[], nn.Module],
                 example_inputs: Any) -> ArchitectureLayout:
        """Plans an architecture: its weight layout and its activation plan.

        Builds the module once with ``module_factory()`` (on the host, or where
        the factory puts it), lays out one slot per parameter and buffer,
        makes the first slot set (initialized with the built module's values,
        counted in ``capacity_bytes``) and moves the built module to the meta
        device (it then holds no memory and is the template of every slot
        set's module). When the arena plans steps on this device, the example
        forward runs inside :func:`torch_renaissance.step` until a step
        replays at stable addresses (at least three steps: two recorded, the
        plan, a replay).

        Args:
            arch_name: name of the architecture.
            module_factory: builds one module of the architecture; all its
                tensor state must be parameters or buffers.
            example_inputs: a tensor or a tuple of positional inputs for one
                representative forward (copied to the device if elsewhere).

        Returns:
            The :class:`ArchitectureLayout` (bytes for weights and activations).

        Raises:
            ValueError: ``arch_name`` is already registered, or the module's
                ``state_dict`` has keys that are not parameters or buffers.
            TypeError: the factory did not return an ``nn.Module``.
            torch.OutOfMemoryError: the first slot set does not fit in
                ``capacity_bytes`` (see :meth:`load`).
        """
        with self._lock:
            if arch_name in self._archs:
                raise ValueError(f"ModelSlots: architecture {arch_name!r} is already registered")
            module = module_factory()
            if not isinstance(module, nn.Module):
                raise TypeError(f"ModelSlots.register({arch_name!r}): the factory returned "
                                f"{type(module).__name__}, not an nn.Module")
            module.eval()
            plan, alias, key_slot, values = self._layout_of(arch_name, module)
            persistent = set(key_slot.values())
            # Non-persistent buffers are not in a state_dict: every slot set
            # gets the built module's values. Kept as Python bytes, so that no
            # allocator (the arena, when installed for the CPU) holds them.
            fixed = {s: _to_bytes(t) for s, t in values.items() if s not in persistent}
            tensor_bytes = sum(t.numel() * t.element_size() for t in values.values())
            layout = ArchitectureLayout(arch_name, plan, plan.nbytes, tensor_bytes,
                                        tuple(key_slot), None, None, False)
            arch = _Arch(layout, module, alias, key_slot, fixed)
            # May raise OOM: nothing is registered yet. The module instance
            # comes once the template is on the meta device.
            first = self._acquire(arch, with_module=False)
            with torch.no_grad():
                for slot, t in values.items():
                    first.mat.slot_view(REGION, slot).copy_(t)
            del values
            arch.template = module.to("meta")
            try:
                first.module = self._instance(arch, first.mat)
                self._archs[arch_name] = arch
                arch.free.append(first)
                act, load, ok = self._plan_activations(arch, first.module, example_inputs)
            except BaseException:
                self._archs.pop(arch_name, None)
                self._release(first)
                raise
            arch.layout = dataclasses.replace(layout, activation_bytes=act,
                                              activation_load_bytes=load, activation_planned=ok)
            return arch.layout

    def _layout_of(self, arch_name: str, module: nn.Module):
        """The weight plan of ``module``: slot per unique tensor, names and values."""
        slot_of: Dict[int, str] = {}
        values: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        alias: Dict[str, str] = {}
        named = itertools.chain(module.named_parameters(remove_duplicate=False),
                                module.named_buffers(remove_duplicate=False))
        for name, t in named:
            if t is None:
                continue
            if id(t) not in slot_of:
                slot_of[id(t)] = name
                values[name] = t
            alias[name] = slot_of[id(t)]
        key_slot: Dict[str, str] = {}
        for key in module.state_dict().keys():
            if key not in alias:
                raise ValueError(f"ModelSlots.register({arch_name!r}): state_dict key {key!r} is "
                                 "not a parameter or buffer (extra state is not supported)")
            key_slot[key] = alias[key]
        plan = MemoryPlan()
        plan.add_region(REGION)
        for name, t in values.items():
            plan.add_slot(REGION, name, t.shape, t.dtype)
        plan.finalize()
        return plan, alias, key_slot, values

    def _instance(self, arch: _Arch, mat: MaterializedPlan) -> nn.Module:
        """A module of ``arch`` whose parameters and buffers are views into ``mat``."""
        made: Dict[str, torch.Tensor] = {}
        memo: Dict[int, Any] = {}
        named = itertools.chain(arch.template.named_parameters(remove_duplicate=False),
                                arch.template.named_buffers(remove_duplicate=False))
        for name, t in named:
            if t is None:
                continue
            slot = arch.alias[name]
            if slot not in made:
                view = mat.slot_view(REGION, slot)
                made[slot] = nn.Parameter(view, requires_grad=False) if isinstance(t, nn.Parameter) else view
            memo[id(t)] = made[slot]
        module = copy.deepcopy(arch.template, memo)
        module.eval()
        return module

    def _planning_arena(self):
        """The arena that plans steps on this device, or None."""
        from torch_renaissance import installer

        cfg = installer.installed_config(self.device)
        if cfg is None or not cfg.planning:
            return None
        return installer.get_arena(self.device)

    def _plan_activations(self, arch: _Arch, module: nn.Module, example_inputs: Any):
        """Runs the example forward as planned steps; returns (bytes, LOAD, planned)."""
        arena = self._planning_arena()
        if arena is None:
            return None, None, False
        if arena.in_step:
            warnings.warn("ModelSlots.register: a step is already open on the arena; the "
                          "activation plan is not measured", stacklevel=3)
            return None, None, False
        inputs = self._to_device(example_inputs)
        ranges: List[Tuple[int, int]] = []
        stats: Dict[str, Any] = {}
        ok = False
        out = None
        for i in range(8):  # steps 0, 1 recorded, plan at the end of 1, 2+ replay
            out = None  # as a serving loop drops the last output before the next
            out = self._planned_forward(arch, module, inputs, {})
            stats = arena.stats()["renaissance"]
            cur = self._step_ranges(arena)
            full = 0 < stats["last_step_allocations"] == stats["last_step_hits"]
            if i >= 2 and full and cur == ranges:
                ok = True
                break
            ranges = cur
        del out
        if not ranges:
            return None, None, False
        return _union_bytes(ranges), int(stats["step_load_bytes"]), ok

    def _step_ranges(self, arena) -> List[Tuple[int, int]]:
        """Address ranges ``[start, end)`` of the last completed step's allocations."""
        return sorted((e["address"], e["address"] + e["size"]) for e in arena.last_step()["entries"])

    def _to_device(self, inputs: Any) -> tuple:
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        return tuple(x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs)

    # -- models -------------------------------------------------------------------

    def load(self, model_name: str, arch_name: str, weights: Weights) -> nn.Module:
        """Places a model's weights into a free slot set of its architecture.

        A free slot set (left by :meth:`unload`, :meth:`offload` or an
        eviction) is reused without allocating; otherwise a new one is made,
        evicting least recently used models first when ``capacity_bytes``
        would be exceeded. Where the device has streams, host weights are
        staged through pinned host memory and copied on the ``h2d`` stream,
        then handed off to the compute stream; on the CPU it is a plain copy.

        Args:
            model_name: a new name.
            arch_name: a registered architecture.
            weights: a ``state_dict`` (exactly the architecture's keys, each
                tensor of the registered shape and dtype, on any device) or a
                module of the architecture.

        Returns:
            The model's module (see :meth:`get`).

        Raises:
            ValueError: ``model_name`` is already loaded or offloaded; or a key
                is missing or unexpected, or a tensor has the wrong shape or
                dtype (the message names the key and what was expected).
                Nothing is copied then.
            KeyError: ``arch_name`` is not registered.
            torch.OutOfMemoryError: the slot set does not fit in
                ``capacity_bytes`` and eviction is off (or nothing is left to
                evict); the message names the architecture, the bytes needed
                and the bytes free.
        """
        with self._lock:
            t0 = time.perf_counter()
            if model_name in self._models:
                state = "loaded" if self._models[model_name].slot_set else "offloaded"
                raise ValueError(f"ModelSlots.load: model {model_name!r} is already {state}; "
                                 "swap() replaces its weights, unload() removes it")
            arch = self._arch(arch_name)
            src = self._validate(arch, weights, model_name)
            s = self._acquire(arch)
            try:
                self._write(arch, s.mat, src)
            except BaseException:
                arch.free.append(s)
                raise
            model = _Model(model_name, arch)
            self._attach(model, s)
            self._models[model_name] = model
            dt = time.perf_counter() - t0
            for c in (model.counters, arch.counters):
                c.loads += 1
                c.switched(dt)
            return s.module

    def swap(self, model_name: str, weights: Weights) -> None:
        """Replaces the weights of a model in place (same addresses).

        For a loaded model the new weights are copied into its slot set (after
        the compute stream's work queued so far, so a forward in flight reads
        the old weights); for an offloaded one into its host copy.

        Args:
            model_name: a loaded or offloaded model.
            weights: as for :meth:`load`.

        Raises:
            KeyError: unknown ``model_name``.
            ValueError: bad weights (as for :meth:`load`); nothing is copied.
        """
        with self._lock:
            t0 = time.perf_counter()
            model = self._model(model_name)
            src = self._validate(model.arch, weights, model_name)
            if model.slot_set is not None:
                self._write(model.arch, model.slot_set.mat, src)
                self._touch(model_name)
            else:
                self._wait_pending()
                with torch.no_grad():
                    for slot, t in src.items():
                        model.host.slot_view(REGION, slot).copy_(t)
            dt = time.perf_counter() - t0
            for c in (model.counters, model.arch.counters):
                c.swaps += 1
                c.switched(dt)

    def get(self, model_name: str) -> nn.Module:
        """The model's module: parameters and buffers are views into its slot set.

        An offloaded model is loaded back first (into a free slot set of its
        architecture, evicting as :meth:`load` does). The module stays valid
        while the model is loaded; after :meth:`unload`, :meth:`offload` or
        an eviction its slot set may hold another model's weights.

        Raises:
            KeyError: unknown ``model_name``.
            torch.OutOfMemoryError: as for :meth:`load`, when reloading.
        """
        with self._lock:
            model = self._model(model_name)
            if model.slot_set is None:
                self._reload(model)
            else:
                self._touch(model_name)
            return model.slot_set.module

    def forward(self, model_name: str, *inputs: Any, **kwargs: Any) -> Any:
        """Runs ``get(model_name)(*inputs, **kwargs)`` without autograd, as one
        planned step of the arena when it plans steps on this device.

        The output lives in the architecture's activation plan; keep it past
        the next forward of that architecture and the arena serves that
        forward's overlapping buffers elsewhere (correct, counted as
        ``renaissance.planned_conflicts``).

        Raises:
            KeyError: unknown ``model_name``.
        """
        with self._lock:
            module = self.get(model_name)
            model = self._models[model_name]
            model.counters.forwards += 1
            model.arch.counters.forwards += 1
            return self._planned_forward(model.arch, module, inputs, kwargs)

    def _planned_forward(self, arch: _Arch, module: nn.Module, inputs: tuple, kwargs: dict) -> Any:
        """One forward without autograd; one planned step when the arena plans.

        The step's key is (this ModelSlots, the architecture): the arena
        records, plans and matches the forwards of each architecture apart,
        so switching architectures never replays another one's layout.
        """
        arena = self._planning_arena()
        with torch.no_grad():
            if arena is None or arena.in_step:
                return module(*inputs, **kwargs)
            from torch_renaissance.step import step

            with step(self.device, key=("ModelSlots", id(self), arch.layout.name)):
                return module(*inputs, **kwargs)

    def unload(self, model_name: str) -> None:
        """Removes a model; its slot set goes back to the free list for reuse.

        Raises:
            KeyError: unknown ``model_name``.
        """
        with self._lock:
            model = self._model(model_name)
            if model.slot_set is not None:
                self._detach(model)
            model.host = None
            del self._models[model_name]

    def offload(self, model_name: Optional[str] = None) -> List[str]:
        """Moves loaded models' weights to host memory; their slot sets become free.

        The weights are copied to one host buffer per model (pinned where the
        device has streams) with the slot set's layout, and the slot set goes
        back to its architecture's free list: it stays allocated (held, counted
        in ``capacity_bytes``) and the next load of that architecture reuses
        it; :meth:`release_free` hands free slot sets back to the allocator.
        The model stays known: :meth:`get` / :meth:`forward` load it back.

        Args:
            model_name: one model, or ``None`` for every loaded model.

        Returns:
            The names offloaded now (already offloaded ones are skipped).

        Raises:
            KeyError: unknown ``model_name``.
        """
        with self._lock:
            names = [model_name] if model_name is not None else list(self._lru)
            done = []
            for name in names:
                model = self._model(name)
                if model.slot_set is not None:
                    self._offload(model)
                    done.append(name)
            return done

    def release_free(self, arch_name: Optional[str] = None) -> int:
        """Hands free slot sets (of one architecture, or all) back to the allocator.

        The next load of such an architecture makes a new slot set (one
        allocation, new addresses).

        Args:
            arch_name: one architecture, or ``None`` for all.

        Returns:
            The bytes released.

        Raises:
            KeyError: unknown ``arch_name``.
        """
        with self._lock:
            archs = [self._arch(arch_name)] if arch_name is not None else list(self._archs.values())
            n = 0
            for arch in archs:
                while arch.free:
                    s = arch.free.pop()
                    n += s.mat.plan.nbytes
                    self._release(s)
            return n

    # -- introspection --------------------------------------------------------------

    def layout(self, arch_name: str) -> ArchitectureLayout:
        """The :class:`ArchitectureLayout` of a registered architecture."""
        return self._arch(arch_name).layout

    def architectures(self) -> List[str]:
        """Registered architecture names, in registration order."""
        return list(self._archs)

    def models(self) -> Dict[str, str]:
        """Every known model: name -> ``"loaded"`` or ``"offloaded"``."""
        return {n: ("loaded" if m.slot_set else "offloaded") for n, m in self._models.items()}

    def __contains__(self, model_name: object) -> bool:
        return model_name in self._models

    def slot_set_address(self, model_name: str) -> Optional[int]:
        """Address of byte 0 of the model's slot set, or None when offloaded."""
        model = self._model(model_name)
        return model.slot_set.mat.data_ptr() if model.slot_set else None

    @property
    def held_bytes(self) -> int:
        """Bytes of every slot set held (loaded or free)."""
        return self._held

    def stats(self) -> Dict[str, Any]:
        """Counters and sizes, per architecture and per model (bytes, seconds).

        Returns:
            ``{"capacity_bytes", "held_bytes", "in_use_bytes", "architectures":
            {name: {"slot_bytes", "tensor_bytes", "activation_bytes",
            "activation_load_bytes", "slot_sets", "slot_sets_in_use", "models",
            "loads", "swaps", "reloads", "offloads", "evictions", "forwards",
            "switches", "mean_switch_seconds", "last_switch_seconds"}},
            "models": {name: {"architecture", "state", "slot_bytes", "address",
            and the same counters}}}``. A switch is a :meth:`load`,
            :meth:`swap` or reload, timed on the host (copies on a stream may
            still be in flight when it returns).
        """
        with self._lock:
            archs = {}
            for name, a in self._archs.items():
                d = {
                    "slot_bytes": a.layout.weight_bytes,
                    "tensor_bytes": a.layout.tensor_bytes,
                    "activation_bytes": a.layout.activation_bytes,
                    "activation_load_bytes": a.layout.activation_load_bytes,
                    "slot_sets": len(a.sets),
                    "slot_sets_in_use": len(a.sets) - len(a.free),
                    "models": sum(1 for m in self._models.values() if m.arch is a),
                }
                d.update(a.counters.as_dict())
                archs[name] = d
            models = {}
            for name, m in self._models.items():
                d = {
                    "architecture": m.arch.layout.name,
                    "state": "loaded" if m.slot_set else "offloaded",
                    "slot_bytes": m.arch.layout.weight_bytes,
                    "address": m.slot_set.mat.data_ptr() if m.slot_set else None,
                }
                d.update(m.counters.as_dict())
                models[name] = d
            return {"capacity_bytes": self.capacity_bytes, "held_bytes": self._held,
                    "in_use_bytes": self._in_use_bytes(), "architectures": archs, "models": models}

    # -- internals ------------------------------------------------------------------

    def _arch(self, arch_name: str) -> _Arch:
        try:
            return self._archs[arch_name]
        except KeyError:
            known = ", ".join(repr(a) for a in self._archs) or "none"
            raise KeyError(f"ModelSlots: architecture {arch_name!r} is not registered "
                           f"(registered: {known}); call register() first") from None

    def _model(self, model_name: str) -> _Model:
        try:
            return self._models[model_name]
        except KeyError:
            known = ", ".join(repr(m) for m in self._models) or "none"
            raise KeyError(f"ModelSlots: unknown model {model_name!r} (known: {known})") from None

    def _touch(self, name: str) -> None:
        self._lru.move_to_end(name)

    def _attach(self, model: _Model, s: _SlotSet) -> None:
        model.slot_set = s
        self._lru[model.name] = None

    def _detach(self, model: _Model) -> None:
        s = model.slot_set
        model.slot_set = None
        self._lru.pop(model.name, None)
        s.arch.free.append(s)

    def _validate(self, arch: _Arch, weights: Weights, model_name: str) -> Dict[str, torch.Tensor]:
        """Checks ``weights`` against the layout; returns slot name -> source tensor."""
        if isinstance(weights, nn.Module):
            weights = weights.state_dict()
        if not isinstance(weights, Mapping):
            raise TypeError(f"ModelSlots: weights of {model_name!r} must be a state_dict "
                            f"(a mapping of str to tensors) or an nn.Module, got {type(weights).__name__}")
        where = f"model {model_name!r} (architecture {arch.layout.name!r})"
        problems = []
        plan = arch.layout.plan
        for key, slot_name in arch.key_slot.items():
            slot = plan.slot(REGION, slot_name)
            want = f"{dtype_name(slot.dtype)} of shape {format_shape(slot.shape)}"
            if key not in weights:
                problems.append(f"missing key {key!r} (expected {want})")
                continue
            t = weights[key]
            if not isinstance(t, torch.Tensor):
                problems.append(f"key {key!r}: a {type(t).__name__}, expected a tensor ({want})")
            elif tuple(t.shape) != slot.shape or t.dtype != slot.dtype:
                problems.append(f"key {key!r}: {dtype_name(t.dtype)} of shape "
                                f"{format_shape(tuple(t.shape))}, expected {want}")
        extra = [k for k in weights if k not in arch.key_slot]
        for key in extra:
            problems.append(f"unexpected key {key!r} (the architecture has no such parameter "
                            "or persistent buffer)")
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ValueError(f"ModelSlots: bad weights for {where}: " + "; ".join(problems[:5]) + more
                             + "; nothing was copied")
        src: Dict[str, torch.Tensor] = {}
        for key, slot_name in arch.key_slot.items():
            src[slot_name] = weights[key].detach()
        return src

    def _write(self, arch: _Arch, mat: MaterializedPlan, src: Dict[str, torch.Tensor]) -> None:
        """Copies validated sources (slot name -> tensor) into a slot set.

        CPU: a plain copy per slot. Accelerator: the ``h2d`` stream first
        waits for the compute stream's queued work (forwards reading the old
        weights); pinned host sources are copied from directly, other host
        sources through the architecture's pinned staging buffer (one copy of
        the whole slot set when every slot is staged), device sources on the
        current stream; then the compute stream waits for ``h2d``
        (``StreamManager.handoff``). Pinned sources are read asynchronously:
        they are kept alive until the copy is done, and must not be changed
        before then.
        """
        if self._streams is None or self._streams.trivial:
            with torch.no_grad():
                for slot, t in src.items():
                    mat.slot_view(REGION, slot).copy_(t)
            return
        sm = self._streams
        host = {k: t for k, t in src.items() if t.device.type == "cpu"}
        pinned = {k: t for k, t in host.items() if t.is_pinned()}
        staged = {k: t for k, t in host.items() if k not in pinned}
        local = {k: t for k, t in src.items() if t.device.type != "cpu"}
        with torch.no_grad():
            if staged:
                stage = self._staging(arch)
                if arch.staging_event is not None:
                    arch.staging_event.synchronize()  # the last copy out of it is done
                for k, t in staged.items():
                    stage.slot_view(REGION, k).copy_(t)
            if host:
                with sm.on("h2d") as h2d:
                    h2d.wait_stream(sm.stream("compute"))
                    if len(staged) == arch.persistent_slots:
                        mat.buffer.copy_(stage.buffer, non_blocking=True)
                    else:
                        for k in staged:
                            mat.slot_bytes(REGION, k).copy_(stage.slot_bytes(REGION, k),
                                                            non_blocking=True)
                    for k, t in pinned.items():
                        mat.slot_view(REGION, k).copy_(t, non_blocking=True)
                    ev = torch.Event(device=self.device)
                    ev.record(h2d)
                if staged:
                    arch.staging_event = ev
                if pinned:
                    self._pending.append((ev, list(pinned.values())))
                sm.handoff(mat.buffer, "compute", from_="h2d")
            for k, t in local.items():
                mat.slot_view(REGION, k).copy_(t)
        self._wait_pending(block=False)

    def _staging(self, arch: _Arch) -> MaterializedPlan:
        """The architecture's pinned host staging buffer (made on first use)."""
        if arch.staging is None:
            plan = arch.layout.plan
            buf = torch.zeros(plan.nbytes, dtype=torch.uint8, pin_memory=True)
            arch.staging = MaterializedPlan(plan, buf)
            _write_fixed(arch, arch.staging)
        return arch.staging

    def _acquire(self, arch: _Arch, with_module: bool = True) -> _SlotSet:
        """A free slot set of ``arch``: reused, or made within ``capacity_bytes``.

        Order when a new one would exceed the capacity: release free slot sets
        of other architectures (they hold no model), then offload least
        recently used models; a model of ``arch`` evicted on the way gives
        its slot set directly. Checks that the capacity can be met before
        changing anything when eviction is off.
        """
        if arch.free:
            return arch.free.pop()
        need = arch.layout.weight_bytes
        cap = self.capacity_bytes
        if cap is not None and self._held + need > cap:
            in_use = self._in_use_bytes()
            if need > cap or (not self.evict and in_use + need > cap):
                self._oom(arch, need, cap - in_use,
                          "eviction is off" if not self.evict else "it exceeds capacity_bytes")
            while self._held + need > cap:
                # 1. Free slot sets of other architectures hold no model: release them.
                victim = next((a for a in self._archs.values() if a is not arch and a.free), None)
                if victim is not None:
                    self._release(victim.free.pop())
                    continue
                # 2. Offload the least recently used model.
                if not self._lru:
                    self._oom(arch, need, cap - self._in_use_bytes(), "nothing left to evict")
                name = next(iter(self._lru))
                model = self._models[name]
                self._offload(model)
                model.counters.evictions += 1
                model.arch.counters.evictions += 1
                if arch.free:  # it was of this architecture: take its slot set
                    return arch.free.pop()
        mat = arch.layout.plan.materialize(self.device)
        _write_fixed(arch, mat)
        s = _SlotSet(arch, mat, self._instance(arch, mat) if with_module else None)
        arch.sets.append(s)
        self._held += need
        return s

    def _in_use_bytes(self) -> int:
        return sum(a.layout.weight_bytes * (len(a.sets) - len(a.free)) for a in self._archs.values())

    def _oom(self, arch: _Arch, need: int, free: int, why: str) -> None:
        raise torch.OutOfMemoryError(
            f"ModelSlots: cannot place a slot set of architecture {arch.layout.name!r}: it needs "
            f"{need} bytes and {max(free, 0)} bytes are free of capacity_bytes={self.capacity_bytes} "
            f"({why}); unload or offload a model, or raise capacity_bytes")

    def _release(self, s: _SlotSet) -> None:
        """Hands a free slot set back to the allocator."""
        arch = s.arch
        if s in arch.free:
            arch.free.remove(s)
        arch.sets.remove(s)
        self._held -= s.mat.plan.nbytes
        s.module = None
        s.mat = None

    def _offload(self, model: _Model) -> None:
        s = model.slot_set
        plan = model.arch.layout.plan
        pinned = self._streams is not None and not self._streams.trivial
        buf = torch.empty(plan.nbytes, dtype=torch.uint8, pin_memory=pinned)
        with torch.no_grad():
            if pinned:
                sm = self._streams
                with sm.on("d2h") as d2h:
                    d2h.wait_stream(sm.stream("compute"))
                    buf.copy_(s.mat.buffer, non_blocking=True)
                # The slot set is reused at once: its bytes must have been read.
                d2h.synchronize()
            else:
                buf.copy_(s.mat.buffer)
        model.host = MaterializedPlan(plan, buf)
        self._detach(model)
        model.counters.offloads += 1
        model.arch.counters.offloads += 1

    def _reload(self, model: _Model) -> None:
        t0 = time.perf_counter()
        arch = model.arch
        s = self._acquire(arch)
        host = model.host
        with torch.no_grad():
            if self._streams is None or self._streams.trivial:
                s.mat.buffer.copy_(host.buffer)
            else:
                sm = self._streams
                with sm.on("h2d") as h2d:
                    h2d.wait_stream(sm.stream("compute"))
                    s.mat.buffer.copy_(host.buffer, non_blocking=True)
                    ev = torch.Event(device=self.device)
                    ev.record(h2d)
                self._pending.append((ev, host.buffer))  # freed once the copy is done
                sm.handoff(s.mat.buffer, "compute", from_="h2d")
        model.host = None
        self._attach(model, s)
        self._wait_pending(block=False)
        dt = time.perf_counter() - t0
        for c in (model.counters, arch.counters):
            c.reloads += 1
            c.switched(dt)

    def _wait_pending(self, block: bool = True) -> None:
        keep = []
        for ev, buf in self._pending:
            if block:
                ev.synchronize()
            elif not ev.query():
                keep.append((ev, buf))
        self._pending = keep


def _to_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (copied to the host)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _write_fixed(arch: _Arch, mat: MaterializedPlan) -> None:
    """Copies the non-persistent buffers' values into a slot set."""
    with torch.no_grad():
        for slot, raw in arch.fixed.items():
            if raw:
                src = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                mat.slot_bytes(REGION, slot)[: len(raw)].copy_(src)


def _union_bytes(ranges: Sequence[Tuple[int, int]]) -> int:
    """Bytes covered by the union of ``[start, end)`` ranges."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(ranges):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
