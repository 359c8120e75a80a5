"""Planned territory under re-planning, pending blocks and fixed segments.

Each scenario prints ours (planning on) beside the dynamic pool alone
(``planning=False``, the baseline every plan must beat or match):

* ``new structures``: 40 structures back to back, each run for two steps (the
  second a new plan: a shape seen once is planned only before the back-off,
  StepPlanner::kBackoffPlans), 2 tensors allocated between steps and kept for a few (issue 18):
  the highest reserved MiB over the run, the peak allocated MiB, and what
  stays reserved after everything is freed and ``empty_cache()``;
* ``pending at the end``: a 118 MiB buffer used on a side stream that
  finishes right after ``end_step`` (SimDevice, issue 11): plan MiB, reserved
  MiB in the steady state, reserved after ``empty_cache()``;
* ``varlen fixed``: the bundled GPT trained on sequence lengths that grow
  every step (16, 32, ..., 480 tokens) with ``expandable_segments=False``
  (issue 11): the largest per-step peak reserved / peak allocated, and the
  last step's.

Run: ``python benchmarks/bench_territory.py``.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from _common import child_env, git_rev, machine, table

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from territory_scenarios import new_structures  # noqa: E402  (the test's scenario)

MiB = 1 << 20


def new_structures_row(C, planning: bool) -> list[str]:
    a = C.Arena(C.HostDevice(), planning=planning)
    run = new_structures(a, planning, steps=80, repeat=2)
    peak = a.stats()["allocated_bytes"]["all"]["peak"]
    for p in run["between"]:
        a.deallocate(p)
    a.empty_cache()
    left = a.stats()["reserved_bytes"]["all"]["current"]
    return [f"{run['peak_reserved'] / MiB:.0f}", f"{peak / MiB:.0f}", f"{left / MiB:.0f}"]


def pending_at_end(C, planning: bool) -> list[str]:
    d = C.SimDevice()
    side = d.new_stream()
    a = C.Arena(d, planning=planning)
    for _ in range(6):
        if planning:
            a.begin_step()
        x = a.allocate(118 * MiB)
        d.enqueue(side, 1)
        a.record_stream(x, side)
        y = a.allocate(2 * MiB)
        a.deallocate(y)
        a.deallocate(x)
        if planning:
            a.end_step()
        else:
            a.sync_point()
        d.run_all()
    s = a.stats()
    plan = s["renaissance"]["plan_bytes"] / MiB if planning else float("nan")
    steady = s["reserved_bytes"]["all"]["current"]
    a.empty_cache()
    return [f"{plan:.0f}", f"{steady / MiB:.0f}", f"{a.stats()['reserved_bytes']['all']['current'] / MiB:.0f}"]


VARLEN = """
import json, sys, torch
import torch_renaissance as tr
from torch_renaissance.examples import gpt
tr.install("cpu", expandable_segments=False, planning=sys.argv[1] == "1")
cfg = gpt.GPTConfig(vocab_size=256, seq_len=512, d_model=128, n_layer=2, n_head=2)
model, opt = gpt.make(cfg, seed=0)
gen = torch.Generator().manual_seed(1)
out = []
for i in range(30):
    x, y = gpt.synthetic_batch(gen, 2, 16 * (i + 1), cfg.vocab_size)
    tr.reset_peak_memory_stats()
    with tr.step():
        gpt.train_step(model, opt, x, y)
    s = tr.memory_stats()
    out.append(s["reserved_bytes.all.peak"] / s["allocated_bytes.all.peak"])
print(json.dumps([max(out[2:]), out[-1]]))
"""


def varlen_fixed(planning: bool) -> list[str]:
    r = subprocess.run([sys.executable, "-c", VARLEN, "1" if planning else "0"], capture_output=True,
                       text=True, env=child_env(), timeout=1200)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    worst, last = json.loads(r.stdout.strip().splitlines()[-1])
    return [f"{worst:.2f}", f"{last:.2f}"]


def main() -> None:
    from torch_renaissance import _C as C

    print(f"# planned territory; {machine()}; {git_rev()}")
    rows = [[name] + new_structures_row(C, p) for name, p in (("dynamic only", False), ("planned", True))]
    print("\nnew structures (MiB)")
    print(table(["", "max reserved", "peak allocated", "reserved after empty_cache"], rows))
    rows = [[name] + pending_at_end(C, p) for name, p in (("dynamic only", False), ("planned", True))]
    print("\npending at the end (MiB)")
    print(table(["", "plan", "steady reserved", "reserved after empty_cache"], rows))
    rows = [[name] + varlen_fixed(p) for name, p in (("dynamic only", False), ("planned", True))]
    print("\nvarlen fixed (peak reserved / peak allocated)")
    print(table(["", "worst step", "last step"], rows))


if __name__ == "__main__":
    main()
