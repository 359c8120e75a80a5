"""Writing a *planned* run back out in PyTorch's snapshot format, so that
PyTorch's memory viewer (``torch/cuda/_memory_viz.py`` and
``torch/utils/viz/MemoryViz.js``) shows the packing; and a plot of a plan
(matplotlib is imported only when :func:`plot_plan` is called)."""
from __future__ import annotations

import bisect
import errno
import os
import pickle
import secrets
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from torch_renaissance.trace.common import (
    DEFAULT_BASE_ADDRESS,
    EXPORT_PROTOCOL,
    MIN_BLOCK_SIZE,
    PathLike,
    to_int,
)
from torch_renaissance.trace.entries import Trace
from torch_renaissance.trace.safe_pickle import KEY_INT_LIMIT, KEY_INT_MIN, PICKLE_MAX_DEPTH
from torch_renaissance.trace.snapshot import Where, check_snapshot_shape


def _check_plan(trace: Trace, offsets: Sequence[int]) -> Tuple[List[int], int]:
    """Validate a plan; return the offsets as ints and the plan size in bytes."""
    if len(offsets) != len(trace.entries):
        raise ValueError(
            f"the plan has {len(offsets)} offsets for a trace of {len(trace.entries)} buffers"
        )
    offs: List[int] = []
    for i, o in enumerate(offsets):
        try:
            value = to_int(o, f"offsets[{i}]")
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if value < 0:
            raise ValueError(f"offsets[{i}] must be >= 0, got {value}")
        offs.append(value)
    end = trace.end_time
    timeline: List[Tuple[int, int, int]] = []  # (time, 0 = free / 1 = alloc, i)
    plan_size = 0
    for i, e in enumerate(trace.entries):
        if not e.holds_memory(end):
            continue
        plan_size = max(plan_size, offs[i] + e.size)
        timeline.append((e.alloc_time, 1, i))
        timeline.append((e.upper(end), 0, i))
    timeline.sort()
    starts: List[int] = []  # live buffers, sorted by offset; pairwise disjoint
    owners: List[int] = []
    for t, kind, i in timeline:
        lo = offs[i]
        hi = lo + trace.entries[i].size
        j = bisect.bisect_left(starts, lo)
        if kind == 0:
            del starts[j], owners[j]
            continue
        for k in (j - 1, j):
            if 0 <= k < len(owners):
                other = owners[k]
                olo = offs[other]
                ohi = olo + trace.entries[other].size
                if olo < hi and lo < ohi:
                    raise ValueError(
                        f"the plan overlaps: buffer {i} at [{lo}, {hi}) and buffer {other} at "
                        f"[{olo}, {ohi}) are both live at time {t}"
                    )
        starts.insert(j, lo)
        owners.insert(j, i)
    return offs, plan_size


