"""The safe unpickler of trace files: reading a pickle never executes code.

Security invariants (tests/test_trace.py holds each; change none without a test):

* Loading a file never executes code from it: :class:`SafeUnpickler` refuses every global
  (``find_class``) and every persistent id, so a pickle can only build dicts, lists, tuples,
  strings, numbers, bytes and sets. ``REDUCE``, ``BUILD``, ``NEWOBJ``, ``OBJ`` and ``INST``
  need a callable or class that only a global can provide.
* Before unpickling, the file's opcodes are scanned without building anything
  (:func:`check_pickle_structure`): containers nested deeper than :data:`PICKLE_MAX_DEPTH`
  levels are refused, so building, hashing or printing the loaded data cannot overflow the C
  stack (CPython's tuple hash recurses in C), and absurd memo indices are refused, so the
  unpickler never sizes its memo from the file. Dict keys and set elements must be strings,
  bytes, ``None``, bools or 64-bit integers: no file can make hashing quadratic, so loading
  is linear in the file size.
  The scan also refuses filling a container that is already inside another one (a cycle,
  or a chain linked first and filled innermost-last), ``DUP`` of a container, and the
  opcodes plain data never needs (``REDUCE``, ``BUILD``, ``EXT1``, ...). It runs in C
  (``csrc/pickle_scan/pickle_scan.c``) when built, else in Python
  (:func:`check_pickle_structure_py`); the two accept and refuse the same files with the
  same messages (tests/test_trace_pickle_scan.py, which also runs the malicious inputs on
  both).
* A file that is compressed (gzip, bzip2, xz, zstd), a zip archive or JSON is named as
  such, never unpickled.
* Only regular files are read (:func:`open_regular`): a directory, FIFO, device
  (``/dev/zero``) or socket is refused before anything is read, on the opened descriptor
  (what is read is what was checked).
* A refused or corrupt pickle raises :class:`ValueError` naming the file; nothing else
  escapes (:func:`safe_unpickle`).
* Only the standard library is imported, and the package's own C scan
  (``trace._pickle_scan``: CPython's C API only, no torch, no ``_C``).
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import stat
from typing import Any, Dict, List

from torch_renaissance.trace.common import EXPECTED_SNAPSHOT, PathLike, foreign_format

try:  # the structure scan in C (csrc/pickle_scan/pickle_scan.c); Python when not built
    from torch_renaissance.trace import _pickle_scan as _scan
except ImportError:  # pragma: no cover (built by setup.py)
    _scan = None


class RefusedGlobal(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only.

    Every way a pickle can reach code goes through a global (``GLOBAL``, ``STACK_GLOBAL``,
    ``INST`` and the ``EXT*`` opcodes all call ``find_class``; ``REDUCE``, ``BUILD``,
    ``NEWOBJ`` and ``OBJ`` need a callable or class that only a global can provide) or through
    a persistent id. Both are refused, so loading imports and calls nothing.
    """

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        what = f"{module}.{name}"
        raise RefusedGlobal(f"the global {what[:200]!s}{'...' if len(what) > 200 else ''}")

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise RefusedGlobal(f"a persistent id ({type(pid).__name__})")


#: Deepest container nesting a snapshot pickle may have. Real snapshots nest less than 10
#: levels (dict > list > dict > list of frames > dict); a tuple nested 200k deep crashes
#: CPython's tuple hash, so anything past this generous limit is refused before unpickling.
PICKLE_MAX_DEPTH = 200
#: Most items the unpickling stack may hold at once. ``pickle`` pushes at most one batch of
#: 1000 list items or dict pairs per nesting level; only a huge tuple or frozenset needs more.
#: Bounds the memory of the structure scan whatever the number of opcodes.
PICKLE_MAX_STACK = 1 << 22
#: Integers a dict key or set element may be: those that fit in 64 bits (``int64`` or
#: ``uint64``). CPython hashes an integer to itself modulo :data:`sys.hash_info.modulus`
#: (``2**61 - 1``), so at most 13 of them share a hash value; integers of any size would let a
#: file of 1 MB hold 100k keys of one hash and make building the dict quadratic (minutes).
KEY_INT_MIN = -(1 << 63)
KEY_INT_LIMIT = 1 << 64

