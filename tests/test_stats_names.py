"""Stats that were all called LOAD have their own names; the old keys stay as
aliases for one release: ``step_and_persistent_load_bytes`` (old
``load_bytes``), ``step_load_bytes`` (the glossary's LOAD) and
``plan_over_step_load_and_obstacles`` (old ``plan_over_load``)."""
from __future__ import annotations

import textwrap

from conftest import run_json


def _three_steps(a):
    for _ in range(3):
        a.begin_step(1)
        x = a.allocate(4096)
        y = a.allocate(8192)  # live together with x
        a.deallocate(x)
        z = a.allocate(1000)
        a.deallocate(y)
        a.deallocate(z)
        a.end_step()


def test_the_loads_have_their_own_names(C):
    a = C.Arena(C.HostDevice())
    keep = a.allocate(1 << 20)  # live across every step
    _three_steps(a)
    r = a.stats()["renaissance"]
    assert r["plans"] >= 1
    # By hand: x and y are live together (4096 + 8192); z (1000 -> 1024 on 64 B) with y.
    assert r["step_load_bytes"] == 4096 + 8192
    assert r["step_and_persistent_load_bytes"] == r["load_bytes"]
    assert r["step_and_persistent_load_bytes"] >= r["step_load_bytes"]
    a.deallocate(keep)


def test_plan_over_step_load_and_obstacles_and_its_old_name():
    r = run_json(textwrap.dedent("""
        import json, torch, torch_renaissance as tr
        tr.install("cpu")
        w = torch.ones(1 << 18)
        for _ in range(4):
            with tr.step():
                a = torch.ones(1 << 16) * 2
                b = (a + 1).sum()
        s = tr.memory_stats()
        print(json.dumps({k[len("renaissance."):]: v for k, v in s.items()
                          if k.startswith("renaissance.")}))
    """))
    assert r["plans"] >= 1 and r["plan_bytes"] > 0
    bound = r["step_load_bytes"] + r["obstacle_bytes"]
    assert r["plan_over_step_load_and_obstacles"] == r["plan_bytes"] / bound
    assert r["plan_over_load"] == r["plan_over_step_load_and_obstacles"]
    assert r["step_and_persistent_load_bytes"] == r["load_bytes"]


def test_every_device_stat_of_the_installed_torch_has_its_key(C):
    # memory_stats() promises the keys of torch.cuda.memory_stats(): every field of
    # c10::CachingDeviceAllocator::DeviceStats in the installed torch's header (the
    # struct torch/csrc/cuda/Module.cpp converts) is a key of the arena's stats, except
    # the per-private-pool map that PyTorch reports through MemPool instead.
    import os
    import re

    import torch

    header = os.path.join(os.path.dirname(torch.__file__), "include", "c10", "core",
                          "CachingDeviceAllocator.h")
    if not os.path.exists(header):
        import pytest
        pytest.skip("the installed torch has no c10 headers")
    text = open(header, encoding="utf-8").read()
    body = text[text.index("struct DeviceStats"):]
    body = body[:body.index("};")]
    fields = set(re.findall(r"^\s*(?:StatArray|Stat|int64_t)\s+(\w+)\s*(?:=[^;]*)?;", body, re.M))
    assert {"num_ooms", "allocated_bytes", "max_split_size"} <= fields  # the parse found the struct
    s = C.Arena(C.HostDevice()).stats()
    missing = sorted(f for f in fields if f not in s)
    assert missing == [], f"DeviceStats fields without a stats key: {missing}"


def test_largest_load_is_over_every_key_not_the_current_layout(C):
    # A serving loop whose last step was its smallest: the report's LOAD was that step's.
    MiB = 2**20
    a = C.Arena(C.HostDevice())

    def big():
        p, q = a.allocate(MiB), a.allocate(2 * MiB)  # both live: LOAD 3 MiB
        a.deallocate(p)
        a.deallocate(q)

    def small():
        a.deallocate(a.allocate(MiB // 2))

    for _ in range(4):
        for key, body in ((1, big), (2, small)):
            a.begin_step(key)
            body()
            a.end_step()
    r = a.stats()["renaissance"]
    assert r["layouts"] == 2, r
    assert r["load_bytes"] == MiB // 2  # the current layout: key 2's
    assert r["largest_load_bytes"] == 3 * MiB


def test_load_is_at_most_the_peak_of_live_bytes_when_a_step_makes_lasting_state(C):
    # A tester's two optimizers: the second one's first step() makes its state after the
    # step's peak, in that one step. LOAD was that step's LOAD + every byte live at plan
    # time (the new state included): 37.9 MiB against a peak allocated of 32.9 MiB. Here by
    # hand: steps 0-2 peak at 8 MiB, step 2 then keeps 8 MiB for good, later steps peak at
    # 2 MiB over it. The most ever live is 10 MiB, so no lower bound may exceed it.
    MiB = 2**20
    a = C.Arena(C.HostDevice(), plan_budget_seconds=0)
    kept = []
    for step in range(8):
        a.begin_step(1)
        a.deallocate(a.allocate((8 if step < 3 else 2) * MiB))
        if step == 2:
            kept.append(a.allocate(8 * MiB))
        a.end_step()
    s = a.stats()
    r = s["renaissance"]
    assert s["allocated_bytes"]["all"]["peak"] == 10 * MiB
    assert r["layouts"] >= 1
    assert r["largest_load_bytes"] == 10 * MiB, r  # was 16 MiB: 8 (step 2's) + 8 (kept after it)
    assert r["load_bytes"] == 10 * MiB, r


def test_hit_rate_counts_a_planned_steps_allocations_after_its_replay_stopped(C):
    # A planned step whose sequence leaves its layout (here: more allocations than
    # planned) is served by the dynamic pool from its first miss on. Those requests
    # were counted nowhere, so a step that ran mostly unplanned showed a hit rate of
    # ~99% (a tester's ViT + bf16 on two threads: 86% of each planned step unplanned).
    MiB = 2**20
    a = C.Arena(C.HostDevice(), plan_budget_ms=0)

    def step(n):
        a.begin_step()
        ps = [a.allocate(MiB) for _ in range(n)]
        for p in ps:
            a.deallocate(p)
        a.end_step()

    for _ in range(4):
        step(6)  # recorded twice, then replayed twice: 12 hits
    before = a.stats()["renaissance"]
    step(10)  # 6 hits, a miss at the 7th, then 3 served by the dynamic pool
    r = a.stats()["renaissance"]
    assert r["planned_hits"] - before["planned_hits"] == 6
    assert r["planned_misses"] - before["planned_misses"] == 1
    assert r["planned_requests"] - before["planned_requests"] == 7
    assert r["planned_unserved"] - before["planned_unserved"] == 3
    assert before["planned_unserved"] == 0
    # The hit rate memory_stats() reports: hits over every allocation of planned steps.
    r2 = run_json(textwrap.dedent("""
        import json, torch, torch_renaissance as tr
        tr.install("cpu", plan_budget_ms=0)
        for n in (6, 6, 6, 6, 10):
            with tr.step():
                xs = [torch.empty(1 << 18) for _ in range(n)]
                del xs
        s = tr.memory_stats()
        print(json.dumps({k[len("renaissance."):]: v for k, v in s.items()
                          if k.startswith("renaissance.")}))
    """))
    assert r2["planned_unserved"] == 3, r2
    assert r2["hit_rate"] == 18 / 22, r2  # 6 + 6 + 6 hits; 6 + 6 + 7 requests + 3 unserved
