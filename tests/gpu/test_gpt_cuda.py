"""The bundled GPT trains on the GPU with planned steps exactly like with PyTorch's allocator."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.gpu


def first_difference(a: list, b: list) -> int | None:
    """The first step whose loss differs between two runs (None: none does)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_gpt_planned_losses_match_native_bit_for_bit(run_case):
    # Two native runs first: if PyTorch's own allocator does not repeat its
    # losses bit for bit here (a library picking other kernels from run to
    # run), comparing ours with it would blame the allocator for nothing.
    # The three runs share the GPU at once (each is a fresh process).
    with ThreadPoolExecutor(3) as pool:
        runs = [pool.submit(run_case, "gpt", mode, "20", timeout=150)
                for mode in ("native", "native", "planned")]
        native, native_again, planned = (r.result() for r in runs)
    assert len(native["losses"]) == 20
    step = first_difference(native["losses"], native_again["losses"])
    if step is not None:
        pytest.skip(f"native is not deterministic here: two runs with PyTorch's allocator differ "
                    f"from step {step} on, so the bit-identical comparison says nothing")
    step = first_difference(planned["losses"], native["losses"])
    assert step is None, f"planned losses differ from native from step {step} on"  # float.hex
    # Steps were really planned: steps 0 and 1 recorded, 2..19 replayed, the
    # last one at its planned offsets.
    assert planned["planned_steps"] >= 15
    assert planned["last_step_allocations"] > 0
    assert planned["last_step_hits"] >= 0.95 * planned["last_step_allocations"]
