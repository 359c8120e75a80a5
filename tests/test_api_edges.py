"""Public-API edges a careless user meets: a decorator that cannot mark the
step it is put on, output paths that cannot be written (checked before any
work is done), devices that are not devices."""
from __future__ import annotations

import pytest

import torch_renaissance as tr


def test_planned_refuses_a_generator_function():
    # Its call returns a generator at once; the body would run later,
    # outside the step (it used to record nothing, silently).
    def gen():
        yield 1

    with pytest.raises(TypeError, match=r"gen is a generator function.*outside the step"):
        tr.planned(gen)


def test_planned_refuses_a_coroutine_function():
    async def coro():
        return 1

    with pytest.raises(TypeError, match=r"coro is a coroutine function"):
        tr.planned(key="k")(coro)


def test_planned_keeps_a_plain_function():
    def f(x):
        return x + 1

    g = tr.planned(f)
    assert g.__name__ == "f" and g.__wrapped__ is f


@pytest.mark.parametrize("call", [lambda: tr.install(123), lambda: tr.memory_stats(123),
                                  lambda: tr.ModelSlots(123), lambda: tr.StreamManager(123)])
def test_a_device_torch_cannot_make_is_named_in_the_error(call):
    # torch.device(123) is accelerator 123; a CPU-only machine refuses it with
    # torch's own text ("Cannot access accelerator device ..."), which named
    # neither the value nor what to pass instead.
    import torch

    if torch.accelerator.is_available():
        pytest.skip("an accelerator exists here: 123 may name a device")
    with pytest.raises(RuntimeError, match=r"123 is not a device it can use \(pass 'cpu', 'cuda' or 'cuda:N'\)"):
        call()


@pytest.mark.parametrize("make", [lambda d: tr.ModelSlots(d), lambda d: tr.StreamManager(d)])
@pytest.mark.parametrize("bad", ["gpu:0", "cuda:x", 1.5])
def test_model_slots_and_stream_manager_name_a_bad_device(make, bad):
    # Both called torch.device() themselves, whose errors name neither the
    # value (for a float) nor what to pass; now they give installer's error.
    with pytest.raises(RuntimeError, match=r"torch_renaissance: .* is not a device it can use "
                                           r"\(pass 'cpu', 'cuda' or 'cuda:N'\)") as e:
        make(bad)
    assert repr(bad) in str(e.value)


def test_demo_json_to_an_unwritable_path_runs_nothing(tmp_path, capsys, monkeypatch):
    # It used to train all three allocators (minutes) and then lose the
    # result in a FileNotFoundError traceback.
    from torch_renaissance import cli

    calls = []
    real = cli._demo_run
    monkeypatch.setattr(cli, "_demo_run", lambda *a, **k: calls.append(a) or real(*a, **k))
    code = cli.main(["demo", "--json", str(tmp_path / "missing" / "x.json"), "--steps", "4"])
    err = capsys.readouterr().err
    assert code == 2 and calls == []
    assert err.strip().splitlines() == [
        f"torch-renaissance demo: --json {tmp_path / 'missing' / 'x.json'}: cannot write: "
        "No such file or directory; nothing was run"]


