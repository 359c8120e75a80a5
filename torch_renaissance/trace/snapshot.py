"""PyTorch memory snapshots as traces: ``torch.cuda.memory._dump_snapshot``
pickles (written by ``torch/csrc/cuda/memory_snapshot.cpp`` from the history
that ``c10/cuda/CUDACachingAllocator.cpp`` records), read through the safe
unpickler (:mod:`torch_renaissance.trace.safe_unpickle`).

Malformed input raises :class:`ValueError` naming the file and the event or
segment index; a loader returns a whole trace or raises, never a partial one.
Sizes are requested bytes, also for the blocks a snapshot knows only from its
``segments`` (see :func:`from_snapshot`)."""
from __future__ import annotations

import bisect
import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from torch_renaissance.trace.common import (
    ACTIVE_STATES,
    ADDRESS_LIMIT,
    DEVICE_LIMIT,
    PathLike,
    SIZE_LIMIT,
    STREAM_LIMIT,
    brief,
    fmt_int,
    is_int,
    to_int,
)
from torch_renaissance.trace.entries import Trace, TraceEntry
from torch_renaissance.trace.safe_pickle import open_regular, safe_unpickle


def load_snapshot(path: PathLike, *, device: Optional[int] = None) -> Trace:
    """Load a PyTorch memory snapshot as a :class:`Trace`.

    Reads the pickles written by ``torch.cuda.memory._dump_snapshot`` (a dict with
    ``segments`` and ``device_traces``; newer files also ``allocator_settings`` and
    ``external_annotations``) with an unpickler that refuses every global, so nothing in the
    file is imported or executed. Before unpickling, the opcodes are scanned without building
    anything, and files whose containers nest more than 200 levels deep (real snapshots nest
    fewer than 10) are refused: CPython's unpickler would otherwise overflow the C stack
    hashing such data. So are dict keys that could share one hash by the thousand (floats,
    tuples, integers over 64 bits; snapshots key their dicts by strings), which would make
    unpickling quadratic. See :func:`from_snapshot` for how events become buffers.

    Args:
        path (str or os.PathLike): the snapshot file.
        device (int, optional): the CUDA device whose trace to read. Default: the only device
            with events or segments.

    Returns:
        Trace: one entry per buffer, ``source`` set to ``path``.

    Raises:
        ValueError: the file names a global (e.g. ``os.system``) or a persistent id, uses an
            opcode that plain data never needs (``REDUCE``, ``BUILD``, ...), nests containers
            more than 200 levels deep, has a dict key or set element other than a string,
            bytes, ``None``, a bool or a 64-bit integer (keys that could make loading
            quadratic), has an address of ``2**64`` or more or a device index of ``2**31``
            or more, is truncated or not a pickle (a compressed file, a zip archive or JSON
            is named as such: decompress a ``.pickle.gz`` first), is not a snapshot dict,
            or has a malformed or inconsistent event or segment (the message names the file
            and the index).
        ValueError: also when ``path`` is not a regular file (a directory, FIFO, device such
            as ``/dev/zero``, or socket), refused before reading anything.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    data = safe_unpickle(path)
    return from_snapshot(data, device=device, source=source)


class DeviceChoiceError(ValueError):
    """A snapshot's device is ambiguous (several have data, none was chosen) or absent.

    Attributes:
        devices (list of int): the devices that have events or segments in the snapshot.
    """

    def __init__(self, message: str, devices: List[int]) -> None:
        super().__init__(message)
        self.devices = list(devices)


def snapshot_devices(snapshot: Dict[str, Any], source: Optional[str] = None) -> List[int]:
    """The devices of a snapshot dict that have events or segments, sorted.

    Args:
        snapshot (dict): as for :func:`from_snapshot`.
        source (str, optional): the file name for error messages.

    Raises:
        ValueError: the dict is not a snapshot (no ``segments`` / ``device_traces`` lists),
            or a segment is malformed.
    """
    w = Where(source if source is not None else "<snapshot>")
    check_snapshot_shape(snapshot, w)
    devices = {d for d, t in enumerate(snapshot["device_traces"]) if t}
    for i, seg in enumerate(snapshot["segments"]):
        if not isinstance(seg, dict):
            raise w.error(f"segments[{i}]", f"must be a dict, got {type(seg).__name__}")
        devices.add(_opt_int(seg, "device", 0, w, f"segments[{i}]"))
    return sorted(devices)


def load_snapshot_devices(path: PathLike,
                          devices: Optional[List[int]] = None) -> Dict[int, Trace]:
    """Load the devices of a PyTorch memory snapshot: ``{device: Trace}``.

    The file is read once, with the same safe unpickler and checks as
    :func:`load_snapshot`; each device with events or segments gets its
    :class:`Trace` (a snapshot with none gives ``{0: <empty trace of device 0>}``).

    Args:
        path: the snapshot file.
        devices (list of int, optional): only these devices (in this order), each of
            which must have events or segments; only their traces are built. Default:
            every device with data.

    Raises:
        DeviceChoiceError: a device of ``devices`` has no events and no segments in the
            snapshot (the message and ``.devices`` name those that have).
        ValueError: as :func:`load_snapshot`, for the first device that fails.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    data = safe_unpickle(path)
    with_data = snapshot_devices(data, source)
    if devices is None:
        return {d: from_snapshot(data, device=d, source=source) for d in with_data or [0]}
    chosen = [to_int(d, "device") for d in devices]
    for d in chosen:
        if d not in with_data:
            raise DeviceChoiceError(
                f"{source}: device_traces: no data for device {d} (devices with data: "
                f"{with_data})", with_data)
    return {d: from_snapshot(data, device=d, source=source) for d in chosen}


