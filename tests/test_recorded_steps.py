"""The recorded steps' peak reserved (issue 16: the whole run, recorded steps included).

Before the first plan exists the dynamic pool serves the recorded steps, and
what ``optimizer.step()`` allocates under the persistent hint is packed into a
segment of its own. HF GPT-2's whole-run peak (1.113 x peak allocated) was
the second recorded step's backward: the first ``step()``'s AdamW foreach
temporaries, freed, were still mapped in the persistent segment (15 MiB), and
the second ``step()``, hinted too, grew that segment again. Now a hinted phase
gives back, when it ends, what it left free in the persistent segment
(``Arena.set_persistent_hint(False)``), and the installer hints only a
``step()`` that makes state (``installer._makes_state``).

The arena-level loop is a seeded model of an ordinary training loop on the
arena's HostDevice (64 KiB granules): parameters; a forward whose activations
die in reverse in the backward; the previous step's output kept alive into
the next step (``out = model(batch)``); gradients kept until ``zero_grad``;
and an AdamW-like ``step()``: state (two tensors per parameter) made in the
first, hinted, step, and in every step a foreach temporary per parameter,
all allocated, then all freed.
"""
from __future__ import annotations

import random

import pytest

KiB, MiB = 1 << 10, 1 << 20
GRANULE = 64 * KiB  # HostRanges::kHostGranularity


def _round(n: int) -> int:
    return -(-n // GRANULE) * GRANULE


def _persistent_free_mapped(a) -> tuple[int, int]:
    """(free bytes still mapped in the persistent segments, the most that
    partial granules can keep mapped there: two granules per free block),
    from the arena's snapshot."""
    free = edges = 0
    for seg in a.snapshot():
        if seg["persistent"]:
            free += seg["total_size"] - seg["allocated_size"]
            edges += sum(min(b["size"], 2 * GRANULE) for b in seg["blocks"] if b["state"] == "inactive")
    return free, edges


def _loop(C, seed: int, steps: int = 6):
    """Runs the loop. Returns (peak reserved from the second recorded step on,
    the whole run's peak allocated, the persistent segment's (free mapped
    bytes, allowance) right after the hinted step() ended), in bytes, the
    arena's invariants checked."""
    rng = random.Random(seed)
    a = C.Arena(C.HostDevice(), plan_budget_ms=0)
    params_sizes = [_round(rng.randint(256 * KiB, 4 * MiB)) for _ in range(rng.randint(6, 14))]
    params = [a.allocate(s) for s in params_sizes]
    act_sizes = [_round(rng.randint(512 * KiB, 6 * MiB)) for _ in range(rng.randint(10, 30))]
    tmp_sizes = [_round(rng.randint(64 * KiB, 2 * MiB)) for _ in act_sizes]
    out_size = _round(rng.randint(2 * MiB, 12 * MiB))
    state, out, after_hint = None, None, None
    for i in range(steps):
        if i == 1:
            a.reset_peak_stats()  # from the second recorded step on
        a.begin_step()
        acts = []
        for s, t in zip(act_sizes, tmp_sizes):  # forward
            acts.append(a.allocate(s))
            a.deallocate(a.allocate(t))
        new_out = a.allocate(out_size)
        if out is not None:
            a.deallocate(out)  # the previous step's output dies once the new one exists
        out = new_out
        grads = []
        for k, t in enumerate(reversed(tmp_sizes)):  # backward
            g = a.allocate(t)
            if k < len(params_sizes):
                grads.append(a.allocate(params_sizes[k]))
            a.deallocate(g)
            a.deallocate(acts.pop())
        grads += [a.allocate(s) for s in params_sizes[len(grads):]]
        makes_state = state is None  # the installer hints only such a step()
        if makes_state:
            a.set_persistent_hint(True)
            state = [a.allocate(s) for s in params_sizes for _ in range(2)]
        temps = [a.allocate(s) for s in params_sizes]
        for t in temps:
            a.deallocate(t)
        if makes_state:
            a.set_persistent_hint(False)
            after_hint = _persistent_free_mapped(a)
        for g in grads:  # zero_grad(set_to_none=True)
            a.deallocate(g)
        a.end_step()
        if i == 0:
            first = a.stats()["allocated_bytes"]["all"]["peak"]
    a.check_invariants()
    s = a.stats()
    peaks = (s["reserved_bytes"]["all"]["peak"], max(first, s["allocated_bytes"]["all"]["peak"]), after_hint)
    for p in params + state + [out]:
        a.deallocate(p)
    a.check_invariants()
    return peaks


@pytest.mark.parametrize("seed", range(12))
def test_a_hinted_step_gives_back_its_temporaries(C, seed):
    reserved, allocated, (free, allowance) = _loop(C, seed)
    # Once the hint is off, the persistent segment keeps mapped only what
    # partial granules at the edges of its free blocks hold: its temporaries'
    # granules went back (the old arena kept all of them mapped: 10-35 MiB
    # here, the parameters' size).
    assert free <= allowance, (free, allowance)
    # From the second recorded step on (the first plan comes after it), the
    # peak reserved against the whole run's peak allocated: what is left is
    # the dynamic pool's best fit in that step, 1.00-1.07 x over these seeds.
    # The old arena: 1.10-1.21 x (the first step()'s freed temporaries still
    # mapped at the second step's peak). The first step's own peak (its
    # state and temporaries mapped beside the dynamic pool's free memory) is
    # not bounded here: that is what is left of issue 16's whole-run figure.
    assert reserved <= allocated * 1.08, (reserved / allocated, reserved - allocated)


def test_only_a_step_that_makes_state_is_hinted():
    # installer._makes_state against PyTorch's own optimizers: AdamW makes its
    # state in the first step() that sees a gradient (torch/optim/adamw.py,
    # _init_group), for each parameter that has one; plain SGD never has any.
    import torch

    from torch_renaissance.installer import _makes_state

    w, b = torch.nn.Parameter(torch.ones(4, 4)), torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([w, b], lr=0.1)
    assert not _makes_state(opt)  # no gradients yet: step() would make nothing
    (w.sum() * 2).backward()
    assert _makes_state(opt)  # w has a gradient and no state
    opt.step()
    assert set(opt.state) == {w} and not _makes_state(opt)  # b has no gradient: no state
    (w.sum() + b.sum()).backward()
    assert _makes_state(opt)  # b has one now
    opt.step()
    assert not _makes_state(opt)
    c = torch.nn.Parameter(torch.ones(3))
    opt.add_param_group({"params": [c]})
    c.sum().backward()
    assert _makes_state(opt)  # a new group's parameter
    # A frozen parameter (never a gradient) keeps the quick count from
    # deciding; the scan still answers.
    frozen = torch.nn.Parameter(torch.ones(2))
    opt2 = torch.optim.AdamW([w, frozen], lr=0.1)
    (w.sum()).backward()
    assert _makes_state(opt2)
    opt2.step()
    assert len(opt2.state) == 1 and not _makes_state(opt2)
    sgd = torch.optim.SGD([w], lr=0.1)
    for _ in range(2):
        assert _makes_state(sgd)  # stateless: every step() may make state, as before
        sgd.step()
