"""What the planned-replay tests share (``test_replay_deviation.py``,
``test_replay_fast_path.py``): a seeded step, a model of the live and outstanding
ranges on a SimDevice arena, and the deviations from the recorded step.

* ``late``: a buffer is freed 20-200 operations after its planned free;
* ``early``: a buffer is freed right after it is allocated;
* ``cross``: a buffer lives into the next step and is freed at its start;
* ``thread``: a buffer is freed from another thread;
* ``record_stream``: a planned buffer is used on a side stream (work enqueued there) and
  freed while that work is outstanding;
* ``bigger`` / ``smaller``: one request asks for more / fewer bytes than recorded;
* ``extra``: an allocation the recorded step did not have.
"""
from __future__ import annotations

import random
import threading

KiB = 1 << 10
DEVIATIONS = ("late", "early", "cross", "thread", "record_stream", "bigger", "smaller", "extra")


def make_step(rng: random.Random, n: int):
    """``n`` buffers of 512 B - 256 KiB, most freed soon, some late: (sizes, ops), each op
    ``("a", i)`` or ``("f", i)``."""
    sizes = [512 * round(2 ** rng.uniform(0, 9)) for _ in range(n)]
    due: dict = {}
    ops = []
    for i in range(n):
        ops.append(("a", i))
        life = 1 + int(rng.expovariate(1 / 6)) if rng.random() < 0.9 else rng.randrange(n)
        due.setdefault(i + life, []).append(i)
        for j in due.pop(i, []):
            ops.append(("f", j))
    for t in sorted(due):
        ops.extend(("f", j) for j in due[t])
    return sizes, ops


def rounded(size: int) -> int:
    """A request's block size on a SimDevice arena (512 B alignment, PyTorch's rounding)."""
    return (size + 511) // 512 * 512


def overlaps(a0, a1, ranges) -> bool:
    return any(a0 < r1 and r0 < a1 for r0, r1 in ranges)


class RangeModel:
    """Live and outstanding ranges, kept by the test. Subclasses say how a block's end is
    known (``block_end``) and what is checked after each operation (``after_op``)."""

    def __init__(self, arena, dev):
        self.arena, self.dev = arena, dev
        self.live: dict = {}  # address -> (end, block bytes, requested bytes)
        # Ranges freed while a side stream had work on them: (start, end, stream, the
        # stream's enqueued count then, the device's wait count then). Free for reuse on
        # stream 0 once the stream completed that much (run_all, or the arena
        # synchronizing its event on the host), or once stream 0 was made to wait on an
        # event of it that covers that work (the territory's epoch events).
        self.outstanding: list = []

    def block_end(self, p: int, size: int) -> int:
        raise NotImplementedError

    def after_op(self) -> None:
        pass

    def occupied(self):
        waits = self.dev.waits()

        def done(o):
            return self.dev.completed(o[2]) >= o[3] or any(
                w.stream == 0 and w.event_stream == o[2] and w.event_position >= o[3]
                for w in waits[o[4]:])

        self.outstanding = [o for o in self.outstanding if not done(o)]
        return [(p, e) for p, (e, _, _) in self.live.items()] + [o[:2] for o in self.outstanding]

    def allocated(self) -> int:
        return sum(n for _, n, _ in self.live.values())

    def alloc(self, size: int) -> int:
        p = self.arena.allocate(size)
        end = self.block_end(p, size)
        for q, e in self.occupied():
            if p < e and q < end:
                raise AssertionError(f"[{p:#x}, {end:#x}) overlaps a live or outstanding range "
                                     f"[{q:#x}, {e:#x})")
        self.live[p] = (end, end - p, size)
        self.allocated_one(p, end)
        self.after_op()
        return p

    def allocated_one(self, p: int, end: int) -> None:
        pass

    def free(self, p: int, on_thread: bool = False) -> None:
        del self.live[p]
        if on_thread:
            t = threading.Thread(target=self.arena.deallocate, args=(p,))
            t.start()
            t.join()
        else:
            self.arena.deallocate(p)
        self.after_op()

    def free_used_on(self, p: int, side: int) -> None:
        self.dev.enqueue(side, 1)
        self.arena.record_stream(p, side)
        self.outstanding.append((p, self.live[p][0], side, self.dev.enqueued(side),
                                 len(self.dev.waits())))
        self.free(p)

    def side_work_done(self) -> None:
        self.dev.run_all()
        assert not self.occupied()[len(self.live):]


def deviated_size(size: int, i: int, target: int, deviation) -> int:
    """Request ``i``'s bytes: the recorded ``size``, or the target's under bigger/smaller."""
    if i == target and deviation == "bigger":
        return size * 2 + 512
    if i == target and deviation == "smaller":
        return max(1, size - 700)
    return size


def after_alloc(model: RangeModel, p: int, i: int, target: int, deviation) -> None:
    """The deviations that act right after the target's allocation (early, extra)."""
    if i == target and deviation == "early":
        model.free(p)
    if i == target and deviation == "extra":
        model.free(model.alloc(3 * KiB + 64))


def free_op(model: RangeModel, p: int, i: int, target: int, deviation, rng: random.Random,
            late: list, keep: list, side: int) -> None:
    """Buffer ``i``'s planned free, as the deviation makes it: skipped (early: freed
    already), postponed (late: ``[ops left, address]`` into ``late``), kept into the next
    step (cross: into ``keep``), from another thread, after a side-stream use, or plain."""
    if i == target and deviation == "early":
        pass
    elif i == target and deviation == "late":
        late.append([rng.randrange(20, 200), p])
    elif i == target and deviation == "cross":
        keep.append(p)
    elif i == target and deviation == "thread":
        model.free(p, on_thread=True)
    elif i == target and deviation == "record_stream":
        model.free_used_on(p, side)
    else:
        model.free(p)


def age_late(model: RangeModel, late: list) -> None:
    """One operation later: frees the postponed buffers whose count ran out."""
    for entry in late:
        entry[0] -= 1
    for entry in [e for e in late if e[0] <= 0]:
        late.remove(entry)
        model.free(entry[1])


def late_free_step(arena, sizes, late: bool = False, key: int = 3):
    """A hand-made step of three buffers a, b, c (``sizes``): a dies before b is made, so
    the plan puts b where a was; with ``late``, a is freed only after b and c are made.
    Returns the addresses (a, b, c)."""
    arena.begin_step(key)
    a = arena.allocate(sizes[0])
    if not late:
        arena.deallocate(a)
    b = arena.allocate(sizes[1])
    c = arena.allocate(sizes[2])
    if late:
        arena.deallocate(a)
    arena.deallocate(b)
    arena.deallocate(c)
    arena.end_step()
    return a, b, c