def is_snapshot_file(path: PathLike) -> bool:
    """True when :func:`load_trace` reads ``path`` as a snapshot (not as CSV).

    By extension (``.pickle``/``.pkl``: yes; ``.csv``: no), else by content (a binary pickle
    starts with ``0x80``).

    Raises:
        OSError: the file has neither extension and cannot be read.
        ValueError: the file has neither extension and is not a regular file (a FIFO, a
            device, a directory: refused at once by :func:`open_regular`, never read).
    """
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".pickle", ".pkl"):
        return suffix != ".csv"
    with open_regular(path) as f:
        return f.read(1) == b"\x80"


class Where:
    """Builds error messages that name the source and the offending item."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, where: str, message: str) -> ValueError:
        return ValueError(f"{self.source}: {where}: {message}")


def _field_int(
    d: Dict[str, Any],
    key: str,
    w: Where,
    where: str,
    *,
    minimum: int = 0,
    limit: Optional[int] = None,
) -> int:
    if key not in d:
        raise w.error(where, f"missing field {key!r} in {_short(d)}")
    return _checked_int(d[key], key, w, where, minimum, limit)


def _opt_int(
    d: Dict[str, Any],
    key: str,
    default: int,
    w: Where,
    where: str,
    *,
    minimum: Optional[int] = None,
    limit: Optional[int] = None,
) -> int:
    value = d.get(key, default)
    if value is None:
        return default
    return _checked_int(value, key, w, where, minimum, limit)


def _checked_int(value: Any, key: str, w: Where, where: str, minimum: Optional[int],
                 limit: Optional[int]) -> int:
    """``value`` of field ``key``, checked to be an integer in ``[minimum, limit)``."""
    if not is_int(value):
        raise w.error(where, f"field {key!r} must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise w.error(where, f"field {key!r} must be >= {minimum}, got {fmt_int(value)}")
    if limit is not None and value >= limit:
        raise w.error(
            where,
            f"field {key!r} must be < 2**{limit.bit_length() - 1}, got {fmt_int(value)}",
        )
    return value


def _short(d: Dict[str, Any]) -> str:
    keys = sorted(k if isinstance(k, str) else brief(k) for k in d.keys())
    shown = [k if len(k) <= 40 else k[:37] + "..." for k in keys[:8]]
    return "{" + ", ".join(shown) + (", ..." if len(keys) > 8 else "") + "}"


def check_snapshot_shape(data: Any, w: Where) -> None:
    if not isinstance(data, dict):
        raise w.error(
            "top level",
            f"not a PyTorch memory snapshot: expected the dict written by "
            f"torch.cuda.memory._dump_snapshot, got {type(data).__name__}",
        )
    missing = [k for k in ("segments", "device_traces") if k not in data]
    if missing:
        raise w.error(
            "top level",
            f"not a PyTorch memory snapshot: the dict has no {' and no '.join(map(repr, missing))} "
            f"(keys: {_short(data)})",
        )
    if not isinstance(data["segments"], list):
        raise w.error("segments", f"must be a list, got {type(data['segments']).__name__}")
    traces = data["device_traces"]
    if not isinstance(traces, list):
        raise w.error("device_traces", f"must be a list, got {type(traces).__name__}")
    for d, t in enumerate(traces):
        if not isinstance(t, list):
            raise w.error(f"device_traces[{d}]", f"must be a list, got {type(t).__name__}")


def from_snapshot(
    snapshot: Dict[str, Any], *, device: Optional[int] = None, source: Optional[str] = None
) -> Trace:
    """Turn a PyTorch memory snapshot dict into a :class:`Trace`.

    Works on the dict returned by ``torch.cuda.memory._snapshot()`` or loaded from a file.
    The device trace is walked with a logical clock, one tick per event: event ``k`` (0-based)
    happens at time ``k + 1``, time ``0`` is the start of the window and
    ``end_time = len(events) + 1``.

    * ``alloc`` starts a buffer at ``addr``; ``free_completed`` ends it (the memory is reusable
      then, after any ``record_stream`` work). A file without any ``free_completed`` ends
      buffers at ``free_requested`` instead.
    * The history is a ring buffer, so the window may start mid-run: a free whose address has
      no live ``alloc`` was allocated before the window and is live from time 0; an
      ``active_allocated`` (or ``active_pending_free``) block of ``segments`` that no event
      mentions is live for the whole window. Buffers allocated and never freed are live to the
      end.
    * PyTorch's reserved bytes: ``segments`` is the state at dump time, the events are history.
      The reserved bytes at the window start are the dump-time total minus the net change of
      the ``segment_alloc``/``segment_map`` (+size) and ``segment_free``/``segment_unmap``
      (-size) events; replaying the events from there ends at the dump-time total, and
      ``pytorch_reserved_peak`` is the highest value on the way (window start included). It is
      ``None`` when the trace has no segment events; ``pytorch_reserved_at_dump`` is always
      set and, in that case, is the reserved bytes throughout the window.

    Entries are ordered by allocation time: first the buffers live at the window start
    (segment blocks by address, then truncated ones by their free), then the window's
    ``alloc`` events in order.

    Sizes are requested sizes everywhere: the events' ``size`` (``CUDACachingAllocator``
    records the requested size) and, for blocks known only from ``segments``, their
    ``requested_size``, not the allocator's block ``size`` (rounded to 512 B and possibly an
    unsplit remainder of up to 1 MiB). This is also how PyTorch's viewer counts them
    (``process_alloc_data`` in ``torch/utils/viz/MemoryViz.js``): LOAD of the loaded trace
    equals the peak of its "Active Memory Timeline". (The reference data README counted
    segment-only blocks by block ``size``; its LOADs are 0.0-0.25% higher for that reason.)

    Args:
        snapshot (dict): the snapshot (``segments``, ``device_traces``).
        device (int, optional): the device to read. Default: the only device with events or
            segments (device 0 when there is none).
        source (str, optional): a name for error messages and ``Trace.source``.

    Returns:
        Trace: the buffers of that device.

    Raises:
        ValueError: the dict is not a snapshot, an event or segment lacks a field or has a
            non-integer or negative one, a size is ``2**63`` bytes or more, an address is
            allocated twice or freed twice, two buffers live at the same time share bytes
            (``[addr, addr + size)`` overlap), an active segment block's ``requested_size``
            (or its history's ``real_size``) exceeds its ``size`` (inactive blocks keep a
            stale ``requested_size`` in real snapshots, and it is not read), a block that is active at dump time was freed by
            the trace, the segment events do not add up to the dump-time segments, or
            ``device`` is ambiguous or absent. The message names the source and the event
            (``device_traces[d][k]``) or segment index.
    """
    w = Where(source if source is not None else "<snapshot>")
    check_snapshot_shape(snapshot, w)
    traces: List[List[Any]] = snapshot["device_traces"]
    segments: List[Any] = snapshot["segments"]
    seg_devices = _segment_devices(segments, w)
    device = _choose_device(traces, seg_devices, device, w)
    events: List[Any] = traces[device] if device < len(traces) else []
    free_action = _free_action(events, device, w)
    h = _walk_events(events, device, free_action, w)
    reserved_at_dump = _add_segment_blocks(h, segments, seg_devices, device,
                                           free_action == "free_completed", w)
    _check_no_overlap(h, device, w)
    h.records.sort(key=lambda r: (r[0], r[1], r[2]))
    entries = [
        TraceEntry(i, r[3], r[4], r[0], r[5], (), r[6]) for i, r in enumerate(h.records)
    ]
    return Trace(
        entries,
        len(events) + 1,
        source=source,
        pytorch_reserved_peak=_reserved_peak(h, reserved_at_dump, device, w),
        pytorch_reserved_at_dump=reserved_at_dump,
    )


# A buffer of the trace being built: (alloc_time, group, order, size, stream, free_time,
# address). Sorted by (alloc_time, group, order): group 0 are segment blocks live since
# before the window (by address), 1 buffers freed in the window with no alloc in it, 2 the
# window's allocs (by event index).
_Record = Tuple[int, int, int, int, int, Optional[int], int]


@dataclasses.dataclass
class _History:
    """What walking a device's events found (see :func:`_walk_events`)."""

    live: Dict[int, Tuple[int, int, int, int]]  # addr -> (tick, size, stream, k), never freed
    freed_at: Dict[int, int]  # addr -> event index of its last free (no alloc since)
    records: List[_Record]
    seg_net: int = 0  # net bytes of the segment events
    seg_max: int = 0  # highest running net
    seg_min: int = 0  # lowest running net
    has_segment_events: bool = False
    block_where: List[str] = dataclasses.field(default_factory=list)  # per segment block record


