"""Command-line and configuration edges: ``run --report`` to a path that
cannot be written, ``demo`` with no steps, config numbers that are not plain ASCII, and keys
given twice."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, clean_env

from torch_renaissance import cli
from torch_renaissance.allocator import make_config, parse_conf

# The script leaves a mark when it runs, then exits with the code it is given.
SCRIPT = """
import sys, pathlib
pathlib.Path(sys.argv[1]).write_text("ran")
sys.exit(int(sys.argv[2]))
"""


def _run(tmp_path, report: str, exit_code: int):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    mark = tmp_path / "ran.txt"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--report", report,
                        str(script), str(mark), str(exit_code)],
                       capture_output=True, text=True, env=clean_env(), cwd=str(REPO), timeout=300)
    return r, mark.exists()


@pytest.mark.parametrize("where", ["missing_dir", "directory"])
def test_run_report_path_that_cannot_be_written_is_refused_before_the_script(tmp_path, where):
    report = tmp_path / "no" / "such" / "dir" / "r.json" if where == "missing_dir" else tmp_path
    r, ran = _run(tmp_path, str(report), 0)
    assert r.returncode == 2, r.stderr[-2000:]
    assert not ran  # the script never started
    assert "Traceback" not in r.stderr
    assert f"torch-renaissance run: --report {report}: cannot write: " in r.stderr
    assert "the script was not run" in r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_run_report_that_fails_at_the_end_keeps_the_scripts_exit_code(tmp_path):
    # /dev/full opens, but every write fails (ENOSPC): only known after the script ran.
    r, ran = _run(tmp_path, "/dev/full", 3)
    assert ran and r.returncode == 3, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    # The write's ENOSPC, not truncate()'s EINVAL on a device (found by a tester).
    assert ("torch-renaissance run: --report /dev/full: cannot write: "
            "No space left on device") in r.stderr, r.stderr[-2000:]
    assert "torch_renaissance memory report" in r.stderr  # the report still went to stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_run_reports_once_when_the_script_forks_a_child_that_exits(tmp_path):
    # A child that leaves through sys.exit() unwinds through run's own code: it must not
    # print (or write) a second report. Found by a tester.
    script = tmp_path / "forks.py"
    script.write_text("import os, sys\n"
                      "pid = os.fork()\n"
                      "if pid == 0:\n"
                      "    sys.exit(0)\n"
                      "os.waitpid(pid, 0)\n")
    report = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--report",
                        str(report), str(script)], capture_output=True, text=True,
                       env=clean_env(), cwd=str(REPO), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("torch_renaissance memory report") == 1, r.stderr
    assert json.loads(report.read_text())["device"] == "cpu"


def test_run_report_is_written_where_the_path_pointed_before_the_script_ran(tmp_path):
    # The script changes directory and exits 5: the relative report path and the exit code
    # both still refer to the start.
    script = tmp_path / "script.py"
    script.write_text("import os, sys\nos.chdir('/')\nsys.exit(5)\n")
    (tmp_path / "old.json").write_text("x" * 100_000)  # longer than the report: truncated
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--report",
                        "old.json", str(script)], capture_output=True, text=True,
                       env=clean_env(), cwd=str(tmp_path), timeout=300)
    assert r.returncode == 5, r.stderr[-2000:]
    rep = json.loads((tmp_path / "old.json").read_text())
    assert rep["device"] == "cpu"


@pytest.mark.parametrize("argv, fragment", [
    (["--steps", "0"], "--steps: must be at least 4"),
    (["--steps", "3"], "--steps: must be at least 4"),
    (["--steps", "-1"], "--steps: must be at least 4"),
    (["--steps", "٣٠"], "--steps: not an integer: '٣٠'"),
    (["--steps", "1_0"], "--steps: not an integer: '1_0'"),
    (["--batch", "0"], "--batch: must be at least 1, got 0"),
    (["--seq", "0"], "--seq: must be at least 1, got 0"),
])
def test_demo_rejects_too_few_steps_before_running_anything(argv, fragment, capsys, monkeypatch):
    def no_run(*a, **k):
        raise AssertionError("the demo must not start")

    monkeypatch.setattr(cli, "_demo_run", no_run)
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", *argv])
    assert info.value.code == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("value", [
    "٣",        # ARABIC-INDIC DIGIT THREE: int() reads 3
    "３",       # FULLWIDTH DIGIT THREE
    "1_000",    # int() reads 1000
    "+3",
    "0x_10",
    "3 4",
    "",
])
def test_config_numbers_are_plain_ascii(value, monkeypatch):
    message = f"bad value {value!r} for config key 'max_reserved_mb'"
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_conf(f"max_reserved_mb:{value}")
    with pytest.raises(ValueError, match="max_reserved_mb"):
        make_config(max_reserved_mb=value)
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", f"max_variants:{value}")
    with pytest.raises(ValueError, match="config key 'max_variants'"):
        make_config()


def test_config_numbers_that_stay_valid():
    assert parse_conf("max_reserved_mb:3") == {"max_reserved_mb": 3}
    assert parse_conf(" max_variants : 0x1F ") == {"max_variants": 31}
    assert parse_conf("plan_budget_ms:0") == {"plan_budget_ms": 0}
    assert make_config(max_reserved_mb="3").max_reserved_bytes == 3 << 20
    assert make_config(max_reserved_bytes=4096).max_reserved_bytes == 4096


@pytest.mark.parametrize("text, key", [
    ("max_reserved_mb:3,max_reserved_mb:4", "max_reserved_mb"),
    ("planning:true,stream_policy:wait,planning:false", "planning"),
    ("max_variants:4, max_variants:4", "max_variants"),  # even with the same value
])
def test_config_key_given_twice_is_refused(text, key, monkeypatch):
    with pytest.raises(ValueError, match=f"config key '{key}' is given twice"):
        parse_conf(text)
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", text)
    with pytest.raises(ValueError, match=f"'{key}' is given twice"):
        make_config()


def test_both_units_of_the_reserved_limit_in_one_source_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="same limit in two units .in TORCH_RENAISSANCE_CONF"):
        parse_conf("max_reserved_mb:1,max_reserved_bytes:4096")
    with pytest.raises(ValueError, match="same limit in two units .as keyword arguments"):
        make_config(max_reserved_mb=1, max_reserved_bytes=4096)
    # One unit in the environment and the other as a keyword: the keyword wins (documented).
    monkeypatch.setenv("TORCH_RENAISSANCE_CONF", "max_reserved_mb:1")
    assert make_config(max_reserved_bytes=4096).max_reserved_bytes == 4096


def _refusals(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    missing = tmp_path / "no" / "p.png"
    return [
        (["--plot", str(missing), str(script)],
         f"--plot {missing}: cannot write: No such file or directory; the script was not run"),
        (["--plot", str(tmp_path), str(script)],
         f"--plot {tmp_path}: cannot write: Is a directory; the script was not run"),
        ([str(tmp_path)], f"{tmp_path} is not a regular file"),
        ([str(fifo)], f"{fifo} is not a regular file"),  # would block reading it
        (["-m", "no_such_module_xyz"], "-m no_such_module_xyz: no module named 'no_such_module_xyz'"),
        (["-mno_such_module_xyz"], "-m no_such_module_xyz: no module named 'no_such_module_xyz'"),
        (["-m", "no_such_pkg_xyz.sub"], "-m no_such_pkg_xyz.sub: No module named 'no_such_pkg_xyz'"),
        (["--report=", str(script)], "--report needs a file path, got an empty one"),
        (["--plot=", str(script)], "--plot needs a file path, got an empty one"),
        (["-m", "nomain_pkg"], "-m nomain_pkg: no module named 'nomain_pkg.__main__'; 'nomain_pkg' is "
                               "a package and cannot be directly executed"),
    ]


def test_run_refuses_what_it_cannot_run_or_write_before_the_program_starts(tmp_path, capsys,
                                                                           monkeypatch):
    # Found by a tester: a --plot path was only found unwritable after the script ran (a
    # matplotlib traceback, exit 1); a directory or a missing -m module gave runpy's
    # traceback and a report of an empty run; a FIFO hung; -mMODULE was dropped; empty
    # --report=/--plot= paths wrote nothing and exited 0.
    (tmp_path / "nomain_pkg").mkdir()
    (tmp_path / "nomain_pkg" / "__init__.py").write_text("")  # python -m imports it too
    monkeypatch.chdir(tmp_path)  # -m looks in the working directory, as python -m does
    for argv, message in _refusals(tmp_path):
        assert cli.main(["run", *argv, str(tmp_path / "mark"), "0"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("torch-renaissance run: ") and message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1 and "memory report" not in err, (argv, err)
        assert not (tmp_path / "mark").exists()


def test_run_attached_module_form_runs_the_module(tmp_path):
    # python -mjson.tool: the attached form names the module as -m MODULE does.
    data = tmp_path / "d.json"
    data.write_text('{"b": 1, "a": 2}')
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "-mjson.tool",
                        "--sort-keys", str(data)], capture_output=True, text=True,
                       env=clean_env(), cwd=str(REPO), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {"a": 2, "b": 1} and r.stdout.index('"a"') < r.stdout.index('"b"')


@pytest.mark.parametrize("target", ["serve.serve", "__main__.serve", "missing_mod_xyz.fn",
                                    "serve.K.go", ".x", "a..b"])
def test_run_step_on_the_program_itself_is_refused_before_it_runs(tmp_path, target):
    # Found by a tester: --step-on serve.serve for `run serve.py` imported serve.py (the
    # whole program ran once), hooked that copy's serve, then ran the program again as
    # __main__ with no step marked. Now refused, the program never started, and no memory
    # report is printed for a run that did not happen.
    script = tmp_path / "serve.py"
    mark = tmp_path / "ran.txt"
    script.write_text(f"open({str(mark)!r}, 'a').write('ran\\n')\n"
                      "def serve(x):\n    return x\n"
                      "class K:\n    def go(self):\n        return 1\n"
                      "for i in range(3):\n    serve(i)\n")
    report = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--report",
                        str(report), "--step-on", target, str(script)], capture_output=True,
                       text=True, env=clean_env(), cwd=str(tmp_path), timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert not mark.exists()  # finding main.K imported main: the program ran once
    assert not report.exists()  # run made it empty for a run that did not happen
    assert "the script was not run" in r.stderr and "memory report" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # The option is named once (it read "--step-on: step_on: ..." before).
    assert r.stderr.startswith("torch-renaissance run: --step-on: ") and "step_on:" not in r.stderr, r.stderr
    if target in ("serve.serve", "__main__.serve", "serve.K.go"):
        assert "mark its steps with torch_renaissance.step()" in r.stderr


def _run_pk(tmp_path, *args):
    pk = tmp_path / "pk"
    pk.mkdir(exist_ok=True)
    (pk / "__init__.py").write_text("def f(x):\n    return x + 1\n")
    (pk / "__main__.py").write_text(f"open({str(tmp_path / 'ran.txt')!r}, 'a').write('ran\\n')\n"
                                    "import pk\n"
                                    "def g():\n    return 0\n"
                                    "for i in range(3):\n    pk.f(i)\n")
    return subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", *args, "-m", "pk"],
                          capture_output=True, text=True, env=clean_env(), cwd=str(tmp_path),
                          timeout=300)


def test_run_step_on_a_packages_own_function_works_and_its_main_is_refused(tmp_path):
    # A breaker found pk.f (in pk/__init__.py) refused for `run -m pk`, whose program is
    # pk/__main__.py, and pk.__main__.g not refused (the program ran twice).
    report = tmp_path / "r.json"
    r = _run_pk(tmp_path, "--report", str(report), "--step-on", "pk.f")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "ran.txt").read_text() == "ran\n"  # once
    assert json.loads(report.read_text())["step_boundaries"] == 3  # one per pk.f call
    (tmp_path / "ran.txt").unlink()
    r = _run_pk(tmp_path, "--step-on", "pk.__main__.g")
    assert r.returncode == 2 and "pk.__main__ is the program being run" in r.stderr, r.stderr
    assert not (tmp_path / "ran.txt").exists()


def test_run_plot_relative_path_is_the_callers_and_fifo_report_does_not_hang(tmp_path):
    # A breaker found a relative --plot written where the script chdir'ed to, and
    # --report on a FIFO nobody reads blocking run before the program started.
    pytest.importorskip("matplotlib")
    (tmp_path / "elsewhere").mkdir()
    script = tmp_path / "cd.py"
    script.write_text("import os, torch\n"
                      f"os.chdir({str(tmp_path / 'elsewhere')!r})\n"
                      "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for i in range(3):\n"
                      "    m(torch.ones(2, 4)).sum().backward(); opt.step(); opt.zero_grad()\n")
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--plot", "p.png",
                        str(script)], capture_output=True, text=True, env=clean_env(),
                       cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "elsewhere" / "p.png").exists()
    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "torch_renaissance.cli", "run", "--report", str(fifo),
                        str(script)], capture_output=True, text=True, env=clean_env(),
                       cwd=str(tmp_path), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"--report {fifo}: cannot write: no process reads that FIFO" in r.stderr
