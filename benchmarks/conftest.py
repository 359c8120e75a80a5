"""pytest-benchmark suites of torch_renaissance (``benchmarks/test_bench_*.py``).

Run: ``pytest benchmarks/ --benchmark-only --benchmark-group-by=group`` (``make bench``). Every
group holds our benchmark and its baseline, so the table prints them side by side; each call
runs many operations (pairs, steps, blocks), and the summary at the end divides the median by
that count (``per_op``) and gives our ratio to the group's baseline. ``--benchmark-json FILE``
keeps the same numbers; ``python benchmarks/bench_json_table.py FILE`` turns it into the
Markdown table of docs/benchmarks.md. With ``--benchmark-disable`` (CI) every benchmark runs
once, on small inputs, as a test.
"""
from __future__ import annotations

import pytest

from _common import machine, per_op_table

_RESULTS_KEY = pytest.StashKey[list]()


def pytest_configure(config):
    config.stash[_RESULTS_KEY] = []


@pytest.fixture
def per_op(request, benchmark):
    """``per_op(ops, unit, baseline=False)``: after ``benchmark(...)``, records that one call
    ran ``ops`` operations of ``unit`` (e.g. 100000 "pair"), for the summary and the JSON."""
    results = request.config.stash[_RESULTS_KEY]

    def record(ops: int, unit: str, baseline: bool = False) -> None:
        benchmark.extra_info.update({"ops_per_call": ops, "unit": unit, "baseline": baseline})
        if benchmark.disabled or benchmark.stats is None:
            return
        results.append({"group": benchmark.group, "name": benchmark.name,
                        "stats": {"median": benchmark.stats.stats.median},
                        "extra_info": dict(benchmark.extra_info)})

    return record


def pytest_terminal_summary(terminalreporter, config):
    results = config.stash.get(_RESULTS_KEY, [])
    if results:
        terminalreporter.write_sep("-", f"per operation (median / operations per call) - {machine()}")
        terminalreporter.write_line(per_op_table(results))
