"""The planner on every shared trace (``../shared/data/traces``), beside best fit by decreasing
size (TFLite's ``ArenaPlanner`` / XLA's heap simulator greedy, the baseline) in one group per
trace.

Budgets are the planner issue's targets: 1 s, 5 s for the MiniMalloc instances. Recorded beside
each time (``extra_info``): the plan's bytes over LOAD (``plan_over_load``), and for ours the
method that won. Every plan is validated. Under ``--benchmark-disable`` only the traces under
100 KB run, with a 0.05 s budget. Skipped without the shared data.
"""
from __future__ import annotations

import pytest

from _common import data_dir

from torch_renaissance import _C as C
from torch_renaissance import trace as T
from torch_renaissance.planner import plan_trace, validate

ROOT = data_dir() / "traces"
FILES = (sorted((ROOT / "snapshots").glob("*.pickle")) + sorted((ROOT / "dsa").glob("*.csv"))
         if ROOT.is_dir() else [])
_loaded: dict = {}


def _trace(path):
    if path not in _loaded:
        _loaded[path] = T.load_trace(path)
    return _loaded[path]


def _budget(benchmark, path) -> float:
    if benchmark.disabled:
        return 0.05
    return 5.0 if path.name.startswith("minimalloc") else 1.0


def _select(benchmark, path):
    if benchmark.disabled and path.stat().st_size > 100_000:
        pytest.skip("a large trace: planned only when timing (--benchmark-only)")
    return _trace(path)


def _columns(tr):
    lifetimes = tr.lifetimes()
    return ([s for s, _, _ in lifetimes], [lo for _, lo, _ in lifetimes],
            [up for _, _, up in lifetimes])


@pytest.mark.skipif(not FILES, reason=f"reference traces not found at {ROOT}")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_planner(benchmark, per_op, path):
    tr = _select(benchmark, path)
    budget = _budget(benchmark, path)
    benchmark.group = f"planner {path.stem} ({len(tr)} buffers)"
    res = benchmark.pedantic(plan_trace, args=(tr,), kwargs={"budget_seconds": budget},
                             rounds=1 if benchmark.disabled else 3, iterations=1)
    assert validate(tr.lifetimes(), res.offsets) is None
    assert res.plan_bytes >= res.load_bytes
    if res.greedy_bytes is not None:
        assert res.plan_bytes <= res.greedy_bytes
    benchmark.extra_info.update({
        "plan_over_load": round(res.plan_bytes / res.load_bytes, 5) if res.load_bytes else None,
        "method": res.method, "budget_s": budget})
    per_op(1, "plan")


@pytest.mark.skipif(not FILES, reason=f"reference traces not found at {ROOT}")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_greedy_by_size(benchmark, per_op, path):
    tr = _select(benchmark, path)
    benchmark.group = f"planner {path.stem} ({len(tr)} buffers)"
    sizes, lowers, uppers = _columns(tr)
    res = benchmark.pedantic(C.greedy_by_size, args=(sizes, lowers, uppers),
                             rounds=1 if benchmark.disabled else 3, iterations=1)
    assert validate(tr.lifetimes(), res["offsets"]) is None
    load = tr.load_bytes()
    benchmark.extra_info["plan_over_load"] = round(res["size"] / load, 5) if load else None
    per_op(1, "plan", baseline=True)
