"""Memory statistics under PyTorch's names, a summary table, and derived numbers.

``memory_stats()`` returns exactly the keys of ``torch.cuda.memory_stats()``
(``torch/cuda/memory.py``, ``torch/csrc/cuda/Module.cpp``: ``allocation``,
``segment``, ``active``, ``inactive_split``, ``allocated_bytes``,
``reserved_bytes``, ``active_bytes``, ``inactive_split_bytes``,
``requested_bytes`` x ``all|small_pool|large_pool`` x
``current|peak|allocated|freed``, ``num_*`` counters, ``max_split_size``,
``oversize_*``) plus ``renaissance.*`` keys for what PyTorch has no name for.
All sizes are bytes.

For CUDA, PyTorch's keys come from the allocator behind ``torch.cuda`` (ours
once installed): the whole device, CUDA-graph pools and MemPools included, with
device-wide peaks; the resets and ``empty_cache`` go through ``torch.cuda`` too.
The ``renaissance.*`` keys describe the device's default arena, where steps
are planned.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Optional

import torch

from torch_renaissance.extension import extension as _ext
from torch_renaissance.installer import (as_torch_device, get_arena, installed_config, installed_device,
                                         is_installed, resolve_device)


def _flatten(prefix: str, value: Any, out: list) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out.append((prefix, value))


def _not_installed(device: Any) -> bool:
    """True when ``device`` is a CPU or CUDA device torch_renaissance is not
    installed for (None: nothing is installed). The stats calls then follow
    ``torch.cuda``'s convention before initialization (PyTorch #186265): the
    resets and ``empty_cache`` do nothing and the statistics are zeros."""
    if device is None:
        return not (is_installed("cpu") or is_installed("cuda"))
    dev = as_torch_device(device)
    return dev.type in ("cpu", "cuda") and not is_installed(dev.type)


def memory_stats_as_nested_dict(device: Any = None) -> dict:
    """The statistics as PyTorch's nested dict (plus a ``renaissance`` sub-dict).

    Before :func:`torch_renaissance.install` for ``device``, every number is 0
    (the keys are the same).

    Raises:
        RuntimeError: ``device`` is neither a CPU nor a CUDA device.
    """
    if _not_installed(device):
        C = _ext()
        nested = C.Arena(C.HostDevice(), planning=False).stats()  # an arena that never allocated
        dev = None
    else:
        dev = resolve_device(device)
        nested = get_arena(dev).stats()
    if dev is not None and dev.type == "cuda":
        # {} until CUDA is initialized: the arena's (all zero) numbers stay.
        for key, value in torch.cuda.memory_stats_as_nested_dict(dev.index).items():
            if key in nested:
                nested[key] = value
    r = nested["renaissance"]
    # Over every allocation of the planned steps: those after a replay stopped
    # (a miss, the conflict limit) were not served by the plan.
    requests = r["planned_requests"] + r["planned_unserved"]
    r["hit_rate"] = r["planned_hits"] / requests if requests else 0.0
    comparable = r["last_step_comparable"]
    r["address_stability"] = r["last_step_same_address"] / comparable if comparable else 0.0
    # Over every replayed step compared with an earlier replay of its layout (what `run`'s
    # report calls "steady steps"): the first replays, compared with the recorded step's
    # dynamic-pool addresses, are left out.
    r["address_stability_steady"] = r["same_address"] / r["comparable"] if r["comparable"] else 0.0
    bound = r["step_load_bytes"] + r["obstacle_bytes"]
    r["plan_over_step_load_and_obstacles"] = r["plan_bytes"] / bound if bound else 0.0
    r["plan_over_load"] = r["plan_over_step_load_and_obstacles"]  # old name, one release
    return nested


def memory_stats(device: Any = None) -> "OrderedDict[str, Any]":
    """Allocator statistics, flattened and sorted like ``torch.cuda.memory_stats``.

    Besides PyTorch's keys, ``renaissance.*`` keys report the planned arena:
    ``planned_hits`` / ``planned_misses`` / ``planned_conflicts`` (requests in
    planned steps served at their planned offset / not matching the trace /
    matching but blocked by a live block), ``planned_fast_hits`` (of the hits,
    those served by the replay fast path, without the arena's lock), ``planned_reordered`` (of the
    hits, those matched to a later position of the plan than their own: concurrent threads'
    requests in another order than recorded), ``planned_grown`` (of the hits, those placed by
    a plan made while a step ran that outgrew its layout: a longer sequence than every planned
    one), ``planned_unserved``
    (allocations of planned steps after their replay stopped, served by the dynamic pool;
    ``hit_rate`` is ``planned_hits`` over these and ``planned_requests`` together), ``plan_bytes`` (planned territory),
    ``step_and_persistent_load_bytes`` (the largest, over the steps the current
    layout holds, of a step's LOAD plus the bytes live before that step and still live
    at its end; a lower bound of the most bytes ever live; old name ``load_bytes``),
    ``largest_load_bytes`` (the largest of those over every layout kept: steps
    of every key and variant), ``step_load_bytes`` (the
    LOAD of the step's planned buffers alone), ``plan_over_step_load_and_obstacles``
    (planned territory over the LOAD of the step's buffers plus the obstacles
    inside it; old name ``plan_over_load``), ``variants``, ``layouts``, ``address_stability``
    (fraction of the last step's allocations at the same address as in the
    step before; ``same_address`` / ``comparable``: the same two counts summed over
    the replayed steps whose reference step replayed too, and
    ``address_stability_steady``, their quotient), ``give_ups`` / ``given_up`` (structures whose replays kept missing,
    frozen: how many times, how many now), ``pending_bytes.*``, ``events_recorded``,
    ``event_queries``.

    Args:
        device: ``"cpu"``, ``"cuda[:N]"``, a ``torch.device`` or None (the
            installed accelerator's current device, else the CPU).

    Returns:
        OrderedDict mapping statistic names to numbers (bytes for sizes); all
        zeros before :func:`torch_renaissance.install` for ``device``.

    Raises:
        RuntimeError: ``device`` is neither a CPU nor a CUDA device.
    """
    out: list = []
    _flatten("", memory_stats_as_nested_dict(device), out)
    out.sort()
    return OrderedDict(out)


def memory_allocated(device: Any = None) -> int:
    """Bytes currently held by tensors (``allocated_bytes.all.current``)."""
    return memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["current"]


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last peak reset."""
    return memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["peak"]


def memory_reserved(device: Any = None) -> int:
    """Bytes the arena holds from the device (``reserved_bytes.all.current``)."""
    return memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["current"]


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since the start or the last peak reset."""
    return memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["peak"]


def _apply(device: Any, on_cuda: Callable[[int], None], on_arena: Callable[[Any], None]) -> None:
    """``on_cuda(index)`` for a CUDA device (through ``torch.cuda``, which reaches
    every arena of the device), else ``on_arena(arena)``; nothing before
    install() (``torch.cuda``'s no-op before initialization)."""
    if _not_installed(device):
        return
    dev = resolve_device(device)
    if dev.type == "cuda":
        on_cuda(dev.index)
    else:
        on_arena(get_arena(dev))


def reset_peak_memory_stats(device: Any = None) -> None:
    """Sets every peak to its current value; current values do not change.

    A no-op before install() for ``device``. For CUDA, ``torch.cuda.reset_peak_memory_stats`` (every arena of the device).
    """
    _apply(device, lambda i: torch.cuda.reset_peak_memory_stats(i), lambda a: a.reset_peak_stats())


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Clears the ``allocated`` / ``freed`` totals and the ``num_*`` counters.

    A no-op before install() for ``device``. For CUDA, ``torch.cuda.reset_accumulated_memory_stats`` (every arena of the device).
    """
    _apply(device, lambda i: torch.cuda.reset_accumulated_memory_stats(i),
           lambda a: a.reset_accumulated_stats())


def empty_cache(device: Any = None) -> None:
    """Returns cached memory that no tensor holds to the device.

    Every free granule of an expandable segment goes back, interior holes
    included, as do wholly free fixed segments. Planned territory is kept (it
    is what later steps replay into). A no-op before install(). For CUDA,
    ``torch.cuda.empty_cache()``: every device, and the graph pools and
    MemPools that nothing uses any more.
    """
    _apply(device, lambda i: torch.cuda.empty_cache(), lambda a: a.empty_cache())


def fragmentation(peak_allocated: int, peak_reserved: int) -> float:
    """``1 - peak_allocated / peak_reserved`` (0 when nothing was reserved)."""
    return 1.0 - peak_allocated / peak_reserved if peak_reserved else 0.0


def _fmt(n: float) -> str:
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:7.2f} {unit}"
    return f"{n:7d} B  "


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table like ``torch.cuda.memory_summary()`` for torch_renaissance's arena.

    Args:
        device: as for :func:`memory_stats`.
        abbreviated: only the ``all`` rows (no per-pool breakdown).

    Returns:
        The table as a string; every line is as wide as the frame. Before
        :func:`torch_renaissance.install` for ``device`` the numbers are 0 and the
        title says so (as :func:`memory_stats`).

    Raises:
        RuntimeError: ``device`` is neither a CPU nor a CUDA device.
    """
    s = memory_stats(device)
    cell = 11  # _fmt's width: "1023.99 KiB", "      0 B  "
    width = 1 + 33 + 2 + 4 * cell + 3 * 3 + 2
    where = ("(torch_renaissance is not installed)" if _not_installed(device)
             else str(get_arena(device).device))
    lines = ["=" * width,
             f"|{' torch_renaissance memory summary, device ' + where:<{width - 2}}|",
             "|" + "-" * (width - 2) + "|",
             f"|{'Metric':<33}| " + " | ".join(f"{h:>{cell}}" for h in (
                 "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")) + " |",
             "|" + "=" * (width - 2) + "|"]
    rows = [("Allocated memory", "allocated_bytes", True),
            ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True),
            ("Reserved memory", "reserved_bytes", True),
            ("Non-releasable memory", "inactive_split_bytes", True),
            ("Allocations", "allocation", False),
            ("Active allocs", "active", False),
            ("Reserved segments", "segment", False),
            ("Non-releasable allocs", "inactive_split", False)]
    pools = ["all"] if abbreviated else ["all", "large_pool", "small_pool"]
    for title, key, is_bytes in rows:
        for pool in pools:
            vals = [s[f"{key}.{pool}.{m}"] for m in ("current", "peak", "allocated", "freed")]
            name = title if pool == "all" else f"      from {pool.replace('_', ' ')}"
            cells = [(_fmt(v) if is_bytes else f"{v:>{cell}d}") for v in vals]
            lines.append(f"|{name:<33}| " + " | ".join(f"{c:>{cell}}" for c in cells) + " |")
        lines.append("|" + "-" * (width - 2) + "|")
    planned = [
        ("Planned steps", f"{s['renaissance.planned_steps']} of {s['renaissance.steps']}"),
        ("Plan hits / misses / conflicts",
         f"{s['renaissance.planned_hits']} / {s['renaissance.planned_misses']} / "
         f"{s['renaissance.planned_conflicts']}"),
        ("Planned territory", _fmt(s["renaissance.plan_bytes"]).strip()),
        ("LOAD (step + persistent)", _fmt(s["renaissance.load_bytes"]).strip()),
        ("Variants / layouts", f"{s['renaissance.variants']} / {s['renaissance.layouts']}"),
        ("Address stability (last step)", f"{100 * s['renaissance.address_stability']:.1f}%"),
        ("Address stability (steady steps)",
         f"{100 * s['renaissance.address_stability_steady']:.1f}%" if s["renaissance.comparable"]
         else "none yet"),
        ("Pending stream-use bytes", _fmt(s["renaissance.pending_bytes.current"]).strip()),
        ("Events recorded / queried",
         f"{s['renaissance.events_recorded']} / {s['renaissance.event_queries']}"),
        ("OOMs / alloc retries", f"{s['num_ooms']} / {s['num_alloc_retries']}"),
    ]
    for name, value in planned:
        lines.append(f"|{name:<33}| {value:<{width - 38}} |")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"


def where_reserved(device: Any = None) -> dict:
    """Where the reserved bytes that hold no live block are, now (bytes).

    Returns:
        ``{"territory_free": ..., "dynamic_cache": ..., "persistent_free": ...}``:
        free bytes inside the planned territory (gaps the plan leaves around
        its obstacles and between its slots at this moment), free bytes of the
        dynamic pool's segments outside it (its cache), and free bytes of the
        persistent segments (optimizer state made in recorded steps).
    """
    out = {"territory_free": 0, "dynamic_cache": 0, "persistent_free": 0}
    for seg in get_arena(device).snapshot():
        # Reserved = mapped bytes; free blocks may also tile unmapped holes
        # of expandable segments, so the free bytes are total - allocated.
        free = seg["total_size"] - seg["allocated_size"]
        if seg["persistent"]:
            out["persistent_free"] += free
            continue
        territory = sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive" and b["in_territory"])
        out["territory_free"] += territory
        out["dynamic_cache"] += max(0, free - territory)
    return out


def _unplanned_reason(device: Any) -> str:
    try:
        cfg = installed_config(installed_device(device))
    except RuntimeError:
        cfg = None
    if cfg is not None and not cfg.planning:
        return "planning is off (planning:False): the dynamic pool served every step"
    return "no step was planned (no step boundary seen, or fewer than 3 steps)"


def report(device: Any = None, step_times: Optional[list] = None,
           earlier_peaks: Optional[tuple] = None, steady_reason: Optional[str] = None) -> dict:
    """The numbers ``torch-renaissance run`` prints, as a dict (bytes, seconds).

    Args:
        device: as for :func:`memory_stats`.
        step_times: seconds between consecutive step boundaries, if seen.
        earlier_peaks: ``(peak allocated, peak reserved)`` from before the
            last :func:`reset_peak_memory_stats` (made once the recorded steps
            and the first replayed step were over). Then the ``peak_*``
            numbers cover the whole run and ``steady_*`` the time since the
            reset; without it the ``steady_*`` numbers are None and
            ``steady_reason`` says why in one line.
        steady_reason: that line (default: a generic one).

    ``load_bytes`` is LOAD, a lower bound: the largest, over every layout
    kept (every key and variant), of one planned step's LOAD plus the bytes
    live before that step and still live at its end (``renaissance.largest_load_bytes``;
    bytes the step made and kept are not counted at its peak: they may be born after it);
    ``plan_bytes`` is the current layout's planned territory, which can be
    larger (obstacles, variants sharing slots).
    """
    s = memory_stats(device)
    now_alloc = s["allocated_bytes.all.peak"]
    now_res = s["reserved_bytes.all.peak"]
    steady = earlier_peaks is not None
    early_alloc, early_res = earlier_peaks or (0, 0)
    peak_alloc = max(early_alloc, now_alloc)
    peak_res = max(early_res, now_res)
    planned = s["renaissance.planned_steps"] > 0
    # The run's LOAD: the largest over every layout (keys, variants), not the
    # current one's (a serving loop's last step may be its smallest).
    load = s["renaissance.largest_load_bytes"] if planned else 0
    times = list(step_times or [])
    # The first interval (from the install to the first boundary) holds the
    # script's start-up; the mean is over the steps after it.
    later = times[1:] if len(times) > 1 else times
    reason = None
    if not planned:
        reason = steady_reason or _unplanned_reason(device)
    elif not steady:
        reason = steady_reason or "the run ended before a step after the first replayed one"
    ratio = lambda a, b: (a / b) if (a is not None and b) else None
    where = where_reserved(device)
    rep = {
        "device": str(get_arena(device).device),
        "peak_allocated_bytes": peak_alloc,
        "peak_reserved_bytes": peak_res,
        "fragmentation": fragmentation(peak_alloc, peak_res),
        "peak_reserved_over_peak_allocated": ratio(peak_res, peak_alloc),
        "allocations": s["allocation.all.allocated"],
        "num_ooms": s["num_ooms"],
        "steps": len(times),
        "mean_step_seconds": (sum(later) / len(later)) if later else None,
        "planned_steps": s["renaissance.planned_steps"],
        "plan_hits": s["renaissance.planned_hits"],
        "plan_misses": s["renaissance.planned_misses"],
        "plan_conflicts": s["renaissance.planned_conflicts"],
        "plans": s["renaissance.plans"],
        "give_ups": s["renaissance.give_ups"],
        "given_up": s["renaissance.given_up"],
        "plan_seconds": s["renaissance.plan_seconds"],
        "plan_hit_rate": s["renaissance.hit_rate"] if planned else None,
        "load_bytes": load if planned else None,
        "plan_bytes": s["renaissance.plan_bytes"] if planned else None,
        "peak_reserved_over_load": ratio(peak_res, load) if planned else None,
        "steady_peak_allocated_bytes": now_alloc if steady else None,
        "steady_peak_reserved_bytes": now_res if steady else None,
        "steady_peak_reserved_over_load": ratio(now_res, load) if steady and planned else None,
        "steady_peak_reserved_over_peak_allocated": ratio(now_res, now_alloc) if steady else None,
        "steady_reason": reason,
        "address_stability": s["renaissance.address_stability"] if planned else None,
        "variants": s["renaissance.variants"],
        "layouts": s["renaissance.layouts"],
        "reserved_bytes": s["reserved_bytes.all.current"],
        "allocated_bytes": s["allocated_bytes.all.current"],
        "territory_free_bytes": where["territory_free"],
        "dynamic_cache_bytes": where["dynamic_cache"],
        "persistent_free_bytes": where["persistent_free"],
    }
    return rep


def export_snapshot(path: Any, device: Any = None) -> dict:
    """Writes the last planned step as a PyTorch memory snapshot (pickle).

    The file opens in PyTorch's memory viewer (``torch.cuda._memory_viz``,
    https://pytorch.org/memory_viz): one segment, the planned territory, with
    every allocation of the last completed step that was served inside it at
    its real offset and logical alloc/free times. Allocations the dynamic pool
    served (persistent ones, misses) live in other segments and are left out.

    Args:
        path: where to write the pickle.
        device: as for :func:`memory_stats`.

    Returns:
        The snapshot dict that was written.

    Raises:
        ValueError: no step has been planned on that arena yet.
    """
    from torch_renaissance import trace as trace_mod

    arena = get_arena(device)
    segs = [g for g in arena.snapshot() if g["plan_top"]]
    step = arena.last_step()
    if not segs or not step["entries"]:
        raise ValueError("export_snapshot: no planned step on this arena yet (mark steps with "
                         "torch_renaissance.step() and run at least three)")
    base, top = segs[0]["address"], segs[0]["plan_top"]
    entries, offsets = [], []
    for e in step["entries"]:
        if not base <= e["address"] < base + top:
            continue
        entries.append(trace_mod.TraceEntry(
            index=len(entries), size=e["size"], stream=e["stream"], alloc_time=e["alloc_time"],
            free_time=e["free_time"], streams_used=tuple(e["streams_used"]), address=e["address"]))
        offsets.append(e["address"] - base)
    tr = trace_mod.Trace(entries=entries, end_time=max(step["end_time"], 1),
                         source=f"torch_renaissance step {step['step']}")
    snap = trace_mod.to_snapshot(tr, offsets, base_address=base, segment_size=top)
    trace_mod.save_snapshot(snap, path)
    return snap
