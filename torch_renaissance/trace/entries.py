"""The trace type: :class:`TraceEntry` (one buffer: size in bytes, stream,
lifetime ``[alloc_time, free_time)`` in a logical clock) and :class:`Trace` (one
step's entries, its end time and LOAD).

Invariants: ``0 <= alloc_time <= free_time <= end_time < 2**62`` (``free_time``
may be ``None``: live at the end of the window) and ``0 <= size < 2**63``;
LOAD treats lifetimes as half-open (a buffer freed at ``t`` and one allocated
at ``t`` are never live together)."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from torch_renaissance.trace.common import SIZE_LIMIT, TIME_LIMIT, fmt_int, to_int


@dataclass(frozen=True)
class TraceEntry:
    """One buffer of a trace.

    Attributes:
        index (int): the buffer's sequence number in its source: allocation order for
            snapshots (``trace.entries[i].index == i``), the ``id`` column for CSV files.
        size (int): requested size in bytes (``0 <= size < 2**63``).
        stream (int): the stream that allocated it (an opaque integer, as in PyTorch's
            snapshots).
        alloc_time (int): logical time of the allocation (``0 <= alloc_time < 2**62``; ``0`` is
            the start of the window).
        free_time (int, optional): logical time of the free (``< 2**62``); ``None`` when the
            buffer is still live at the end of the window. The lifetime is
            ``[alloc_time, free_time)``.
        streams_used (tuple of int): streams other than ``stream`` that used the buffer
            (``record_stream`` or a stream hand-off); they keep it live until their work is done.
        address (int, optional): the address recorded in the source, when it has one.
    """

    index: int
    size: int
    stream: int = 0
    alloc_time: int = 0
    free_time: Optional[int] = None
    streams_used: Tuple[int, ...] = ()
    address: Optional[int] = None

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        for name in ("index", "size", "stream", "alloc_time"):
            setattr_(self, name, to_int(getattr(self, name), f"TraceEntry.{name}"))
        if self.index < 0:
            raise ValueError(f"TraceEntry.index must be >= 0, got {self.index}")
        if not 0 <= self.size < SIZE_LIMIT:
            raise ValueError(
                f"TraceEntry.size must be >= 0 and < 2**63 bytes, got {fmt_int(self.size)}"
            )
        if not 0 <= self.alloc_time < TIME_LIMIT:
            raise ValueError(
                f"TraceEntry.alloc_time must be >= 0 and < 2**62, got {fmt_int(self.alloc_time)}"
            )
        if self.free_time is not None:
            setattr_(self, "free_time", to_int(self.free_time, "TraceEntry.free_time"))
            if self.free_time < self.alloc_time:
                raise ValueError(
                    f"TraceEntry {self.index}: free_time {fmt_int(self.free_time)} is before "
                    f"alloc_time {self.alloc_time}"
                )
            if self.free_time >= TIME_LIMIT:
                raise ValueError(
                    f"TraceEntry.free_time must be < 2**62, got {fmt_int(self.free_time)}"
                )
        setattr_(
            self,
            "streams_used",
            tuple(to_int(s, "TraceEntry.streams_used[i]") for s in self.streams_used),
        )
        if self.address is not None:
            setattr_(self, "address", to_int(self.address, "TraceEntry.address"))

    def upper(self, end_time: int) -> int:
        """The end of the lifetime: ``free_time``, or ``end_time`` when never freed."""
        return end_time if self.free_time is None else self.free_time

    def holds_memory(self, end_time: int) -> bool:
        """False for a zero-size buffer or an empty lifetime (nothing to place)."""
        return self.size > 0 and self.upper(end_time) > self.alloc_time


@dataclass
class Trace:
    """The allocations of one step (or of one recorded window).

    Attributes:
        entries (list of TraceEntry): the buffers. Plans are lists of offsets in the same
            order: ``offsets[i]`` belongs to ``entries[i]``.
        end_time (int): logical time at the end of the window (``< 2**62``); buffers never
            freed are live until then. Every ``alloc_time`` and ``free_time`` is
            ``<= end_time``.
        source (str, optional): where the trace came from (a file path), for messages.
        pytorch_reserved_peak (int, optional): PyTorch's caching allocator's peak reserved
            bytes during the window, from the snapshot's ``segment_*`` events; ``None`` when
            the source has no segment events (see :func:`from_snapshot` for the rule).
        pytorch_reserved_at_dump (int, optional): PyTorch's reserved bytes when the snapshot
            was taken (the sum of its segments' ``total_size``); ``None`` for non-snapshot
            sources. Without segment events the reserved bytes did not change during the
            window, so this is also the peak over the window.
    """

    entries: List[TraceEntry]
    end_time: int
    source: Optional[str] = None
    pytorch_reserved_peak: Optional[int] = None
    pytorch_reserved_at_dump: Optional[int] = None

    def __post_init__(self) -> None:
        self.entries = list(self.entries)
        self.end_time = to_int(self.end_time, "Trace.end_time")
        if self.end_time >= TIME_LIMIT:
            raise ValueError(f"Trace.end_time must be < 2**62, got {fmt_int(self.end_time)}")
        for e in self.entries:
            if not isinstance(e, TraceEntry):
                raise TypeError(f"Trace.entries must hold TraceEntry, got {type(e).__name__}")
            last = e.alloc_time if e.free_time is None else e.free_time
            if last > self.end_time:
                raise ValueError(
                    f"Trace: entry {e.index} ends at {last}, after end_time {self.end_time}"
                )

    def __len__(self) -> int:
        return len(self.entries)

    def lifetimes(self) -> List[Tuple[int, int, int]]:
        """The planning instance of this trace.

        Returns:
            list of ``(size, lower, upper)``: per entry, in order, its size in bytes and its
            lifetime ``[lower, upper)``; ``upper = end_time`` for entries never freed.
        """
        end = self.end_time
        return [
            (e.size, e.alloc_time, e.upper(end))
            for e in self.entries
        ]

    def load_bytes(self) -> int:
        """LOAD, the lower bound of every plan: the peak over time of the sum of live sizes.

        Lifetimes are half-open, so a buffer freed at ``t`` does not overlap one allocated at
        ``t``. O(n log n).

        Returns:
            int: LOAD in bytes (0 for an empty trace).
        """
        return _load_of(self.lifetimes())

    def __repr__(self) -> str:
        return (
            f"Trace({len(self.entries)} buffers, end_time={self.end_time}, "
            f"load={self.load_bytes()} B, source={self.source!r})"
        )


def _load_of(lifetimes: Sequence[Tuple[int, int, int]]) -> int:
    deltas: List[Tuple[int, int]] = []
    for size, lower, upper in lifetimes:
        if size > 0 and upper > lower:
            deltas.append((lower, size))
            deltas.append((upper, -size))
    deltas.sort(key=operator.itemgetter(0))
    live = peak = 0
    i, n = 0, len(deltas)
    while i < n:
        t = deltas[i][0]
        while i < n and deltas[i][0] == t:  # apply every change at t, then measure
            live += deltas[i][1]
            i += 1
        if live > peak:
            peak = live
    return peak
