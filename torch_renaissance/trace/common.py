"""What every part of the trace package shares: the limits every trace keeps
(sizes below ``2**63``, times below ``2**62``, addresses below ``2**64``) and
the integer helpers of the loaders' error messages. Standard library only."""
from __future__ import annotations

import operator
import os
import re
import reprlib
from typing import Any, Union


PathLike = Union[str, "os.PathLike[str]"]

#: Default base address of an exported plan: a 2 MiB-aligned address in the range where the
#: CUDA driver places device allocations, so that exported files look like real ones.
DEFAULT_BASE_ADDRESS = 0x7F00_0000_0000

# kMinBlockSize in c10/cuda/CUDACachingAllocator.cpp: every block is a multiple of it.
MIN_BLOCK_SIZE = 512

# Pickle protocol of exported files. MemoryViz.js's unpickler reads protocols 2 to 4 only.
EXPORT_PROTOCOL = 4

#: Sizes in bytes are below this (``uint64`` in the planner, ``int64`` in PyTorch).
SIZE_LIMIT = 1 << 63
#: Logical times are below this (``int64`` in the planner, with room for ``lower + period``).
TIME_LIMIT = 1 << 62
#: Addresses in snapshots are below this (64-bit pointers). Addresses key the loader's dicts:
#: bounded, at most 9 of them share a hash value (CPython hashes an int modulo 2**61 - 1), so
#: a file of colliding addresses cannot make loading quadratic.
ADDRESS_LIMIT = 1 << 64
#: Stream ids are below this (a ``cudaStream_t`` as an integer, >= 0).
STREAM_LIMIT = 1 << 64
#: Device indices are below this (CUDA's ``int`` ordinals; ``c10::DeviceIndex`` is smaller).
DEVICE_LIMIT = 1 << 31

INT_RE = re.compile(r"[+-]?[0-9]+")
CSV_COLUMNS = ("id", "lower", "upper", "size")
ACTIVE_STATES = ("active_allocated", "active_pending_free")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def fmt_int(value: int) -> str:
    """``str(value)``, also for integers too long for ``str`` (``sys.int_info`` digit limit)."""
    if value.bit_length() > 128:
        return f"a{' negative' if value < 0 else 'n'} integer of {value.bit_length()} bits"
    return str(value)


def brief(value: Any) -> str:
    """A short ``repr`` of a value read from a file, for error messages; never raises."""
    if is_int(value):
        return fmt_int(value)
    try:
        return reprlib.repr(value)
    except Exception:  # e.g. a tuple holding an integer too long for repr
        return f"<{type(value).__name__}>"


def to_int(value: Any, what: str) -> int:
    """``operator.index`` that also refuses ``bool``: accepts ``int`` and NumPy integers."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}") from None
