"""The planner through the bindings: validity on random and shared instances
(checked by an independent reference in this file), LOAD, errors, determinism,
and the `torch-renaissance plan` command."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from conftest import clean_env


def pieces(lo: int, up: int, period: int):
    """The time intervals a lifetime covers (two when it wraps a cycle)."""
    if period and up > period:
        return [(lo, period), (0, up - period)]
    return [(lo, up)]


def overlap_in_time(a, b, period) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in pieces(*a, period) for y0, y1 in pieces(*b, period))


def check_plan(sizes, lowers, uppers, offsets, period=0, fixed=()):
    """Independent O(n^2) validity check; returns the plan size."""
    items = [(o, s, lo, up) for o, s, lo, up in zip(offsets, sizes, lowers, uppers)]
    items += [tuple(f) for f in fixed]
    n = len(sizes)
    for i in range(len(items)):
        oi, si, li, ui = items[i]
        for j in range(i + 1, len(items)):
            if i >= n and j >= n:
                continue  # two obstacles: given, not planned
            oj, sj, lj, uj = items[j]
            if si and sj and overlap_in_time((li, ui), (lj, uj), period):
                assert oi + si <= oj or oj + sj <= oi, f"buffers {i} and {j} collide"
    return max([o + s for o, s, _, _ in items] or [0])


def load_ref(sizes, lowers, uppers, period=0, fixed=()):
    """LOAD by brute force over every time step."""
    items = list(zip(sizes, lowers, uppers)) + [(s, lo, up) for _, s, lo, up in fixed]
    horizon = max([period] + [up for _, _, up in items] + [1])
    best = 0
    for t in range(horizon):
        live = sum(s for s, lo, up in items
                   if any(a <= t < b for a, b in pieces(lo, up, period)))
        best = max(best, live)
    return best


def random_instance(rng: random.Random, n: int, cyclic: bool, obstacles: int):
    period = 40 if cyclic else 0
    sizes, lowers, uppers = [], [], []
    for _ in range(n):
        lo = rng.randrange(0, 39)
        if cyclic and rng.random() < 0.3:
            up = lo + rng.randint(1, 40)  # may wrap
        else:
            up = rng.randint(lo + 1, 40)
        sizes.append(rng.choice([64, 128, 512, 1000, 4096]) * rng.randint(1, 8))
        lowers.append(lo)
        uppers.append(up)
    fixed = []
    top = 0
    for _ in range(obstacles):
        size = rng.randint(1, 16) * 256
        fixed.append((top + rng.randint(0, 4) * 256, size, 0, period or 40))
        top = fixed[-1][0] + size
    return sizes, lowers, uppers, period, fixed


@pytest.mark.parametrize("seed", range(12))
def test_random_instances_give_valid_plans_with_exact_load(C, seed):
    rng = random.Random(seed)
    sizes, lowers, uppers, period, fixed = random_instance(rng, rng.randint(1, 60), seed % 2 == 1, seed % 3)
    # No clock: on a loaded machine the wall clock can stop even the baseline
    # (greedy_size is then 0, the documented "did not finish"; a CI run saw it).
    r = C.plan(sizes, lowers, uppers, period, fixed, 0.05, clock_seconds=math.inf)
    assert r["stopped_by"] != "clock"
    size = check_plan(sizes, lowers, uppers, r["offsets"], period, fixed)
    assert r["size"] == size
    assert r["load"] == load_ref(sizes, lowers, uppers, period, fixed)
    assert r["load"] <= r["size"] <= r["greedy_size"]
    g = C.greedy_by_size(sizes, lowers, uppers, period, fixed)
    assert check_plan(sizes, lowers, uppers, g["offsets"], period, fixed) == g["size"]
    assert C.validate(sizes, lowers, uppers, r["offsets"], period, fixed) == ""


def test_validate_rejects_a_collision(C):
    # Two buffers live at once placed at the same offset.
    msg = C.validate([100, 100], [0, 1], [5, 6], [0, 0])
    assert msg and "0" in msg and "1" in msg
    assert C.validate([100, 100], [0, 5], [5, 6], [0, 0]) == ""  # disjoint lifetimes may share


def test_plans_are_deterministic(C):
    sizes, lowers, uppers, period, fixed = random_instance(random.Random(42), 200, True, 2)
    # No clock: the work count alone stops the search (a loaded machine's
    # clock would stop the two runs at different points).
    a = C.plan(sizes, lowers, uppers, period, fixed, 0.2, clock_seconds=math.inf)
    b = C.plan(sizes, lowers, uppers, period, fixed, 0.2, clock_seconds=math.inf)
    assert a["stopped_by"] != "clock"
    assert a["offsets"] == b["offsets"] and a["method"] == b["method"]


@pytest.mark.parametrize("sizes, lowers, uppers, period, needle", [
    ([10], [5], [5], 0, "0"),          # upper <= lower
    ([10], [-1], [5], 0, "0"),         # negative time
    ([10, 10], [0, 3], [4, 2], 0, "1"),
    ([10], [45], [50], 40, "0"),       # lower past the period
])
def test_malformed_problems_raise_value_error_naming_the_buffer(C, sizes, lowers, uppers, period, needle):
    with pytest.raises(ValueError, match=needle):
        C.plan(sizes, lowers, uppers, period)


SMALL = ["dsa/minimalloc_A.csv", "dsa/minimalloc_C.csv", "dsa/iopddl_G_1.csv",
         "snapshots/gpt_small_snapshot.pickle", "snapshots/gpt_medium_ctx512_inference.pickle"]


@pytest.mark.parametrize("name", SMALL)
def test_small_shared_instances_plan_validly(shared_data, name):
    from torch_renaissance import trace as T
    from torch_renaissance.planner import plan_trace

    tr = T.load_trace(shared_data / name)
    res = plan_trace(tr, budget_seconds=0.5, clock_seconds=math.inf)
    lt = tr.lifetimes()
    sizes, lowers, uppers = zip(*lt)
    if len(lt) <= 2000:
        size = check_plan(sizes, lowers, uppers, res.offsets)
    else:  # O(n log n) sweep for the bigger ones
        size = max(o + s for o, s in zip(res.offsets, sizes))
    assert res.plan_bytes == size
    assert res.load_bytes == tr.load_bytes()
    assert res.load_bytes <= res.plan_bytes <= res.greedy_bytes


def test_runtime_plans_are_valid(C):
    # A recorded step with cyclic lifetimes (a "gradient" that outlives the
    # step) and an obstacle (a block that lives across steps).
    arena = C.Arena(C.HostDevice())
    keep = arena.allocate(3 << 20)
    grad = None
    for step in range(4):
        arena.begin_step()
        tmp = [arena.allocate((k + 1) * 100_000) for k in range(10)]
        if grad is not None:
            arena.deallocate(grad)  # last step's "gradient" dies after the step began
        for p in tmp[::2]:
            arena.deallocate(p)
        grad = arena.allocate(700_000)
        for p in tmp[1::2]:
            arena.deallocate(p)
        arena.end_step()
    lp = arena.last_plan()
    assert lp["period"] > 0 and lp["fixed"], lp  # it wraps, and it has an obstacle
    check_plan(lp["sizes"], lp["lowers"], lp["uppers"], lp["offsets"], lp["period"], lp["fixed"])
    s = arena.stats()["renaissance"]
    assert s["last_step_hits"] == s["last_step_allocations"] == 11
    arena.deallocate(grad)
    arena.deallocate(keep)
    arena.check_invariants()


def _random_step(arena, seed=7, n=400):
    """Three recorded steps of ``n`` allocations of seeded sizes (4 KiB multiples); every third
    allocation frees an earlier one, the rest die at the step's end."""
    rng = random.Random(seed)
    sizes = [rng.choice([1, 3, 5, 7, 11]) * 4096 * rng.randint(1, 40) for _ in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    for _ in range(3):
        arena.begin_step()
        live = {}
        for i in range(n):
            live[i] = arena.allocate(sizes[i])
            if i % 3 == 2 and order[i] in live and order[i] != i:
                arena.deallocate(live.pop(order[i]))
        for p in live.values():
            arena.deallocate(p)
        arena.end_step()
    return arena.last_plan()


def test_plan_deterministic_turns_the_clock_off(C):
    # plan_budget_ms 1 leaves no clock after the planner's tail (at least 4 ms):
    # the clock stops the search at once, and the sweep's plan (above LOAD here)
    # is the step's plan. plan_deterministic stops it at the work count only
    # (the floor's, since 1 ms of work is less): the same plan in every arena,
    # never "clock", and no taller than the clock's.
    clocked = _random_step(C.Arena(C.HostDevice(), plan_budget_ms=1))
    assert clocked["stopped_by"] == "clock", clocked["stopped_by"]
    plans = [_random_step(C.Arena(C.HostDevice(), plan_budget_ms=1, plan_deterministic=True))
             for _ in range(2)]
    for lp in plans:
        assert lp["stopped_by"] in ("work", "bound", "done"), lp["stopped_by"]
        check_plan(lp["sizes"], lp["lowers"], lp["uppers"], lp["offsets"], lp["period"], lp["fixed"])
    assert plans[0]["offsets"] == plans[1]["offsets"]

    def top(lp):
        return max(o + s for o, s in zip(lp["offsets"], lp["sizes"]))
    assert top(plans[0]) <= top(clocked)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "plan", *args],
                          capture_output=True, text=True, env=clean_env(), timeout=300)


