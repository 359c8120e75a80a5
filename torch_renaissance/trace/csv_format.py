"""CSV planning instances ``id,lower,upper,size`` (the format of the
MiniMalloc, SOMAS and IOPDDL benchmark sets) as traces. Malformed input raises
:class:`ValueError` naming the file and the line."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from torch_renaissance.trace.common import (
    CSV_COLUMNS, EXPECTED_CSV, INT_RE, PathLike, SIZE_LIMIT, TIME_LIMIT, foreign_format,
)
from torch_renaissance.trace.entries import Trace, TraceEntry
from torch_renaissance.trace.safe_pickle import open_regular


# Per column: the exclusive upper bound of its values (every column is >= 0).
_CSV_LIMITS = {"id": SIZE_LIMIT, "lower": TIME_LIMIT, "upper": TIME_LIMIT, "size": SIZE_LIMIT}


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _csv_int(x: str, name: str) -> int:
    """Parse one CSV field (ASCII digits, optional sign) and check it against its bounds.

    Raises:
        ValueError: not an integer, negative, or not below the column's bound. The message
            lacks the ``file:line:`` prefix; the caller adds it.
    """
    if not INT_RE.fullmatch(x):
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
        ValueError: the file is compressed (gzip, bzip2, xz, zstd), a zip archive or JSON
            (the message says which), or not UTF-8.
        ValueError: also when ``path`` is not a regular file (a directory, FIFO, device such
            as ``/dev/zero``, or socket), refused before reading anything.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    with open_regular(path) as f:
        raw = f.read()
    foreign = foreign_format(raw[:16], EXPECTED_CSV)
    if foreign:
        raise ValueError(f"{source}: not a CSV trace: {foreign}")
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
            if len(fields) == 4 and all(INT_RE.fullmatch(x) for x in fields):
                columns = {name: i for i, name in enumerate(CSV_COLUMNS)}
                nfields = 4
            else:
                names = [x.lower() for x in fields]
                missing = [c for c in CSV_COLUMNS if c not in names]
                if missing:
                    raise ValueError(
                        f"{source}:{lineno}: the header {_clip(line)!r} lacks the column(s) "
                        f"{', '.join(missing)} (expected id,lower,upper,size)"
                    )
                dups = sorted({c for c in CSV_COLUMNS if names.count(c) > 1})
                if dups:
                    raise ValueError(f"{source}:{lineno}: the header repeats {', '.join(dups)}")
                columns = {c: names.index(c) for c in CSV_COLUMNS}
                nfields = len(fields)
                header_line = lineno
                continue
        if len(fields) != nfields:
            raise ValueError(
                f"{source}:{lineno}: expected {nfields} fields, got {len(fields)}: {_clip(line)!r}"
            )
        try:
            ident, lower, upper, size = (_csv_int(fields[columns[c]], c) for c in CSV_COLUMNS)
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
