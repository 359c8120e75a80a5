"""A thread's front against a reference model of its bins (csrc/core/free_cache.h,
docs/design.md "Per-thread fronts").

The model keeps what the front keeps: 32 bins keyed by (rounded size, stream), a key's bin
among the 4 bins from its Fibonacci-hashed home (a bin keeps its key when it empties and is
re-keyed only when no bin of the window has the new key), 16 blocks a bin, last in first out,
8 MiB in all; a block handed out only for a request within its booked size (a smaller one goes
on the 64-entry dirty list); the counters a fold adds to the books, and the folds themselves
(at ``stats()``, and before a slow allocation that would raise a value of the books above its
peak). From that it predicts, for every allocation, whether the front serves it and with which
pointer, and the stats at every check.

More keys than bins (two streams: the default stream's keys go through the front's direct map,
the other stream's through the probe window) make bins change keys all the time, which is where
a direct map that named a stale bin would hand out or cache a block in the wrong bin. The
segments are large enough that no pool grows after its first segment (a growth folds the
fronts that cache its stream, which the model does not predict).
"""
from __future__ import annotations

import random

import pytest

KiB = 1 << 10
MiB = 1 << 20
M64 = (1 << 64) - 1
BINS, PROBES, DEPTH, MAX_BYTES, DIRTY = 32, 4, 16, 8 * MiB, 64


def bin_home(rounded: int, stream: int) -> int:
    x = ((rounded >> 6) + 0x9E3779B9 * stream) & M64
    return ((x * 0x9E3779B97F4A7C15) & M64) >> 59


class Block:
    def __init__(self, ptr: int, size: int, stream: int, booked: int):
        self.ptr, self.size, self.stream = ptr, size, stream
        self.booked = booked  # the books' requested bytes for it
        self.caller = booked  # what its caller asked for while live
        self.live = True


class FrontModel:
    def __init__(self):
        self.keys = [(0, 0)] * BINS
        self.bins: list[list[Block]] = [[] for _ in range(BINS)]
        self.cached_bytes = 0
        self.dirty: list[Block] = []
        self.acc = [0, 0, 0]  # net allocations, bytes, requested bytes served since the last fold

    def _window(self, key):
        home = bin_home(*key)
        return [(home + k) % BINS for k in range(PROBES)]

    def take(self, rounded: int, stream: int, n: int):
        key = (rounded, stream)
        i = next((i for i in self._window(key) if self.keys[i] == key), None)
        if i is None:
            return None
        blocks = self.bins[i]
        for k in range(len(blocks) - 1, -1, -1):
            b = blocks[k]
            if b.booked < n:
                continue
            if b.booked != n:
                if len(self.dirty) == DIRTY:
                    continue
                self.dirty.append(b)
            last = blocks.pop()
            if k < len(blocks):
                blocks[k] = last
            self.cached_bytes -= b.size
            b.live, b.caller = True, n
            self.acc[0] += 1
            self.acc[1] += b.size
            self.acc[2] += n
            return b
        return None

    def put(self, b: Block) -> bool:
        if self.cached_bytes + b.size > MAX_BYTES:
            return False
        key, empty, target = (b.size, b.stream), None, None
        for i in self._window(key):
            if self.keys[i] == key:
                target = i if len(self.bins[i]) < DEPTH else -1
                break
            if not self.bins[i] and empty is None:
                empty = i
        if target is None:
            target = empty if empty is not None else -1
            if target >= 0:
                self.keys[target] = key
        if target < 0:
            return False
        self.bins[target].append(b)
        self.cached_bytes += b.size
        b.live = False
        self.acc[0] -= 1
        self.acc[1] -= b.size
        self.acc[2] -= b.caller
        return True

    def fold(self) -> list[Block]:
        """Books the counters and the dirty blocks; returns the cached blocks it frees."""
        for b in self.dirty:
            if b.live:
                b.booked = b.caller
        self.dirty = []
        freed = [b for blocks in self.bins for b in blocks]
        self.bins = [[] for _ in range(BINS)]
        self.cached_bytes = 0
        self.acc = [0, 0, 0]
        return freed


