"""Weights: an architecture's weight layout, module instances viewing a slot
set, validation of a model's weights, and copying them into a slot set.

Invariants:

* Weights are validated (keys, shapes, dtypes) before a byte is copied
  (:func:`validate`), so a failed load or swap leaves every slot set and every
  model as it was.
* One slot per unique tensor (tied parameters share one); every
  ``state_dict`` key maps to a slot; non-persistent buffers (not in a
  ``state_dict``) are written from the built module's values into every new
  slot set (:func:`write_fixed`).
* On an accelerator, a copy into a slot set runs on the ``h2d`` stream after
  the compute stream's queued work, and the compute stream waits for it
  before its next use (:meth:`WeightCopies.write`); host sources read
  asynchronously stay alive until their copy is done (``pending``).

Sources: ``torch.nn.Module.state_dict`` / ``load_state_dict`` semantics for
keys (``torch/nn/modules/module.py``); staging through pinned memory on a copy
stream as in ``torch.utils.data``'s pin-memory thread.
"""
from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import nn

from torch_renaissance.memory_plan import MaterializedPlan, MemoryPlan, dtype_name, format_shape
from torch_renaissance.model_slots.records import REGION, Arch, Weights

__all__ = ["layout_of", "instance", "validate", "write_fixed", "to_bytes", "WeightCopies"]


def layout_of(arch_name: str, module: nn.Module):
    """The weight plan of ``module``: slot per unique tensor, names and values.

    Returns:
        ``(plan, alias, key_slot, values)``: the finalized plan, every
        parameter/buffer name -> slot name, ``state_dict`` key -> slot name,
        and slot name -> the module's tensor.

    Raises:
        ValueError: a ``state_dict`` key is not a parameter or buffer.
    """
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


def instance(arch: Arch, mat: MaterializedPlan) -> nn.Module:
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


def validate(arch: Arch, weights: Weights, model_name: str) -> Dict[str, torch.Tensor]:
    """Checks ``weights`` against the layout; returns slot name -> source tensor.

    Raises:
        TypeError: ``weights`` is neither a mapping nor an ``nn.Module``.
        ValueError: a key is missing or unexpected, or a tensor has the wrong
            shape or dtype, or is not a dense strided tensor with data (sparse, meta,
            quantized, nested); the first five problems are named.
    """
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
        elif t.layout is not torch.strided or t.is_meta or t.is_quantized or t.is_nested:
            # Shape and dtype match, yet copy_() into the slot would fail part-way
            # through the model (a sparse or meta tensor has no bytes to copy).
            kind = ("a meta tensor (no data)" if t.is_meta else
                    f"a {str(t.layout).replace('torch.', '')} tensor" if t.layout is not torch.strided
                    else "a quantized tensor" if t.is_quantized else "a nested tensor")
            problems.append(f"key {key!r}: {kind}, expected a dense {want}")
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


def to_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (copied to the host)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write_fixed(arch: Arch, mat: MaterializedPlan) -> None:
    """Copies the non-persistent buffers' values into a slot set."""
    with torch.no_grad():
        for slot, raw in arch.fixed.items():
            if raw:
                src = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                mat.slot_bytes(REGION, slot)[: len(raw)].copy_(src)


class WeightCopies:
    """Copies into and out of slot sets, on the device's copy streams.

    Args:
        device: the slot sets' device.
        streams: its :class:`~torch_renaissance.StreamManager`, or ``None``
            on the CPU (plain copies).

    ``pending`` holds ``(event, host buffers)`` of asynchronous copies still
    in flight; :meth:`wait_pending` drops those done (or waits for all).
    """

    def __init__(self, device: torch.device, streams: Any) -> None:
        self.device = device
        self.streams = streams
        self.pending: List[Tuple[Any, Any]] = []

    @property
    def plain(self) -> bool:
        """True when copies are plain, synchronous ones (no copy streams)."""
        return self.streams is None or self.streams.trivial

    def write(self, arch: Arch, mat: MaterializedPlan, src: Dict[str, torch.Tensor]) -> None:
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
        if self.plain:
            with torch.no_grad():
                for slot, t in src.items():
                    mat.slot_view(REGION, slot).copy_(t)
            return
        sm = self.streams
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
                    self.pending.append((ev, list(pinned.values())))
                sm.handoff(mat.buffer, "compute", from_="h2d")
            for k, t in local.items():
                mat.slot_view(REGION, k).copy_(t)
        self.wait_pending(block=False)

    def _staging(self, arch: Arch) -> MaterializedPlan:
        """The architecture's pinned host staging buffer (made on first use)."""
        if arch.staging is None:
            plan = arch.layout.plan
            buf = torch.zeros(plan.nbytes, dtype=torch.uint8, pin_memory=True)
            arch.staging = MaterializedPlan(plan, buf)
            write_fixed(arch, arch.staging)
        return arch.staging

    def wait_pending(self, block: bool = True) -> None:
        """Drops the finished copies from ``pending``; ``block``: waits for all."""
        keep = []
        for ev, buf in self.pending:
            if block:
                ev.synchronize()
            elif not ev.query():
                keep.append((ev, buf))
        self.pending = keep
