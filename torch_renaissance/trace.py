"""Traces: the allocations of one step, read from real files and written back out.

A :class:`Trace` is what the planner plans: one :class:`TraceEntry` per buffer, with its
size in bytes, its stream and its lifetime ``[alloc_time, free_time)`` in a logical clock.
This module reads traces from

* PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles, written by
  ``torch/csrc/cuda/memory_snapshot.cpp`` from the history that
  ``c10/cuda/CUDACachingAllocator.cpp`` records), with an unpickler that refuses every global;
* CSV planning instances ``id,lower,upper,size`` (the format of the MiniMalloc, SOMAS and IOPDDL
  benchmark sets),

and writes a *planned* run back out in the snapshot format, so that PyTorch's memory viewer
(``torch/cuda/_memory_viz.py`` and ``torch/utils/viz/MemoryViz.js``) shows the packing.

Invariants kept here:

* Loading a file never executes code from it: :class:`_SafeUnpickler` refuses every global
  (``find_class``) and every persistent id, so a pickle can only build dicts, lists, tuples,
  strings, numbers, bytes and sets.
* Before unpickling, the file's opcodes are scanned without building anything
  (:func:`_check_pickle_structure`): containers nested deeper than :data:`_PICKLE_MAX_DEPTH`
  levels are refused, so building, hashing or printing the loaded data cannot overflow the C
  stack (CPython's tuple hash recurses in C), and absurd memo indices are refused, so the
  unpickler never sizes its memo from the file. Dict keys and set elements must be strings,
  bytes, ``None``, bools or 64-bit integers, and addresses (the keys of the loader's own
  dicts) below ``2**64``: no file can make hashing quadratic, so loading is linear in the
  file size.
* Only regular files are read: a directory, FIFO, device (``/dev/zero``) or socket is
  refused before anything is read.
* Malformed input raises :class:`ValueError` naming the file and the line (CSV) or the event /
  segment index (snapshot). A loader returns a whole trace or raises: never a partial one.
* In every trace, ``0 <= alloc_time <= free_time <= end_time < 2**62`` (``free_time`` may be
  ``None``: live at the end of the window) and ``0 <= size < 2**63``, so every trace can be
  passed to the planner (sizes are ``uint64`` there, times ``int64`` with room for the sum of
  two times).
* LOAD (:meth:`Trace.load_bytes`) treats lifetimes as half-open: a buffer freed at ``t`` and
  one allocated at ``t`` are never live together. Sizes are requested bytes, also for the
  blocks a snapshot knows only from its ``segments`` (see :func:`from_snapshot`).
* Only the standard library is imported at module level (matplotlib is imported by
  :func:`plot_plan` when called); nothing from the rest of the package or from ``_C``.
"""
from __future__ import annotations

import bisect
import io
import operator
import os
import pickle
import pickletools
import re
import reprlib
import stat
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__all__ = [
    "DEFAULT_BASE_ADDRESS",
    "Trace",
    "TraceEntry",
    "from_snapshot",
    "load_csv",
    "load_snapshot",
    "load_trace",
    "plot_plan",
    "save_snapshot",
    "to_snapshot",
]

PathLike = Union[str, "os.PathLike[str]"]

#: Default base address of an exported plan: a 2 MiB-aligned address in the range where the
#: CUDA driver places device allocations, so that exported files look like real ones.
DEFAULT_BASE_ADDRESS = 0x7F00_0000_0000

# kMinBlockSize in c10/cuda/CUDACachingAllocator.cpp: every block is a multiple of it.
_MIN_BLOCK_SIZE = 512

# Pickle protocol of exported files. MemoryViz.js's unpickler reads protocols 2 to 4 only.
_EXPORT_PROTOCOL = 4

#: Sizes in bytes are below this (``uint64`` in the planner, ``int64`` in PyTorch).
_SIZE_LIMIT = 1 << 63
#: Logical times are below this (``int64`` in the planner, with room for ``lower + period``).
_TIME_LIMIT = 1 << 62
#: Addresses in snapshots are below this (64-bit pointers). Addresses key the loader's dicts:
#: bounded, at most 9 of them share a hash value (CPython hashes an int modulo 2**61 - 1), so
#: a file of colliding addresses cannot make loading quadratic.
_ADDRESS_LIMIT = 1 << 64
#: Device indices are below this (CUDA's ``int`` ordinals; ``c10::DeviceIndex`` is smaller).
_DEVICE_LIMIT = 1 << 31

_INT_RE = re.compile(r"[+-]?[0-9]+")
_CSV_COLUMNS = ("id", "lower", "upper", "size")
_ACTIVE_STATES = ("active_allocated", "active_pending_free")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fmt_int(value: int) -> str:
    """``str(value)``, also for integers too long for ``str`` (``sys.int_info`` digit limit)."""
    if value.bit_length() > 128:
        return f"a{' negative' if value < 0 else 'n'} integer of {value.bit_length()} bits"
    return str(value)


def _brief(value: Any) -> str:
    """A short ``repr`` of a value read from a file, for error messages; never raises."""
    if _is_int(value):
        return _fmt_int(value)
    try:
        return reprlib.repr(value)
    except Exception:  # e.g. a tuple holding an integer too long for repr
        return f"<{type(value).__name__}>"


