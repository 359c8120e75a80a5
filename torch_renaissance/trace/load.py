"""Loading a trace file of either kind, chosen by extension, else by content."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch_renaissance.trace.common import EXPECTED_CSV, EXPECTED_SNAPSHOT, PathLike, foreign_format
from torch_renaissance.trace.csv_format import load_csv
from torch_renaissance.trace.entries import Trace
from torch_renaissance.trace.safe_pickle import open_regular
from torch_renaissance.trace.snapshot import load_snapshot


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
        ValueError: the file has neither extension and is compressed (gzip, bzip2, xz,
            zstd), a zip archive or JSON: the message says which.
        ValueError: also when ``path`` is not a regular file (a directory, FIFO, device such
            as ``/dev/zero``, or socket), refused before reading anything.
        OSError: the file cannot be read.
    """
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return load_csv(path)
    if suffix in (".pickle", ".pkl"):
        return load_snapshot(path, **kwargs)
    with open_regular(path) as f:
        head = f.read(16)
    foreign = foreign_format(head, f"{EXPECTED_SNAPSHOT}, or {EXPECTED_CSV[len('expected '):]}")
    if foreign:
        raise ValueError(f"{os.fspath(path)}: not a trace: {foreign}")
    if head[:1] == b"\x80":
        return load_snapshot(path, **kwargs)
    return load_csv(path)
