"""A step's temporaries with short lifetimes counted in allocations: each
allocation ages the pending ones and frees those whose count ran out (used by
the keyed-step and back-off loops)."""
from __future__ import annotations

from typing import List, Optional


def allocate_aging(arena, size: int, life: Optional[int], pending: List[list]) -> int:
    """Allocates ``size`` bytes on ``arena``, then counts every pending
    ``[allocations left, pointer]`` down by one and frees those below zero.
    The new block joins ``pending`` with ``life`` allocations to live (it is
    freed after ``life + 1`` more), unless ``life`` is None (the caller keeps it).

    Returns:
        the new block's address (int).
    """
    p = arena.allocate(size)
    for item in pending:
        item[0] -= 1
    for item in [x for x in pending if x[0] < 0]:
        arena.deallocate(item[1])
        pending.remove(item)
    if life is not None:
        pending.append([life, p])
    return p