def _to_int(value: Any, what: str) -> int:
    """``operator.index`` that also refuses ``bool``: accepts ``int`` and NumPy integers."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}") from None


# --------------------------------------------------------------------------------------------
# The trace type
# --------------------------------------------------------------------------------------------


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
            setattr_(self, name, _to_int(getattr(self, name), f"TraceEntry.{name}"))
        if self.index < 0:
            raise ValueError(f"TraceEntry.index must be >= 0, got {self.index}")
        if not 0 <= self.size < _SIZE_LIMIT:
            raise ValueError(
                f"TraceEntry.size must be >= 0 and < 2**63 bytes, got {_fmt_int(self.size)}"
            )
        if not 0 <= self.alloc_time < _TIME_LIMIT:
            raise ValueError(
                f"TraceEntry.alloc_time must be >= 0 and < 2**62, got {_fmt_int(self.alloc_time)}"
            )
        if self.free_time is not None:
            setattr_(self, "free_time", _to_int(self.free_time, "TraceEntry.free_time"))
            if self.free_time < self.alloc_time:
                raise ValueError(
                    f"TraceEntry {self.index}: free_time {_fmt_int(self.free_time)} is before "
                    f"alloc_time {self.alloc_time}"
                )
            if self.free_time >= _TIME_LIMIT:
                raise ValueError(
                    f"TraceEntry.free_time must be < 2**62, got {_fmt_int(self.free_time)}"
                )
        setattr_(
            self,
            "streams_used",
            tuple(_to_int(s, "TraceEntry.streams_used[i]") for s in self.streams_used),
        )
        if self.address is not None:
            setattr_(self, "address", _to_int(self.address, "TraceEntry.address"))

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
        self.end_time = _to_int(self.end_time, "Trace.end_time")
        if self.end_time >= _TIME_LIMIT:
            raise ValueError(f"Trace.end_time must be < 2**62, got {_fmt_int(self.end_time)}")
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


# --------------------------------------------------------------------------------------------
# PyTorch memory snapshots
# --------------------------------------------------------------------------------------------


class _RefusedGlobal(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only.

    Every way a pickle can reach code goes through a global (``GLOBAL``, ``STACK_GLOBAL``,
    ``INST`` and the ``EXT*`` opcodes all call ``find_class``; ``REDUCE``, ``BUILD``,
    ``NEWOBJ`` and ``OBJ`` need a callable or class that only a global can provide) or through
    a persistent id. Both are refused, so loading imports and calls nothing.
    """

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        what = f"{module}.{name}"
        raise _RefusedGlobal(f"the global {what[:200]!s}{'...' if len(what) > 200 else ''}")

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise _RefusedGlobal(f"a persistent id ({type(pid).__name__})")


#: Deepest container nesting a snapshot pickle may have. Real snapshots nest less than 10
#: levels (dict > list > dict > list of frames > dict); a tuple nested 200k deep crashes
#: CPython's tuple hash, so anything past this generous limit is refused before unpickling.
_PICKLE_MAX_DEPTH = 200
#: Most items the unpickling stack may hold at once. ``pickle`` pushes at most one batch of
#: 1000 list items or dict pairs per nesting level; only a huge tuple or frozenset needs more.
#: Bounds the memory of the structure scan whatever the number of opcodes.
_PICKLE_MAX_STACK = 1 << 22
#: Integers a dict key or set element may be: those that fit in 64 bits (``int64`` or
#: ``uint64``). CPython hashes an integer to itself modulo :data:`sys.hash_info.modulus`
#: (``2**61 - 1``), so at most 13 of them share a hash value; integers of any size would let a
#: file of 1 MB hold 100k keys of one hash and make building the dict quadratic (minutes).
_KEY_INT_MIN = -(1 << 63)
_KEY_INT_LIMIT = 1 << 64

