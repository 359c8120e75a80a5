"""Activations: every forward of an architecture as a planned step of the arena.

When torch_renaissance is installed for the device with planning on,
:meth:`ModelSlots.register` runs the example forward inside
:func:`torch_renaissance.step` until the arena has recorded and planned it
and a step replays at stable addresses (:func:`plan_activations`); every
:meth:`ModelSlots.forward` is one such step (:func:`planned_forward`), so all
models of an architecture share that activation plan.

Invariants:

* Each architecture's forwards are steps of their own key
  ``("ModelSlots", id(slots), arch name)``: the arena records, plans and
  matches them apart, and switching architectures never replays another
  one's layout.
* A forward inside a step already open on the arena runs plainly (no nested
  step); without a planning arena every forward runs plainly.
* The arena has one open step at a time, so the caller serializes forwards
  (``ModelSlots`` holds its lock).

Each architecture (each input shape) is one variant of the arena: keep
``max_variants`` (default 8) at least that many, or the least recently used
architecture is recorded and planned again when it comes back.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

__all__ = ["planning_arena", "to_device", "plan_activations", "planned_forward", "union_bytes"]


def planning_arena(device: torch.device):
    """The arena that plans steps on ``device``, or None."""
    from torch_renaissance import installer

    cfg = installer.installed_config(device)
    if cfg is None or not cfg.planning:
        return None
    return installer.get_arena(device)


def to_device(device: torch.device, inputs: Any) -> tuple:
    """``inputs`` (a tensor or a tuple) as a tuple, tensors moved to ``device``."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)


def planned_forward(device: torch.device, key: Tuple[Any, ...], module: nn.Module,
                    inputs: tuple, kwargs: dict) -> Any:
    """One forward without autograd; one planned step of ``key`` when the arena plans."""
    arena = planning_arena(device)
    with torch.no_grad():
        if arena is None or arena.in_step:
            return module(*inputs, **kwargs)
        from torch_renaissance.step import step

        with step(device, key=key):
            return module(*inputs, **kwargs)


def plan_activations(device: torch.device, forward: Callable[[tuple], Any],
                     example_inputs: Any) -> Tuple[Optional[int], Optional[int], bool]:
    """Runs ``forward(inputs)`` (one planned step each) until a step replays
    every allocation at the same addresses, at most 8 times.

    Returns:
        ``(activation bytes, LOAD bytes, planned)``: the union of the replayed
        step's address ranges, its ``step_load_bytes``, and whether it
        replayed fully; ``(None, None, False)`` without a planning arena or
        inside an open step (with a warning).
    """
    arena = planning_arena(device)
    if arena is None:
        return None, None, False
    if arena.in_step:
        warnings.warn("ModelSlots.register: a step is already open on the arena; the "
                      "activation plan is not measured", stacklevel=3)
        return None, None, False
    inputs = to_device(device, example_inputs)
    ranges: List[Tuple[int, int]] = []
    stats: Dict[str, Any] = {}
    ok = False
    out = None
    for i in range(8):  # steps 0, 1 recorded, plan at the end of 1, 2+ replay
        out = None  # as a serving loop drops the last output before the next
        out = forward(inputs)
        stats = arena.stats()["renaissance"]
        cur = _step_ranges(arena)
        full = 0 < stats["last_step_allocations"] == stats["last_step_hits"]
        if i >= 2 and full and cur == ranges:
            ok = True
            break
        ranges = cur
    del out
    if not ranges:
        return None, None, False
    return union_bytes(ranges), int(stats["step_load_bytes"]), ok


def _step_ranges(arena) -> List[Tuple[int, int]]:
    """Address ranges ``[start, end)`` of the last completed step's allocations."""
    return sorted((e["address"], e["address"] + e["size"]) for e in arena.last_step()["entries"])


def union_bytes(ranges: Sequence[Tuple[int, int]]) -> int:
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