def test_cli_plan_json_and_png(shared_data, tmp_path):
    from torch_renaissance import trace as T

    path = shared_data / "snapshots" / "gpt_small_snapshot.pickle"
    png = tmp_path / "plan.png"
    r = _cli(str(path), "--json", "--budget", "0.2", "--png", str(png))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"buffers", "load_bytes", "greedy_bytes", "plan_bytes", "pytorch_reserved_bytes",
                        "pytorch_reserved_at_dump_bytes", "plan_seconds", "lower_bound_bytes",
                        "optimal", "stopped_by"}
    assert out["stopped_by"] in ("bound", "work", "clock", "done")
    assert out["optimal"] == (out["plan_bytes"] == out["lower_bound_bytes"])
    assert out["load_bytes"] <= out["lower_bound_bytes"] <= out["plan_bytes"]
    tr = T.load_snapshot(path)
    assert out["buffers"] == len(tr) and out["load_bytes"] == tr.load_bytes()
    assert out["pytorch_reserved_bytes"] == tr.pytorch_reserved_peak
    # greedy is None ("not finished") only when the wall clock stopped it (a loaded machine).
    if out["greedy_bytes"] is None:
        assert out["stopped_by"] == "clock", out
    else:
        assert out["load_bytes"] <= out["plan_bytes"] <= out["greedy_bytes"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["pytorch_reserved_at_dump_bytes"] == tr.pytorch_reserved_at_dump
    r = _cli(str(shared_data / "dsa" / "minimalloc_C.csv"), "--json")
    assert json.loads(r.stdout)["pytorch_reserved_bytes"] is None


def test_cli_plan_bad_file_is_a_clear_error(tmp_path, capsys):
    # In this process: `plan` installs nothing (the JSON/PNG test above runs the CLI as a program).
    from torch_renaissance import cli

    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,5,3,100\n")
    assert cli.main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv:2:" in err and "upper must be > lower" in err
    assert cli.main(["plan", str(tmp_path / "missing.pickle")]) == 2
    assert "missing.pickle" in capsys.readouterr().err


@pytest.mark.parametrize("n, load, cell", [
    (13_923_997_704, 13_923_997_700, "+4 B"),  # gpt_train_b's plan: not "+0.00%"
    (100_000_000 + 4 * 1024, 100_000_000, "+4.0 KiB"),
    (100_005, 100_000, "+0.01%"),
    (100, 100, "+0.00%"),  # at LOAD
    (None, 100, "n/a"),
    (5, 0, "n/a"),
])
def test_cli_plan_device_all_cells_say_bytes_under_a_hundredth_percent(n, load, cell):
    # A fresh user's find: the --device all table showed +0.00% where the one-device output
    # says "+4 bytes over LOAD".
    from torch_renaissance import cli

    assert cli._pct_cell(n, load) == cell


def _multi_device_snapshot(tmp_path, devices=(0, 1, 2)):
    """A snapshot with data for several devices: a different synthetic step on each."""
    from torch_renaissance import trace as T
    from torch_renaissance.planner import plan_trace
    from torch_renaissance.synthetic import training_step

    snap = {"segments": [], "device_traces": [[] for _ in range(max(devices) + 1)],
            "external_annotations": []}
    expected = {}
    for d in devices:
        lt = training_step(1000, seed=d)[: 300 + 50 * d]
        end = max(u for _, _, u in lt)
        tr = T.Trace([T.TraceEntry(i, s, 0, lo, up) for i, (s, lo, up) in enumerate(lt)], end)
        one = T.to_snapshot(tr, plan_trace(tr, budget_seconds=0).offsets,
                            base_address=(d + 1) << 40, device=d)
        snap["segments"] += one["segments"]
        snap["device_traces"][d] = one["device_traces"][d]
    path = tmp_path / "three.pickle"
    T.save_snapshot(snap, path)
    for d in devices:
        expected[d] = T.load_snapshot(path, device=d)
    return path, expected


def test_cli_plan_device_all_gives_one_object_per_device_and_totals(tmp_path, capsys):
    from torch_renaissance import cli

    path, traces = _multi_device_snapshot(tmp_path)
    assert cli.main(["plan", str(path), "--device", "all", "--json", "--budget", "0.1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["device"] for o in out["devices"]] == [0, 1, 2]
    for o in out["devices"]:
        tr = traces[o["device"]]
        assert o["buffers"] == len(tr) and o["load_bytes"] == tr.load_bytes()
        assert o["load_bytes"] <= o["plan_bytes"]
    for key in ("buffers", "load_bytes", "plan_bytes", "greedy_bytes"):
        vals = [o[key] for o in out["devices"]]
        # greedy is None on a device whose wall clock stopped it (a loaded machine): the total too.
        assert out["total"][key] == (None if None in vals else sum(vals)), key
    assert all(o["greedy_bytes"] is not None or o["stopped_by"] == "clock" for o in out["devices"])
    # One device: the same numbers as that device's row.
    assert cli.main(["plan", str(path), "--device", "1", "--json", "--budget", "0.1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["buffers"] == len(traces[1]) and one["load_bytes"] == traces[1].load_bytes()
    # The table form has a row per device and a total row.
    assert cli.main(["plan", str(path), "--device", "all", "--budget", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[2:]] == ["0", "1", "2", "total"]


@pytest.mark.parametrize("argv, needles", [
    (["--device", "7"], ["--device 7", "[0, 1, 2]"]),
    ([], ["devices [0, 1, 2]", "--device N", "--device all"]),
    (["--device", "all", "--png", "x.png"], ["--png", "--device N"]),
])
def test_cli_plan_device_errors_are_one_line_naming_real_flags(tmp_path, capsys, argv, needles):
    from torch_renaissance import cli

    path, _ = _multi_device_snapshot(tmp_path)
    assert cli.main(["plan", str(path), "--budget", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    # Every flag the message names is one `plan` has.
    flags = {a for act in cli.build_parser()._subparsers._group_actions[0].choices["plan"]._actions
             for a in act.option_strings}
    for word in err.replace(",", " ").replace(";", " ").replace(":", " ").split():
        if word.startswith("--"):
            assert word in flags, word


def test_cli_plan_device_on_a_csv_and_bad_values(tmp_path, capsys):
    from torch_renaissance import cli

    csv = tmp_path / "t.csv"
    csv.write_text("id,lower,upper,size\n0,0,3,100\n1,1,4,200\n")
    assert cli.main(["plan", str(csv), "--device", "0"]) == 2
    err = capsys.readouterr().err
    assert "CSV" in err and "--device" in err and err.count("\n") == 1
    for bad in ("x", "-1", "\u0663"):
        with pytest.raises(SystemExit) as e:
            cli.main(["plan", str(csv), "--device", bad])
        assert e.value.code == 2
        assert "--device" in capsys.readouterr().err


def test_plan_result_reports_what_stopped_the_search(C):
    # Reached LOAD: "bound", optimal.
    r = C.plan([100, 100, 50], [0, 2, 0], [3, 5, 2], budget_seconds=1.0)
    assert r["size"] == r["load"] == r["lower_bound"] == 200
    assert r["optimal"] and r["stopped_by"] == "bound"
    # Budget 0: no search; the constructive passes only (nothing stops them early here).
    sizes, lowers, uppers, period, fixed = random_instance(random.Random(5), 60, False, 0)
    r0 = C.plan(sizes, lowers, uppers, period, fixed, 0.0)
    assert r0["stopped_by"] in ("bound", "done")
    assert r0["optimal"] == (r0["size"] == r0["lower_bound"])
    # A chain (0 overlaps 1, 1 overlaps 2, 0 and 2 never meet): LOAD 5 is reachable.
    r = C.plan([3, 2, 3], [0, 1, 2], [2, 3, 4], budget_seconds=0.5)
    assert r["size"] == 5 and r["optimal"] and r["stopped_by"] == "bound"


def within_budget_once(runs: list, budget: float) -> bool:
    """The wall-clock promise, checked so that a process the OS did not run
    for a while cannot fail it alone: a plan that overran the budget by more
    than the 0.1 s allowance is retried, up to 3 runs, and one run within it
    passes. A planner that does not keep the clock overruns every time; a
    descheduled process (seen: +1.5 s at load 10-15, on a 215-buffer step
    whose whole search takes milliseconds of CPU) does not do so three
    times in a row."""
    return min(runs) <= budget + 0.1


def test_hard_instance_is_stopped_by_the_clock_within_the_budget(shared_data):
    # MiniMalloc's E cannot be solved in 0.3 s: the search runs until the
    # clock stops it (or, on a very fast machine, the work count), and
    # returns within the budget plus the allowance (issue 12).
    from torch_renaissance import trace as T
    from torch_renaissance.planner import plan_trace

    tr = T.load_trace(shared_data / "dsa" / "minimalloc_E.csv")
    runs = []
    for _ in range(3):  # see within_budget_once
        res = plan_trace(tr, budget_seconds=0.3)
        assert res.stopped_by in ("clock", "work")
        assert not res.optimal and res.lower_bound_bytes == res.load_bytes
        runs.append(res.seconds)
        if res.seconds <= 0.3 + 0.1:
            break
    assert within_budget_once(runs, 0.3), runs


def test_plans_stopped_by_the_work_count_are_byte_identical(C):
    # Without the clock, the work count alone stops the search: byte-identical
    # plans run to run, however loaded the machine. With the clock (the
    # default), a run the clock did not stop gives that same plan.
    from torch_renaissance.synthetic import training_step

    cols = [list(c) for c in zip(*training_step(3000, seed=11))]
    a = C.plan(*cols, budget_seconds=0.05, clock_seconds=math.inf)
    b = C.plan(*cols, budget_seconds=0.05, clock_seconds=math.inf)
    assert a["stopped_by"] in ("bound", "work", "done")
    assert a["offsets"] == b["offsets"] and a["method"] == b["method"] and a["size"] == b["size"]
    c = C.plan(*cols, budget_seconds=0.05)
    if c["stopped_by"] != "clock":
        assert c["offsets"] == a["offsets"] and c["method"] == a["method"]


def test_step_with_obstacles_keeps_the_wall_clock_budget(C):
    # Issue 18 item 5: a ~2,000-buffer step with 62 obstacles (persistent
    # blocks with gaps between them, as the arena's) took 3 x the runtime
    # budget and more (the old cap was 2 x budget + 0.25 s). Now the clock
    # stops the search at the budget, leaving time for the final check.
    from torch_renaissance.synthetic import training_step

    lt = training_step(2000, seed=3)
    horizon = max(u for _, _, u in lt)
    rng = random.Random(0)
    fixed, off = [], 0
    for _ in range(62):
        off += rng.choice([0, 512, 1 << 20, 8 << 20]) * rng.randint(0, 2)
        size = rng.choice([512, 1 << 20, 16 << 20, 100 << 20]) * rng.randint(1, 3)
        lo = 0 if rng.random() < 0.7 else rng.randrange(horizon // 2)
        up = horizon if lo == 0 else rng.randrange(lo + 1, horizon + 1)
        fixed.append((off, size, lo, up))
        off += size
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    for budget in (0.25, 0.5):
        runs = []
        for _ in range(3):  # see within_budget_once
            r = C.plan(sizes, lowers, uppers, 0, fixed, budget)
            assert C.validate(sizes, lowers, uppers, r["offsets"], 0, fixed) == ""
            assert r["lower_bound"] <= r["size"]
            runs.append(r["seconds"])
            if r["seconds"] <= budget + 0.1:
                break
        assert within_budget_once(runs, budget), (budget, runs, r["stopped_by"])


@pytest.mark.parametrize("n, seed", [(1000, 0), (3000, 1), (10000, 2)])
def test_synthetic_steps_are_seeded_training_steps(n, seed):
    # The generator the benchmark measures the planner on: same seed, same
    # instance; different seeds differ; the count is near the target;
    # lifetimes are well formed and sizes multiples of 512; and it has the
    # shape of a training step: the LOAD peak is near the forward/backward
    # turn (most activations live), not at the start or the end.
    from torch_renaissance.synthetic import training_step

    a, b = training_step(n, seed), training_step(n, seed)
    assert a == b and a != training_step(n, seed + 1)
    assert 0.85 * n <= len(a) <= 1.8 * n
    assert all(s % 512 == 0 and s > 0 and 0 <= lo < up for s, lo, up in a)
    horizon = max(up for _, _, up in a)
    live = [0] * (horizon + 1)
    for s, lo, up in a:
        live[lo] += s
        live[up] -= s
    for t in range(1, len(live)):
        live[t] += live[t - 1]
    peak_at = live.index(max(live))
    assert 0.1 * horizon < peak_at < 0.9 * horizon
    with pytest.raises(ValueError, match="buffers"):
        training_step(10)


@pytest.mark.parametrize("call, needle", [
    (lambda P: P.plan_lifetimes([(-1, 0, 1)]), r"buffer 0: size is -1; it must be in \[0, 2\*\*63\)"),
    (lambda P: P.plan_lifetimes([(4, 0, 1), (2**63, 0, 1)]), r"buffer 1: size is 9223372036854775808"),
    (lambda P: P.plan_lifetimes([(1.5, 0, 1)]), r"buffer 0: size must be an integer, not float"),
    (lambda P: P.plan_lifetimes([(True, 0, 1)]), r"buffer 0: size must be an integer, not bool"),
    (lambda P: P.plan_lifetimes([(1, 0, "2")]), r"buffer 0: upper time must be an integer, not str"),
    (lambda P: P.plan_lifetimes([(1, 0)]), r"buffer 0: expected \(size, lower, upper\), got \(1, 0\)"),
    (lambda P: P.plan_lifetimes([(1, -1, 1)]), r"buffer 0: negative lower time -1"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], seed=-1), r"seed is -1"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], seed=2**64), r"seed is 18446744073709551616"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], budget_seconds=math.nan), r"budget_seconds is nan"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], budget_seconds="1"), r"budget_seconds must be a number"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], clock_seconds=-5), r"clock_seconds is -5"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], threads=0), r"threads must be 1 or 2, got 0"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], threads=3), r"threads must be 1 or 2, got 3"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], threads=True), r"threads must be 1 or 2, got True"),
    (lambda P: P.plan_lifetimes([(1, 0, 1)], threads=2.0), r"threads must be 1 or 2, got 2.0"),
    (lambda P: P.validate([(10, 0, 2)], [-1]), r"offset 0 is -1; it must be in \[0, 2\*\*64\)"),
    (lambda P: P.validate([(10, 0, 2)], [0.0]), r"offset 0 must be an integer, not float"),
])
def test_planner_api_bad_values_are_one_value_error_naming_them(call, needle):
    # Was: pybind's 20-line "incompatible function arguments" TypeError for sizes, seeds and
    # offsets it cannot convert, and True planned as a 1-byte buffer.
    from torch_renaissance import planner as P

    with pytest.raises(ValueError, match="planner: " + needle) as info:
        call(P)
    assert "\n" not in str(info.value)


