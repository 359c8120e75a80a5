"""Trace files that would load in quadratic time, and files that are not regular files.

CPython hashes an integer to its value modulo ``sys.hash_info.modulus`` (``2**61 - 1``), so
the integers ``c + k * (2**61 - 1)`` all share one hash: a dict of 20k of them takes tens of
seconds to build and a 1 MB file minutes. The pickles here are written opcode by opcode (building
such a dict in the test would itself be quadratic), from seeded random residues. Each must be
refused by the opcode scan, before the unpickler builds anything, or load correctly when its
keys are bounded so that at most 13 share a hash (9 for addresses, which are >= 0).
"""
from __future__ import annotations

import collections
import os
import pickle
import random
import struct
import sys
import threading

import pytest

from test_trace import T

P = sys.hash_info.modulus


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _long1(v: int) -> bytes:
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)  # LONG1


def _float(x: float) -> bytes:
    return b"G" + struct.pack(">d", x)  # BINFLOAT


def _tuple2(a: int, b: int) -> bytes:
    return b"J" + struct.pack("<i", a) + b"J" + struct.pack("<i", b) + b"\x86"  # TUPLE2


def _dict_setitems(keys, value=b"N"):
    """A dict as pickle writes it: EMPTY_DICT, then SETITEMS in batches of 1000 pairs."""
    out = [b"}"]
    for i in range(0, len(keys), 1000):
        out.append(b"(" + b"".join(k + value for k in keys[i:i + 1000]) + b"u")
    return b"".join(out)


def _snapshot_holding(extra: bytes) -> bytes:
    """``{"segments": [], "device_traces": [], "x": <extra>}`` in protocol 4."""
    return (b"\x80\x04}(" + _str("segments") + b"]" + _str("device_traces") + b"]"
            + _str("x") + extra + b"u.")


def _colliding_ints(rng: random.Random, n: int):
    """n distinct integers of one hash value: c + k * P for shuffled k."""
    c = rng.randrange(1, P)
    ks = list(range(n))
    rng.shuffle(ks)
    return [c + k * P for k in ks]


def _adversarial_files(seed: int):
    """(name, bytes, the opcode that must be refused) per shape of key set."""
    rng = random.Random(seed)
    ints = _colliding_ints(rng, 20_000)  # ~0.25 MB; took ~20 s to load before the bound
    assert len({hash(k) for k in ints}) == 1
    yield "int_keys_setitems", _snapshot_holding(_dict_setitems([_long1(k) for k in ints])), \
        "SETITEMS"
    yield "int_keys_dict_opcode", _snapshot_holding(
        b"(" + b"".join(_long1(k) + b"N" for k in ints[:2000]) + b"d"), "DICT"
    yield "int_key_setitem", _snapshot_holding(b"}" + _long1(ints[0]) + b"Ns"), "SETITEM"
    yield "set_additems", _snapshot_holding(
        b"\x8f(" + b"".join(_long1(k) for k in ints[:5000]) + b"\x90"), "ADDITEMS"
    yield "frozenset", _snapshot_holding(
        b"(" + b"".join(_long1(k) for k in ints[:5000]) + b"\x91"), "FROZENSET"
    # A float of hash 1 for every exponent that is a multiple of 61: 2.0 ** (61 k).
    floats = [2.0 ** (61 * k) for k in range(-16, 17)]
    assert len({hash(x) for x in floats}) == 1
    yield "float_keys", _snapshot_holding(_dict_setitems([_float(x) for x in floats])), "SETITEMS"
    # Tuples of small integers can be made to share a hash too: none is a key in a snapshot.
    pairs = [(rng.randrange(1 << 30), rng.randrange(1 << 30)) for _ in range(100)]
    yield "tuple_keys", _snapshot_holding(_dict_setitems([_tuple2(a, b) for a, b in pairs])), \
        "SETITEMS"
    # A big integer kept in the memo (a list item) and read back as a dict key.
    memo = (b"(" + b"](" + _long1(ints[1]) + b"\x94e" + b"}" + b"h\x00Ns" + b"t")
    yield "key_through_the_memo", _snapshot_holding(memo), "SETITEM"


@pytest.mark.parametrize("seed", [0, 1])
def test_keys_that_share_a_hash_are_refused_before_unpickling(tmp_path, monkeypatch, seed):
    def no_unpickling(self):
        raise AssertionError("the scan must refuse this file before the unpickler runs")

    monkeypatch.setattr(T._SafeUnpickler, "load", no_unpickling)
    names = []
    for name, data, opcode in _adversarial_files(seed):
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:
            T.load_snapshot(path)
        msg = str(info.value)
        assert msg.startswith(f"{path}: refusing to load: {opcode} makes a "), msg
        assert "quadratic time" in msg and "opcode at byte" in msg, msg
        names.append(name)
    assert len(names) == 8


