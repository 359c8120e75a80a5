"""``torch-renaissance run``: step times from every step boundary, and ``--plot``'s peak marks and step numbers."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import clean_env, run_report

MIXED = """
import torch, torch_renaissance as tr
torch.manual_seed(0)
m = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):                 # 3 optimizer-step boundaries
    m(torch.randn(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
for _ in range(4):                 # then 4 steps the program marks itself
    with tr.step():
        with torch.no_grad():
            m(torch.randn(8, 64)).sum()
print("ok")
"""


def test_run_times_every_boundary_whatever_made_it(tmp_path):
    # run had two sources of step times: auto_steps' (optimizer steps only)
    # and the recorder's boundaries. A program that marks its own steps after
    # some optimizer steps got "steps": 3 beside "step_boundaries": 7.
    (tmp_path / "mixed.py").write_text(MIXED)
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(tmp_path / "r.json"),
                        str(tmp_path / "mixed.py")], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["step_boundaries"] == 7 and rep["steps"] == 7, rep
    assert rep["mean_step_seconds"] > 0


class _Rec:
    """A recorder's drawn fields, by hand."""

    def __init__(self, samples, boundaries):
        self.samples, self.boundaries, self.replayed_at = samples, boundaries, None


def test_plot_marks_the_highest_reserved_sample_and_numbers_few_steps(tmp_path):
    pytest.importorskip("matplotlib")
    from torch_renaissance.cli import plot_timeline

    mib = 2**20
    # 3 steps; a 1-sample spike of 50 MiB reserved in step 1, at 0.15 s.
    samples = [(i * 0.01, 10 * mib, (50 if i == 15 else 20) * mib) for i in range(30)]
    out = tmp_path / "mem.png"
    drawn = plot_timeline(_Rec(samples, [0.1, 0.2, 0.3]), str(out), "t", load=8 * mib,
                          peak_reserved=51 * mib, peak_allocated=10 * mib)
    assert drawn == {"peak_sample": (0.15, 50 * mib), "steps_numbered": True}
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Many steps: not numbered (the numbers would overlap); no samples, no mark.
    drawn = plot_timeline(_Rec([], [i * 0.01 for i in range(1, 101)]), str(out), "t")
    assert drawn == {"peak_sample": None, "steps_numbered": False}


def test_run_plot_of_a_short_script(tmp_path):
    pytest.importorskip("matplotlib")
    script = tmp_path / "s.py"
    script.write_text(MIXED)
    png = tmp_path / "mem.png"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--plot", str(png), str(script)],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"memory over time drawn to {png}" in r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


AS_PYTHON = r"""
import json, os, sys
here = os.path.dirname(__file__)
os.chdir("/")
with open(os.path.join(here, "beside.txt")) as f:  # a file next to the script, after a chdir
    beside = f.read()
print(json.dumps({"file": __file__, "argv": sys.argv, "path0": sys.path[0], "beside": beside}))
"""


def test_run_gives_the_program_what_python_gives_it(tmp_path):
    # Under run, __file__ was the path as given (relative), so a script that changed directory
    # could not find its own files; and a "--" after the script was dropped from its argv.
    (tmp_path / "prog.py").write_text(AS_PYTHON)
    (tmp_path / "beside.txt").write_text("here")
    seen = {}
    for who, cmd in (("python", [sys.executable]), ("run", [sys.executable, "-m", "torch_renaissance", "run"])):
        r = subprocess.run([*cmd, "prog.py", "--", "--lr", "0.1"], capture_output=True, text=True,
                           env=clean_env(), cwd=str(tmp_path), timeout=300)
        assert r.returncode == 0, (who, r.stderr)
        seen[who] = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["run"] == seen["python"]
    assert seen["run"] == {"file": str(tmp_path / "prog.py"), "argv": ["prog.py", "--", "--lr", "0.1"],
                           "path0": str(tmp_path), "beside": "here"}


def test_a_program_that_ends_by_os_exit_leaves_a_report_saying_so(tmp_path):
    # The report file was left empty (not JSON), or an earlier run's report was left in place.
    prog = tmp_path / "quit.py"
    prog.write_text("import os, torch\nx = torch.ones(1000)\nos._exit(7)\n")
    out = tmp_path / "r.json"
    out.write_text('{"earlier": "run"}')
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(out), str(prog)],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 7, r.stderr
    rep = json.loads(out.read_text())
    assert rep["complete"] is False and "os._exit()" in rep["reason"]


def test_steady_reason_says_planning_is_off(tmp_path):
    prog = tmp_path / "train.py"
    prog.write_text("import torch\nm = torch.nn.Linear(8, 8)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                    "for _ in range(5):\n    m(torch.randn(4, 8)).sum().backward()\n    opt.step()\n"
                    "    opt.zero_grad()\n")
    out = tmp_path / "r.json"
    env = clean_env()
    env["TORCH_RENAISSANCE_CONF"] = "planning:False"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(out), str(prog)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["step_boundaries"] == 5 and rep["planned_steps"] == 0
    assert rep["steady_reason"] == "planning is off (planning:False): the dynamic pool served every step"


def test_steady_reason_names_a_step_on_function_never_called(tmp_path):
    # It said "for inference give --step-on" beside a --step-on that was given.
    prog = tmp_path / "infer.py"
    prog.write_text("import torch\nm = torch.nn.Linear(8, 8)\nwith torch.no_grad():\n"
                    "    for _ in range(3):\n        m(torch.randn(4, 8))\n")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(out),
                        "--step-on", "torch.nn.functional.gelu", str(prog)],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["step_boundaries"] == 0
    assert rep["steady_reason"] == ("no step boundary was seen: no optimizer.step() and no call of "
                                    "torch.nn.functional.gelu (--step-on)")


