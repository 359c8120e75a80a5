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


@pytest.mark.parametrize("where", ["missing/x.png", "."])
def test_plan_png_to_an_unwritable_path_still_prints_the_plan(tmp_path, capsys, where):
    # It used to print a traceback (FileNotFoundError / IsADirectoryError)
    # before any of the plan's numbers.
    pytest.importorskip("matplotlib")
    from torch_renaissance import cli

    csv = tmp_path / "t.csv"
    csv.write_text("id,lower,upper,size\n0,0,2,100\n1,1,3,200\n2,2,4,100\n")
    png = tmp_path / where
    code = cli.main(["plan", str(csv), "--png", str(png), "--json", "--budget", "0.1"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[0].startswith(f"torch-renaissance plan: --png: {png}: cannot write: ")
    import json

    plan = json.loads(out.strip().splitlines()[-1])
    assert plan["load_bytes"] == plan["plan_bytes"] == 300  # 200 + 100 live at once


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