# What each opcode does to the stack, for _check_pickle_structure.
(
    _OP_PUSH_PRIMITIVE,  # push a non-container that hashes safely (str, bytes, None, bool, int32)
    _OP_PUSH_NUMBER,  # push an integer of any size or a float: a key only when a 64-bit integer
    _OP_PUSH_EMPTY,  # push an empty container
    _OP_MARK,
    _OP_BUILD_FROM_MARK,  # pop to the mark, push a container of those items
    _OP_BUILD_COUNTED,  # pop 1-3 items, push a tuple of them
    _OP_APPEND,  # pop 1 item into the container below it
    _OP_SETITEM,  # pop 2 items into the container below them
    _OP_FILL_FROM_MARK,  # pop to the mark into the container below the mark
    _OP_POP,
    _OP_POP_MARK,
    _OP_DUP,
    _OP_PUT,
    _OP_MEMOIZE,
    _OP_GET,
    _OP_NOTHING,  # PROTO, FRAME
    _OP_STOP,
    _OP_REFUSED,  # names a global or a persistent id: the unpickler refuses it right there
) = range(18)
_OPCODE_EFFECTS: Dict[str, int] = {
    **dict.fromkeys(
        "BININT BININT1 BININT2 STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES "
        "BINBYTES8 BYTEARRAY8 UNICODE SHORT_BINUNICODE BINUNICODE BINUNICODE8 NONE NEWTRUE "
        "NEWFALSE".split(),
        _OP_PUSH_PRIMITIVE,
    ),
    **dict.fromkeys("INT LONG LONG1 LONG4 FLOAT BINFLOAT".split(), _OP_PUSH_NUMBER),
    **dict.fromkeys("EMPTY_DICT EMPTY_LIST EMPTY_TUPLE EMPTY_SET".split(), _OP_PUSH_EMPTY),
    "MARK": _OP_MARK,
    **dict.fromkeys("TUPLE LIST DICT FROZENSET".split(), _OP_BUILD_FROM_MARK),
    **dict.fromkeys("TUPLE1 TUPLE2 TUPLE3".split(), _OP_BUILD_COUNTED),
    "APPEND": _OP_APPEND,
    "SETITEM": _OP_SETITEM,
    **dict.fromkeys("APPENDS SETITEMS ADDITEMS".split(), _OP_FILL_FROM_MARK),
    "POP": _OP_POP,
    "POP_MARK": _OP_POP_MARK,
    "DUP": _OP_DUP,
    **dict.fromkeys("PUT BINPUT LONG_BINPUT".split(), _OP_PUT),
    "MEMOIZE": _OP_MEMOIZE,
    **dict.fromkeys("GET BINGET LONG_BINGET".split(), _OP_GET),
    **dict.fromkeys("PROTO FRAME".split(), _OP_NOTHING),
    "STOP": _OP_STOP,
    **dict.fromkeys("GLOBAL STACK_GLOBAL INST PERSID BINPERSID".split(), _OP_REFUSED),
}
_COUNTED = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
# Opcodes that hash items, and which: every item (sets) or every other one from the first
# (dict keys; SETITEM's key is the item below the value).
_KEY_STRIDE = {"SETITEM": 2, "SETITEMS": 2, "DICT": 2, "ADDITEMS": 1, "FROZENSET": 1}
#: ``refs`` value of a stack item that must not be hashed: a float or an integer outside
#: ``[_KEY_INT_MIN, _KEY_INT_LIMIT)`` (containers are known by their depth, >= 1).
_UNSAFE_KEY = -2
#: ``memo`` value of such an item (depths + 1 are <= _PICKLE_MAX_DEPTH + 1 < 255).
_MEMO_UNSAFE_KEY = 255
# The same, keyed by the opcode objects pickletools.genops yields (faster than by name).
_EFFECT_OF_OP = {op: _OPCODE_EFFECTS.get(op.name) for op in pickletools.opcodes}


