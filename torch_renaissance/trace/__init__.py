"""Traces: the allocations of one step, read from real files and written back out.

A :class:`Trace` is what the planner plans: one :class:`TraceEntry` per buffer, with its
size in bytes, its stream and its lifetime ``[alloc_time, free_time)`` in a logical clock.
One module per concept:

* :mod:`~torch_renaissance.trace.entries` - the trace type (:class:`Trace`, :class:`TraceEntry`);
* :mod:`~torch_renaissance.trace.safe_pickle` - the unpickler that never executes code from a
  file, with its security invariants at the top;
* :mod:`~torch_renaissance.trace.snapshot` - PyTorch memory snapshots
  (``torch.cuda.memory._dump_snapshot`` pickles) as traces;
* :mod:`~torch_renaissance.trace.csv_format` - CSV planning instances ``id,lower,upper,size``
  (the MiniMalloc, SOMAS and IOPDDL benchmark sets);
* :mod:`~torch_renaissance.trace.load` - :func:`load_trace`, either kind by extension or content;
* :mod:`~torch_renaissance.trace.export` - a *planned* run written back out in the snapshot
  format, so that PyTorch's memory viewer shows the packing, and :func:`plot_plan`;
* :mod:`~torch_renaissance.trace.common` - the limits every trace keeps and shared helpers.

Invariants kept by the package:

* Loading a file never executes code from it (:mod:`~torch_renaissance.trace.safe_pickle`).
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
  :func:`plot_plan` when called), and the package's own C structure scan
  ``trace._pickle_scan`` when it is built (CPython's C API only; the same scan runs in
  Python without it); nothing from the rest of the package or from ``_C``.
* Two buffers live at the same time never share bytes, and a buffer known from a
  snapshot's segments is never larger than its block.

``torch_renaissance/trace.py`` was this package's single module; every name it had is
importable from here as before.
"""
from __future__ import annotations

from torch_renaissance.trace.common import DEFAULT_BASE_ADDRESS, PathLike
from torch_renaissance.trace.csv_format import load_csv
from torch_renaissance.trace.entries import Trace, TraceEntry
from torch_renaissance.trace.export import plot_plan, save_snapshot, to_snapshot
from torch_renaissance.trace.load import load_trace
from torch_renaissance.trace.safe_pickle import (
    PICKLE_MAX_DEPTH,
    BadPickle,
    RefusedGlobal,
    SafeUnpickler,
    check_pickle_structure,
    open_regular,
    safe_unpickle,
)
from torch_renaissance.trace.snapshot import (
    DeviceChoiceError,
    from_snapshot,
    is_snapshot_file,
    load_snapshot,
    load_snapshot_devices,
    snapshot_devices,
)

# The old module's private names (tests and scripts used some of them).
_check_pickle_structure = check_pickle_structure
_safe_unpickle = safe_unpickle
_open_regular = open_regular
_SafeUnpickler = SafeUnpickler
_BadPickle = BadPickle
_RefusedGlobal = RefusedGlobal
_PICKLE_MAX_DEPTH = PICKLE_MAX_DEPTH  # to read; the limit in force is safe_pickle.PICKLE_MAX_DEPTH

__all__ = [
    "DEFAULT_BASE_ADDRESS",
    "DeviceChoiceError",
    "PathLike",
    "Trace",
    "TraceEntry",
    "from_snapshot",
    "is_snapshot_file",
    "load_csv",
    "load_snapshot",
    "load_snapshot_devices",
    "load_trace",
    "plot_plan",
    "save_snapshot",
    "snapshot_devices",
    "to_snapshot",
]