def _segment_devices(segments: List[Any], w: Where) -> List[int]:
    """The device of each dump-time segment (0 when absent)."""
    seg_devices: List[int] = []
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise w.error(f"segments[{i}]", f"must be a dict, got {type(seg).__name__}")
        seg_devices.append(
            _opt_int(seg, "device", 0, w, f"segments[{i}]", minimum=0, limit=DEVICE_LIMIT)
        )
    return seg_devices


def _choose_device(traces: List[List[Any]], seg_devices: List[int], device: Optional[int],
                   w: Where) -> int:
    """``device``, checked, or the only device with events or segments (0 when none)."""
    with_data = sorted({d for d, t in enumerate(traces) if t} | set(seg_devices))
    if device is None:
        if len(with_data) > 1:
            raise DeviceChoiceError(
                f"{w.source}: device_traces: the snapshot has data for devices {with_data}; "
                "pass device= to choose one", with_data)
        return with_data[0] if with_data else 0
    device = to_int(device, "device")
    if device < 0 or (device not in with_data and device >= len(traces)):
        raise DeviceChoiceError(
            f"{w.source}: device_traces: no device {device} (devices with data: {with_data})",
            with_data)
    return device


#: The actions of ``torch.cuda.memory._snapshot()``'s device traces: ``TraceEntry::Action``
#: (``c10/cuda/CUDACachingAllocator.h``) as ``action_to_str`` in
#: ``torch/csrc/cuda/memory_snapshot.cpp`` names them, and ``user_defined`` (annotations).
KNOWN_ACTIONS = frozenset({
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom", "user_defined",
})