def test_plan_png_to_an_unwritable_path_is_refused_before_planning(tmp_path, capsys, monkeypatch):
    # It used to print a traceback (FileNotFoundError / IsADirectoryError) before any of the
    # plan's numbers; then the plan and a one-line error after the whole budget was spent
    # (a fresh user's find). Now the path is checked first, as run's --report and demo's
    # --json: one line, exit 2, and the planner is never called.
    from torch_renaissance import cli, planner

    trace = tmp_path / "t.csv"
    trace.write_text("id,lower,upper,size\n0,0,2,64\n1,1,3,32\n")
    called = []
    monkeypatch.setattr(planner, "plan_trace", lambda *a, **k: called.append(a))
    for png, reason in [(tmp_path / "no" / "such" / "dir" / "p.png", "No such file or directory"),
                        (tmp_path, "Is a directory")]:
        assert cli.main(["plan", str(trace), "--budget", "60", "--png", str(png)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"torch-renaissance plan: --png {png}: cannot write: {reason}; "
                       "nothing was planned"]
    assert cli.main(["plan", str(trace), "--png", ""]) == 2
    assert capsys.readouterr().err.strip() == \
        "torch-renaissance plan: --png needs a file path, got an empty one; nothing was planned"
    assert called == []


def test_memory_summary_lines_are_one_width_and_numbers_are_the_stats():
    # Found by a tester: 11-character cells in 10-character columns, and a frame of 83
    # characters around rows of 87.
    import textwrap

    from conftest import run_python

    r = run_python(textwrap.dedent("""
        import torch, torch_renaissance as tr
        before = tr.memory_summary("cpu")          # as memory_stats: zeros, not an error
        assert "not installed" in before.splitlines()[1], before
        assert {len(l) for l in before.splitlines()} == {91}, before
        tr.install("cpu")
        x = torch.empty(1 << 20)                    # 4 MiB, one large-pool block
        s = tr.memory_stats("cpu")
        out = tr.memory_summary("cpu")
        lines = out.splitlines()
        assert {len(l) for l in lines} == {91}, out
        row = next(l for l in lines if l.startswith("|Allocated memory"))
        cells = [c.strip() for c in row.split("|")[2:6]]
        assert cells[0] == "4.00 MiB" and cells[3] == "0 B", cells
        assert s["allocated_bytes.all.current"] == 4 << 20
        row = next(l for l in lines if l.startswith("|Allocations"))
        assert [int(c) for c in row.split("|")[2:6]] == [1, 1, 1, 0], row
        print("OK")
    """))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr


def test_demo_child_failure_is_one_line(monkeypatch, capsys):
    # A tester: `demo --seq 100000` printed the CLI's RuntimeError wrapping the child's
    # whole traceback (two nested tracebacks); now one line with the child's last one.
    import subprocess
    import sys

    from torch_renaissance import cli

    real = subprocess.Popen

    def child(cmd, **kw):
        code = ("import sys; print('STEP 0', flush=True); "
                "raise MemoryError('you tried to allocate 640000000000 bytes')")
        return real([sys.executable, "-c", code], **kw)

    monkeypatch.setattr(cli.subprocess, "Popen", child)
    assert cli.main(["demo", "--steps", "4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("torch-renaissance demo: the default run failed (exit 1): MemoryError: "
                          "you tried to allocate 640000000000 bytes"), err


def test_small_api_refusals_found_by_a_tester():
    from torch_renaissance import ModelSlots
    from torch_renaissance.auto import devices_from_env
    from torch_renaissance.memory_plan import MemoryPlan

    for bad in (2.7, "3", True):
        with pytest.raises(ValueError, match="capacity_bytes must be an int"):
            ModelSlots("cpu", capacity_bytes=bad)  # 2.7 became 2
    assert ModelSlots("cpu", capacity_bytes=3).capacity_bytes == 3
    plan = MemoryPlan()
    plan.finalize()
    with pytest.raises(TypeError, match="MemoryPlan or a describe"):
        plan.first_difference([])  # was AttributeError: 'list' has no 'get'
    assert plan.first_difference(plan) is None
    # TORCH_RENAISSANCE strips ASCII spaces only, as TORCH_RENAISSANCE_CONF's parser does.
    assert devices_from_env(" cpu\t") == ["cpu"]
    with pytest.raises(ValueError, match="not one of"):
        devices_from_env("\u00a0cpu")


def test_device_and_geometry_messages_name_only_what_is_wrong(C):
    from torch_renaissance import ModelSlots, StreamManager

    for make in (tr.install, ModelSlots, StreamManager):
        with pytest.raises(RuntimeError, match="supports 'cpu' and 'cuda' devices, not 'meta'"):
            make("meta")  # ModelSlots/StreamManager said "Cannot access accelerator device"
    with pytest.raises(RuntimeError) as e:
        tr.install(None)
    assert str(e.value) == ("torch_renaissance: None is not a device it can use "
                            "(pass 'cpu', 'cuda' or 'cuda:N')")  # was torch's 6-line overload list
    with pytest.raises(ValueError) as e:
        C.Arena(C.HostDevice(), expandable_segments=False, small_segment=2**20 + 1)
    assert "small_segment (1048577 bytes)" in str(e.value) and "large_segment" not in str(e.value)


def test_plan_trace_and_step_on_refuse_wrong_types_with_type_errors():
    # A tester saw AttributeError ("'list' object has no attribute 'lifetimes'",
    # "'NoneType' object has no attribute 'split'").
    from torch_renaissance import step_on
    from torch_renaissance.planner import plan_trace

    for bad in (None, [], [(0, 10, 5)]):
        with pytest.raises(TypeError, match="plan_trace takes a Trace"):
            plan_trace(bad)
    for bad in (None, 3, b"os.path.join"):
        with pytest.raises(TypeError, match="step_on: the name must be a str"):
            step_on(bad)


def test_step_on_and_planned_refuse_what_cannot_be_called():
    # A breaker: step_on(on_step_end='x') was accepted and every later call of the hooked
    # function raised; @planned(5) failed only when the wrapper was called; '.x' gave a
    # bare "Empty module name".
    import torch_renaissance as tr

    with pytest.raises(TypeError, match="on_step_end must be callable"):
        tr.step_on("json.dumps", on_step_end="x")
    with pytest.raises(TypeError, match="planned decorates a function, not int"):
        tr.planned(5)
    for bad in (".x", "a..b", "os.", "print"):
        with pytest.raises(ValueError, match=r"step_on: .* is not a dotted name"):
            tr.step_on(bad)
    import json

    assert json.dumps([1]) == "[1]"  # nothing was hooked


@pytest.mark.parametrize("call, error, message", [
    (lambda a: a.allocate(-1), ValueError, "Arena.allocate(): size must be >= 0, got -1"),
    (lambda a: a.allocate(2**64), ValueError,
     "Arena.allocate(): size 18446744073709551616 does not fit in 64 bits"),
    (lambda a: a.allocate(True), TypeError, "Arena.allocate(): size must be an int, not bool"),
    (lambda a: a.allocate(1.5), TypeError, "Arena.allocate(): size must be an int, not float"),
    (lambda a: a.allocate(64, -2), ValueError, "Arena.allocate(): stream must be >= 0, got -2"),
    (lambda a: a.deallocate(None), TypeError, "Arena.deallocate(): ptr must be an int, not NoneType"),
    (lambda a: a.deallocate(-5), ValueError, "Arena.deallocate(): ptr must be >= 0, got -5"),
    (lambda a: a.record_stream(1.0, 0), TypeError,
     "Arena.record_stream(): ptr must be an int, not float"),
    (lambda a: a.block_size(-1), ValueError, "Arena.block_size(): ptr must be >= 0, got -1"),
])
def test_arena_calls_refuse_bad_integers_in_one_line(C, call, error, message):
    # Was pybind's multi-line "incompatible function arguments" TypeError with the overloads.
    a = C.Arena(C.HostDevice())
    before = a.stats()
    with pytest.raises(error) as e:
        call(a)
    assert str(e.value) == message
    assert a.stats() == before and a.check_invariants() is None  # nothing allocated or lost


def test_arena_calls_take_numpy_integers(C):
    np = pytest.importorskip("numpy")
    a = C.Arena(C.HostDevice())
    p = a.allocate(np.int64(1000))
    assert a.block_size(np.uint64(p)) >= 1000
    a.deallocate(np.uint64(p))
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0


def test_arena_calls_let_errors_of_index_through(C):
    # Only "not an integer" (TypeError) becomes the one-line message; what __index__ itself
    # raises (KeyboardInterrupt, MemoryError, its own error) goes on unchanged.
    class Boom:
        def __init__(self, exc):
            self.exc = exc

        def __index__(self):
            raise self.exc

    a = C.Arena(C.HostDevice())
    for exc in (KeyboardInterrupt(), MemoryError(), RuntimeError("boom")):
        with pytest.raises(type(exc)):
            a.allocate(Boom(exc))
    assert a.stats()["allocated_bytes"]["all"]["current"] == 0


def test_memory_summary_gives_the_steady_address_stability_beside_the_last_steps():
    # A new user read "Address stability (last step)" after 8 steps and asked for the whole
    # run's figure: the summary now also gives the steady steps' one (same_address /
    # comparable, the replays compared with an earlier replay of their layout).
    import textwrap

    from conftest import run_python

    r = run_python(textwrap.dedent("""
        import torch, torch_renaissance as tr
        tr.install("cpu")
        m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(m.parameters(), 0.1)
        for i in range(8):
            with tr.step():
                loss = m(torch.randn(8, 32)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            if i == 0:
                out = tr.memory_summary("cpu")
                row = next(l for l in out.splitlines() if "(steady steps)" in l)
                assert "none yet" in row, row  # nothing replayed yet
        s = tr.memory_stats("cpu")
        same, comparable = s["renaissance.same_address"], s["renaissance.comparable"]
        assert comparable > 0
        assert s["renaissance.address_stability_steady"] == same / comparable
        out = tr.memory_summary("cpu")
        row = next(l for l in out.splitlines() if "(steady steps)" in l)
        assert f"{100 * same / comparable:.1f}%" in row, row
        assert {len(l) for l in out.splitlines()} == {91}, out
        print("OK", same, comparable)
    """))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr + r.stdout
