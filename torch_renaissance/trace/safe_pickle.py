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
* Only regular files are read (:func:`open_regular`): a directory, FIFO, device
  (``/dev/zero``) or socket is refused before anything is read, on the opened descriptor
  (what is read is what was checked).
* A refused or corrupt pickle raises :class:`ValueError` naming the file; nothing else
  escapes (:func:`safe_unpickle`).
* Only the standard library is imported.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import stat
from array import array
from typing import Any, Dict, List

from torch_renaissance.trace.common import PathLike


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

# What each opcode does to the stack, for check_pickle_structure.
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
#: ``objs`` value of a stack item that is not a container and hashes safely (a string,
#: bytes, ``None``, a bool or an integer in ``[KEY_INT_MIN, KEY_INT_LIMIT)``).
_PRIMITIVE = -1
#: ``objs`` value of a stack item that must not be hashed: a float or an integer outside
#: ``[KEY_INT_MIN, KEY_INT_LIMIT)`` (containers have object numbers >= 0).
_UNSAFE_KEY = -2
# The same, keyed by the opcode objects pickletools.genops yields (faster than by name).
_EFFECT_OF_OP = {op: _OPCODE_EFFECTS.get(op.name) for op in pickletools.opcodes}


class BadPickle(Exception):
    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def check_pickle_structure(data: bytes) -> None:
    """Refuse a pickle that cannot be loaded safely and fast, without building any object.

    Walks the opcodes with :func:`pickletools.genops` and replays what the unpickler does to
    its stack. Each container the file builds gets an object number; per object the walk
    keeps its nesting depth (1 + the deepest item) and whether it is already inside another
    container. Per stack item it keeps the depth of what it holds (0 for strings, numbers,
    bytes and ``None``) and its object number, and per memo entry the object (or primitive)
    stored there, so a container read back with ``GET`` is the same object with its current
    depth.

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
    the file size; the stack is capped at :data:`PICKLE_MAX_STACK` items, the memo at four
    bytes per byte of file (eight past 2 GiB) and the object table at two bytes per container.

    Dict keys and set elements must be strings, bytes, ``None``, booleans or integers in
    ``[-2**63, 2**64)``. Those never make building a dict slow: string and bytes hashes are
    randomized per process, and at most 13 such integers share a hash value. Floats, bigger
    integers, tuples and frozensets can be made to share one hash by the thousand (CPython's
    integer hash is the value modulo ``2**61 - 1``, and tuple and frozenset hashes combine
    their items' hashes invertibly), which makes unpickling quadratic: a 1 MB file then
    takes minutes. PyTorch's snapshots key every dict by strings.

    Raises:
        BadPickle: the file is nested deeper than :data:`PICKLE_MAX_DEPTH`, fills a container
            that is already inside another one (a cycle or a crafted chain), keeps more than
            :data:`PICKLE_MAX_STACK` items on the stack, uses an opcode that plain data never
            needs (``REDUCE``, ``BUILD``, ``EXT1``, ...), hashes a key that is not allowed
            above, or is not a well-formed pickle (truncated, unknown opcode, stack underflow,
            memo index out of range).
    """
    limit, max_stack, size = PICKLE_MAX_DEPTH, PICKLE_MAX_STACK, len(data)
    depths = bytearray()  # per stack item: the depth of its object (<= limit < 255)
    # per stack item: its container's object number, _PRIMITIVE or _UNSAFE_KEY
    objs: List[int] = []
    marks: List[int] = []  # stack lengths at the open MARKs
    odepth = bytearray()  # per container: its depth (>= 1)
    inside = bytearray()  # per container: 1 once it is an item of another container
    # per memo index: 0 when unset, else the stored stack item's objs value + 3
    memo = array("i" if size < (1 << 31) - 3 else "q")
    memo_count = 0  # set memo entries (the index MEMOIZE uses)
    effect_of = _EFFECT_OF_OP.get
    push, push_obj = depths.append, objs.append
    key_min, key_limit = KEY_INT_MIN, KEY_INT_LIMIT

    def deeper(d: int) -> int:
        if d > limit:
            raise BadPickle(
                f"refusing to load: the pickle nests containers {d} levels deep, more than the "
                f"{limit} allowed (memory snapshots nest fewer than 20)",
                refused=True,
            )
        return d

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
        """Pops the stack items from ``start`` into a container; the depth they give it."""
        d = max(depths[start:], default=-1) + 1
        if d > 1:  # some items are containers: each is now inside another one
            for o in objs[start:]:
                if o >= 0:
                    inside[o] = 1
        del depths[start:], objs[start:]
        return d

    def new_container(d: int) -> None:
        push(deeper(d))
        push_obj(len(odepth))
        odepth.append(d)
        inside.append(0)

    def fill(target: int, d: int, name: str) -> None:  # stack[target] gets items of depth d - 1
        o = objs[target]
        if d > 1 and o >= 0 and inside[o]:
            raise BadPickle(
                f"refusing to load: {name} fills a container that is already inside another "
                "one (a cycle, or a chain built to nest deeper than the limit; pickle never "
                "writes that for plain data)",
                refused=True,
            )
        if d > depths[target]:
            depths[target] = deeper(d)
            if o >= 0:
                odepth[o] = d

    pos = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            effect = effect_of(op)
            if effect == _OP_GET:
                v = (memo[arg] if 0 <= arg < len(memo) else 0) - 3
                if v < -2:
                    raise BadPickle(f"{op.name} of memo index {arg}, which is not set")
                push(odepth[v] if v >= 0 else 0)
                push_obj(v)
            elif effect == _OP_PUSH_PRIMITIVE:
                push(0)
                push_obj(_PRIMITIVE)
            elif effect == _OP_PUSH_NUMBER:  # float, or int (bool for INT's 00 / 01)
                push(0)
                push_obj(_PRIMITIVE if type(arg) is not float and key_min <= arg < key_limit
                         else _UNSAFE_KEY)
            elif effect == _OP_PUT or effect == _OP_MEMOIZE:
                if len(depths) <= (marks[-1] if marks else 0):
                    raise BadPickle(f"stack underflow at {op.name}")
                idx = memo_count if effect == _OP_MEMOIZE else arg
                if not 0 <= idx < size:  # pickle numbers its memo entries 0, 1, 2, ...
                    raise BadPickle(f"{op.name} of memo index {idx}, out of range")
                if idx >= len(memo):
                    memo.frombytes(bytes(memo.itemsize * (idx + 1 - len(memo))))
                if not memo[idx]:
                    memo_count += 1
                memo[idx] = objs[-1] + 3
                continue
            elif effect == _OP_MARK:
                deeper(len(marks) + 1)  # each open MARK is a container being built
                marks.append(len(depths))
                continue
            elif effect == _OP_PUSH_EMPTY:
                new_container(1)
            elif effect == _OP_FILL_FROM_MARK or effect == _OP_BUILD_FROM_MARK:
                if not marks:
                    raise BadPickle(f"{op.name} without a MARK")
                k = marks.pop()
                stride = _KEY_STRIDE.get(op.name)
                if stride:
                    check_keys(k, stride, op.name)
                if effect == _OP_BUILD_FROM_MARK:
                    new_container(max(take(k), 1))
                elif len(depths) > k:  # there are items, for the container just below the mark
                    if k == 0:
                        raise BadPickle(f"stack underflow at {op.name}")
                    fill(k - 1, take(k), op.name)
                continue
            elif effect == _OP_APPEND or effect == _OP_SETITEM:
                n = 1 if effect == _OP_APPEND else 2
                x = len(depths) - n  # the items; the container is just below them
                if x < 1 or x < (marks[-1] if marks else 0):
                    raise BadPickle(f"stack underflow at {op.name}")
                if n == 2:
                    check_keys(x, 2, op.name)
                fill(x - 1, take(x), op.name)
                continue
            elif effect == _OP_BUILD_COUNTED:
                x = len(depths) - _COUNTED[op.name]
                if x < (marks[-1] if marks else 0):
                    raise BadPickle(f"stack underflow at {op.name}")
                new_container(take(x))
                continue
            elif effect == _OP_DUP:
                if len(depths) <= (marks[-1] if marks else 0):
                    raise BadPickle(f"stack underflow at {op.name}")
                if objs[-1] >= 0:
                    raise BadPickle(
                        "refusing to load: DUP of a container (pickle never writes DUP; two "
                        "stack copies of one container could hide its depth)",
                        refused=True,
                    )
                push(0)
                push_obj(objs[-1])
            elif effect == _OP_POP:
                if marks and marks[-1] == len(depths):
                    marks.pop()
                elif len(depths) > (marks[-1] if marks else 0):
                    depths.pop()
                    objs.pop()
                else:
                    raise BadPickle(f"stack underflow at {op.name}")
                continue
            elif effect == _OP_POP_MARK:
                if not marks:
                    raise BadPickle(f"{op.name} without a MARK")
                k = marks.pop()
                del depths[k:], objs[k:]
                continue
            elif effect == _OP_NOTHING:
                continue
            elif effect == _OP_STOP:
                if len(depths) <= (marks[-1] if marks else 0):
                    raise BadPickle(f"stack underflow at {op.name}")
                return
            elif effect == _OP_REFUSED:
                return  # SafeUnpickler refuses this opcode before building anything after it
            else:
                raise BadPickle(
                    f"refusing to load: the pickle uses the opcode {op.name}, which plain data "
                    "(dicts, lists, strings, numbers) never needs",
                    refused=True,
                )
            if len(depths) > max_stack:  # after a push
                raise BadPickle(
                    f"refusing to load: the pickle keeps more than {max_stack} items on the "
                    "unpickling stack",
                    refused=True,
                )
    except BadPickle as exc:
        raise BadPickle(f"{exc} (opcode at byte {pos})", refused=exc.refused) from None
    except Exception as exc:  # genops: truncated, unknown opcode, bad argument; MemoryError
        raise BadPickle(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    raise BadPickle("pickle exhausted before seeing STOP")  # pragma: no cover (genops raises)


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