def to_snapshot(
    trace: Trace,
    offsets: Sequence[int],
    base_address: int = DEFAULT_BASE_ADDRESS,
    *,
    device: int = 0,
    segment_size: Optional[int] = None,
    stream: Optional[int] = None,
) -> Dict[str, Any]:
    """Export a planned run of ``trace`` as a PyTorch memory snapshot dict.

    Buffer ``i`` lives at ``base_address + offsets[i]`` during its lifetime. The result has
    the fields that ``torch/cuda/_memory_viz.py`` (``segsum``, ``trace``, ``segments``,
    ``memory``, ``trace_plot``, ``segment_plot``) and the viewer ``MemoryViz.js`` read:

    * ``segments``: one segment (``segment_type='large'``) at ``base_address`` covering the
      plan, with the buffers live at the end of the window as ``active_allocated`` blocks and
      the gaps as ``inactive`` blocks, tiling the segment;
    * ``device_traces[device]``: a ``segment_alloc`` of that segment at time 0, then per
      buffer an ``alloc`` at its ``alloc_time`` and, when freed, a ``free_requested`` directly
      followed by a ``free_completed`` at its ``free_time``. At equal times frees come before
      allocations (lifetimes are half-open). Events carry ``action``, ``addr``, ``size``,
      ``stream``, ``time_us`` (the logical time) and ``frames: []``.

    Buffers of size 0 or with an empty lifetime hold no memory and are left out (PyTorch never
    records them either). :func:`load_snapshot` of the saved result gives back the same sizes,
    addresses and overlaps of lifetimes, retimed to one tick per event.

    Args:
        trace (Trace): the trace that was planned.
        offsets (sequence of int): ``offsets[i]`` is the offset in bytes of
            ``trace.entries[i]`` from the start of the plan.
        base_address (int): address of offset 0. Default: :data:`DEFAULT_BASE_ADDRESS`.
        device (int): the CUDA device index to file the plan under. Default: 0.
        segment_size (int, optional): size in bytes of the exported segment. Default: the plan
            size (highest end offset) rounded up to 512 bytes, PyTorch's smallest block.
        stream (int, optional): the segment's stream. Default: the first buffer's stream.

    Returns:
        dict: the snapshot; write it with :func:`save_snapshot`.

    Raises:
        ValueError: ``offsets`` has the wrong length or a negative or non-integer offset, two
            buffers live at the same time overlap, ``segment_size`` is smaller than the plan,
            ``device`` is outside ``[0, 127]`` (``c10::DeviceIndex``), ``stream`` is negative
            or ``base_address + segment_size`` passes ``2**64`` (the loader would refuse the
            file).
    """
    offs, plan_size = _check_plan(trace, offsets)
    base_address = to_int(base_address, "base_address")
    device = to_int(device, "device")
    if base_address < 0 or device < 0:
        raise ValueError("base_address and device must be >= 0")
    if device > EXPORT_DEVICE_MAX:  # device_traces holds one list per device up to it
        raise ValueError(f"device {device} is past {EXPORT_DEVICE_MAX}, the highest CUDA "
                         "device index (c10::DeviceIndex is 8 bits)")
    if segment_size is None:
        segment_size = -(-plan_size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    segment_size = to_int(segment_size, "segment_size")
    if segment_size < plan_size:
        raise ValueError(
            f"segment_size {segment_size} is smaller than the plan ({plan_size} bytes)"
        )
    if base_address + segment_size > 1 << 64:
        raise ValueError(f"base_address {base_address:#x} + segment_size {segment_size} passes "
                         "2**64: addresses are 64-bit")
    if stream is None:
        stream = trace.entries[0].stream if trace.entries else 0
    stream = to_int(stream, "stream")
    if not 0 <= stream < 1 << 64:
        raise ValueError(f"stream must be in [0, 2**64) (a cudaStream_t), got {stream}")

    end = trace.end_time
    kept = [i for i, e in enumerate(trace.entries) if e.holds_memory(end)]
    timeline: List[Tuple[int, int, int]] = []  # (time, 0 = free / 1 = alloc, i)
    for i in kept:
        e = trace.entries[i]
        timeline.append((e.alloc_time, 1, i))
        if e.free_time is not None:
            timeline.append((e.free_time, 0, i))
    timeline.sort()

    events: List[Dict[str, Any]] = [
        {
            "action": "segment_alloc",
            "addr": base_address,
            "size": segment_size,
            "stream": stream,
            "time_us": 0,
            "frames": [],
        }
    ]
    for t, kind, i in timeline:
        e = trace.entries[i]
        actions = ("alloc",) if kind == 1 else ("free_requested", "free_completed")
        for action in actions:
            events.append(
                {
                    "action": action,
                    "addr": base_address + offs[i],
                    "size": e.size,
                    "stream": e.stream,
                    "time_us": t,
                    "frames": [],
                }
            )

    blocks: List[Dict[str, Any]] = []
    cursor = 0
    active = 0
    for i in sorted((i for i in kept if trace.entries[i].free_time is None), key=offs.__getitem__):
        e = trace.entries[i]
        if offs[i] > cursor:
            blocks.append(_inactive_block(base_address + cursor, offs[i] - cursor))
        blocks.append(
            {
                "address": base_address + offs[i],
                "size": e.size,
                "requested_size": e.size,
                "state": "active_allocated",
                "frames": [],
            }
        )
        active += e.size
        cursor = offs[i] + e.size
    if cursor < segment_size:
        blocks.append(_inactive_block(base_address + cursor, segment_size - cursor))
    segment = {
        "device": device,
        "address": base_address,
        "total_size": segment_size,
        "allocated_size": active,
        "active_size": active,
        "requested_size": active,
        "stream": stream,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    device_traces: List[List[Dict[str, Any]]] = [[] for _ in range(device + 1)]
    device_traces[device] = events
    return {"segments": [segment], "device_traces": device_traces, "external_annotations": []}


def _inactive_block(address: int, size: int) -> Dict[str, Any]:
    return {
        "address": address,
        "size": size,
        "requested_size": 0,
        "state": "inactive",
        "frames": [],
    }


#: Highest device index :func:`to_snapshot` files a plan under (``c10::DeviceIndex`` is int8).
EXPORT_DEVICE_MAX = 127


def _check_loadable(snapshot: Any) -> None:
    """Refuse what :func:`load_snapshot`'s safe unpickler would refuse in a written file:
    dict keys and set elements other than strings, bytes, ``None``, bools and integers in
    ``[-2**63, 2**64)``; nesting deeper than :data:`PICKLE_MAX_DEPTH`; cycles. One
    iterative walk (shared sub-objects are visited once).

    Raises:
        ValueError: naming the first such key, the depth, or the cycle.
    """
    def bad_key(k: Any) -> bool:
        if k is None or isinstance(k, (str, bytes, bool)):
            return False
        return not (type(k) is int and KEY_INT_MIN <= k < KEY_INT_LIMIT)

    containers = (dict, list, tuple, set, frozenset)
    active: set = set()  # ids of the containers on the current path
    done: set = set()
    stack: List[Tuple[Any, int, bool]] = [(snapshot, 1, False)]
    while stack:
        obj, depth, leaving = stack.pop()
        if leaving:
            active.discard(id(obj))
            done.add(id(obj))
            continue
        if id(obj) in active:
            raise ValueError("a snapshot holds plain data without cycles; this one contains "
                             f"a {type(obj).__name__} inside itself")
        if id(obj) in done:
            continue
        if depth > PICKLE_MAX_DEPTH:
            raise ValueError(f"a snapshot nests at most {PICKLE_MAX_DEPTH} containers deep "
                             "(what load_snapshot reads back)")
        active.add(id(obj))
        stack.append((obj, depth, True))
        if isinstance(obj, dict):
            for k, v in obj.items():
                if bad_key(k):
                    raise ValueError(f"a snapshot's dict keys are strings or 64-bit integers "
                                     f"(load_snapshot refuses others); got {k!r}")
                if isinstance(v, containers):
                    stack.append((v, depth + 1, False))
            continue
        keyed = isinstance(obj, (set, frozenset))
        for v in obj:
            if keyed and bad_key(v):
                raise ValueError(f"a snapshot's set elements are strings or 64-bit integers "
                                 f"(load_snapshot refuses others); got {v!r}")
            if isinstance(v, containers):
                stack.append((v, depth + 1, False))


class _PlainPickler(pickle.Pickler):
    """Pickles plain data only, so that the file loads with the safe unpickler."""

    def reducer_override(self, obj: Any) -> Any:  # noqa: D102
        raise ValueError(
            f"a snapshot holds plain data only (dict, list, tuple, str, int, float, bool, None); "
            f"got {type(obj).__name__}"
        )


def save_snapshot(snapshot: Dict[str, Any], path: PathLike) -> None:
    """Write a snapshot dict as a pickle that PyTorch's memory viewer opens.

    The file is written with pickle protocol 4 (``MemoryViz.js`` reads protocols 2 to 4) and
    holds plain data only, so :func:`load_snapshot` reads it back. The file is replaced
    atomically, keeping its mode (a new file gets 0666 less the umask, as ``open`` gives); a
    symbolic link is written through to the file it names.

    Args:
        snapshot (dict): a snapshot, e.g. from :func:`to_snapshot`.
        path (str or os.PathLike): where to write it.

    Raises:
        ValueError: ``snapshot`` is not a snapshot dict, holds something other than plain
            data, or plain data that :func:`load_snapshot` would refuse (a float or tuple
            dict key, nesting past :data:`PICKLE_MAX_DEPTH`, a cycle); the file is then left
            untouched; ``path`` names something other than a regular file (a device such as
            ``/dev/full``, a FIFO, a directory), or is empty, and nothing is written.
        OSError: the file cannot be written (``FileNotFoundError`` for a missing directory,
            ``PermissionError``...; ``filename`` is ``path``, never the temporary file).
    """
    given = os.fspath(path)
    if isinstance(given, bytes):
        given = os.fsdecode(given)
    if not given:
        raise ValueError("save_snapshot: the path is empty; nothing was written")
    target = given
    check_snapshot_shape(snapshot, Where(target))
    _check_loadable(snapshot)
    # A symbolic link is written through (the file it names is replaced, the link
    # stays); anything but a regular file (a device such as /dev/full, a FIFO, a
    # directory) is refused before anything is written.
    target = os.path.realpath(target)
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):  # the directory check below names it
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"save_snapshot: {target} is not a regular file (a device, FIFO or directory); "
            f"a snapshot is written to regular files only, nothing was written"
        )
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        # Named here: the temporary file's error would name a file the caller never gave.
        if os.path.exists(directory):
            raise NotADirectoryError(errno.ENOTDIR, f"save_snapshot: not a directory: "
                                     f"{directory} (nothing was written)", given)
        raise FileNotFoundError(errno.ENOENT, f"save_snapshot: no such directory: {directory} "
                                "(nothing was written)", given)
    # The temporary file is created with mode 0666 less the umask, as open() would
    # make the file (mkstemp's 0600 would leave the snapshot unreadable to others);
    # an existing file keeps its mode.
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666
    for _ in range(100):
        tmp = os.path.join(directory, f".snapshot-{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
            break
        except FileExistsError:
            continue
        except OSError as e:  # named by the path given, not the temporary file's name
            raise type(e)(e.errno, f"save_snapshot: cannot write {given}: {e.strerror} "
                          "(nothing was written)", given) from None
    else:  # pragma: no cover - 100 collisions of 64 random bits
        raise FileExistsError(f"save_snapshot: no free temporary name in {directory}")
    try:
        if st is not None:
            os.chmod(tmp, mode)  # the existing file's mode, whatever the umask
        with os.fdopen(fd, "wb") as f:
            _PlainPickler(f, protocol=EXPORT_PROTOCOL).dump(snapshot)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def plot_plan(
    trace: Trace, offsets: Sequence[int], path: PathLike, title: Optional[str] = None
) -> Path:
    """Draw a plan as address x time rectangles and write it as a PNG.

    Each buffer is a rectangle spanning its lifetime (x, logical time) and its bytes
    ``[offset, offset + size)`` (y, in MiB). Dashed lines mark LOAD and the plan size.

    Args:
        trace (Trace): the trace that was planned.
        offsets (sequence of int): ``offsets[i]`` in bytes for ``trace.entries[i]``.
        path (str or os.PathLike): the PNG to write.
        title (str, optional): the figure title. Default: source, buffer count, plan size and
            LOAD.

    Returns:
        pathlib.Path: ``path``.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: the plan is invalid (as :func:`to_snapshot`).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "plot_plan needs matplotlib: install it with `pip install matplotlib` "
            "(or `pip install torch_renaissance[plot]`)"
        ) from exc
    offs, plan_size = _check_plan(trace, offsets)
    load = trace.load_bytes()
    mib = float(1 << 20)
    end = trace.end_time
    verts = []
    for i, e in enumerate(trace.entries):
        if not e.holds_memory(end):
            continue
        y0, y1 = offs[i] / mib, (offs[i] + e.size) / mib
        x0, x1 = e.alloc_time, e.upper(end)
        verts.append(((x0, y0), (x1, y0), (x1, y1), (x0, y1)))
    fig = Figure(figsize=(10, 6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = [f"C{i % 10}" for i in range(len(verts))]
    ax.add_collection(
        PolyCollection(verts, facecolors=colors, edgecolors="black", linewidths=0.1, alpha=0.8)
    )
    ax.axhline(load / mib, color="black", linestyle="--", linewidth=0.8, label="LOAD")
    ax.axhline(plan_size / mib, color="red", linestyle=":", linewidth=0.8, label="plan size")
    ax.set_xlim(0, max(end, 1))
    ax.set_ylim(0, max(plan_size, load, 1) / mib * 1.05)
    ax.set_xlabel("logical time")
    ax.set_ylabel("offset (MiB)")
    if title is None:
        over = f" (+{100.0 * (plan_size / load - 1):.2f}% over LOAD)" if load else ""
        title = (
            f"{Path(trace.source).name if trace.source else 'plan'}: {len(trace.entries)} buffers, "
            f"plan {plan_size / mib:.1f} MiB{over}, LOAD {load / mib:.1f} MiB"
        )
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    out = Path(path)
    fig.savefig(out, format="png")
    return out
