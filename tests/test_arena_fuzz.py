"""The differential fuzz of the arena (tests/arena_fuzz.py), short runs; the
long one is ``python tools/fuzz_arena.py``."""
from __future__ import annotations

import pytest

from arena_fuzz import Fuzz


@pytest.mark.parametrize("policy,expandable,seed", [("defer", True, 1), ("wait", True, 2),
                                                    ("defer", False, 3)])
def test_fuzz_arena_against_a_reference_model(C, policy, expandable, seed):
    f = Fuzz(C, seed, policy=policy, expandable=expandable)
    f.run(2500)
    s = f.arena.stats()["renaissance"]
    # The run exercised planned steps of several keys and streams.
    assert s["plans"] >= 3 and s["planned_steps"] >= 10, s