# What each opcode does to the stack, for check_pickle_structure's generic path (the most
# frequent opcodes of real snapshots have their own branches in the loop).
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
    _OP_NOT_PLAIN,  # REDUCE, BUILD, EXT1, ...: plain data never needs it
) = range(19)
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
# How each opcode's argument is laid out after the opcode byte (the pickle format, as
# pickletools documents it): no argument, a fixed number of bytes, data after a length
# (1, 4 or 8 bytes, little-endian; "s4": signed), or a text line ending in "\n".
_ARG_LAYOUT: Dict[str, Any] = {
    **dict.fromkeys("BININT1 BINGET BINPUT PROTO EXT1".split(), 1),
    **dict.fromkeys("BININT2 EXT2".split(), 2),
    **dict.fromkeys("BININT LONG_BINGET LONG_BINPUT EXT4".split(), 4),
    **dict.fromkeys("BINFLOAT FRAME".split(), 8),
    **dict.fromkeys("SHORT_BINUNICODE SHORT_BINSTRING SHORT_BINBYTES LONG1".split(), "n1"),
    **dict.fromkeys("BINUNICODE BINBYTES".split(), "n4"),
    **dict.fromkeys("BINSTRING LONG4".split(), "s4"),
    **dict.fromkeys("BINUNICODE8 BINBYTES8 BYTEARRAY8".split(), "n8"),
    **dict.fromkeys("INT LONG FLOAT STRING UNICODE GET PUT PERSID GLOBAL INST".split(), "line"),
}
_COUNTED = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
# Opcodes that hash items, and which: every item (sets) or every other one from the first
# (dict keys; SETITEM's key is the item below the value).
_KEY_STRIDE = {"SETITEM": 2, "SETITEMS": 2, "DICT": 2, "ADDITEMS": 1, "FROZENSET": 1}
#: Per opcode byte: (name, effect, argument layout, keys stride), None for bytes that are
#: no opcode. Built from :mod:`pickletools`' opcode table (names and codes only).
_OPCODE_TABLE: List[Any] = [None] * 256
for _op in pickletools.opcodes:
    _OPCODE_TABLE[ord(_op.code)] = (
        _op.name, _OPCODE_EFFECTS.get(_op.name, _OP_NOT_PLAIN), _ARG_LAYOUT.get(_op.name, 0),
        _KEY_STRIDE.get(_op.name, 0),
    )
del _op
#: ``objs`` value of a stack item that is not a container and hashes safely (a string,
#: bytes, ``None``, a bool or an integer in ``[KEY_INT_MIN, KEY_INT_LIMIT)``).
_PRIMITIVE = -1
#: ``objs`` value of a stack item that must not be hashed: a float or an integer outside
#: ``[KEY_INT_MIN, KEY_INT_LIMIT)`` (containers have object numbers >= 0).
_UNSAFE_KEY = -2
#: Memo value of an entry never set.
_UNSET = -3


class BadPickle(Exception):
    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class _Truncated(Exception):
    pass


def _text_int(line: bytes) -> int:
    """The integer of an ``INT``/``LONG``/``GET``/``PUT`` text line, as the unpickler reads
    it (base 0, else base 10; ``LONG``'s ``L`` suffix dropped); raises ValueError when it is
    none."""
    if len(line) > 64:  # more digits than any 64-bit integer or memo index has
        raise ValueError("too long")
    text = line.decode("ascii")
    if text.endswith("L"):
        text = text[:-1]
    try:
        return int(text, 0)
    except ValueError:
        return int(text)  # "010": the C unpickler falls back to base 10


def _text_arg(name: str, line: bytes) -> int:
    """What the scan needs of a protocol-0 text argument: for ``INT``/``LONG``, whether the
    number is a safe key (``_PRIMITIVE``, else ``_UNSAFE_KEY``); for ``GET``/``PUT``, the
    memo index, or -1 when the line is no index (the scan then refuses it). Also called
    by the C scan (``_pickle_scan``) for these rare opcodes."""
    try:
        value = _text_int(line)
    except (ValueError, UnicodeDecodeError):
        value = None
    if name in ("GET", "PUT"):
        return value if value is not None and 0 <= value < (1 << 62) else -1
    if value is not None and KEY_INT_MIN <= value < KEY_INT_LIMIT:
        return _PRIMITIVE
    return _UNSAFE_KEY  # the unpickler refuses it, or it is a number too big for a key