class _BadPickle(Exception):
    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def _check_pickle_structure(data: bytes) -> None:
    """Refuse a pickle that cannot be loaded safely and fast, without building any object.

    Walks the opcodes with :func:`pickletools.genops` and replays what the unpickler does to
    its stack, keeping per stack item only the nesting depth of the object it holds (0 for
    strings, numbers, bytes and ``None``; 1 + the deepest item for a container) and whether
    it may be hashed. Memo entries remember the same, the depth raised when that object is
    filled later (as ``pickle`` does: a list is memoized empty, then appended to). The walk
    stops at the first opcode naming a global or a persistent id: the unpickler refuses that
    opcode before building anything after it. Time and memory are linear in the file size;
    the stack is capped at :data:`_PICKLE_MAX_STACK` items and the memo at one byte per byte
    of file.

    Dict keys and set elements must be strings, bytes, ``None``, booleans or integers in
    ``[-2**63, 2**64)``. Those never make building a dict slow: string and bytes hashes are
    randomized per process, and at most 13 such integers share a hash value. Floats, bigger
    integers, tuples and frozensets can be made to share one hash by the thousand (CPython's
    integer hash is the value modulo ``2**61 - 1``, and tuple and frozenset hashes combine
    their items' hashes invertibly), which makes unpickling quadratic: a 1 MB file then
    takes minutes. PyTorch's snapshots key every dict by strings.

    Raises:
        _BadPickle: the file is nested deeper than :data:`_PICKLE_MAX_DEPTH`, keeps more than
            :data:`_PICKLE_MAX_STACK` items on the stack, uses an opcode that plain data never
            needs (``REDUCE``, ``BUILD``, ``EXT1``, ...), hashes a key that is not allowed
            above, or is not a well-formed pickle (truncated, unknown opcode, stack underflow,
            memo index out of range).
    """
    limit, max_stack, size = _PICKLE_MAX_DEPTH, _PICKLE_MAX_STACK, len(data)
    depths = bytearray()  # per stack item: the depth of its object (<= limit < 255)
    # per stack item: the memo index it was stored at or read from, -1, or _UNSAFE_KEY
    refs = array("q")
    marks: List[int] = []  # stack lengths at the open MARKs
    memo = bytearray()  # per memo index: 1 + the depth of its object; 0 when unset
    memo_count = 0  # set memo entries (the index MEMOIZE uses)
    effect_of = _EFFECT_OF_OP.get
    push, push_ref = depths.append, refs.append
    key_min, key_limit = _KEY_INT_MIN, _KEY_INT_LIMIT

    def deeper(d: int) -> int:
        if d > limit:
            raise _BadPickle(
                f"refusing to load: the pickle nests containers {d} levels deep, more than the "
                f"{limit} allowed (memory snapshots nest fewer than 20)",
                refused=True,
            )
        return d

    def check_keys(start: int, stride: int, name: str) -> None:
        # The items that name hashes: stack[start::stride]. Containers have depth >= 1.
        if max(depths[start::stride], default=0) == 0 and _UNSAFE_KEY not in refs[start::stride]:
            return
        raise _BadPickle(
            f"refusing to load: {name} makes a {'set element' if stride == 1 else 'dict key'} "
            "of a float, a tuple, a frozenset or an integer outside [-2**63, 2**64); such keys "
            "can share one hash by the thousand and make loading take quadratic time (memory "
            "snapshots key their dicts by strings)",
            refused=True,
        )

    def fill(target: int, d: int) -> None:  # the container at stack index target gets depth d
        if d > depths[target]:
            depths[target] = deeper(d)
            idx = refs[target]
            if idx >= 0 and memo[idx] <= d:
                memo[idx] = d + 1

    pos = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            effect = effect_of(op)
            if effect == _OP_GET:
                m = memo[arg] if 0 <= arg < len(memo) else 0
                if not m:
                    raise _BadPickle(f"{op.name} of memo index {arg}, which is not set")
                if m == _MEMO_UNSAFE_KEY:
                    push(0)
                    push_ref(_UNSAFE_KEY)
                else:
                    push(m - 1)
                    push_ref(arg)
            elif effect == _OP_PUSH_PRIMITIVE:
                push(0)
                push_ref(-1)
            elif effect == _OP_PUSH_NUMBER:  # float, or int (bool for INT's 00 / 01)
                push(0)
                push_ref(-1 if type(arg) is not float and key_min <= arg < key_limit else _UNSAFE_KEY)
            elif effect == _OP_PUT or effect == _OP_MEMOIZE:
                if len(depths) <= (marks[-1] if marks else 0):
                    raise _BadPickle(f"stack underflow at {op.name}")
                idx = memo_count if effect == _OP_MEMOIZE else arg
                if not 0 <= idx < size:  # pickle numbers its memo entries 0, 1, 2, ...
                    raise _BadPickle(f"{op.name} of memo index {idx}, out of range")
                if idx >= len(memo):
                    memo.extend(bytes(idx + 1 - len(memo)))
                if not memo[idx]:
                    memo_count += 1
                if refs[-1] == _UNSAFE_KEY:  # a number: its memo entry is never filled
                    memo[idx] = _MEMO_UNSAFE_KEY
                else:
                    memo[idx] = depths[-1] + 1
                    refs[-1] = idx
                continue
            elif effect == _OP_MARK:
                deeper(len(marks) + 1)  # each open MARK is a container being built
                marks.append(len(depths))
                continue
            elif effect == _OP_PUSH_EMPTY:
                push(1)
                push_ref(-1)
            elif effect == _OP_FILL_FROM_MARK or effect == _OP_BUILD_FROM_MARK:
                if not marks:
                    raise _BadPickle(f"{op.name} without a MARK")
                k = marks.pop()
                stride = _KEY_STRIDE.get(op.name)
                if stride:
                    check_keys(k, stride, op.name)
                d = max(depths[k:], default=-1) + 1  # the depth the items give a container
                del depths[k:], refs[k:]
                if effect == _OP_BUILD_FROM_MARK:
                    push(deeper(max(d, 1)))
                    push_ref(-1)
                elif d > 0:  # there are items, for the container just below the mark
                    if k == 0:
                        raise _BadPickle(f"stack underflow at {op.name}")
                    fill(k - 1, d)
                continue
            elif effect == _OP_APPEND or effect == _OP_SETITEM:
                n = 1 if effect == _OP_APPEND else 2
                x = len(depths) - n  # the items; the container is just below them
                if x < 1 or x < (marks[-1] if marks else 0):
                    raise _BadPickle(f"stack underflow at {op.name}")
                if n == 2:
                    check_keys(x, 2, op.name)
                d = max(depths[x:]) + 1
                del depths[x:], refs[x:]
                fill(x - 1, d)
                continue
            elif effect == _OP_BUILD_COUNTED:
                x = len(depths) - _COUNTED[op.name]
                if x < (marks[-1] if marks else 0):
                    raise _BadPickle(f"stack underflow at {op.name}")
                d = deeper(max(depths[x:]) + 1)
                del depths[x:], refs[x:]
                push(d)
                push_ref(-1)
                continue
            elif effect == _OP_DUP:
                if len(depths) <= (marks[-1] if marks else 0):
                    raise _BadPickle(f"stack underflow at {op.name}")
                push(depths[-1])
                push_ref(refs[-1])
            elif effect == _OP_POP:
                if marks and marks[-1] == len(depths):
                    marks.pop()
                elif len(depths) > (marks[-1] if marks else 0):
                    depths.pop()
                    refs.pop()
                else:
                    raise _BadPickle(f"stack underflow at {op.name}")
                continue
            elif effect == _OP_POP_MARK:
                if not marks:
                    raise _BadPickle(f"{op.name} without a MARK")
                k = marks.pop()
                del depths[k:], refs[k:]
                continue
            elif effect == _OP_NOTHING:
                continue
            elif effect == _OP_STOP:
                if len(depths) <= (marks[-1] if marks else 0):
                    raise _BadPickle(f"stack underflow at {op.name}")
                return
            elif effect == _OP_REFUSED:
                return  # _SafeUnpickler refuses this opcode before building anything after it
            else:
                raise _BadPickle(
                    f"refusing to load: the pickle uses the opcode {op.name}, which plain data "
                    "(dicts, lists, strings, numbers) never needs",
                    refused=True,
                )
            if len(depths) > max_stack:  # after a push
                raise _BadPickle(
                    f"refusing to load: the pickle keeps more than {max_stack} items on the "
                    "unpickling stack",
                    refused=True,
                )
    except _BadPickle as exc:
        raise _BadPickle(f"{exc} (opcode at byte {pos})", refused=exc.refused) from None
    except Exception as exc:  # genops: truncated, unknown opcode, bad argument; MemoryError
        raise _BadPickle(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    raise _BadPickle("pickle exhausted before seeing STOP")  # pragma: no cover (genops raises)


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _open_regular(path: PathLike) -> io.BufferedReader:
    """``open(path, "rb")`` for regular files only; refuses anything else at once.

    The file is opened without blocking (a FIFO with no writer would block ``open``) and
    checked with ``fstat`` on the opened descriptor, so that what is read is what was
    checked: ``/dev/zero`` or a FIFO would otherwise be read forever or wait forever.

    Raises:
        ValueError: ``path`` is a directory, FIFO, device or socket (the message names it).
        OSError: the file cannot be opened.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a file")
            raise ValueError(f"{os.fspath(path)}: not a regular file ({kind}); a trace is a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return f


def _safe_unpickle(path: PathLike) -> Any:
    source = os.fspath(path)
    with _open_regular(path) as f:
        data = f.read()
    try:
        _check_pickle_structure(data)
    except _BadPickle as exc:
        if exc.refused:
            raise ValueError(f"{source}: {exc}") from None
        raise ValueError(f"{source}: not a readable pickle (truncated or corrupt): {exc}") from None
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as exc:
        raise ValueError(
            f"{source}: refusing to load: the pickle names {exc.what}. Memory "
            "snapshots are plain data (dicts, lists, strings, numbers); this loader never "
            "imports or calls anything named in a file"
        ) from None
    except Exception as exc:  # truncated or corrupt: any unpickling error, MemoryError too
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ValueError(
            f"{source}: not a readable pickle (truncated or corrupt): {detail}"
        ) from None


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
            or more, is truncated or not a pickle, is not a snapshot dict,
            or has a malformed or inconsistent event or segment (the message names the file
            and the index).
        ValueError: also when ``path`` is not a regular file (a directory, FIFO, device such
            as ``/dev/zero``, or socket), refused before reading anything.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    data = _safe_unpickle(path)
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
    w = _Where(source if source is not None else "<snapshot>")
    _check_snapshot_shape(snapshot, w)
    devices = {d for d, t in enumerate(snapshot["device_traces"]) if t}
    for i, seg in enumerate(snapshot["segments"]):
        if not isinstance(seg, dict):
            raise w.error(f"segments[{i}]", f"must be a dict, got {type(seg).__name__}")
        devices.add(_opt_int(seg, "device", 0, w, f"segments[{i}]"))
    return sorted(devices)


def load_snapshot_devices(path: PathLike) -> Dict[int, Trace]:
    """Load every device of a PyTorch memory snapshot: ``{device: Trace}``.

    The file is read once, with the same safe unpickler and checks as
    :func:`load_snapshot`; each device with events or segments gets its
    :class:`Trace` (a snapshot with none gives ``{0: <empty trace of device 0>}``).

    Raises:
        ValueError: as :func:`load_snapshot`, for the first device that fails.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    data = _safe_unpickle(path)
    devices = snapshot_devices(data, source)
    return {d: from_snapshot(data, device=d, source=source) for d in devices or [0]}


def is_snapshot_file(path: PathLike) -> bool:
    """True when :func:`load_trace` reads ``path`` as a snapshot (not as CSV).

    By extension (``.pickle``/``.pkl``: yes; ``.csv``: no), else by content (a binary pickle
    starts with ``0x80``).

    Raises:
        OSError: the file has neither extension and cannot be read.
    """
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".pickle", ".pkl"):
        return suffix != ".csv"
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


