"""Planned steps: record, plan, replay. Each scenario installs the CPU
allocator, so it runs in its own process and prints one JSON line.

Steps are counted from 0 as loop indices are: steps 0 and 1 are recorded (the
dynamic pool serves them), the plan is made at the end of step 1, step 2 is the
first replay, and from step 3 on every step sits at the addresses of the step
before."""
from __future__ import annotations

import textwrap

from conftest import run_json

MiB = 1 << 20

PRELUDE = textwrap.dedent("""
    import json, sys, torch
    import torch_renaissance as tr
    from torch_renaissance.examples import gpt

    def snap():
        s = tr.memory_stats()
        return {k: s[k] for k in ("renaissance.last_step_hits", "renaissance.last_step_allocations",
                                  "renaissance.address_stability", "renaissance.planned_conflicts",
                                  "renaissance.planned_misses", "renaissance.variants",
                                  "renaissance.load_bytes", "renaissance.plan_bytes",
                                  "reserved_bytes.all.current", "reserved_bytes.all.peak",
                                  "allocated_bytes.all.peak", "num_ooms")}
""")


def run_scenario(body: str, *args: str) -> dict:
    return run_json(PRELUDE + textwrap.dedent(body), *args)


# The plan budget is raised from 250 ms a search: the pinned re-plans run
# the search up to three times, and at load 10+ on 2 cores a 250 ms search
# stopped at 7,182,336 bytes of a 7,097,088 bound (reserved 1.012 x LOAD,
# against 1.007 when it reaches the bound).
GPT_30 = """
    mode = sys.argv[1]
    if mode == "planned":
        tr.install("cpu", plan_budget_ms=5000)
    cfg = gpt.GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layer=2, n_head=4)
    model, opt = gpt.make(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    losses, per_step = [], []
    for i in range(30):
        x, y = gpt.synthetic_batch(gen, 4, 64, cfg.vocab_size)
        if mode != "planned":
            losses.append(gpt.train_step(model, opt, x, y))
            continue
        if i == 3:
            tr.reset_peak_memory_stats()   # steady state: from the first replayed step on
        with tr.step():
            losses.append(gpt.train_step(model, opt, x, y))
        per_step.append(snap())
    print(json.dumps({"losses": [l.hex() for l in losses], "steps": per_step}))
"""


def test_gpt_30_steps_planned_hits_stability_and_load():
    default = run_scenario(GPT_30, "default")
    planned = run_scenario(GPT_30, "planned")
    assert planned["losses"] == default["losses"], "losses must be bit-identical"
    steady = planned["steps"][3:]  # steps 3..29
    for n, s in enumerate(steady, start=3):
        hits, allocs = s["renaissance.last_step_hits"], s["renaissance.last_step_allocations"]
        assert allocs > 100
        assert hits >= 0.99 * allocs, (n, hits, allocs)
        assert s["renaissance.address_stability"] == 1.0, (n, s)
    last = steady[-1]
    # Peak reserved from step 3 on (persistent region included) vs the LOAD of
    # the recorded step plus the persistent bytes (what load_bytes reports).
    assert last["reserved_bytes.all.peak"] <= 1.01 * last["renaissance.load_bytes"], last
    assert last["renaissance.load_bytes"] >= last["allocated_bytes.all.peak"] * 0.99
    assert last["num_ooms"] == 0