def test_greedy_of_nothing_is_zero_not_unfinished():
    # LOAD 0 (no buffers, or only empty ones): greedy's height is 0, a result, not "greedy did
    # not finish within the budget" (None).
    from torch_renaissance import planner as P

    for rows in ([], [(0, 0, 1)], [(0, 0, 3), (0, 1, 2)]):
        r = P.plan_lifetimes(rows)
        assert (r.plan_bytes, r.load_bytes, r.greedy_bytes) == (0, 0, 0), rows
    assert P.plan_lifetimes([(5, 0, 1), (3, 0, 2)]).greedy_bytes == 8


def test_numpy_integers_are_plain_integers_to_the_planner():
    np = pytest.importorskip("numpy")
    from torch_renaissance import planner as P

    r = P.plan_lifetimes([(np.int64(6), np.int32(0), 2), (4, np.uint8(1), np.int64(3))])
    assert r.plan_bytes == 10 and r.offsets in ([0, 6], [4, 0])


def test_cli_plan_shows_reserved_at_dump_when_a_snapshot_has_no_segment_events(shared_data):
    # gpt_train_b has no segment_* events: its reserved peak is unknown, but what PyTorch held
    # when the snapshot was taken is (the segments list). Was: "PyTorch reserved n/a".
    from torch_renaissance import trace as T

    path = shared_data / "snapshots" / "gpt_train_b.pickle"
    tr = T.load_snapshot(path)
    assert tr.pytorch_reserved_peak is None and tr.pytorch_reserved_at_dump > tr.load_bytes()
    r = _cli(str(path), "--budget", "0.2")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("PyTorch reserved"))
    pct = 100 * (tr.pytorch_reserved_at_dump / tr.load_bytes() - 1)
    assert f"{tr.pytorch_reserved_at_dump / 2**20:.1f} MiB" in line and f"{pct:+.2f}% vs LOAD" in line
    assert "when the snapshot was taken" in line
    out = json.loads(_cli(str(path), "--json", "--budget", "0.2").stdout)
    assert out["pytorch_reserved_bytes"] is None
    assert out["pytorch_reserved_at_dump_bytes"] == tr.pytorch_reserved_at_dump