def _number_key(op_name: str, arg: bytes) -> int:
    """``_PRIMITIVE`` when the number an opcode pushes is a safe key, else ``_UNSAFE_KEY``."""
    if op_name in ("FLOAT", "BINFLOAT"):
        return _UNSAFE_KEY
    if op_name in ("LONG1", "LONG4"):
        value = int.from_bytes(arg, "little", signed=True)
        return _PRIMITIVE if KEY_INT_MIN <= value < KEY_INT_LIMIT else _UNSAFE_KEY
    return _text_arg(op_name, arg)  # INT, LONG: text ("00" / "01" are False / True)


def check_pickle_structure(data: bytes) -> None:
    """Refuse a pickle that cannot be loaded safely and fast, without building any object.

    Walks the opcodes in one pass over the bytes and replays what the unpickler does to its
    stack. Each container the file builds gets an object number; per object the walk keeps
    its nesting depth (1 + the deepest item) and whether it is already inside another
    container. Per stack item it keeps its object number (or a mark for a string, bytes, a
    number or ``None``, which nest 0 deep), and per memo entry the object (or primitive)
    stored there, so a container read back with ``GET`` is the same object with its current
    depth. The opcodes real snapshots use most (``BINGET``, ``LONG_BINGET``, ``MEMOIZE``,
    ``MARK``, small integers, ``EMPTY_DICT``, ``SETITEMS``, ...) have their own branches; the
    rest go through a table of each opcode's argument layout and stack effect. Strings are
    skipped by their length, never decoded (the unpickler checks their encoding).

    A container is complete before it goes into another one in every pickle ``pickle``
    writes for acyclic data (a list is memoized empty, filled, then appended to its parent;
    a second reference is a ``GET`` of the finished object). The walk refuses filling a
    container with containers once it is inside another container: that is how a file could
    link empty lists first and fill them innermost-last, nesting deeper than any depth the
    walk saw, and it is also how a cycle is made. ``DUP`` of a container is refused for the
    same reason (``pickle`` never writes ``DUP``). So every depth the walk computes is final
    and the nesting limit holds for the object the unpickler builds.

    The walk stops at the first opcode naming a global or a persistent id: the unpickler
    refuses that opcode before building anything after it. Time and memory are linear in
    the file size; the stack is capped at :data:`PICKLE_MAX_STACK` items, the memo at eight
    bytes per byte of file (one list slot per memo index, which must be below the file
    size) and the object table at two bytes per container.

    Dict keys and set elements must be strings, bytes, ``None``, booleans or integers in
    ``[-2**63, 2**64)``. Those never make building a dict slow: string and bytes hashes are
    randomized per process, and at most 13 such integers share a hash value. Floats, bigger
    integers, tuples and frozensets can be made to share one hash by the thousand (CPython's
    integer hash is the value modulo ``2**61 - 1``, and tuple and frozenset hashes combine
    their items' hashes invertibly), which makes unpickling quadratic: a 1 MB file then
    takes minutes. PyTorch's snapshots key every dict by strings.

    The walk runs in C (``csrc/pickle_scan/pickle_scan.c``, the module
    ``torch_renaissance.trace._pickle_scan``) when that module is built, else in Python
    (:func:`check_pickle_structure_py`, the reference: both accept and refuse the same files,
    tests/test_trace_pickle_scan.py). On the shared snapshots the C scan takes a quarter to
    two fifths of ``pickle.loads``' time (about 3 ms per MB), the whole safe load 1.0-2.0x
    ``pickle.loads``; with the Python scan the load takes 14-27x (docs/benchmarks.md).

    Raises:
        BadPickle: the file is nested deeper than :data:`PICKLE_MAX_DEPTH`, fills a container
            that is already inside another one (a cycle or a crafted chain), keeps more than
            :data:`PICKLE_MAX_STACK` items on the stack, uses an opcode that plain data never
            needs (``REDUCE``, ``BUILD``, ``EXT1``, ...), hashes a key that is not allowed
            above, or is not a well-formed pickle (truncated, unknown opcode, stack underflow,
            memo index out of range or not set, containers put into a string or number).
    """
    if _scan is not None:
        failure = _scan.scan(data, PICKLE_MAX_DEPTH, PICKLE_MAX_STACK, _text_arg)
        if failure is not None:
            message, refused, pos = failure
            raise BadPickle(f"{message} (opcode at byte {pos})", refused=refused)
        return
    check_pickle_structure_py(data)