class _Where:
    """Builds error messages that name the source and the offending item."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, where: str, message: str) -> ValueError:
        return ValueError(f"{self.source}: {where}: {message}")


def _field_int(
    d: Dict[str, Any],
    key: str,
    w: _Where,
    where: str,
    *,
    minimum: int = 0,
    limit: Optional[int] = None,
) -> int:
    if key not in d:
        raise w.error(where, f"missing field {key!r} in {_short(d)}")
    value = d[key]
    if not _is_int(value):
        raise w.error(where, f"field {key!r} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise w.error(where, f"field {key!r} must be >= {minimum}, got {_fmt_int(value)}")
    if limit is not None and value >= limit:
        raise w.error(
            where,
            f"field {key!r} must be < 2**{limit.bit_length() - 1}, got {_fmt_int(value)}",
        )
    return value


def _opt_int(
    d: Dict[str, Any],
    key: str,
    default: int,
    w: _Where,
    where: str,
    *,
    minimum: Optional[int] = None,
    limit: Optional[int] = None,
) -> int:
    value = d.get(key, default)
    if value is None:
        return default
    if not _is_int(value):
        raise w.error(where, f"field {key!r} must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise w.error(where, f"field {key!r} must be >= {minimum}, got {_fmt_int(value)}")
    if limit is not None and value >= limit:
        raise w.error(
            where,
            f"field {key!r} must be < 2**{limit.bit_length() - 1}, got {_fmt_int(value)}",
        )
    return value


def _short(d: Dict[str, Any]) -> str:
    keys = sorted(k if isinstance(k, str) else _brief(k) for k in d.keys())
    shown = [k if len(k) <= 40 else k[:37] + "..." for k in keys[:8]]
    return "{" + ", ".join(shown) + (", ..." if len(keys) > 8 else "") + "}"


def _check_snapshot_shape(data: Any, w: _Where) -> None:
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
            allocated twice or freed twice, a block that is active at dump time was freed by
            the trace, the segment events do not add up to the dump-time segments, or
            ``device`` is ambiguous or absent. The message names the source and the event
            (``device_traces[d][k]``) or segment index.
    """
    w = _Where(source if source is not None else "<snapshot>")
    _check_snapshot_shape(snapshot, w)
    traces: List[List[Any]] = snapshot["device_traces"]
    segments: List[Any] = snapshot["segments"]

    seg_devices: List[int] = []
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise w.error(f"segments[{i}]", f"must be a dict, got {type(seg).__name__}")
        seg_devices.append(
            _opt_int(seg, "device", 0, w, f"segments[{i}]", minimum=0, limit=_DEVICE_LIMIT)
        )
    with_data = sorted({d for d, t in enumerate(traces) if t} | set(seg_devices))
    if device is None:
        if len(with_data) > 1:
            raise DeviceChoiceError(
                f"{w.source}: device_traces: the snapshot has data for devices {with_data}; "
                "pass device= to choose one", with_data)
        device = with_data[0] if with_data else 0
    else:
        device = _to_int(device, "device")
        if device < 0 or (device not in with_data and device >= len(traces)):
            raise DeviceChoiceError(
                f"{w.source}: device_traces: no device {device} (devices with data: {with_data})",
                with_data)
    events: List[Any] = traces[device] if device < len(traces) else []

    # Pass 1: which action ends a buffer.
    for k, e in enumerate(events):
        if not isinstance(e, dict):
            where = f"device_traces[{device}][{k}]"
            raise w.error(where, f"event must be a dict, got {type(e).__name__}")
        if not isinstance(e.get("action"), str):
            where = f"device_traces[{device}][{k}]"
            raise w.error(where, f"event has no 'action' string: {_short(e)}")
    has_completed = any(e["action"] == "free_completed" for e in events)
    free_action = "free_completed" if has_completed else "free_requested"

    # Pass 2: walk the history. Records are (alloc_time, group, order, size, stream, free, addr).
    live: Dict[int, Tuple[int, int, int, int]] = {}  # addr -> (tick, size, stream, k)
    freed_at: Dict[int, int] = {}  # addr -> event index of its last free (no alloc since)
    records: List[Tuple[int, int, int, int, int, Optional[int], int]] = []
    seg_net = seg_max = seg_min = 0
    has_segment_events = False
    for k, e in enumerate(events):
        tick = k + 1
        action = e["action"]
        if action == "alloc":
            where = f"device_traces[{device}][{k}]"
            addr = _field_int(e, "addr", w, where, limit=_ADDRESS_LIMIT)
            size = _field_int(e, "size", w, where, limit=_SIZE_LIMIT)
            stream = _opt_int(e, "stream", 0, w, where)
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
            addr = _field_int(e, "addr", w, where, limit=_ADDRESS_LIMIT)
            size = _field_int(e, "size", w, where, limit=_SIZE_LIMIT)
            stream = _opt_int(e, "stream", 0, w, where)
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
            size = _field_int(e, "size", w, where, limit=_SIZE_LIMIT)
            has_segment_events = True
            seg_net += size if action in ("segment_alloc", "segment_map") else -size
            seg_max = max(seg_max, seg_net)
            seg_min = min(seg_min, seg_net)
        # other actions (free_requested when frees complete later, oom, snapshot, ...) tick only
    end_time = len(events) + 1
    for _addr, (tick, size, stream, k) in live.items():
        records.append((tick, 2, k, size, stream, None, _addr))

    # Segments at dump time: reserved bytes and the blocks live since before the window.
    reserved_at_dump = 0
    order = 0
    for i, seg in enumerate(segments):
        if seg_devices[i] != device:
            continue
        where = f"segments[{i}]"
        seg_addr = _field_int(seg, "address", w, where, limit=_ADDRESS_LIMIT)
        reserved_at_dump += _field_int(seg, "total_size", w, where, limit=_SIZE_LIMIT)
        seg_stream = _opt_int(seg, "stream", 0, w, where)
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise w.error(where, f"'blocks' must be a list, got {type(blocks).__name__}")
        addr = seg_addr
        for j, b in enumerate(blocks):
            bwhere = f"segments[{i}]['blocks'][{j}]"
            if not isinstance(b, dict):
                raise w.error(bwhere, f"block must be a dict, got {type(b).__name__}")
            bsize = _field_int(b, "size", w, bwhere, limit=_SIZE_LIMIT)
            state = b.get("state")
            if not isinstance(state, str):
                raise w.error(bwhere, "block has no 'state' string")
            baddr = _opt_int(b, "address", addr, w, bwhere, minimum=0, limit=_ADDRESS_LIMIT)
            addr = baddr + bsize
            if state not in _ACTIVE_STATES or baddr in live:
                continue
            if baddr in freed_at:
                if state == "active_pending_free" or not has_completed:
                    continue  # freed by the user, and the trace ends buffers at that request
                raise w.error(
                    bwhere,
                    f"block at {baddr:#x} is {state!r} at dump time, but event "
                    f"{freed_at[baddr]} freed it and no later event allocated it",
                )
            requested = b.get("requested_size")
            if requested is None and isinstance(b.get("history"), list) and b["history"]:
                first = b["history"][0]
                requested = first.get("real_size") if isinstance(first, dict) else None
            if requested is None:
                requested = bsize
            if not _is_int(requested) or not 0 <= requested < _SIZE_LIMIT:
                raise w.error(
                    bwhere,
                    f"'requested_size' must be an integer in [0, 2**63), got {_brief(requested)}",
                )
            records.append((0, 0, order, requested, seg_stream, None, baddr))
            order += 1

    if has_segment_events:
        start = reserved_at_dump - seg_net
        if start + seg_min < 0:
            raise w.error(
                f"device_traces[{device}]",
                f"segment events free {-(start + seg_min)} bytes more than were reserved: they "
                f"do not add up to the {reserved_at_dump} bytes of segments at dump time",
            )
        reserved_peak: Optional[int] = start + seg_max
    else:
        reserved_peak = None

    records.sort(key=lambda r: (r[0], r[1], r[2]))
    entries = [
        TraceEntry(i, r[3], r[4], r[0], r[5], (), r[6]) for i, r in enumerate(records)
    ]
    return Trace(
        entries,
        end_time,
        source=source,
        pytorch_reserved_peak=reserved_peak,
        pytorch_reserved_at_dump=reserved_at_dump,
    )


