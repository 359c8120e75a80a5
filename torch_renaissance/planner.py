"""Planning traces offline: LOAD, greedy by size, and torch_renaissance's plan.

Thin Python face of ``csrc/core/planner.h`` (best fit by decreasing size as in
TFLite's ``ArenaPlanner`` / XLA's ``GlobalDecreasingSizeBestFitHeap``, then a
search within a time budget; see docs/design.md).
"""
from __future__ import annotations

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


def _ext():
    from torch_renaissance.extension import extension

    return extension()


def _columns(lifetimes: Sequence[Tuple[int, int, int]]) -> Tuple[List[int], List[int], List[int]]:
    """``(size, lower, upper)`` rows as the extension's three columns."""
    sizes, lowers, uppers = zip(*lifetimes) if lifetimes else ((), (), ())
    return list(sizes), list(lowers), list(uppers)


def plan_lifetimes(lifetimes: Sequence[Tuple[int, int, int]], budget_seconds: float = 1.0,
                   seed: int = 0, clock_seconds: Optional[float] = None) -> PlanResult:
    """Plans buffers given as ``(size, lower, upper)`` (lifetime ``[lower, upper)``).

    ``budget_seconds`` and ``seed`` as for :func:`plan_trace`; ``clock_seconds`` is the
    wall-clock part of the budget (default: ``budget_seconds``; ``math.inf``: no clock, so the
    plan depends on the input alone, however slow the machine).

    Raises:
        ValueError: a malformed buffer (``upper <= lower``, negative values),
            naming its index.
    """
    r = _ext().plan(*_columns(lifetimes), budget_seconds=budget_seconds, seed=seed,
                    clock_seconds=-1.0 if clock_seconds is None else clock_seconds)
    return PlanResult(list(r["offsets"]), r["size"], r["load"], r["greedy_size"] or None,
                      r["seconds"], r["method"], r["lower_bound"], r["optimal"], r["stopped_by"])


def plan_trace(trace: Trace, budget_seconds: float = 1.0, seed: int = 0,
               clock_seconds: Optional[float] = None) -> PlanResult:
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

    Returns:
        :class:`PlanResult`; ``offsets[i]`` belongs to ``trace.entries[i]``.
    """
    return plan_lifetimes(trace.lifetimes(), budget_seconds, seed, clock_seconds)


def validate(lifetimes: Sequence[Tuple[int, int, int]], offsets: Sequence[int]) -> Optional[str]:
    """None if ``offsets`` never overlap two buffers live at once, else the first clash."""
    msg = _ext().validate(*_columns(lifetimes), list(offsets))
    return msg or None
