"""Training loops whose step structure changes from step to step (issue 16).

A periodic ``torch.no_grad()`` eval inside the loop lands in the step after an
optimizer step: every ``every``-th step has its own structure (the eval's
temporaries first, then the training step), so its own layout. Steps switch
between the two layouts, and each replay finds the previous step's live-outs
(the kept batch and loss: an alternating layout) where the *other* layout put
them, and its first requests are placed before it is known which layout the
step follows. Before: 2-4 conflicts at every switch, the eval layout's conflicts
carried across its steps, a re-plan every 2 * ``every`` steps to the end of the
run (a 40-step MLP under ``run``: reserved 157.4 MiB against 129.4 MiB with
planning off). The loops here are hand-made on ``_C.Arena`` with budget-0 plans,
so the counts do not depend on the machine.
"""
from __future__ import annotations

import random

import pytest

from _aging import allocate_aging

KiB = 1 << 10


def _shape(rng: random.Random):
    """A seeded training step: the forward's temporaries (size, life in allocations),
    the batch and loss sizes, the gradients' sizes, the optimizer's temporaries,
    and the eval's temporaries."""
    return dict(
        batch=rng.randint(4, 32) * 16 * KiB,
        fwd=[(rng.randint(1, 64) * 8 * KiB, rng.randint(0, 5)) for _ in range(rng.randint(8, 30))],
        loss=512,
        grads=[rng.randint(4, 128) * 8 * KiB for _ in range(rng.randint(2, 8))],
        opt=[(rng.randint(4, 128) * 8 * KiB, rng.randint(0, 2)) for _ in range(rng.randint(2, 6))],
        eval=[(rng.randint(1, 64) * 8 * KiB, rng.randint(0, 3)) for _ in range(rng.randint(3, 12))],
    )


class Loop:
    """``for i: x = batch(); loss = model(x); loss.backward(); opt.step(); opt.zero_grad();
    if i % every == 0: eval`` with the step boundary at ``opt.step()`` (as ``run``). The
    previous batch and loss stay live until the new ones exist (the variables keep them)."""

    def __init__(self, arena, shape, hint=False):
        self.arena, self.s, self.hint = arena, shape, hint
        self.x = self.loss = None
        self.grads = []
        self.state = None
        self.persistent_seen = 0  # the persistent segments' bytes inside the optimizer step

    def _alloc(self, size, life, pending):
        return allocate_aging(self.arena, size, life, pending)

    def step(self, evaluate: bool):
        a, s = self.arena, self.s
        a.begin_step()
        for g in self.grads:  # zero_grad (set_to_none) after the boundary
            a.deallocate(g)
        self.grads = []
        pending = []
        if evaluate:  # no_grad eval: temporaries only
            for size, life in s["eval"]:
                self._alloc(size, life, pending)
            for _, p in pending:
                a.deallocate(p)
            pending = []
        x = a.allocate(s["batch"])
        if self.x is not None:
            a.deallocate(self.x)
        self.x = x
        for size, life in s["fwd"]:
            self._alloc(size, life, pending)
        loss = a.allocate(s["loss"])
        if self.loss is not None:
            a.deallocate(self.loss)
        self.loss = loss
        for size in s["grads"]:
            self.grads.append(a.allocate(size))
        for _, p in pending:
            a.deallocate(p)
        pending = []
        if self.hint:  # inside optimizer.step() (PyTorch's optimizer step hooks)
            a.set_persistent_hint(True)
            if self.state is None:  # the optimizer's state: made in its first step, kept
                self.state = [a.allocate(size) for size in s["grads"]]
        for size, life in s["opt"]:
            self._alloc(size, life, pending)
        if self.hint:
            self.persistent_seen = _persistent_bytes(a)
        for _, p in pending:
            a.deallocate(p)
        if self.hint:
            a.set_persistent_hint(False)
        a.end_step()


