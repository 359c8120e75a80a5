"""ModelSlots: many models on one device in planned, per-architecture slot sets.

The facade of the package: architectures and models by name, the loaded
models' recency (LRU) and the lock that serializes every call. What it does
with them lives next door: ``weights.py`` (layouts, validation, copies),
``pool.py`` (the slot-set pool and its capacity invariant), ``offload.py``
(host copies) and ``activations.py`` (forwards as planned steps).

Invariants kept here:

* ``_lru`` holds exactly the loaded models, least recently used first; a
  model is loaded iff it has a slot set (``_attach`` / ``_detach``).
* Every public method runs under ``_lock`` (reentrant): one forward at a time,
  all architectures together, as the arena has one open step at a time.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from torch_renaissance.model_slots import activations, offload
from torch_renaissance.model_slots import weights as weight_ops
from torch_renaissance.model_slots.pool import SlotSet, SlotSetPool
from torch_renaissance.model_slots.records import REGION, Arch, ArchitectureLayout, Model, Weights

__all__ = ["ModelSlots"]


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
        from torch_renaissance.installer import as_torch_device

        dev = as_torch_device(device)
        if dev.type != "cpu" and dev.index is None:
            dev = torch.device(dev.type, torch.accelerator.current_device_index())
        if capacity_bytes is not None and int(capacity_bytes) < 0:
            raise ValueError(f"capacity_bytes must be >= 0 or None, got {capacity_bytes}")
        self.device = dev
        self.capacity_bytes = None if capacity_bytes is None else int(capacity_bytes)
        self.evict = bool(evict)
        self._archs: Dict[str, Arch] = {}
        self._models: Dict[str, Model] = {}
        self._lru: "OrderedDict[str, None]" = OrderedDict()  # loaded models, least recent first
        self._pool = SlotSetPool(dev, self.capacity_bytes, self.evict, self._archs)
        self._lock = threading.RLock()
        streams = None
        if dev.type != "cpu":
            from torch_renaissance.streams import StreamManager

            streams = StreamManager(dev)
        self._copies = weight_ops.WeightCopies(dev, streams)

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
            plan, alias, key_slot, values = weight_ops.layout_of(arch_name, module)
            persistent = set(key_slot.values())
            # Non-persistent buffers are not in a state_dict: every slot set
            # gets the built module's values. Kept as Python bytes, so that no
            # allocator (the arena, when installed for the CPU) holds them.
            fixed = {s: weight_ops.to_bytes(t) for s, t in values.items() if s not in persistent}
            tensor_bytes = sum(t.numel() * t.element_size() for t in values.values())
            layout = ArchitectureLayout(arch_name, plan, plan.nbytes, tensor_bytes,
                                        tuple(key_slot), None, None, False)
            arch = Arch(layout, module, alias, key_slot, fixed)
            # May raise OOM: nothing is registered yet. The module instance
            # comes once the template is on the meta device.
            first = self._acquire(arch, with_module=False)
            with torch.no_grad():
                for slot, t in values.items():
                    first.mat.slot_view(REGION, slot).copy_(t)
            del values
            arch.template = module.to("meta")
            try:
                first.module = weight_ops.instance(arch, first.mat)
                self._archs[arch_name] = arch
                arch.free.append(first)
                act, load, ok = activations.plan_activations(
                    self.device, lambda x: self._planned_forward(arch, first.module, x, {}),
                    example_inputs)
            except BaseException:
                self._archs.pop(arch_name, None)
                self._pool.release(first)
                raise
            arch.layout = dataclasses.replace(layout, activation_bytes=act,
                                              activation_load_bytes=load, activation_planned=ok)
            return arch.layout

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
            src = weight_ops.validate(arch, weights, model_name)
            s = self._acquire(arch)
            try:
                self._copies.write(arch, s.mat, src)
            except BaseException:
                arch.free.append(s)
                raise
            model = Model(model_name, arch)
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
            src = weight_ops.validate(model.arch, weights, model_name)
            if model.slot_set is not None:
                self._copies.write(model.arch, model.slot_set.mat, src)
                self._touch(model_name)
            else:
                self._copies.wait_pending()
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
            return sum(self._pool.release_free(arch) for arch in archs)

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
        return self._pool.held_bytes

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
            return {"capacity_bytes": self.capacity_bytes, "held_bytes": self._pool.held_bytes,
                    "in_use_bytes": self._pool.in_use_bytes(), "architectures": archs, "models": models}

    # -- internals ------------------------------------------------------------------

    def _arch(self, arch_name: str) -> Arch:
        try:
            return self._archs[arch_name]
        except KeyError:
            known = ", ".join(repr(a) for a in self._archs) or "none"
            raise KeyError(f"ModelSlots: architecture {arch_name!r} is not registered "
                           f"(registered: {known}); call register() first") from None

    def _model(self, model_name: str) -> Model:
        try:
            return self._models[model_name]
        except KeyError:
            known = ", ".join(repr(m) for m in self._models) or "none"
            raise KeyError(f"ModelSlots: unknown model {model_name!r} (known: {known})") from None

    def _touch(self, name: str) -> None:
        self._lru.move_to_end(name)

    def _attach(self, model: Model, s: SlotSet) -> None:
        model.slot_set = s
        self._lru[model.name] = None

    def _detach(self, model: Model) -> None:
        s = model.slot_set
        model.slot_set = None
        self._lru.pop(model.name, None)
        s.arch.free.append(s)


    def _acquire(self, arch: Arch, with_module: bool = True) -> SlotSet:
        """A free slot set of ``arch`` from the pool, evicting LRU models for room."""
        return self._pool.acquire(arch, self._evict_lru, with_module)

    def _evict_lru(self) -> bool:
        """Offloads the least recently used loaded model; False when none is loaded."""
        if not self._lru:
            return False
        model = self._models[next(iter(self._lru))]
        self._offload(model)
        model.counters.evictions += 1
        model.arch.counters.evictions += 1
        return True

    def _planned_forward(self, arch: Arch, module: nn.Module, inputs: tuple, kwargs: dict) -> Any:
        """One forward without autograd; one planned step when the arena plans.

        The step's key is (this ModelSlots, the architecture): the arena
        records, plans and matches the forwards of each architecture apart,
        so switching architectures never replays another one's layout.
        """
        key = ("ModelSlots", id(self), arch.layout.name)
        return activations.planned_forward(self.device, key, module, inputs, kwargs)

    def _offload(self, model: Model) -> None:
        model.host = offload.copy_to_host(self._copies, model.slot_set.mat)
        self._detach(model)
        model.counters.offloads += 1
        model.arch.counters.offloads += 1

    def _reload(self, model: Model) -> None:
        t0 = time.perf_counter()
        arch = model.arch
        s = self._acquire(arch)
        offload.copy_from_host(self._copies, model.host, s.mat)
        model.host = None
        self._attach(model, s)
        dt = time.perf_counter() - t0
        for c in (model.counters, arch.counters):
            c.reloads += 1
            c.switched(dt)