def _free_action(events: List[Any], device: int, w: Where) -> str:
    """Which action ends a buffer: ``free_completed``, or ``free_requested`` in a file
    without any ``free_completed``. Checks that every event is a dict with an action."""
    for k, e in enumerate(events):
        if not isinstance(e, dict):
            where = f"device_traces[{device}][{k}]"
            raise w.error(where, f"event must be a dict, got {type(e).__name__}")
        if not isinstance(e.get("action"), str):
            where = f"device_traces[{device}][{k}]"
            raise w.error(where, f"event has no 'action' string: {_short(e)}")
    unknown = [e["action"] for e in events if e["action"] not in KNOWN_ACTIONS]
    if unknown and len(unknown) == len(events):
        raise w.error(f"device_traces[{device}]",
                      f"no event has an action PyTorch writes (first: {brief(unknown[0])}; "
                      f"known: {', '.join(sorted(KNOWN_ACTIONS))})")
    if unknown:  # a newer PyTorch may add actions: skip them, and say so
        kinds = sorted(set(unknown))
        warnings.warn(f"{w.source}: device {device}: {len(unknown)} events with actions this "
                      f"loader does not know were skipped: {', '.join(brief(a) for a in kinds[:5])}"
                      + (" ..." if len(kinds) > 5 else ""), stacklevel=4)
    has_completed = any(e["action"] == "free_completed" for e in events)
    return "free_completed" if has_completed else "free_requested"