def test_keys_bounded_to_64_bits_load_and_equal_the_reference(tmp_path):
    rng = random.Random(7)
    # Every integer of [-2**63, 2**64) sharing a hash with others: up to 9 of one sign, and
    # hash 0 (k * P, both signs) and hash -2 (-1 - k * P and -2 - k * P) gather 13 and 10.
    keys = []
    for c in [rng.randrange(8, P) for _ in range(2000)] + list(range(8)):
        keys += [c + k * P for k in range(9) if c + k * P < 1 << 64]
        keys += [-(c + k * P) for k in range(5) if c + k * P <= 1 << 63]
    keys += [-(1 << 63), (1 << 64) - 1, 0, -1, -2]
    keys = list(dict.fromkeys(keys))
    rng.shuffle(keys)
    assert max(collections.Counter(hash(k) for k in keys).values()) == 13
    extra = [b"\x8c\x01s", b"C\x01b", b"N", b"\x88", b"J\xff\xff\xff\xff"]  # str, bytes, None, True, -1
    data = _snapshot_holding(_dict_setitems([_long1(k) for k in keys] + extra[:4], value=b"K\x07"))
    path = tmp_path / "bounded.pickle"
    path.write_bytes(data)
    expected = {k: 7 for k in keys}
    expected.update({"s": 7, b"b": 7, None: 7, True: 7})
    assert pickle.loads(data)["x"] == expected  # what the bytes say, by the standard unpickler
    assert T._safe_unpickle(path)["x"] == expected
    assert len(T.load_snapshot(path)) == 0


@pytest.mark.parametrize("key", [1 << 64, -(1 << 63) - 1, 10**30])
def test_integer_keys_just_past_64_bits_are_refused(tmp_path, key):
    path = tmp_path / "edge.pickle"
    path.write_bytes(_snapshot_holding(_dict_setitems([_long1(key)])))
    with pytest.raises(ValueError, match="refusing to load: SETITEMS makes a dict key"):
        T.load_snapshot(path)


def test_integers_of_any_size_are_still_fine_as_values(tmp_path):
    path = tmp_path / "values.pickle"
    path.write_bytes(_snapshot_holding(b"](" + b"".join(_long1(3 + k * P) for k in range(50))
                                       + _float(0.5) + b"e"))
    assert T._safe_unpickle(path)["x"] == [3 + k * P for k in range(50)] + [0.5]


def _events_at(addresses, rng):
    """Allocate every address, then free them in a seeded order."""
    sizes = [512 * rng.randrange(1, 64) for _ in addresses]
    events = [{"action": "alloc", "addr": a, "size": s, "stream": 0}
              for a, s in zip(addresses, sizes)]
    order = list(range(len(addresses)))
    rng.shuffle(order)
    events += [{"action": "free_completed", "addr": addresses[i], "size": sizes[i], "stream": 0}
               for i in order]
    return sizes, order, events


def test_colliding_addresses_past_64_bits_are_refused(tmp_path):
    rng = random.Random(3)
    addresses = _colliding_ints(rng, 5000)
    _, _, events = _events_at(addresses, rng)
    first_big = next(i for i, a in enumerate(addresses) if a >= 1 << 64)
    path = tmp_path / "addresses.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))
    with pytest.raises(ValueError, match=rf"device_traces\[0\]\[{first_big}\]: field 'addr' "
                                         r"must be < 2\*\*64"):
        T.load_snapshot(path)


@pytest.mark.parametrize("segment, where, field", [
    ({"address": 1 << 64, "total_size": 512, "blocks": []}, r"segments\[0\]", "address"),
    ({"address": 0, "total_size": 512, "blocks": [
        {"address": 5 + 9 * P, "size": 512, "state": "active_allocated"}]},
     r"segments\[0\]\['blocks'\]\[0\]", "address"),
    ({"address": 0, "total_size": 0, "blocks": [], "device": 1 << 31}, r"segments\[0\]",
     "device"),
    ({"address": 0, "total_size": 0, "blocks": [], "device": -P}, r"segments\[0\]", "device"),
])
def test_segment_addresses_and_devices_are_bounded(tmp_path, segment, where, field):
    # Devices go into a set and block addresses into dict look-ups: unbounded, they collide.
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": []}, protocol=4))
    with pytest.raises(ValueError, match=rf"{where}: field '{field}' must be"):
        T.load_snapshot(path)


@pytest.mark.parametrize("stream, needle", [(-7, "must be >= 0, got -7"),
                                             (2**100, "must be < 2\\*\\*64")])