def check_pickle_structure_py(data: bytes) -> None:
    """:func:`check_pickle_structure` in Python: the reference of the C scan and its fallback.

    Raises:
        BadPickle: as :func:`check_pickle_structure`, with the same messages.
    """
    limit, max_stack, size = PICKLE_MAX_DEPTH, PICKLE_MAX_STACK, len(data)
    # Per stack item: its container's object number (>= 0), _PRIMITIVE or _UNSAFE_KEY.
    objs: List[int] = []
    marks: List[int] = []  # stack lengths at the open MARKs
    odepth = bytearray()  # per container: its depth (1 <= depth <= limit < 255)
    inside = bytearray()  # per container: 1 once it is an item of another container
    # Per memo index: the stored stack item's objs value, or _UNSET. At least 256 entries,
    # so BINGET needs no bounds check; grown as PUTs need (indices are below the file size).
    memo: List[int] = [_UNSET] * 256
    memo_count = 0  # set memo entries (the index MEMOIZE uses)
    push = objs.append
    new_obj, new_inside = odepth.append, inside.append

    def deeper(d: int) -> int:
        if d > limit:
            raise BadPickle(
                f"refusing to load: the pickle nests containers {d} levels deep, more than the "
                f"{limit} allowed (memory snapshots nest fewer than 20)",
                refused=True,
            )
        return d

    def fence() -> int:
        return marks[-1] if marks else 0

    def check_keys(start: int, stride: int, name: str) -> None:
        # The items that name hashes: stack[start::stride]; all must be safe primitives.
        keys = objs[start::stride]
        if keys.count(_PRIMITIVE) == len(keys):
            return
        raise BadPickle(
            f"refusing to load: {name} makes a {'set element' if stride == 1 else 'dict key'} "
            "of a float, a container or an integer outside [-2**63, 2**64); such keys "
            "can share one hash by the thousand and make loading take quadratic time (memory "
            "snapshots key their dicts by strings)",
            refused=True,
        )

    def take(start: int) -> int:
        """Pops the stack items from ``start`` into a container; the depth they give it
        (0 for no items, 1 for primitives only)."""
        items = objs[start:]
        del objs[start:]
        if not items:
            return 0
        d = 1
        if max(items) >= 0:  # some items are containers: each is now inside another one
            for o in items:
                if o >= 0:
                    inside[o] = 1
                    if odepth[o] >= d:
                        d = odepth[o] + 1
        return d

    def new_container(d: int) -> None:
        push(len(odepth))
        new_obj(deeper(d))
        new_inside(0)

    def fill(target: int, d: int, name: str) -> None:  # stack[target] gets items of depth d - 1
        o = objs[target]
        if o < 0:
            if d > 1:  # the unpickler fails there too; say why now
                raise BadPickle(f"{name} puts containers into a string or number")
            return
        if d > 1 and inside[o]:
            raise BadPickle(
                f"refusing to load: {name} fills a container that is already inside another "
                "one (a cycle, or a chain built to nest deeper than the limit; pickle never "
                "writes that for plain data)",
                refused=True,
            )
        if d > odepth[o]:
            odepth[o] = deeper(d)

    def fill_from_mark(name: str, stride: int) -> None:
        if not marks:
            raise BadPickle(f"{name} without a MARK")
        k = marks.pop()
        if stride:
            check_keys(k, stride, name)
        if len(objs) > k:  # there are items, for the container just below the mark
            if k == 0:
                raise BadPickle(f"stack underflow at {name}")
            fill(k - 1, take(k), name)

    def memo_put(idx: int, name: str) -> None:
        nonlocal memo_count
        if len(objs) <= fence():
            raise BadPickle(f"stack underflow at {name}")
        if not 0 <= idx < size:  # pickle numbers its memo entries 0, 1, 2, ...
            raise BadPickle(f"{name} of memo index {idx}, out of range")
        if idx >= len(memo):
            memo.extend([_UNSET] * (idx + 1 - len(memo)))
        if memo[idx] == _UNSET:
            memo_count += 1
        memo[idx] = objs[-1]

    def not_set(name: str, idx: int) -> BadPickle:
        return BadPickle(f"{name} of memo index {idx}, which is not set")

    pos = at = last = 0
    try:
        while True:
            last, at = at, pos  # the fast branches skip arguments unread: see the handler
            op = data[pos]
            # The opcodes of real snapshots, most frequent first (90% are BINGET/LONG_BINGET).
            if op == 0x68:  # BINGET
                v = memo[data[pos + 1]]
                if v == _UNSET:
                    raise not_set("BINGET", data[pos + 1])
                push(v)
                pos += 2
            elif op == 0x6A:  # LONG_BINGET
                i = data[pos + 1] | data[pos + 2] << 8 | data[pos + 3] << 16 | data[pos + 4] << 24
                v = memo[i] if i < len(memo) else _UNSET
                if v == _UNSET:
                    raise not_set("LONG_BINGET", i)
                push(v)
                pos += 5
            elif op == 0x94:  # MEMOIZE
                memo_put(memo_count, "MEMOIZE")
                pos += 1
                continue
            elif op == 0x28:  # MARK
                deeper(len(marks) + 1)  # each open MARK is a container being built
                marks.append(len(objs))
                pos += 1
                continue
            elif op == 0x4B:  # BININT1
                push(_PRIMITIVE)
                pos += 2
            elif op == 0x7D or op == 0x5D:  # EMPTY_DICT, EMPTY_LIST
                push(len(odepth))
                new_obj(1)
                new_inside(0)
                pos += 1
            elif op == 0x75:  # SETITEMS
                fill_from_mark("SETITEMS", 2)
                pos += 1
                continue
            elif op == 0x65:  # APPENDS
                fill_from_mark("APPENDS", 0)
                pos += 1
                continue
            elif op == 0x4A:  # BININT
                push(_PRIMITIVE)
                pos += 5
            elif op == 0x8C:  # SHORT_BINUNICODE
                push(_PRIMITIVE)
                pos += 2 + data[pos + 1]
            elif op == 0x8A and data[pos + 1] <= 8:  # LONG1 of at most 8 bytes: an int64
                push(_PRIMITIVE)
                pos += 2 + data[pos + 1]
            else:  # the rest: by the table
                entry = _OPCODE_TABLE[op]
                if entry is None:
                    raise BadPickle(f"unknown opcode (byte {op})")
                name, effect, layout, stride = entry
                pos += 1
                arg: Any = None
                if layout:
                    if layout.__class__ is int:  # a fixed number of bytes, little-endian
                        if pos + layout > size:
                            raise _Truncated
                        arg = int.from_bytes(data[pos:pos + layout], "little")
                        pos += layout
                    elif layout == "line":
                        end = data.find(b"\n", pos)
                        if end < 0:
                            raise _Truncated
                        arg = data[pos:end]
                        pos = end + 1
                    else:  # data after its length
                        width = 1 if layout == "n1" else 8 if layout == "n8" else 4
                        if pos + width > size:
                            raise _Truncated
                        n = int.from_bytes(data[pos:pos + width], "little",
                                           signed=layout == "s4")
                        if n < 0:
                            raise BadPickle(f"{name} with a negative length ({n})")
                        pos += width + n
                        if pos > size:
                            raise _Truncated
                        arg = data[pos - n:pos] if effect == _OP_PUSH_NUMBER else None
                if effect == _OP_PUSH_PRIMITIVE:
                    push(_PRIMITIVE)
                elif effect == _OP_PUSH_NUMBER:
                    push(_number_key(name, arg))
                elif effect == _OP_GET:
                    if layout == "line":
                        arg = _text_arg(name, arg)
                    v = memo[arg] if 0 <= arg < len(memo) else _UNSET
                    if v == _UNSET:
                        raise not_set(name, arg)
                    push(v)
                elif effect == _OP_PUT:
                    if layout == "line":
                        arg = _text_arg(name, arg)
                    memo_put(arg, name)
                    continue
                elif effect == _OP_MEMOIZE:
                    memo_put(memo_count, name)
                    continue
                elif effect == _OP_MARK:
                    deeper(len(marks) + 1)
                    marks.append(len(objs))
                    continue
                elif effect == _OP_PUSH_EMPTY:
                    new_container(1)
                elif effect == _OP_FILL_FROM_MARK:
                    fill_from_mark(name, stride)
                    continue
                elif effect == _OP_BUILD_FROM_MARK:
                    if not marks:
                        raise BadPickle(f"{name} without a MARK")
                    k = marks.pop()
                    if stride:
                        check_keys(k, stride, name)
                    new_container(max(take(k), 1))
                    # no continue: an empty MARK gives one item more (the stack cap below)
                elif effect == _OP_APPEND or effect == _OP_SETITEM:
                    x = len(objs) - (1 if effect == _OP_APPEND else 2)  # the container is at x - 1
                    if x < 1 or x < fence():
                        raise BadPickle(f"stack underflow at {name}")
                    if stride:
                        check_keys(x, 2, name)
                    fill(x - 1, take(x), name)
                    continue
                elif effect == _OP_BUILD_COUNTED:
                    x = len(objs) - _COUNTED[name]
                    if x < fence():
                        raise BadPickle(f"stack underflow at {name}")
                    new_container(take(x))
                    continue
                elif effect == _OP_DUP:
                    if len(objs) <= fence():
                        raise BadPickle(f"stack underflow at {name}")
                    if objs[-1] >= 0:
                        raise BadPickle(
                            "refusing to load: DUP of a container (pickle never writes DUP; two "
                            "stack copies of one container could hide its depth)",
                            refused=True,
                        )
                    push(objs[-1])
                elif effect == _OP_POP:
                    if marks and marks[-1] == len(objs):
                        marks.pop()
                    elif len(objs) > fence():
                        objs.pop()
                    else:
                        raise BadPickle(f"stack underflow at {name}")
                    continue
                elif effect == _OP_POP_MARK:
                    if not marks:
                        raise BadPickle(f"{name} without a MARK")
                    del objs[marks.pop():]
                    continue
                elif effect == _OP_NOTHING:
                    continue
                elif effect == _OP_STOP:
                    if len(objs) <= fence():
                        raise BadPickle(f"stack underflow at {name}")
                    return
                elif effect == _OP_REFUSED:
                    return  # SafeUnpickler refuses this opcode before building anything after it
                else:
                    raise BadPickle(
                        f"refusing to load: the pickle uses the opcode {name}, which plain data "
                        "(dicts, lists, strings, numbers) never needs",
                        refused=True,
                    )
            if len(objs) > max_stack:  # after a push
                raise BadPickle(
                    f"refusing to load: the pickle keeps more than {max_stack} items on the "
                    "unpickling stack",
                    refused=True,
                )
    except BadPickle as exc:
        raise BadPickle(f"{exc} (opcode at byte {at})", refused=exc.refused) from None
    except (IndexError, _Truncated):  # an opcode or its argument runs past the end
        if at > size:  # the previous opcode's argument ran past the end, found at the next one
            at = last
        raise BadPickle(f"pickle data was truncated: {size} bytes (opcode at byte {at})") from None
    except MemoryError:
        raise BadPickle("MemoryError") from None


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: PathLike) -> io.BufferedReader:
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


def safe_unpickle(path: PathLike) -> Any:
    source = os.fspath(path)
    with open_regular(path) as f:
        data = f.read()
    foreign = foreign_format(data[:16], EXPECTED_SNAPSHOT)
    if foreign:
        raise ValueError(f"{source}: not a pickle: {foreign}")
    try:
        check_pickle_structure(data)
    except BadPickle as exc:
        if exc.refused:
            raise ValueError(f"{source}: {exc}") from None
        raise ValueError(f"{source}: not a readable pickle (truncated or corrupt): {exc}") from None
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except RefusedGlobal as exc:
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