def _walk_events(events: List[Any], device: int, free_action: str, w: Where) -> _History:
    """Walks the history, one tick per event: the buffers it allocates and frees (those
    never freed are live to the end), and the running net of the segment events."""
    h = _History(live={}, freed_at={}, records=[])
    live, freed_at, records = h.live, h.freed_at, h.records
    for k, e in enumerate(events):
        tick = k + 1
        action = e["action"]
        if action == "alloc":
            where = f"device_traces[{device}][{k}]"
            addr = _field_int(e, "addr", w, where, limit=ADDRESS_LIMIT)
            size = _field_int(e, "size", w, where, limit=SIZE_LIMIT)
            stream = _opt_int(e, "stream", 0, w, where, minimum=0, limit=STREAM_LIMIT)
            if addr in live:
                raise w.error(
                    where,
                    f"'alloc' at {addr:#x}, which is already allocated (by event "
                    f"{live[addr][3]}) and not freed",
                )
            live[addr] = (tick, size, stream, k)
            freed_at.pop(addr, None)
        elif action == free_action:
            where = f"device_traces[{device}][{k}]"
            addr = _field_int(e, "addr", w, where, limit=ADDRESS_LIMIT)
            size = _field_int(e, "size", w, where, limit=SIZE_LIMIT)
            stream = _opt_int(e, "stream", 0, w, where, minimum=0, limit=STREAM_LIMIT)
            rec = live.pop(addr, None)
            if rec is not None:
                records.append((rec[0], 2, rec[3], rec[1], rec[2], tick, addr))
            elif addr in freed_at:
                raise w.error(
                    where,
                    f"{action!r} at {addr:#x}, which event {freed_at[addr]} already freed "
                    "(no 'alloc' in between)",
                )
            else:  # allocated before the window (ring-buffer truncation)
                records.append((0, 1, k, size, stream, tick, addr))
            freed_at[addr] = k
        elif action in ("segment_alloc", "segment_map", "segment_free", "segment_unmap"):
            where = f"device_traces[{device}][{k}]"
            size = _field_int(e, "size", w, where, limit=SIZE_LIMIT)
            h.has_segment_events = True
            h.seg_net += size if action in ("segment_alloc", "segment_map") else -size
            h.seg_max = max(h.seg_max, h.seg_net)
            h.seg_min = min(h.seg_min, h.seg_net)
        # other actions (free_requested when frees complete later, oom, snapshot, ...) tick only
    for _addr, (tick, size, stream, k) in live.items():
        records.append((tick, 2, k, size, stream, None, _addr))
    return h


def _add_segment_blocks(h: _History, segments: List[Any], seg_devices: List[int], device: int,
                        has_completed: bool, w: Where) -> int:
    """Adds to ``h.records`` the active blocks of ``device``'s dump-time segments that no
    event mentions (live for the whole window, by their requested size); returns the
    device's reserved bytes at dump time."""
    live, freed_at = h.live, h.freed_at
    reserved_at_dump = 0
    order = 0
    for i, seg in enumerate(segments):
        if seg_devices[i] != device:
            continue
        where = f"segments[{i}]"
        seg_addr = _field_int(seg, "address", w, where, limit=ADDRESS_LIMIT)
        reserved_at_dump += _field_int(seg, "total_size", w, where, limit=SIZE_LIMIT)
        seg_stream = _opt_int(seg, "stream", 0, w, where, minimum=0, limit=STREAM_LIMIT)
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise w.error(where, f"'blocks' must be a list, got {type(blocks).__name__}")
        addr = seg_addr
        for j, b in enumerate(blocks):
            bwhere = f"segments[{i}]['blocks'][{j}]"
            if not isinstance(b, dict):
                raise w.error(bwhere, f"block must be a dict, got {type(b).__name__}")
            bsize = _field_int(b, "size", w, bwhere, limit=SIZE_LIMIT)
            state = b.get("state")
            if not isinstance(state, str):
                raise w.error(bwhere, "block has no 'state' string")
            baddr = _opt_int(b, "address", addr, w, bwhere, minimum=0, limit=ADDRESS_LIMIT)
            addr = baddr + bsize
            if state not in ACTIVE_STATES or baddr in live:
                continue
            if baddr in freed_at:
                if state == "active_pending_free" or not has_completed:
                    continue  # freed by the user, and the trace ends buffers at that request
                raise w.error(
                    bwhere,
                    f"block at {baddr:#x} is {state!r} at dump time, but event "
                    f"{freed_at[baddr]} freed it and no later event allocated it",
                )
            h.records.append((0, 0, order, _requested_size(b, bsize, w, bwhere), seg_stream,
                              None, baddr))
            h.block_where.append(bwhere)
            order += 1
    return reserved_at_dump