def run(C, device, streams, unit, keys, seed, ops=2500):
    rng = random.Random(seed)
    a = C.Arena(device, planning=False, expandable_segments=False, small_segment=256 * MiB,
                large_segment=256 * MiB)
    front = FrontModel()
    blocks: dict[int, Block] = {}  # live or cached in the front, by pointer
    peak = [0, 0, 0]
    served = 0

    def true_values():
        live = [b for b in blocks.values() if b.live]
        return [len(live), sum(b.size for b in live), sum(b.caller for b in live)]

    def check_stats():
        s = a.stats()  # folds every front
        for b in front.fold():
            del blocks[b.ptr]
        t = true_values()
        for k, name in enumerate(["allocation", "allocated_bytes", "requested_bytes"]):
            assert s[name]["all"]["current"] == t[k], (name, s[name]["all"], t[k])
            assert s[name]["all"]["peak"] == peak[k], (name, s[name]["all"], peak[k])

    for step in range(ops):
        live = [b for b in blocks.values() if b.live]
        if live and (len(live) > 60 or rng.random() < 0.48):
            b = rng.choice(live)
            if not front.put(b):
                # The fast path and the slow one both find no room: freed for real.
                del blocks[b.ptr]
            a.deallocate(b.ptr)
        else:
            stream = rng.choice(streams)
            rounded = rng.choice(keys[:6] if rng.random() < 0.6 else keys)  # some keys hot
            n = rounded - (rng.randrange(unit) if rng.random() < 0.3 else 0)
            want = front.take(rounded, stream, n)
            if want is None:
                # The slow path: a fold first when booking it would raise the books' peak.
                t = true_values()
                books = [t[k] - front.acc[k] for k in range(3)]
                if any(books[k] + d > peak[k] for k, d in enumerate((1, rounded, n))):
                    for f in front.fold():
                        del blocks[f.ptr]
            p = a.allocate(n, stream)
            if want is not None:
                assert p == want.ptr, (step, n, stream)
                served += 1
            else:
                assert p not in blocks, (step, n, stream)  # not cached, not live
                blocks[p] = Block(p, rounded, stream, n)
            assert a.block_size(p) == rounded
            t = true_values()
            peak = [max(x, y) for x, y in zip(peak, t)]
        if step % 250 == 0:
            a.check_invariants()
        if step % 500 == 499:
            check_stats()
    a.check_invariants()
    check_stats()
    for b in [b for b in blocks.values() if b.live]:
        a.deallocate(b.ptr)
    a.flush_cache()
    a.check_invariants()
    assert a.stats()["allocation"]["all"]["current"] == 0
    return served


@pytest.mark.parametrize("seed", range(3))
def test_host_front_serves_as_the_model_says(C, seed):
    """HostDevice (64 B units): the default stream only, 50 keys (6 of them hot) up to
    1 MiB, all in the direct map."""
    rng = random.Random(100 + seed)
    keys = [512, 1024, 64 * KiB, MiB, 576, 4 * KiB] + [64 * rng.randrange(1, 16385) for _ in range(44)]
    served = run(C, C.HostDevice(), [0], 64, keys, seed)
    assert served > 80  # the front does serve: the model's predictions were exercised


@pytest.mark.parametrize("seed", range(3))
def test_sim_front_serves_as_the_model_says_on_two_streams(C, seed):
    """SimDevice (512 B units): two streams, 24 keys each (6 of them hot); stream 0's
    through the direct map, the other stream's through the probe window."""
    rng = random.Random(200 + seed)
    dev = C.SimDevice()
    s1 = dev.new_stream()
    keys = [512 * rng.randrange(1, 129) for _ in range(24)]
    served = run(C, dev, [0, s1], 512, keys, seed)
    assert served > 80