# --------------------------------------------------------------------------------------------
# CSV instances
# --------------------------------------------------------------------------------------------


# Per column: the exclusive upper bound of its values (every column is >= 0).
_CSV_LIMITS = {"id": _SIZE_LIMIT, "lower": _TIME_LIMIT, "upper": _TIME_LIMIT, "size": _SIZE_LIMIT}


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _csv_int(x: str, name: str) -> int:
    """Parse one CSV field (ASCII digits, optional sign) and check it against its bounds.

    Raises:
        ValueError: not an integer, negative, or not below the column's bound. The message
            lacks the ``file:line:`` prefix; the caller adds it.
    """
    if not _INT_RE.fullmatch(x):
        raise ValueError(f"{name} must be an integer, got {_clip(x)!r}")
    negative = x.startswith("-")
    digits = x.lstrip("+-").lstrip("0") or "0"
    limit = _CSV_LIMITS[name]
    bound = f"2**{limit.bit_length() - 1}"
    if len(digits) > 40:  # past every bound; int() would also refuse over 4300 digits
        if negative:
            raise ValueError(f"{name} must be >= 0, got a {len(digits)}-digit negative number")
        raise ValueError(f"{name} must be < {bound}, got a {len(digits)}-digit number")
    value = -int(digits) if negative else int(digits)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value >= limit:
        raise ValueError(f"{name} must be < {bound}, got {value}")
    return value