def test_cli_plan_device_all_shows_reserved_at_dump_marked(shared_data, capsys):
    # The per-device table fell back to "n/a" where the single-device output shows the
    # reserved bytes at dump time (a snapshot without segment events); found by a new user.
    from torch_renaissance import cli
    from torch_renaissance import trace as T

    path = shared_data / "snapshots" / "gpt_train_b.pickle"
    tr = T.load_snapshot(path)
    assert cli.main(["plan", str(path), "--device", "all", "--budget", "0.1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pct = f"{100 * (tr.pytorch_reserved_at_dump / tr.load_bytes() - 1):+.2f}%*"
    rows = {ln.split()[0]: ln.split() for ln in lines[2:] if not ln.startswith("*")}
    assert rows["0"][-2] == pct and rows["total"][-2] == pct, lines  # the PyTorch column
    assert lines[-1].startswith("* PyTorch's reserved bytes when the snapshot was taken")


def test_cli_plan_device_without_data_is_refused_and_totals_mix_peak_and_dump(tmp_path, capsys):
    # A tester: on a snapshot with data on devices 0 and 2, `--device 1` (an empty list in
    # device_traces) planned 0 buffers with exit 0. The total row's PyTorch column sums
    # each device's peak, or its dump-time bytes where it has no segment events.
    from torch_renaissance import cli
    from torch_renaissance import trace as T

    path, traces = _multi_device_snapshot(tmp_path, devices=(0, 2))
    assert cli.main(["plan", str(path), "--device", "1", "--budget", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device 1" in err and "[0, 2]" in err, err
    # Device 2 without its segment events: no peak, only the reserved bytes at dump time.
    snap = T.safe_pickle.safe_unpickle(path)
    snap["device_traces"][2] = [e for e in snap["device_traces"][2]
                                if not e["action"].startswith("segment_")]
    mixed = tmp_path / "mixed.pickle"
    T.save_snapshot(snap, mixed)
    t0, t2 = T.load_snapshot(mixed, device=0), T.load_snapshot(mixed, device=2)
    assert t0.pytorch_reserved_peak is not None and t2.pytorch_reserved_peak is None
    assert cli.main(["plan", str(mixed), "--device", "all", "--budget", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: ln.split() for ln in lines[2:] if not ln.startswith("*")}
    want = t0.pytorch_reserved_peak + t2.pytorch_reserved_at_dump
    load = t0.load_bytes() + t2.load_bytes()
    assert rows["total"][-2] == f"{100 * (want / load - 1):+.2f}%*", lines
    assert cli.main(["plan", str(mixed), "--device", "all", "--json", "--budget", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"]["pytorch_reserved_bytes"] is None
    assert out["total"]["pytorch_reserved_at_dump_bytes"] == want


def sweep_check(sizes, lowers, uppers, offsets, period):
    """Independent O(n log n) validity check of a cyclic plan (no obstacles): every
    piece of a lifetime (two when it wraps) is an interval of time; at each tick, the
    byte ranges live must not overlap. Returns the plan size."""
    import bisect

    events = []  # (tick, 0 = end / 1 = start, index)
    for i, (s, lo, up) in enumerate(zip(sizes, lowers, uppers)):
        if s == 0:
            continue
        for a, b in pieces(lo, up, period):
            events.append((a, 1, i))
            events.append((b, 0, i))
    events.sort()
    starts = []  # sorted offsets of the live byte ranges
    end_at = {}  # offset -> (end, index)
    for _, kind, i in events:
        o, e = offsets[i], offsets[i] + sizes[i]
        if kind == 0:
            starts.pop(bisect.bisect_left(starts, o))
            del end_at[o]
            continue
        k = bisect.bisect_left(starts, o)
        assert o not in end_at, f"buffer {i} collides with buffer {end_at.get(o, (0, -1))[1]}"
        if k > 0:
            prev_end, j = end_at[starts[k - 1]]
            assert prev_end <= o, f"buffers {j} and {i} collide"
        if k < len(starts):
            assert e <= starts[k], f"buffers {i} and {end_at[starts[k]][1]} collide"
        starts.insert(k, o)
        end_at[o] = (e, i)
    return max(o + s for o, s in zip(offsets, sizes))


def diff_load(sizes, lowers, uppers, period):
    """LOAD by a difference array over the period."""
    d = [0] * (period + 1)
    for s, lo, up in zip(sizes, lowers, uppers):
        for a, b in pieces(lo, up, period):
            d[a] += s
            d[b] -= s
    live, best = 0, 0
    for t in range(period):
        live += d[t]
        best = max(best, live)
    return best


def _plan_cyclic_within_half_a_percent(C, n, seed, budget):
    """Plans ``alternating_step(n, seed)`` (clock off: the same plan on every machine) and
    checks the plan: LOAD as the test computes it, the height by a sweep, at most +0.5% over
    LOAD. Returns the instance ``(lifetimes, period)``."""
    from torch_renaissance.synthetic import alternating_step

    lt, period = alternating_step(n, seed)
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    r = C.plan(sizes, lowers, uppers, period, [], budget, clock_seconds=math.inf)
    load = diff_load(sizes, lowers, uppers, period)
    assert r["load"] == load
    assert sweep_check(sizes, lowers, uppers, r["offsets"], period) == r["size"]
    assert r["size"] <= load * 1.005, (r["size"] / load, r["method"], r["stopped_by"])
    return lt, period


@pytest.mark.parametrize("n, seed, budget", [(2000, 2, 0.25), (3000, 3, 1.0), (2000, 6, 1.0)])
def test_alternating_steps_plan_at_load(C, n, seed, budget):
    # Issue 12 / 16, the planner's gap: the two-phase problem of a loop that keeps
    # its previous output (logits and KV-like cache tensors dropped just before the
    # step's peak; torch_renaissance.synthetic.alternating_step). Greedy and the
    # improvement phases of a large instance left one phase's outputs above the
    # rest (+8.8%, +3.4%, +4.0% over LOAD on these, 1,878-2,810 buffers): the
    # wrapping buffers held the plan's top at every tick. The canonical search now
    # runs on such cyclic instances, and reaches LOAD at the step planner's budget
    # (0.25 s) or at the benchmark's (1 s), the clock off (plans the same on every
    # machine).
    lt, period = _plan_cyclic_within_half_a_percent(C, n, seed, budget)
    assert sum(u > period for _, _, u in lt) > 0  # the instance is cyclic, with wrapping buffers


@pytest.mark.parametrize("n, seed, budget", [(8000, 25, 1.0), (14000, 33, 1.0), (16000, 34, 0.25)])
def test_large_alternating_steps_plan_near_load(C, n, seed, budget):
    # Above the canonical search's cap for cyclic instances (6,000 buffers) only the
    # constructive passes and the repairs run: the two phases' copies of each kept
    # output sat side by side, and when one phase's died (just before the loss's
    # backward, the peak) each left a hole under the other's: +4.07% and +2.03% over
    # LOAD at 1 s (7,662 and 13,468 buffers). Best fit by length class, those that die
    # together side by side: +0.245% and at LOAD. At the step planner's 0.25 s the
    # baseline left no room for that pass in the passes' half of the work count on
    # 15,452 buffers (greedy's plan, +10.4%); it now runs whenever the work count
    # can pay for it: +0.072%.
    lt, _ = _plan_cyclic_within_half_a_percent(C, n, seed, budget)
    assert len(lt) > 6000


@pytest.mark.parametrize("n, seed", [(4000, 3), (8000, 1), (8000, 4), (16000, 3)])
def test_alternating_steps_whose_logits_top_the_plan_are_planned_by_end(C, n, seed):
    # Session 19: at the step planner's 0.25 s these were +11.3%, +7.7%, +7.3% and +3.8% over
    # LOAD (the 8,000-buffer ones at 1 s too): the logits-sized buffers (32 MB here, three to
    # five ticks long around the loss) sat on top, no gap their size left below them where
    # 0.99 x LOAD is live. First fit by end, the buffers that die last first (the wrapping ones
    # before all others), leaves their room: +0.026% to +0.053%.
    _plan_cyclic_within_half_a_percent(C, n, seed, 0.25)


@pytest.mark.parametrize("n, seed", [(400, 0), (2000, 1), (6000, 5)])
def test_alternating_steps_are_two_phases_of_one_loop(n, seed):
    # The generator: seeded (same seed, same instance; another differs); well formed
    # cyclic lifetimes; phase 1 is phase 0 shifted by half the period, buffer for
    # buffer; phase 1's outputs and gradients wrap; phase 0's outputs live longer
    # than a step (so the layout alternates) and die in phase 1.
    from torch_renaissance.synthetic import alternating_step

    lt, period = alternating_step(n, seed)
    assert (lt, period) == alternating_step(n, seed)
    assert alternating_step(n, seed + 1) != (lt, period)
    assert 0.75 * n <= len(lt) <= 1.25 * n and len(lt) % 2 == 0 and period % 2 == 0
    half, step = len(lt) // 2, period // 2
    for s, lo, up in lt:
        assert s > 0 and s % 512 == 0 and 0 <= lo < period and lo < up <= lo + period
    for (s0, lo0, up0), (s1, lo1, up1) in zip(lt[:half], lt[half:]):
        assert s1 == s0 and lo1 == lo0 + step and up1 == up0 + step
    wraps = [up > period for _, _, up in lt]
    assert not any(wraps[:half]) and any(wraps[half:])
    long_lived = [(s, lo, up) for s, lo, up in lt[:half] if up - lo > step]
    assert long_lived, "the kept outputs outlive a step"
    assert all(step < up < period for _, _, up in long_lived)  # dead within phase 1
    with pytest.raises(ValueError, match="buffers must be in"):
        alternating_step(100, 0)


def size_class_key(lifetimes, i):
    """Size class (floor(log2 size) // 2) descending, then lifetime descending, then size
    descending, then index."""
    size, lo, up = lifetimes[i]
    return (-(max(size.bit_length() - 1, 0) // 2), -(up - lo), -size, i)


def size_key(lifetimes, i):
    """Greedy by size's order: size descending, then start, then lifetime descending, then
    index."""
    size, lo, up = lifetimes[i]
    return (-size, lo, -(up - lo), i)


def fit_ref(lifetimes, key, first: bool) -> int:
    """Reference: place the buffers in the order of ``key``, each at the lowest (first) or
    the tightest (best) gap among the placed buffers it overlaps in time (the top of them
    when none fits). Returns the plan's height in bytes. Independent of the extension
    (numpy for the overlap mask, a plain walk over the gaps)."""
    import numpy as np

    n = len(lifetimes)
    order = sorted(range(n), key=lambda i: key(lifetimes, i))
    lo_a = np.zeros(n, dtype=np.int64)
    up_a = np.zeros(n, dtype=np.int64)
    off_a = np.zeros(n, dtype=object)
    end_a = np.zeros(n, dtype=object)
    height = 0
    for k, i in enumerate(order):
        size, lo, up = lifetimes[i]
        hit = np.nonzero((lo_a[:k] < up) & (lo < up_a[:k]))[0]
        spans = sorted(zip(off_a[hit], end_a[hit]))
        cur, best, best_gap = 0, None, None
        for o, e in spans:
            if o > cur and o - cur >= size and (best_gap is None or o - cur < best_gap):
                best, best_gap = cur, o - cur
                if first or best_gap == size:
                    break
            cur = max(cur, e)
        off = cur if best is None else best
        lo_a[k], up_a[k], off_a[k], end_a[k] = lo, up, off, off + size
        height = max(height, off + size)
    return height


def check_plan_by_ticks(lifetimes, offsets) -> int:
    """Independent validity check for large linear instances: two buffers that overlap in
    time are both live at the later one's first tick, so at every first tick the live
    buffers, sorted by offset, must not overlap. Returns the plan size."""
    import numpy as np

    size = np.array([s for s, _, _ in lifetimes], dtype=object)
    lo = np.array([l for _, l, _ in lifetimes], dtype=np.int64)
    up = np.array([u for _, _, u in lifetimes], dtype=np.int64)
    off = np.array(offsets, dtype=object)
    for t in np.unique(lo):
        live = np.nonzero((lo <= t) & (t < up) & (size > 0))[0]
        spans = sorted(zip(off[live], off[live] + size[live]))
        for (_, e0), (o1, _) in zip(spans, spans[1:]):
            assert e0 <= o1, f"two buffers live at tick {t} collide"
    return max(o + s for o, s in zip(offsets, size))


@pytest.mark.parametrize("seed", [2, 5])
def test_xla_buffers_plan_is_no_taller_than_size_class_fit(seed):
    """Buffers whose sizes span orders of magnitude with long lifetimes (XLA style): the
    planner's plan is no taller than best fit and first fit in size-class order, which
    the portfolio now has (it ordered by exact size only: +2.2% over LOAD on seed 5,
    where size-class first fit is at LOAD). Clock off: the same plan on any machine."""
    from torch_renaissance.planner import plan_lifetimes
    from torch_renaissance.synthetic import xla_buffers

    lt = xla_buffers(4000, seed)
    res = plan_lifetimes(lt, budget_seconds=0.3, clock_seconds=math.inf)
    assert check_plan_by_ticks(lt, res.offsets) == res.plan_bytes
    ref = min(fit_ref(lt, size_class_key, first=True), fit_ref(lt, size_class_key, first=False))
    assert res.plan_bytes <= ref


@pytest.mark.parametrize("seed", [1, 3])
def test_large_xla_buffers_plan_is_no_taller_than_first_fit(seed):
    """Above 10,000 buffers the portfolio has first fit by size and by size class, admitted
    at a fraction of a best-fit pass's work, so they run where the best-fit passes no
    longer fit in the passes' share: on 12,000 XLA-style buffers at 0.2 s the plan is no
    taller than either, computed in the test. On main, where only best-fit passes ran at
    that size, seed 3's plan was +0.855% over LOAD (first fit by size +0.211%), seed 1's
    +10.182% (+4.211%). Clock off."""
    from torch_renaissance.planner import plan_lifetimes
    from torch_renaissance.synthetic import xla_buffers

    lt = xla_buffers(12_000, seed)
    res = plan_lifetimes(lt, budget_seconds=0.2, clock_seconds=math.inf)
    assert check_plan_by_ticks(lt, res.offsets) == res.plan_bytes
    ref = min(fit_ref(lt, size_key, first=True), fit_ref(lt, size_class_key, first=True))
    assert res.plan_bytes <= ref


@pytest.mark.parametrize("n, seed", [(60, 0), (230, 2), (400, 9)])
def test_packed_square_is_seeded_and_its_layout_is_a_valid_plan(n, seed):
    # The MiniMalloc-style generator: seeded, `n` buffers on a 1,024 grid, and its own
    # layout (the square it was cut from) is a valid plan no taller than 1,048,576 bytes,
    # checked here independently of the planner; LOAD is at most that height.
    from torch_renaissance.synthetic import packed_square

    lt, offsets = packed_square(n, seed)
    assert (lt, offsets) == packed_square(n, seed)
    assert packed_square(n, seed + 1) != (lt, offsets)
    assert len(lt) == len(offsets) == n
    for (s, lo, up), o in zip(lt, offsets):
        assert s > 0 and s % 1024 == 0 and lo % 1024 == 0 and up % 1024 == 0 and o % 1024 == 0
        assert 0 <= lo < up <= 1 << 20 and o + s <= 1 << 20
    height = check_plan_by_ticks(lt, offsets)
    assert height <= 1 << 20
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    assert diff_load(sizes, lowers, uppers, 1 << 20) <= height
    with pytest.raises(ValueError, match="buffers"):
        packed_square(10, 0)


@pytest.mark.parametrize("n, seed, most", [(230, 2, 1.05), (260, 7, 1.10)])
def test_packed_square_plans_lower_with_the_peak_repair(n, seed, most):
    # Issue 12, tenth pass: on small hard instances (MiniMalloc's family, here
    # packed_square's) the search over the whole instance stalls after its first plans,
    # and now gets 70% of the budget, the peak repair the rest (windows at the plan's top
    # and, up to 320 buffers, the top band, each re-planned with everything else fixed).
    # Clock off, 1 s: with the search alone these were +6.445% and +10.938% over LOAD;
    # with the repair's windows +4.395% and +10.449%; with the top band too +4.395% and
    # +9.375%.
    from torch_renaissance.planner import plan_lifetimes
    from torch_renaissance.synthetic import packed_square

    lt, _ = packed_square(n, seed)
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    load = diff_load(sizes, lowers, uppers, 1 << 20)
    res = plan_lifetimes(lt, budget_seconds=1.0, clock_seconds=math.inf)
    assert res.load_bytes == load
    assert check_plan_by_ticks(lt, res.offsets) == res.plan_bytes
    assert res.plan_bytes <= most * load, (res.plan_bytes / load, res.method)


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_square_raise_starts_near_the_best_plan(seed):
    # Issue 12, eleventh pass: the capacity-targeted raise walked every level from the
    # bound up (0.5% steps) at each round's node limit, so on packed_square(210, 1), best
    # +9.6%-11.9% after the first plans, a round paid for ~20 levels that never succeed at
    # those limits. It now starts each turn at most 8 levels (4%) below the best plan.
    # Clock off, 1 s: +9.570% (seed 0) and +11.914% (seed 1) before, +7.520% after.
    from torch_renaissance.planner import plan_lifetimes
    from torch_renaissance.synthetic import packed_square

    lt, _ = packed_square(210, 1)
    sizes, lowers, uppers = (list(c) for c in zip(*lt))
    load = diff_load(sizes, lowers, uppers, 1 << 20)
    res = plan_lifetimes(lt, budget_seconds=1.0, seed=seed, clock_seconds=math.inf)
    assert res.load_bytes == load
    assert check_plan_by_ticks(lt, res.offsets) == res.plan_bytes
    assert res.plan_bytes <= 1.08 * load, (res.plan_bytes / load, res.method)


@pytest.mark.parametrize(
    "n, load, expected",
    [
        (13_923_997_704, 13_923_997_700, "  (+4 bytes over LOAD, under +0.01%)"),  # gpt_train_b's plan
        (100_004, 100_000, "  (+4 bytes over LOAD, under +0.01%)"),  # 0.004% would print +0.00%
        (100_005, 100_000, "  (+0.01% vs LOAD)"),  # 0.005% is shown as a percentage
        (110, 100, "  (+10.00% vs LOAD)"),
        (100, 100, "  (+0.00% vs LOAD)"),  # at LOAD
        (None, 100, ""),
        (5, 0, ""),
    ],
)
def test_cli_plan_says_bytes_when_a_size_is_above_load_by_under_a_hundredth_percent(n, load, expected):
    # gpt_train_b's plan is 4 bytes above LOAD after a search the clock stopped; "+0.00% vs LOAD"
    # read as "at LOAD" beside "stopped by: the wall clock" (a new user's report).
    from torch_renaissance.cli import _vs_load

    assert _vs_load(n, load) == expected


def test_plan_result_repr_names_the_numbers_not_every_offset():
    # A new user's print(plan_trace(t)) dumped every offset (20 KB for a 1,000-buffer trace).
    from torch_renaissance import planner as P

    # 600 buffers: 200 x (4 + 6 bytes live in [0, 2)), then 200 x 8 bytes in [2, 3).
    r = P.plan_lifetimes([(4, 0, 2), (6, 0, 2), (8, 2, 3)] * 200, budget_seconds=0.1)
    text = repr(r)
    assert len(text) < 400
    assert f"plan_bytes={r.plan_bytes}" in text and f"load_bytes={r.load_bytes}" in text
    assert "offsets=<600 offsets>" in text
    assert len(r.offsets) == 600  # the field itself is whole


@pytest.mark.parametrize("bad", [0, 3, -1, 2**64, True, False, 2.0, None, "2"])
def test_the_extension_refuses_a_thread_count_other_than_one_or_two(C, bad):
    # The extension's own check (a breaker found True taken as 1 and pybind's multi-line
    # TypeError for the rest), one line naming the value.
    with pytest.raises(ValueError, match=r"^planner: threads must be 1 or 2, got ") as info:
        C.plan([4], [0], [1], threads=bad)
    assert repr(bad) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("n, seed", [(60, 3), (120, 4)])
def test_one_and_two_threads_each_give_one_plan_run_to_run(n, seed):
    # Options::threads: with the clock off, the work counts alone stop both threads, and
    # the plan returned is chosen by them (the side that reaches its lower bound in fewer
    # units), never by which thread ran faster: byte-identical plans run to run, with 1
    # thread and with 2, and both valid.
    from torch_renaissance.planner import plan_lifetimes
    from torch_renaissance.synthetic import packed_square

    lt, _ = packed_square(n, seed)
    for threads in (1, 2):
        runs = [plan_lifetimes(lt, budget_seconds=0.2, clock_seconds=math.inf, threads=threads)
                for _ in range(3)]
        assert all(r.offsets == runs[0].offsets and r.method == runs[0].method for r in runs)
        assert check_plan_by_ticks(lt, runs[0].offsets) == runs[0].plan_bytes
        assert runs[0].lower_bound_bytes <= runs[0].plan_bytes


def test_the_second_thread_plans_minimalloc_e_at_load_within_a_second(shared_data):
    # Issue 12: MiniMalloc's E (215 buffers, LOAD 1,048,576 = the optimum) was +7.422%
    # over LOAD at 1 s: the branch and bound at LOAD (its exact schedule) had half of
    # the search's share, about a third of the budget, and needed 2.2 s. On a second
    # thread it has the whole budget beside the other phases: at LOAD, proved optimal.
    # Clock off, so the work counts decide on any machine; one thread stays above.
    from torch_renaissance import trace as T
    from torch_renaissance.planner import plan_trace

    tr = T.load_trace(shared_data / "dsa" / "minimalloc_E.csv")
    two = plan_trace(tr, budget_seconds=1.0, clock_seconds=math.inf, threads=2)
    assert two.optimal and two.plan_bytes == two.load_bytes == 1 << 20
    assert two.method == "canonical_search"
    one = plan_trace(tr, budget_seconds=1.0, clock_seconds=math.inf, threads=1)
    assert one.plan_bytes > one.load_bytes


@pytest.mark.parametrize("name", ["A", "B", "C", "D"])
def test_minimalloc_a_to_d_are_within_minimallocs_height_at_one_second(shared_data, name):
    # Issue 12's target for MiniMalloc's challenging A-E: a height at most 1,048,576 (the
    # benchmark's capacity, where MiniMalloc finds its plans) or at LOAD, and "optimal" when
    # the search proves it. The clock off, so a 1 s budget's work count decides on any
    # machine. LOAD here by a sweep over the lifetimes; E is
    # test_the_second_thread_plans_minimalloc_e_at_load_within_a_second.
    from torch_renaissance import trace as T
    from torch_renaissance.planner import plan_trace

    tr = T.load_trace(shared_data / "dsa" / f"minimalloc_{name}.csv")
    lt = tr.lifetimes()
    events = sorted([(lo, s) for s, lo, _ in lt] + [(up, -s) for s, _, up in lt],
                    key=lambda e: (e[0], e[1]))
    live = load = 0
    for _, delta in events:
        live += delta
        load = max(load, live)
    r = plan_trace(tr, budget_seconds=1.0, clock_seconds=math.inf)
    assert check_plan_by_ticks(lt, r.offsets) == r.plan_bytes <= 1 << 20
    assert r.load_bytes == load
    assert r.optimal == (r.plan_bytes == load)


def test_cli_plan_json_says_optimal_when_the_search_proves_it(shared_data):
    # MiniMalloc's C is at LOAD in hundredths of a second (well within the 1 s budget on
    # a loaded machine): the JSON says so.
    r = _cli(str(shared_data / "dsa" / "minimalloc_C.csv"), "--json", "--budget", "1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["optimal"] is True and out["plan_bytes"] == out["load_bytes"] == out["lower_bound_bytes"]