def _both(tmp_path, args, cwd=None):
    """(python's, run's) (exit code, stdout, stderr) for ``args``."""
    out = []
    for cmd in ([sys.executable], [sys.executable, "-m", "torch_renaissance", "run"]):
        r = subprocess.run([*cmd, *args], capture_output=True, text=True, env=clean_env(),
                           cwd=str(cwd or tmp_path), timeout=300)
        out.append((r.returncode, r.stdout, r.stderr))
    return out


def test_run_runs_what_python_runs_pyc_zip_folder_and_dotdot_after_a_link(tmp_path):
    import py_compile
    import zipfile as zf

    body = "import sys\nprint('ran', __file__, sys.argv[1:])\n"
    (tmp_path / "src.py").write_text(body)
    py_compile.compile(str(tmp_path / "src.py"), cfile=str(tmp_path / "comp.pyc"), doraise=True)
    with zf.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", body)
    (tmp_path / "pkgdir").mkdir()
    (tmp_path / "pkgdir" / "__main__.py").write_text(body)
    # ly -> other/y; ly/../z.py is other/z.py to the kernel (abspath would say ./z.py).
    (tmp_path / "other" / "y").mkdir(parents=True)
    (tmp_path / "other" / "z.py").write_text("print('right file')\n")
    (tmp_path / "z.py").write_text("print('wrong file')\n")
    (tmp_path / "ly").symlink_to(tmp_path / "other" / "y")
    for args in (["comp.pyc", "a"], ["app.zip", "a"], ["pkgdir", "a"], ["ly/../z.py"]):
        (pc, po, pe), (rc, ro, re_) = _both(tmp_path, args)
        assert pc == 0 and rc == 0, (args, pe, re_)
        assert ro.splitlines()[0] == po.splitlines()[0], args
    assert _both(tmp_path, ["ly/../z.py"])[1][1].splitlines()[0] == "right file"


def test_a_syntax_error_is_shown_as_python_shows_it(tmp_path):
    (tmp_path / "syn.py").write_text("x = 1\ndef g(:\n    pass\n")
    (pc, _, pe), (rc, _, re_) = _both(tmp_path, ["syn.py"])
    assert pc == rc == 1
    assert re_.startswith(pe), re_  # no frames of run's own before the script's error
    assert "cli.py" not in re_


def test_the_script_keeps_main_module_features_python_gives(tmp_path):
    (tmp_path / "m.py").write_text(
        "import atexit, pickle, sys\n"
        "x: int = 1\n"
        "print(__annotations__)\n"
        "def f():\n    return 1\n"
        "atexit.register(lambda: print('atexit', len(pickle.dumps(f)) > 0, sys.modules['__main__'].f is f))\n")
    (pc, po, pe), (rc, ro, re_) = _both(tmp_path, ["m.py"])
    assert pc == rc == 0, (pe, re_)
    assert po.splitlines() == ["{'x': <class 'int'>}", "atexit True True"]
    assert ro.splitlines()[:2] == po.splitlines()


def test_report_naming_the_script_does_not_wipe_it_before_it_runs(tmp_path):
    # The unfinished-report note goes only where a report may go (a new, empty or JSON file).
    prog = tmp_path / "self.py"
    prog.write_text("print('script body ran')\n")
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(prog), str(prog)],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "script body ran", r.stderr


