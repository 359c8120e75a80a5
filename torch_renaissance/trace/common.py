"""What every part of the trace package shares: the limits every trace keeps
(sizes below ``2**63``, times below ``2**62``, addresses below ``2**64``) and
the integer helpers of the loaders' error messages. Standard library only."""
from __future__ import annotations

import operator
import os
import re
import reprlib
from typing import Any, Optional, Union


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


#: What the trace loaders expect, for the messages of :func:`foreign_format`.
EXPECTED_SNAPSHOT = ("expected a PyTorch memory snapshot: the pickle that "
                     "torch.cuda.memory._dump_snapshot writes")
EXPECTED_CSV = "expected a CSV trace: a header id,lower,upper,size (optional) and rows of integers"
# Magic numbers of compressed files and archives (RFC 1952, bzip2, xz, RFC 8878, zip); none
# can start a valid snapshot pickle (whose first opcode is PROTO 0x80, or MARK / EMPTY_DICT
# followed by another opcode in protocols 0-1) or a CSV trace.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip-compressed; decompress it first (gunzip FILE)"),
    (b"BZh", "bzip2-compressed; decompress it first (bunzip2 FILE)"),
    (b"\xfd7zXZ\x00", "xz-compressed; decompress it first (unxz FILE)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed; decompress it first (unzstd FILE)"),
    (b"PK\x03\x04", "a zip archive; extract the trace from it first"),
)


def foreign_format(head: bytes, expected: str) -> Optional[str]:
    """What a file that starts with ``head`` is, when it is a format no trace loader reads
    (compressed, an archive, JSON), as the end of an error message; None otherwise.

    Args:
        head (bytes): the file's first bytes (16 are enough).
        expected (str): what the loader expected (:data:`EXPECTED_SNAPSHOT`,
            :data:`EXPECTED_CSV`), named in the JSON message.
    """
    for magic, what in _COMPRESSED:
        if head.startswith(magic):
            return f"the file is {what}"
    if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"["):  # neither is a pickle opcode
        return f"the file is JSON text; {expected}"
    return None