# A deviation: a block the plan lets die mid-step is kept alive in step 5 (a
# user holding on to a tensor once) while the plan reuses its bytes later in
# the same step.  The controlled tail of the step makes that reuse certain:
# `act` and `h` are alive together, then `act` dies and `t` (the same size)
# is made while `h` still lives, so a layout of height 2 N (+ the GPT step's
# small leftovers) must put `t` over `act`'s bytes.  The test checks that
# overlap in a planned step before it relies on it.
KEEP_ALIVE = """
    tr.install("cpu")
    cfg = gpt.GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layer=2, n_head=4)
    model, opt = gpt.make(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    N = 8 * (1 << 20) + 3 * 4096          # bytes; larger than anything the GPT step makes
    kept = {}
    out = []
    for i in range(9):
        x, y = gpt.synthetic_batch(gen, 4, 64, cfg.vocab_size)
        with tr.step():
            gpt.train_step(model, opt, x, y)
            act = torch.full((N // 4,), float(i))
            h = act + 1.0
            if i == 5:
                kept["act"] = act                 # kept past its planned death
                act.fill_(-1.0)                   # a pattern nothing in the step writes
                kept["addr"] = act.data_ptr()
            del act
            t = torch.zeros(N // 4)
            t += h
            del h, t
        s = snap()
        s["step"] = i
        r = tr.get_arena("cpu").last_step()
        s["big"] = [(e["address"], e["size"]) for e in r["entries"] if e["size"] == N]
        if i == 6:
            s["pattern_ok"] = bool((kept["act"] == -1.0).all())
            del kept["act"]
        if i == 5:
            s["kept_addr"] = kept["addr"]
        out.append(s)
    print(json.dumps({"N": N, "steps": out}))
"""


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def test_keep_alive_deviation_is_safe_and_recovers():
    res = run_scenario(KEEP_ALIVE)
    steps = {s["step"]: s for s in res["steps"]}
    s4, s5, s6, s7 = steps[4], steps[5], steps[6], steps[7]
    assert s4["renaissance.last_step_hits"] == s4["renaissance.last_step_allocations"]
    # The premise: in a planned step the plan puts t over act's bytes.
    act4, h4, t4 = s4["big"]
    assert _overlap(act4, t4) and not _overlap(act4, h4) and not _overlap(h4, t4), s4["big"]
    # Step 5 keeps act: it was still served at its planned address ...
    act5, h5, t5 = s5["big"]
    assert act5 == act4 and s5["kept_addr"] == act4[0]
    # ... and t, planned over it, went elsewhere: a conflict, counted.
    assert not _overlap(t5, act5), s5["big"]
    assert s5["renaissance.planned_conflicts"] > s4["renaissance.planned_conflicts"]
    assert s5["renaissance.planned_misses"] == 0
    # Step 6: act's own slot is still held (the kept tensor dies after step 6),
    # so act and t are served elsewhere; the kept pattern survives.
    assert s6["pattern_ok"], "the kept activation was overwritten"
    act6, h6, t6 = s6["big"]
    assert not _overlap(act6, act4) and not _overlap(t6, act4), s6["big"]
    assert s6["renaissance.planned_conflicts"] >= s5["renaissance.planned_conflicts"] + 2
    assert s6["renaissance.planned_misses"] == 0
    # Steps 7 and 8: planned again, no new conflict, every request a hit. The
    # conflicts of steps 5 and 6 re-planned step 7 around the kept tensor (a
    # larger layout); once it had died, step 8 got the first plan back: its
    # size, its addresses and the reserved bytes of step 4.
    for s in (s7, steps[8]):
        assert s["renaissance.planned_conflicts"] == s6["renaissance.planned_conflicts"], s
        assert s["renaissance.last_step_hits"] == s["renaissance.last_step_allocations"], s
        assert s["renaissance.planned_misses"] == 0
    s8 = steps[8]
    assert s8["big"] == s4["big"]
    assert s8["renaissance.plan_bytes"] == s4["renaissance.plan_bytes"]
    assert s8["reserved_bytes.all.current"] == s4["reserved_bytes.all.current"]


VARIANTS = """
    tr.install("cpu")
    cfg = gpt.GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layer=2, n_head=4)
    model, opt = gpt.make(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(16):
        batch = 8 if i % 2 == 0 else 5
        x, y = gpt.synthetic_batch(gen, batch, 64, cfg.vocab_size)
        with tr.step():
            gpt.train_step(model, opt, x, y)
        s = snap(); s["step"] = i
        out.append(s)
    print(json.dumps(out))
"""


def test_alternating_batch_sizes_make_two_variants_and_stop_growing():
    steps = run_scenario(VARIANTS)
    assert steps[-1]["renaissance.variants"] == 2
    # Once both shapes have been seen and planned, reserved never grows.
    settled = [s["reserved_bytes.all.current"] for s in steps[4:]]
    assert max(settled) == settled[0], settled
    for s in steps[6:]:
        assert s["renaissance.last_step_hits"] == s["renaissance.last_step_allocations"], s