@pytest.mark.parametrize("where", ["alloc", "segment"])
def test_streams_are_bounded_like_the_other_integer_fields(tmp_path, stream, needle, where):
    # A stream is a cudaStream_t as an integer; found by a tester: -7 and 2**100 were taken.
    if where == "alloc":
        snap = {"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 0, "size": 512, "stream": stream}]]}
        at = r"device_traces\[0\]\[0\]"
    else:
        snap = {"segments": [{"address": 0, "total_size": 512, "stream": stream,
                              "blocks": []}], "device_traces": []}
        at = r"segments\[0\]"
    path = tmp_path / "streams.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    with pytest.raises(ValueError, match=rf"{at}: field 'stream' {needle}"):
        T.load_snapshot(path)


def test_addresses_sharing_hashes_within_64_bits_load_exactly(tmp_path):
    rng = random.Random(11)
    # 500 hash values, 8 addresses each (all of them below 2**64): 4,000 buffers.
    addresses = [c + k * P for c in (rng.randrange(8, P) for _ in range(500)) for k in range(8)]
    rng.shuffle(addresses)
    assert all(a < 1 << 64 for a in addresses)
    sizes, order, events = _events_at(addresses, rng)
    path = tmp_path / "collide.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))
    trace = T.load_snapshot(path)
    n = len(addresses)
    free_tick = {i: n + 1 + pos for pos, i in enumerate(order)}  # event k happens at k + 1
    expected = [(sizes[i], i + 1, free_tick[i], addresses[i]) for i in range(n)]
    got = [(e.size, e.alloc_time, e.free_time, e.address) for e in trace.entries]
    assert got == expected
    assert trace.end_time == 2 * n + 1


# --------------------------------------------------------------------------------------------
# Files that are not regular files
# --------------------------------------------------------------------------------------------


def _call_with_deadline(fn, unblock, seconds=20.0):
    """fn() in a thread; if it is still running after ``seconds``, unblock() and fail."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: B036 - handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        unblock()
        t.join(5)
        pytest.fail(f"still blocked after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("name", ["trace.pickle", "trace.csv", "trace"])
def test_a_fifo_is_refused_at_once(tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)

    def unblock():  # a writer lets a blocked open() go on; closing it ends a blocked read
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)

    with pytest.raises(ValueError, match=rf"{name}: not a regular file \(a FIFO\)"):
        _call_with_deadline(lambda: T.load_trace(fifo), unblock)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
@pytest.mark.parametrize("load", ["load_trace", "load_snapshot", "load_csv"])
def test_dev_zero_is_refused_at_once(load):
    with pytest.raises(ValueError, match=r"/dev/zero: not a regular file \(a character device\)"):
        _call_with_deadline(lambda: getattr(T, load)("/dev/zero"), lambda: None)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"not a regular file \(a directory\)"):
        T.load_trace(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_cli_plan_refuses_non_regular_files(tmp_path, capsys):
    from torch_renaissance import cli

    fifo = tmp_path / "pipe.pickle"
    os.mkfifo(fifo)

    def unblock():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    targets = [str(fifo)] + (["/dev/zero"] if os.path.exists("/dev/zero") else [])
    for target in targets:
        assert _call_with_deadline(lambda: cli.main(["plan", target]), unblock) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"torch-renaissance plan: {target}: not a regular file"), err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("device", ["all", "0"])
def test_cli_plan_with_device_refuses_non_regular_files(tmp_path, capsys, device):
    # With --device the CLI first asks whether the file is a snapshot; for a name without a
    # .pickle/.csv suffix that reads its first byte, which must not block on a FIFO nor take
    # /dev/zero's NUL for a CSV nor report a directory with a raw errno.
    from torch_renaissance import cli

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def unblock():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    kinds = {str(fifo): "a FIFO", str(tmp_path): "a directory"}
    if os.path.exists("/dev/zero"):
        kinds["/dev/zero"] = "a character device"
    for target, kind in kinds.items():
        code = _call_with_deadline(lambda: cli.main(["plan", target, "--device", device]), unblock)
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.strip() == (f"torch-renaissance plan: {target}: not a regular file ({kind}); "
                               "a trace is a file"), err


def test_unknown_actions_are_skipped_with_a_warning_and_all_unknown_is_an_error(tmp_path):
    # Found by a tester: a file whose events were all mistyped ("Alloc") planned as 0 buffers
    # with exit 0. A newer PyTorch may add actions, so a few unknown ones only warn.
    ev = [{"action": "alloc", "addr": 0, "size": 512, "stream": 0},
          {"action": "Alloc", "addr": 512, "size": 512, "stream": 0},
          {"action": "free_completed", "addr": 0, "size": 512, "stream": 0}]
    path = tmp_path / "typos.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [ev]}, protocol=4))
    with pytest.warns(UserWarning, match=r"typos.pickle: device 0: 1 events with actions this "
                                         r"loader does not know were skipped: 'Alloc'"):
        tr = T.load_snapshot(path)
    assert [(e.size, e.address) for e in tr.entries] == [(512, 0)]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [
        [dict(e, action=e["action"].upper()) for e in ev]]}, protocol=4))
    with pytest.raises(ValueError, match=r"device_traces\[0\]: no event has an action PyTorch "
                                         r"writes \(first: 'ALLOC'; known: alloc, "):
        T.load_snapshot(path)
