"""Planning traces offline: LOAD, greedy by size, and torch_renaissance's plan.

Thin Python face of ``csrc/core/planner.h`` (best fit by decreasing size as in
TFLite's ``ArenaPlanner`` / XLA's ``GlobalDecreasingSizeBestFitHeap``, then a
search within a time budget; see docs/design.md).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from torch_renaissance.trace import Trace


@dataclass(frozen=True)
class PlanResult:
    """A plan of one trace. Sizes and offsets in bytes, times in seconds."""

    offsets: List[int]        # one per trace entry, in entry order
    plan_bytes: int           # highest end offset
    load_bytes: int           # LOAD: no plan can be smaller
    greedy_bytes: Optional[int]  # best fit by decreasing size; None when the budget cut it short
    seconds: float            # wall time of the planner
    method: str               # which strategy gave the returned offsets
    lower_bound_bytes: int = 0  # best lower bound known (LOAD, obstacle bound, proved infeasible + 1)
    optimal: bool = False     # plan_bytes == lower_bound_bytes: no valid plan is smaller
    stopped_by: str = ""      # "bound", "work" (deterministic count), "clock" (wall time), "done"

    def __repr__(self) -> str:
        # Every field but the offsets, which are one per buffer (a 1,000-buffer trace's repr
        # was 20 KB): their count instead. ``.offsets`` has them.
        over = (self.plan_bytes - self.load_bytes) / self.load_bytes if self.load_bytes else 0.0
        return (f"PlanResult(plan_bytes={self.plan_bytes}, load_bytes={self.load_bytes} "
                f"({over:+.3%} over LOAD), greedy_bytes={self.greedy_bytes}, "
                f"lower_bound_bytes={self.lower_bound_bytes}, optimal={self.optimal}, "
                f"stopped_by={self.stopped_by!r}, method={self.method!r}, "
                f"seconds={self.seconds:.3f}, offsets=<{len(self.offsets)} offsets>)")


def _ext():
    from torch_renaissance.extension import extension

    return extension()


#: Sizes and offsets are bytes below 2**63 (the loaders' limit; the planner adds them in
#: 64-bit integers), times are integers below 2**63.
_LIMIT = 1 << 63


def _whole(value, what: str, limit: int = _LIMIT) -> int:
    """``value`` as an int in ``[0, limit)``; ValueError naming ``what`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"planner: {what} must be an integer, not bool ({value!r})")
    if not isinstance(value, int):
        try:
            value = operator.index(value)  # numpy integers; not floats or strings
        except TypeError:
            raise ValueError(f"planner: {what} must be an integer, not {type(value).__name__} "
                             f"({value!r})") from None
    if not 0 <= value < limit:
        raise ValueError(f"planner: {what} is {value}; it must be in [0, 2**{limit.bit_length() - 1})")
    return value


def _columns(lifetimes: Sequence[Tuple[int, int, int]]) -> Tuple[List[int], List[int], List[int]]:
    """``(size, lower, upper)`` rows as the extension's three columns.

    Raises:
        ValueError: a row that is not three integers, a size outside ``[0, 2**63)``, or a
            time outside ``[0, 2**63)``, naming the buffer's index. (``upper <= lower`` is
            the extension's check, with the same wording.)
    """
    rows = list(lifetimes)
    if all(type(r) is tuple and len(r) == 3 for r in rows):  # the fast path: plain ints
        cols = ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        if all(not c or (set(map(type, c)) == {int} and min(c) >= 0 and max(c) < _LIMIT)
               for c in cols):
            return cols[0], cols[1], cols[2]
    sizes: List[int] = []
    lowers: List[int] = []
    uppers: List[int] = []
    for i, row in enumerate(rows):  # the slow path: convert, or name the first bad value
        try:
            size, lower, upper = row
        except (TypeError, ValueError):
            raise ValueError(f"planner: buffer {i}: expected (size, lower, upper), got {row!r}") from None
        if isinstance(lower, int) and not isinstance(lower, bool) and lower < 0:
            raise ValueError(f"planner: buffer {i}: negative lower time {lower}")
        sizes.append(_whole(size, f"buffer {i}: size"))
        lowers.append(_whole(lower, f"buffer {i}: lower time"))
        uppers.append(_whole(upper, f"buffer {i}: upper time"))
    return sizes, lowers, uppers


def _seconds(value, what: str, allow_none: bool = False) -> float:
    """A duration in seconds: a real number >= 0 (``math.inf`` allowed), not NaN."""
    if value is None and allow_none:
        return -1.0  # the extension's "same as the budget"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"planner: {what} must be a number of seconds, not "
                         f"{type(value).__name__} ({value!r})")
    if not value >= 0:  # also NaN
        raise ValueError(f"planner: {what} is {value!r}; it must be >= 0 seconds")
    return float(value)


def plan_lifetimes(lifetimes: Sequence[Tuple[int, int, int]], budget_seconds: float = 1.0,
                   seed: int = 0, clock_seconds: Optional[float] = None,
                   threads: int = 2) -> PlanResult:
    """Plans buffers given as ``(size, lower, upper)`` (lifetime ``[lower, upper)``).

    ``budget_seconds``, ``seed`` and ``threads`` as for :func:`plan_trace`; ``clock_seconds``
    is the wall-clock part of the budget (default: ``budget_seconds``; ``math.inf``: no clock,
    so the plan depends on the input alone, however slow the machine).

    Raises:
        ValueError: a malformed buffer (``upper <= lower``, negative or non-integer values,
            a size of 2**63 or more), naming its index; a negative or non-integer ``seed``
            (it must be below 2**64); a negative or NaN budget; ``threads`` not 1 or 2.
    """
    columns = _columns(lifetimes)
    budget = _seconds(budget_seconds, "budget_seconds")
    clock = _seconds(clock_seconds, "clock_seconds", allow_none=True)
    seed = _whole(seed, "seed", 1 << 64)
    r = _ext().plan(*columns, budget_seconds=budget, seed=seed, clock_seconds=clock,
                    threads=threads)
    # The extension says 0 for "greedy did not finish"; with LOAD 0 (no buffers, or all of
    # size 0) greedy's 0 is a result.
    greedy = r["greedy_size"] if r["greedy_size"] or r["load"] == 0 else None
    return PlanResult(list(r["offsets"]), r["size"], r["load"], greedy,
                      r["seconds"], r["method"], r["lower_bound"], r["optimal"], r["stopped_by"])


def plan_trace(trace: Trace, budget_seconds: float = 1.0, seed: int = 0,
               clock_seconds: Optional[float] = None, threads: int = 2) -> PlanResult:
    """Plans every buffer of ``trace``.

    Args:
        trace: from :func:`torch_renaissance.trace.load_trace` or recorded.
        budget_seconds: wall-time budget in seconds. The search stops at a
            work count derived from it or at the wall clock, whichever comes
            first (``stopped_by`` says which); the plan is the same on every
            machine unless the clock stopped it (a slow or loaded machine).
        seed: seed of the randomized orderings.
        clock_seconds: the wall-clock part of the budget (default ``budget_seconds``);
            ``math.inf`` turns the clock off (reproducible plans on any machine).
        threads: 2 (default) runs a second CPU thread beside the other phases: the
            search's branch and bound at the lower bound (MiniMalloc's exact schedule) on
            traces of up to 1,500 buffers, the peak-first passes (the peak tick's buffers
            stacked first) on larger ones; 1 keeps everything on one thread. The two may
            give different plans; each is reproducible with the clock off.

    Returns:
        :class:`PlanResult`; ``offsets[i]`` belongs to ``trace.entries[i]``.

    Raises:
        TypeError: ``trace`` is not a :class:`~torch_renaissance.trace.Trace` (for
            ``(size, lower, upper)`` tuples use :func:`plan_lifetimes`).
        ValueError: as :func:`plan_lifetimes`.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"plan_trace takes a Trace (torch_renaissance.trace.load_trace), not "
                        f"{type(trace).__name__}; plan_lifetimes takes (size, lower, upper) tuples")
    return plan_lifetimes(trace.lifetimes(), budget_seconds, seed, clock_seconds, threads)


def validate(lifetimes: Sequence[Tuple[int, int, int]], offsets: Sequence[int]) -> Optional[str]:
    """None if ``offsets`` never overlap two buffers live at once, else the first clash.

    Raises:
        ValueError: a malformed buffer (as :func:`plan_lifetimes`), or an offset that is
            not an integer in ``[0, 2**64)``, naming its index.
    """
    columns = _columns(lifetimes)
    offs = [_whole(o, f"offset {i}", 1 << 64) for i, o in enumerate(offsets)]
    msg = _ext().validate(*columns, offs)
    return msg or None