def _requested_size(b: Dict[str, Any], bsize: int, w: Where, bwhere: str) -> int:
    """A segment block's requested size: ``requested_size``, else its first history
    entry's ``real_size``, else the block size."""
    requested, field = b.get("requested_size"), "'requested_size'"
    if requested is None and isinstance(b.get("history"), list) and b["history"]:
        first = b["history"][0]
        requested = first.get("real_size") if isinstance(first, dict) else None
        field = "history[0]['real_size']"
    if requested is None:
        requested, field = bsize, "'size'"
    if not is_int(requested) or not 0 <= requested < SIZE_LIMIT:
        raise w.error(
            bwhere,
            f"{field} must be an integer in [0, 2**63), got {brief(requested)}",
        )
    if requested > bsize:
        raise w.error(
            bwhere,
            f"{field} is {requested} bytes, more than the block's 'size' of {bsize} bytes: "
            "an active block holds what was requested (PyTorch rounds requests up, never down)",
        )
    return requested


def _record_where(h: _History, record: _Record, device: int) -> str:
    """Names the event or segment block a buffer of the trace being built comes from."""
    group, order = record[1], record[2]
    if group == 0:
        return h.block_where[order]
    if group == 1:
        return f"device_traces[{device}][{order}] (a free of a block allocated before the window)"
    return f"device_traces[{device}][{order}]"


def _check_no_overlap(h: _History, device: int, w: Where) -> None:
    """Refuses two buffers live at the same time whose address ranges ``[addr, addr + size)``
    overlap (lifetimes half-open, as LOAD counts them). PyTorch never hands out one byte
    twice: the caching allocator's blocks of live tensors are disjoint, and events and
    segment blocks record requested sizes, which are at most the block sizes."""

    changes = []  # (time, 0 = free / 1 = alloc, record index): frees first at a tick
    for i, r in enumerate(h.records):
        if r[3] == 0:
            continue  # an empty buffer holds no byte
        changes.append((r[0], 1, i))
        if r[5] is not None:
            changes.append((r[5], 0, i))
    changes.sort()
    starts: List[int] = []  # the live buffers' addresses, sorted
    live: Dict[int, int] = {}  # address -> record index
    for time, kind, i in changes:
        addr, size = h.records[i][6], h.records[i][3]
        if kind == 0:
            if live.get(addr) == i:
                del live[addr]
                del starts[bisect.bisect_left(starts, addr)]
            continue
        at = bisect.bisect_left(starts, addr)
        other = None
        if at < len(starts) and starts[at] < addr + size:
            other = live[starts[at]]
        elif at > 0 and starts[at - 1] + h.records[live[starts[at - 1]]][3] > addr:
            other = live[starts[at - 1]]
        if other is not None:
            o = h.records[other]
            raise w.error(
                _record_where(h, h.records[i], device),
                f"the buffer [{addr:#x}, {addr + size:#x}) overlaps the live buffer "
                f"[{o[6]:#x}, {o[6] + o[3]:#x}) of {_record_where(h, o, device)} at time {time}: "
                "two live blocks cannot share bytes",
            )
        starts.insert(at, addr)
        live[addr] = i


def _reserved_peak(h: _History, reserved_at_dump: int, device: int, w: Where) -> Optional[int]:
    """PyTorch's highest reserved bytes in the window (the start included), replaying the
    segment events from the dump-time total back; None without segment events."""
    if not h.has_segment_events:
        return None
    start = reserved_at_dump - h.seg_net
    if start + h.seg_min < 0:
        raise w.error(
            f"device_traces[{device}]",
            f"segment events free {-(start + h.seg_min)} bytes more than were reserved: they "
            f"do not add up to the {reserved_at_dump} bytes of segments at dump time",
        )
    return start + h.seg_max