def test_run_report_counts_the_plans_made(tmp_path):
    # A tester found replans only from step-time stalls: the report had no count of
    # plans. The program reads the arena's own count after its last step; the report
    # (JSON and text) must say the same, and a fixed loop of one structure plans once.
    (tmp_path / "loop.py").write_text(
        "import torch, torch_renaissance as tr\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Linear(64, 64)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(8):\n"
        "    m(torch.randn(8, 64)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "print(tr.memory_stats()['renaissance.plans'])\n")
    r, rep = run_report(tmp_path / "loop.py", tmp_path / "r.json")
    seen = int(r.stdout.strip())
    assert rep["plans"] == seen == 1, (rep["plans"], seen)
    assert rep["plan_seconds"] >= 0
    assert f"plans made             {seen}  (planner time" in r.stderr, r.stderr


KEPT_FIRST_OUTPUT = """
import random, torch, torch_renaissance as tr
from torch import nn
rng = random.Random({seed})
torch.manual_seed({seed})
d, h, o = 256, 1024, rng.choice((4096, 6144))
m = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, o))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
g = torch.Generator().manual_seed({seed})
first = None
for i in range(1, 13):
    out = m(torch.randn(256, d, generator=g))
    out.float().pow(2).mean().backward()
    opt.step()
    s = tr.memory_stats()  # right after the boundary (the optimizer step's hook)
    print(i, s["renaissance.plans"], s["renaissance.planned_steps"], s["reserved_bytes.all.current"], flush=True)
    opt.zero_grad()
    if first is None:
        first = out  # kept for the whole run, as torch.compile's first call's outputs
"""


@pytest.mark.parametrize("seed", range(2))
def test_steady_window_starts_after_a_re_plans_first_replay(tmp_path, seed):
    """The first step's output kept for the whole run (torch.compile's first call
    does this) makes the first plan leave the later outputs to the dynamic pool; the
    first replay sees them die and re-plans. The step after that re-plan is its first
    replay, with the old outputs beside the new plan: no steady step. The steady
    window used to start after the first replayed step and counted it (1.16 x here,
    HF GPT-2 under torch.compile 1.137 against 1.018 from the step after it)."""
    (tmp_path / "loop.py").write_text(KEPT_FIRST_OUTPUT.format(seed=seed))
    r, rep = run_report(tmp_path / "loop.py", tmp_path / "r.json")
    rows = [tuple(map(int, line.split())) for line in r.stdout.split("\n") if line.strip()]
    # The plan and the re-plan at the end of its first replay (and a refine
    # of it where it was pinned or over its bound: no steady step either).
    assert rep["plans"] in (2, 3), rep
    # Reference: the first boundary after which a step replayed and no plan was
    # made at it; the window is the steps after it (step k ends at boundary k).
    expect = next(i for k, (i, plans, replayed, _) in enumerate(rows)
                  if replayed >= 1 and plans == (rows[k - 1][1] if k else 0)) + 1
    assert rep["steady_from_step"] == expect, (rows, rep["steady_from_step"])
    assert expect > 3, rows  # the re-plan's first replay is left out
    assert f"steps {expect}-12 and the end" in r.stderr, r.stderr
    # The window holds the plan proper, which serves every request in the
    # territory it reserved at the boundary: its peak is the highest reserved at
    # the window's boundaries (the script's own readings). With the re-plan's
    # first replay in it, the old outputs beside the new plan were above them
    # (185.4 and 151.5 MiB against 181.4 and 131.4).
    assert rep["steady_peak_reserved_bytes"] == max(res for i, _, _, res in rows if i >= expect - 1), (rows, rep)


@pytest.mark.parametrize(
    "n, expected",
    [
        (None, "n/a"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (34_240, "33.4 KiB"),   # a new user's "above LOAD" part that printed as 0.0 MiB
        (42_624, "41.6 KiB"),
        (-42_624, "-41.6 KiB"),  # the report's "rest" may be negative
        (2**20 - 1, "1024.0 KiB"),
        (2**20, "1.0 MiB"),
        (3 * 2**20 + 2**19, "3.5 MiB"),
        (-5 * 2**20, "-5.0 MiB"),
    ],
)
def test_report_sizes_show_small_parts_in_their_own_unit(n, expected):
    """The report's "reserved, not live" and "above LOAD" lines give a sum and its parts:
    parts of tens of KiB all printed as 0.0 MiB beside a total of 0.1 MiB, so they did
    not visibly add up. Each is now in the unit that shows it (hand-computed values)."""
    from torch_renaissance.cli import _size

    assert _size(n) == expected
