"""A differential fuzz of the core arena through the bindings.

The arena (on a SimDevice, whose streams run only when the fuzz advances
them, or on a HostDevice, whose events complete at once) is driven with random allocations, frees, stream uses, stream progress,
sync points, empty_cache calls and planned steps of several step keys on
several streams (fixed programs per key, so that they are planned and
replayed, perturbed now and then so that they also miss and re-plan). A
reference model checks, at every operation:

* live ranges are disjoint (a sorted index of the live blocks);
* stats are exact: allocated bytes and the allocation count equal the
  model's sums (and ``check_invariants()`` every few thousand operations);
* byte patterns are intact: every live block carries its own byte at its
  first and last 64 bytes, checked before it is freed;
* stream ordering: memory freed while stream X still had work on it (X its
  allocating stream, or a stream recorded with ``record_stream``) may go to a
  stream S != X only after S was made to wait on an event of X covering that
  work, or after the memory went back to the device (``empty_cache``: the
  model then forgets what it knew).

Used by ``tests/test_arena_fuzz.py`` (a short run), ``tests/test_contract.py``
(every device x segment mode x planning x stream policy) and ``tools/fuzz_arena.py``
(a long one).
"""
from __future__ import annotations

import bisect
import ctypes
import random

MiB = 1 << 20
EDGE = 64  # bytes checked at each end of a block


class Violation(AssertionError):
    """The arena broke an invariant the reference model checks."""


class HostStreams:
    """The stream view of a HostDevice for the model: the CPU has no
    asynchronous streams (its events complete at once), so every stream's
    work is always complete and nothing is ever pending."""

    def __init__(self, device):
        self.device = device
        self.count = 0

    def new_stream(self) -> int:
        self.count += 1
        return self.count

    def enqueue(self, stream: int, units: int = 1) -> None:
        pass

    def advance(self, stream: int, units: int) -> None:
        pass

    def enqueued(self, stream: int) -> int:
        return 0

    def completed(self, stream: int) -> int:
        return 0

    def waits(self) -> list:
        return []