@pytest.mark.parametrize("same_forward", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_periodic_eval_settles(C, seed, same_forward):
    rng = random.Random(seed)
    every = rng.choice((3, 4, 5, 7))
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    shape = _shape(rng)
    if same_forward:
        # The eval runs the training step's forward (same sizes, more than the
        # 16 requests a step chooses its layout in): its batch and forward's
        # temporaries, freed at once, then its loss. The training step after an
        # eval step began on the eval layout and stayed on it past the common
        # prefix (HF Qwen2 eval every 5: 5-7 conflicts after each eval).
        shape["fwd"] = [(size, life) for size, life in shape["fwd"]] + \
            [(rng.randint(1, 64) * 8 * KiB, 1) for _ in range(20)]
        shape["eval"] = [(shape["batch"], 1)] + [(size, 0) for size, _ in shape["fwd"]] + [(4096, 0)]
    loop = Loop(arena, shape)
    steps = 12 * every
    plans, conflicts, evals = [], [], []
    for i in range(1, steps + 1):
        before = arena.stats()["renaissance"]["planned_conflicts"]
        evals.append(i % every == 1 and i > 1)
        loop.step(evaluate=evals[-1])  # the eval after step i - 1
        r = arena.stats()["renaissance"]
        plans.append(r["plans"])
        conflicts.append(r["planned_conflicts"] - before)
    r = arena.stats()["renaissance"]
    # Two structures, two layouts; planned once each (a re-plan of a layout the
    # first switches conflicted with may come in the first two eval periods).
    assert r["layouts"] == 2, r
    settled = 3 * every
    assert plans[-1] == plans[settled], plans
    assert plans[-1] <= 4, plans
    # Switching layouts costs nothing once both exist. Before: 2-7 conflicts in
    # the steps around each eval, and a re-plan every other eval period.
    training = [c for c, e in zip(conflicts[settled:], evals[settled:]) if not e]
    at_evals = [c for c, e in zip(conflicts[settled:], evals[settled:]) if e]
    assert sum(training) == 0, conflicts
    if same_forward:
        # Not all: the eval step begins on the training layout (it follows
        # training steps), and its forward's buffers that die at once cannot all
        # share the training forward's offsets (the kept batch lives longer in
        # the eval step): a few conflicts in each eval step, never more: the
        # later evals conflict no more than the first ones after settling
        # (with the first replay's bridge the first window's steps can conflict
        # less than an eval step does, so the bound is the evals' own), and
        # fewer than the eval step has requests.
        half = len(at_evals) // 2
        assert max(at_evals[half:]) <= max(at_evals[:half]), conflicts
        assert max(at_evals) < len(shape["eval"]) + 2, conflicts
    else:
        assert sum(at_evals) == 0, conflicts
    assert r["last_step_hits"] == r["last_step_allocations"], r
    arena.check_invariants()


def _persistent_bytes(arena):
    return sum(seg["total_size"] for seg in arena.snapshot() if seg["persistent"])


@pytest.mark.parametrize("seed", range(4))
def test_a_step_that_leaves_its_layout_keeps_optimizer_temporaries_out_of_the_persistent_segment(C, seed):
    """What an optimizer makes while a step is recorded goes to the persistent segment
    (its state, packed apart). In a step that began replaying and left its layout (the
    first eval step) the state exists: the optimizer's temporaries grew that segment by
    their size (a 3-layer MLP under ``run``: the eval step's peak 153.4 MiB, 129.1 after,
    for a steady 113.4 MiB)."""
    rng = random.Random(seed + 100)
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    loop = Loop(arena, _shape(rng), hint=True)
    for _ in range(4):  # recorded, planned, replayed
        loop.step(evaluate=False)
    assert arena.stats()["renaissance"]["last_step_hits"] > 0
    held = loop.persistent_seen  # the state alone: the temporaries were planned
    assert held >= sum(loop.s["grads"])
    loop.step(evaluate=True)  # a new structure: leaves the layout at its first requests
    r = arena.stats()["renaissance"]
    assert r["planned_misses"] >= 1, r
    assert loop.persistent_seen == held, (held, loop.persistent_seen)
    arena.check_invariants()


def _routed_step(arena, rng, experts, tokens, held):
    """An eager MoE layer stack: per layer, the router's outputs, then per expert
    buffers sized by its token count (data-dependent: drawn per step), then the
    combine; the loss is kept to the next step (as a loop's variable)."""
    arena.begin_step()
    pending = []
    for _layer in range(3):
        allocate_aging(arena, 64 * KiB, 2, pending)         # hidden states
        allocate_aging(arena, 8 * KiB, 1, pending)          # router logits
        counts = [rng.randint(tokens // 4, tokens) for _ in range(experts)]
        for c in counts:
            allocate_aging(arena, c * 512, 1, pending)      # the expert's tokens
            allocate_aging(arena, c * 1024, 0, pending)     # its activation
        allocate_aging(arena, 64 * KiB, 2, pending)         # combined output
    loss = arena.allocate(512)
    for _, p in pending:
        arena.deallocate(p)
    if held:
        arena.deallocate(held.pop())
    held.append(loss)
    arena.end_step()


@pytest.mark.parametrize("seed", range(6))
def test_sizes_that_change_every_step_stop_being_planned(C, seed):
    """Eager MoE routing: one structure, but the experts' sizes change every step, so
    nearly every replay outgrows a slot, misses, and is planned again (HF Qwen2-MoE:
    hit rate 20%, 27-40 plans in 60 steps, more reserved than with planning off). The
    layout is frozen once its replays keep missing: no more plans, and an outgrown
    request is served alone by the dynamic pool while the rest of the step replays."""
    rng = random.Random(seed)
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0)
    held = []
    experts, tokens = rng.choice((4, 8)), rng.choice((64, 128, 256))
    plans = []
    for _ in range(60):
        before = arena.stats()["renaissance"]
        _routed_step(arena, rng, experts, tokens, held)
        r = arena.stats()["renaissance"]
        plans.append(r["plans"])
    r = arena.stats()["renaissance"]
    assert r["give_ups"] >= 1, r
    # Frozen within the first 20 steps: no plan after them (before: a plan
    # in most steps to the end).
    assert plans[-1] == plans[20], plans
    # The last step is served by the dynamic pool (its structure frozen):
    # nothing of it replayed, so nothing missed, hit or went unserved.
    d = {k: r[k] - before[k] for k in ("planned_unserved", "planned_hits", "planned_misses", "planned_steps")}
    assert d == dict.fromkeys(d, 0), d
    arena.check_invariants()


def _moe_peak_reserved(C, seed, warmup, steps, **options):
    """Peak reserved bytes of ``steps`` routed steps after ``warmup`` of them (peaks
    reset in between), on a HostDevice arena with budget-0 plans and ``options``."""
    rng = random.Random(seed)
    arena = C.Arena(C.HostDevice(), plan_budget_ms=0, **options)
    held = []
    experts, tokens = rng.choice((4, 8)), rng.choice((64, 128, 256))
    for k in range(warmup + steps):
        if k == warmup:
            arena.reset_peak_stats()
        _routed_step(arena, rng, experts, tokens, held)
    arena.check_invariants()
    return arena.stats()["reserved_bytes"]["all"]["peak"], arena.stats()["renaissance"]


def test_a_frozen_structure_costs_no_more_than_planning_off(C):
    """Once eager MoE's structure is frozen, its steps cost no more than with planning
    off: the territory goes back to the dynamic pool, which serves the whole step.
    Before (a frozen layout replayed, an outgrown request served alone beside the
    territory) the layout's top stayed reserved next to the dynamic pool's segments:
    peak reserved over steps 20-60 1.13-1.73 x planning off's in these seeds. The
    dynamic pool's own history (what the planned steps before the give-up left where)
    can still differ from planning off's by a granule in a seed, so each seed gets 10%
    and the seeds together none."""
    on_total = off_total = 0
    worse = []
    for seed in range(12):
        on, r = _moe_peak_reserved(C, seed, 20, 40)
        off, _ = _moe_peak_reserved(C, seed, 20, 40, planning=False)
        assert r["give_ups"] >= 1, (seed, r)
        on_total, off_total = on_total + on, off_total + off
        if on > 1.10 * off:
            worse.append((seed, on, off))
    assert not worse, worse
    assert on_total <= off_total, (on_total, off_total)


EVAL_LOOP = """
import torch, torch_renaissance as tr
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
# The highest reserved at a step boundary in run's steady state: from the first
# boundary at which a step had replayed and no plan was made (at the latest
# after 4 replayed steps).
top, steady, plans = 0, False, 0
for i in range(1, 31):
    x = torch.randn(64, 256, generator=g); y = torch.randint(0, 10, (64,), generator=g)
    loss = nn.functional.cross_entropy(m(x), y); loss.backward(); opt.step()
    s = tr.memory_stats()  # right after the boundary (the optimizer step's hook)
    replayed = s["renaissance.planned_steps"]
    steady = steady or replayed >= 4 or (replayed >= 1 and s["renaissance.plans"] == plans)
    plans = s["renaissance.plans"]
    if steady:
        top = max(top, s["reserved_bytes.all.current"])
    opt.zero_grad()
    if i % 5 == 0 and i < 30:  # (none after the last step: no tail step of a new shape)
        with torch.no_grad():
            ev = nn.functional.cross_entropy(m(torch.randn(64, 256, generator=g)), y).item()
print(top)
"""


def test_run_report_on_a_training_loop_with_a_periodic_eval(tmp_path):
    """A plain-PyTorch loop with a no_grad eval every 5 steps under ``run``: the
    training and eval layouts are planned once each, and the report tells the truth
    about it. Before: the plans went on (5 in 30 steps here; 13 in 40 for a tester's
    Qwen2), address stability was the last step's (100% beside 281 conflicts), and
    "above LOAD" named parts from other moments that left most of it unexplained."""
    from conftest import run_report

    (tmp_path / "loop.py").write_text(EVAL_LOOP)
    r, rep = run_report(tmp_path / "loop.py", tmp_path / "r.json")
    top = int(r.stdout.strip())
    # The two layouts' plans, and a refine of the training layout's first plan
    # where it was pinned or over its bound (installed only when lower).
    assert rep["plans"] in (2, 3) and rep["layouts"] == 2, rep
    # Over the steady steps (replayed ones compared with a replayed step of their
    # layout), not the last step only.
    assert rep["address_stability_over"] == "steady steps", rep
    assert rep["address_stability_last_step"] == 1.0, rep
    assert 0.5 < rep["address_stability"] <= 1.0, rep
    # Above LOAD: what the steps reserved above the highest steady boundary is the
    # steady peak less the highest reserved the program saw at a boundary, and the
    # parts add up to the total.
    p = rep["above_load_parts"]
    assert p["within_step_bytes"] == rep["steady_peak_reserved_bytes"] - top, (p, top)
    assert sum(v for k, v in p.items() if k.endswith("_bytes")) == rep["above_load_bytes"], p
    assert "reserved inside steps above the highest steady boundary" in r.stderr, r.stderr