VARLEN = """
    import random
    tr.install("cpu")
    cfg = gpt.GPTConfig(vocab_size=256, seq_len=512, d_model=128, n_layer=2, n_head=2)
    model, opt = gpt.make(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    rng = random.Random(7)
    out = []
    longest = 0
    for i in range(200):
        t = rng.randint(16, 512)
        longest = max(longest, t)
        x, y = gpt.synthetic_batch(gen, 2, t, cfg.vocab_size)
        with tr.step():
            gpt.train_step(model, opt, x, y)
        s = snap(); s["len"] = t; s["longest"] = longest
        out.append(s)
    print(json.dumps(out))
"""


def test_variable_lengths_reserved_stops_growing():
    steps = run_scenario(VARLEN)
    longest = steps[-1]["longest"]
    first = next(i for i, s in enumerate(steps) if s["len"] == longest)
    # The step after the longest length was seen (and planned) fixes reserved.
    after = [s["reserved_bytes.all.current"] for s in steps[first + 1:]]
    assert after and max(after) == after[0], (first, after[:10])
    last = steps[-1]
    assert last["reserved_bytes.all.peak"] <= 1.25 * last["allocated_bytes.all.peak"], last
    assert last["num_ooms"] == 0


LARGE_BLOCK = """
    MiB = 1 << 20
    tr.install("cpu", max_reserved_mb=100)
    persistent = torch.ones(50 * MiB, dtype=torch.uint8)        # e.g. weights
    addrs, out = [], []
    for i in range(6):
        with tr.step():
            big = torch.empty(40 * MiB, dtype=torch.uint8)      # 40% of the limit
            big.fill_(1)
            addrs.append(big.data_ptr())
            del big
            small = [torch.full((2 * MiB,), i, dtype=torch.uint8) for _ in range(20)]
            total = sum(int(t[0]) for t in small)
            del small
        s = snap(); s["step"] = i
        out.append(s)
    print(json.dumps({"steps": out, "addrs": addrs}))
"""


def test_large_freed_block_is_not_lost_to_small_ones():
    r = run_scenario(LARGE_BLOCK)
    steps = r["steps"]
    assert all(s["num_ooms"] == 0 for s in steps)
    assert max(s["reserved_bytes.all.peak"] for s in steps) <= 100 * MiB
    # From the first replayed step on the big tensor is at one planned address
    # and the small ones reuse its range (no growth).
    assert len(set(r["addrs"][2:])) == 1
    for s in steps[2:]:
        assert s["renaissance.last_step_hits"] == s["renaissance.last_step_allocations"]
        assert s["reserved_bytes.all.current"] == steps[2]["reserved_bytes.all.current"]


EXPORT = """
    import pickle
    from torch.cuda import _memory_viz as mv
    tr.install("cpu")
    cfg = gpt.GPTConfig(vocab_size=512, seq_len=64, d_model=128, n_layer=2, n_head=4)
    model, opt = gpt.make(cfg, seed=0)
    gen = torch.Generator().manual_seed(1)
    for i in range(4):
        x, y = gpt.synthetic_batch(gen, 4, 64, cfg.vocab_size)
        with tr.step():
            gpt.train_step(model, opt, x, y)
    path = sys.argv[1]
    snap_written = tr.export_snapshot(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    html = mv.trace_plot(snap)
    seg_html = mv.segment_plot(snap)
    summary = mv.segsum(snap)
    step = tr.get_arena().last_step()
    seg = [g for g in tr.get_arena().snapshot() if g["plan_top"]][0]
    inside = [e for e in step["entries"] if seg["address"] <= e["address"] < seg["address"] + seg["plan_top"]]
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    print(json.dumps({"html": len(html), "seg_html": len(seg_html), "segsum": len(summary),
                      "allocs": len(allocs), "inside": len(inside),
                      "addr_ok": sorted(a["addr"] for a in allocs) == sorted(e["address"] for e in inside)}))
"""


def test_export_planned_run_opens_in_memory_viz(tmp_path):
    r = run_scenario(EXPORT, str(tmp_path / "plan.pickle"))
    assert r["html"] > 1000 and r["seg_html"] > 1000 and r["segsum"] > 0
    assert r["allocs"] == r["inside"] > 100
    assert r["addr_ok"]