class Fuzz:
    """One fuzz campaign.

    Args:
        C: the compiled extension.
        seed: the campaign's seed.
        policy: the arena's ``stream_policy``.
        expandable: the arena's ``expandable_segments`` (and, on a SimDevice,
            whether the device offers address ranges at all).
        device: ``"sim"`` (SimDevice: streams run when the fuzz advances them)
            or ``"host"`` (HostDevice: CPU memory, events complete at once).
        planning: the arena's ``planning``; off, marked steps run unplanned.
    """

    def __init__(self, C, seed: int, policy: str = "defer", expandable: bool = True,
                 streams: int = 3, keys: int = 3, device: str = "sim", planning: bool = True):
        self.C = C
        self.rng = random.Random(seed)
        if device == "sim":
            self.device = C.SimDevice()
            self.device.set_address_ranges(expandable)
            self.dev = self.device
        elif device == "host":
            self.device = C.HostDevice()
            self.dev = HostStreams(self.device)
        else:
            raise ValueError(f"device must be 'sim' or 'host', not {device!r}")
        self.arena = C.Arena(self.device, stream_policy=policy, plan_budget_seconds=0.0,
                             expandable_segments=expandable, planning=planning)
        self.streams = [0] + [self.dev.new_stream() for _ in range(streams)]
        self.live: dict[int, tuple[int, int, int]] = {}  # ptr -> (block size, stream, byte)
        self.starts: list[int] = []                       # sorted live starts
        self.uses: dict[int, set[int]] = {}
        # Freed ranges with work pending at the free, sorted by start: (start,
        # end, stream with work, its position, len(waits) at the free, (base,
        # stream) of the segment it was in)
        self.pend: list[tuple[int, int, int, int, int]] = []
        self.allocated = 0
        self.ops = 0
        self.steps = 0  # marked steps run (begin_step ... end_step)
        self.maxlen = 0  # the longest range in pend
        self.seg_key = None
        self.segs: list[tuple[int, int, int]] = []
        # One program per key: its stream and (size, stream, lifetime, use stream or -1).
        self.programs = []
        for k in range(keys):
            home = self.streams[k % len(self.streams)]
            prog = []
            for _ in range(self.rng.randint(3, 24)):
                s = home if self.rng.random() < 0.8 else self.rng.choice(self.streams)
                use = self.rng.choice(self.streams) if self.rng.random() < 0.2 else -1
                prog.append((int(2 ** self.rng.uniform(9, 23)), s, self.rng.randint(0, 6), use))
            self.programs.append((k + 1, prog))

    # --- checked primitives -------------------------------------------------
    def fail(self, what: str) -> None:
        raise Violation(f"op {self.ops}: {what}")

    def allocate(self, size: int, stream: int) -> int:
        a, dev = self.arena, self.dev
        if self.pend:
            self.forget_released()  # a release inside this operation
        p = a.allocate(size, stream)
        n = a.block_size(p)
        if n < size:
            self.fail(f"block of {n} bytes for a request of {size}")
        i = bisect.bisect_left(self.starts, p)
        if i < len(self.starts) and self.starts[i] < p + n:
            self.fail(f"{p:#x}+{n} overlaps the live block at {self.starts[i]:#x}")
        if i > 0:
            q = self.starts[i - 1]
            if q + self.live[q][0] > p:
                self.fail(f"{p:#x}+{n} overlaps the live block at {q:#x}")
        waits = None
        lo = bisect.bisect_left(self.pend, (p - self.maxlen,))
        for start, stop, x, pos, widx, _ in self.pend[lo:]:
            if start >= p + n:
                break
            if stop <= p or x == stream or dev.completed(x) >= pos:
                continue
            if waits is None:
                waits = dev.waits()
            if not any(w.stream == stream and w.event_stream == x and w.event_position >= pos
                       for w in waits[widx:]):
                self.fail(f"stream {stream} got {p:#x}+{n} while stream {x} still works on "
                          f"[{start:#x}, {stop:#x}) (position {pos}, done {dev.completed(x)}) "
                          f"and no wait covers it")
        byte = self.rng.randrange(1, 256)
        m = min(EDGE, n)
        ctypes.memset(p, byte, m)
        ctypes.memset(p + n - m, byte, m)
        self.live[p] = (n, stream, byte)
        bisect.insort(self.starts, p)
        self.uses[p] = set()
        self.allocated += n
        return p

    def record(self, p: int, stream: int) -> None:
        self.dev.enqueue(stream, 1)
        self.arena.record_stream(p, stream)
        if stream != self.live[p][1]:
            self.uses[p].add(stream)

    def free(self, p: int) -> None:
        n, stream, byte = self.live.pop(p)
        m = min(EDGE, n)
        if ctypes.string_at(p, m) != bytes([byte]) * m or \
                ctypes.string_at(p + n - m, m) != bytes([byte]) * m:
            self.fail(f"the bytes of the live block at {p:#x}+{n} were overwritten")
        self.starts.pop(bisect.bisect_left(self.starts, p))
        nwaits = len(self.dev.waits())
        seg = self.segment_of(p, p + n)
        for x in self.uses.pop(p) | {stream}:
            pos = self.dev.enqueued(x)
            if self.dev.completed(x) < pos:
                bisect.insort(self.pend, (p, p + n, x, pos, nwaits, seg))
                self.maxlen = max(self.maxlen, n)
        self.allocated -= n
        self.arena.deallocate(p)

    def segments(self) -> list[tuple[int, int, int]]:
        """The mapped segments as sorted (base, end, stream), refreshed when
        the arena reserved or released memory since the last look."""
        s = self.arena.stats()
        key = (s["num_device_alloc"], s["num_device_free"])
        if key != self.seg_key:
            self.seg_key = key
            self.segs = sorted((g["address"], g["address"] + g["total_size"], g["stream"])
                               for g in self.arena.snapshot())
        return self.segs

    def segment_of(self, start: int, end: int):
        segs = self.segments()
        i = bisect.bisect_right(segs, (start, 1 << 62, 1 << 62)) - 1
        if i >= 0 and segs[i][0] <= start and end <= segs[i][1]:
            return segs[i][0], segs[i][2]
        return None

    def forget_released(self) -> None:
        # Memory that went back to the device (empty_cache, the trims after a
        # plan) is safe for anyone: forget what was pending in ranges that are
        # no longer in the segment (same base, same stream) they were freed in.
        before = self.seg_key
        self.segments()
        if self.seg_key[1] == (before[1] if before else 0):
            return
        self.pend = [r for r in self.pend if self.segment_of(r[0], r[1]) == r[5]]

    def check_stats(self, full: bool) -> None:
        s = self.arena.stats()
        if s["allocated_bytes"]["all"]["current"] != self.allocated:
            self.fail(f"allocated_bytes {s['allocated_bytes']['all']['current']} != {self.allocated}")
        if s["allocation"]["all"]["current"] != len(self.live):
            self.fail(f"allocation count {s['allocation']['all']['current']} != {len(self.live)}")
        if full:
            self.arena.check_invariants()
        self.forget_released()
        if full or len(self.pend) > 4096:
            self.pend = [r for r in self.pend if self.dev.completed(r[2]) < r[3]]

    # --- operations -----------------------------------------------------------
    def random_op(self, in_step: bool = False) -> None:
        rng = self.rng
        r = rng.random()
        if in_step and 0.45 <= r < 0.75:
            r = 0.8  # the step frees its own blocks; no random frees inside it
        if r < 0.30 or not self.live:
            self.allocate(int(2 ** rng.uniform(6, 23)), rng.choice(self.streams))
        elif r < 0.45:
            self.record(rng.choice(list(self.live)), rng.choice(self.streams))
        elif r < 0.75:
            self.free(rng.choice(list(self.live)))
        elif r < 0.93:
            s = rng.choice(self.streams)
            self.dev.enqueue(s, rng.randint(0, 2))
            self.dev.advance(s, rng.randint(0, 6))
        elif r < 0.98:
            self.arena.sync_point()
        else:
            self.arena.empty_cache()

    def step(self) -> None:
        key, prog = self.rng.choice(self.programs)
        rng = self.rng
        self.steps += 1
        self.arena.begin_step(key)
        mine: list[tuple[int, int]] = []  # (ptr, free at op index)
        for j, (size, s, life, use) in enumerate(prog):
            if rng.random() < 0.05:
                size = int(size * rng.choice((0.5, 1.5, 2.0)))  # a perturbed step
            p = self.allocate(max(size, 1), s)
            self.dev.enqueue(s, 1)
            if use >= 0:
                self.record(p, use)
            mine.append((p, j + life))
            for q, t in [m for m in mine if m[1] <= j]:
                mine.remove((q, t))
                self.free(q)
            if rng.random() < 0.1:
                self.random_op(in_step=True)
        for q, _ in mine:
            if rng.random() < 0.9:
                self.free(q)  # the rest outlive the step
        self.arena.end_step()

    def run(self, ops: int, check_every: int = 2000) -> None:
        """Runs ``ops`` operations, with ``check_invariants()`` every
        ``check_every`` of them and at the end."""
        while self.ops < ops:
            self.ops += 1
            if self.rng.random() < 0.03:
                self.step()
            else:
                self.random_op()
            self.check_stats(full=self.ops % check_every == 0)
        self.check_stats(full=True)
        st = self.arena.stats()
        if st["num_ooms"]:
            self.fail("an out-of-memory error with no limit")