def load_csv(path: PathLike) -> Trace:
    """Load a planning instance ``id,lower,upper,size`` as a :class:`Trace`.

    One buffer a row: ``id`` (a unique integer, ``0 <= id < 2**63``, kept as
    ``TraceEntry.index``), the lifetime ``[lower, upper)`` in a logical clock
    (``0 <= lower < upper < 2**62``) and the size in bytes (``0 <= size < 2**63``); these
    bounds are what the planner can take. The first line is a header naming those four columns
    (in any order; other columns are ignored); a file whose first line is four integers has no
    header and uses that order. Lines end with ``\\n``, ``\\r\\n`` or ``\\r`` (universal
    newlines); blank lines and lines starting with ``#`` are skipped. Entries keep the file's
    order and ``end_time`` is the largest ``upper``. This is the format of the MiniMalloc,
    SOMAS and IOPDDL instances in the ``cappadokes/idealloc`` benchmarks.

    Args:
        path (str or os.PathLike): the CSV file (UTF-8).

    Returns:
        Trace: one entry per row, ``source`` set to ``path``.

    Raises:
        ValueError: the file is empty or has no rows, a header lacks a column, a row has the
            wrong number of fields, a non-integer, a value out of the bounds above, an
            ``upper <= lower`` or a repeated id. The message is ``file:line: ...``.
        ValueError: also when ``path`` is not a regular file (a directory, FIFO, device such
            as ``/dev/zero``, or socket), refused before reading anything.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    with _open_regular(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source}: not a UTF-8 text file ({exc})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines

    columns: Optional[Dict[str, int]] = None
    nfields = 0
    entries: List[TraceEntry] = []
    id_line: Dict[int, int] = {}
    end_time = 0
    header_line = 1
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [x.strip() for x in line.split(",")]
        if columns is None:
            if len(fields) == 4 and all(_INT_RE.fullmatch(x) for x in fields):
                columns = {name: i for i, name in enumerate(_CSV_COLUMNS)}
                nfields = 4
            else:
                names = [x.lower() for x in fields]
                missing = [c for c in _CSV_COLUMNS if c not in names]
                if missing:
                    raise ValueError(
                        f"{source}:{lineno}: the header {_clip(line)!r} lacks the column(s) "
                        f"{', '.join(missing)} (expected id,lower,upper,size)"
                    )
                dups = sorted({c for c in _CSV_COLUMNS if names.count(c) > 1})
                if dups:
                    raise ValueError(f"{source}:{lineno}: the header repeats {', '.join(dups)}")
                columns = {c: names.index(c) for c in _CSV_COLUMNS}
                nfields = len(fields)
                header_line = lineno
                continue
        if len(fields) != nfields:
            raise ValueError(
                f"{source}:{lineno}: expected {nfields} fields, got {len(fields)}: {_clip(line)!r}"
            )
        try:
            ident, lower, upper, size = (_csv_int(fields[columns[c]], c) for c in _CSV_COLUMNS)
            if upper <= lower:
                raise ValueError(
                    f"upper must be > lower (lifetime [lower, upper)), "
                    f"got lower={lower} upper={upper}"
                )
            if ident in id_line:
                raise ValueError(f"id {ident} already used on line {id_line[ident]}")
            entries.append(TraceEntry(ident, size, 0, lower, upper, (), None))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}:{lineno}: {exc}") from None
        id_line[ident] = lineno
        if upper > end_time:
            end_time = upper
    if columns is None:
        raise ValueError(f"{source}:1: empty file (expected a header id,lower,upper,size and rows)")
    if not entries:
        raise ValueError(f"{source}:{header_line}: no rows after the header")
    return Trace(entries, end_time, source=source)


def load_trace(path: PathLike, **kwargs: Any) -> Trace:
    """Load a trace file, choosing the loader by extension, else by content.

    ``.csv`` goes to :func:`load_csv`; ``.pickle``/``.pkl`` to :func:`load_snapshot`;
    other files are snapshots when they start like a binary pickle (``0x80``), CSV otherwise.

    Args:
        path (str or os.PathLike): the file.
        **kwargs: passed to :func:`load_snapshot` (e.g. ``device``).

    Returns:
        Trace: the loaded trace.

    Raises:
        ValueError: as the chosen loader.
        ValueError: also when ``path`` is not a regular file (a directory, FIFO, device such
            as ``/dev/zero``, or socket), refused before reading anything.
        OSError: the file cannot be read.
    """
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return load_csv(path)
    if suffix in (".pickle", ".pkl"):
        return load_snapshot(path, **kwargs)
    with _open_regular(path) as f:
        head = f.read(1)
    if head == b"\x80":
        return load_snapshot(path, **kwargs)
    return load_csv(path)


# --------------------------------------------------------------------------------------------
# Export of a planned run
# --------------------------------------------------------------------------------------------


def _check_plan(trace: Trace, offsets: Sequence[int]) -> Tuple[List[int], int]:
    """Validate a plan; return the offsets as ints and the plan size in bytes."""
    if len(offsets) != len(trace.entries):
        raise ValueError(
            f"the plan has {len(offsets)} offsets for a trace of {len(trace.entries)} buffers"
        )
    offs: List[int] = []
    for i, o in enumerate(offsets):
        try:
            value = _to_int(o, f"offsets[{i}]")
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
            buffers live at the same time overlap, or ``segment_size`` is smaller than the plan.
    """
    offs, plan_size = _check_plan(trace, offsets)
    base_address = _to_int(base_address, "base_address")
    device = _to_int(device, "device")
    if base_address < 0 or device < 0:
        raise ValueError("base_address and device must be >= 0")
    if segment_size is None:
        segment_size = -(-plan_size // _MIN_BLOCK_SIZE) * _MIN_BLOCK_SIZE
    segment_size = _to_int(segment_size, "segment_size")
    if segment_size < plan_size:
        raise ValueError(
            f"segment_size {segment_size} is smaller than the plan ({plan_size} bytes)"
        )
    if stream is None:
        stream = trace.entries[0].stream if trace.entries else 0
    stream = _to_int(stream, "stream")

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
    atomically.

    Args:
        snapshot (dict): a snapshot, e.g. from :func:`to_snapshot`.
        path (str or os.PathLike): where to write it.

    Raises:
        ValueError: ``snapshot`` is not a snapshot dict or holds something other than plain
            data (the file is then left untouched).
        OSError: the file cannot be written.
    """
    target = os.fspath(path)
    _check_snapshot_shape(snapshot, _Where(target))
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".snapshot-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            _PlainPickler(f, protocol=_EXPORT_PROTOCOL).dump(snapshot)
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
