"""Third-party models run unchanged under ``torch-renaissance run``.

``benchmarks/models/hf_train.py`` is an ordinary loop (``out = model(**batch)`` keeps the
previous step's outputs alive across the step boundary). Each test runs it under
``run --report`` with a tiny config and few steps (one thread, so that the losses do not
depend on the machine's load), and compares its losses with the same loop on PyTorch's own
CPU allocator in this process (or in a child process where this process has torch_renaissance
installed), with the planner's clock off (``plan_deterministic``) unless a test says otherwise.
HF models are built from configs (no downloads); skipped without ``transformers``
(CI installs it: Makefile DEPS). The full-size table is benchmarks/bench_models.py.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO, clean_env

SCRIPT = REPO / "benchmarks" / "models" / "hf_train.py"
needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                              reason="transformers is not installed")


def _baseline(args, tmp_path):
    """The losses on PyTorch's default CPU allocator."""
    import torch_renaissance as tr

    if not tr.installer.is_installed("cpu"):
        sys.path.insert(0, str(SCRIPT.parent))
        try:
            import hf_train
        finally:
            sys.path.remove(str(SCRIPT.parent))
        import torch

        threads = torch.get_num_threads()
        try:
            return hf_train.train(list(args))
        finally:
            torch.set_num_threads(threads)
    r = subprocess.run([sys.executable, str(SCRIPT), *args, "--losses", str(tmp_path / "a.json")],
                       capture_output=True, text=True, env=clean_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / "a.json").read_text())


# The planner's clock off (plan_deterministic): each planner call stops at its work count, so
# the plans, and the steady ratios held to 1.02 here, are the same on every machine however
# loaded. With the clock, CI's 2 shared cores once cut the d 256 GPT-2's 2,220-buffer plan
# short (1.020; 1.000 on every machine that finishes the work in the budget).
DETERMINISTIC = "plan_deterministic:True"


def _run(tmp_path, *args, conf=DETERMINISTIC):
    args = (*args, "--threads", "1")
    ours = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(tmp_path / "r.json"),
                           str(SCRIPT), *args, "--losses", str(tmp_path / "b.json")],
                          capture_output=True, text=True, timeout=900,
                          env=clean_env({"TORCH_RENAISSANCE_CONF": conf} if conf else None))
    assert ours.returncode == 0, ours.stderr[-3000:]
    b = json.loads((tmp_path / "b.json").read_text())
    assert b == _baseline(args, tmp_path), "losses must be bit-identical to PyTorch's allocator"
    return json.loads((tmp_path / "r.json").read_text()), ours.stderr


def _check_planned(rep, steady_max):
    # Every request of the replayed steps is served by the plan (no miss, no
    # conflict: the recorded live-outs in the first replay's way are pinned),
    # nothing is left in the dynamic pool next to the territory, and LOAD
    # stays a lower bound (never above what was live).
    assert rep["plan_misses"] == 0 and rep["plan_conflicts"] == 0 and rep["plan_hit_rate"] == 1.0, rep
    assert rep["steady_reason"] is None, rep
    assert rep["load_bytes"] <= rep["peak_allocated_bytes"], rep
    assert rep["steady_peak_reserved_over_peak_allocated"] <= steady_max, rep


@needs_hf
def test_hf_gpt2_output_kept_across_steps_is_planned(tmp_path):
    # Before issue 16: the logits of `out` (8 MiB here) went to the dynamic
    # pool next to the territory on every step, steady 1.19 x peak allocated.
    rep, err = _run(tmp_path, "--arch", "gpt2", "--size", "tiny", "--steps", "7", "--seq", "64")
    # 1.184 once before the fix (1.002-1.010 otherwise): the first replay's
    # logits conflicted with the recorded ones (pinning re-planned the step
    # and moved them there) and went to the dynamic pool for two steps.
    _check_planned(rep, 1.02)
    assert rep["address_stability"] == 1.0
    assert "steady peak reserved" in err and "above LOAD" in err
    # The parts of "above LOAD" add up to it (a tester added up parts taken at
    # other moments and found most of it unexplained): what steps reserved above
    # the highest steady boundary, that boundary's parts, and a named rest.
    parts = rep["above_load_parts"]
    assert sum(v for k, v in parts.items() if k.endswith("_bytes")) == rep["above_load_bytes"], rep
    assert "rest (not attributed" in err, err


@needs_hf
def test_hf_gpt2_d256_steady_at_peak_allocated(tmp_path):
    # Issue 16's GPT-2 (4 layers, d 256, vocab 8000, batch 4 x 128): 1.023 x
    # steady. Its first plan is pinned (no bridge fitted: the new logits are
    # born before the recorded ones die, over both of the plan's logits
    # positions) and over its bound (162.7 MiB for 158.2); the refine made from
    # its first replay is bridged and replaces it at its bound: 1.000 in the
    # eleventh pass's runs (load 9-45). The window leaves out the refine's
    # first replay.
    rep, err = _run(tmp_path, "--arch", "gpt2", "--steps", "7")
    _check_planned(rep, 1.02)
    assert rep["plans"] <= 2 and rep["steady_from_step"] <= 5, rep
    assert rep["address_stability"] == 1.0, rep
    # The whole run, recorded steps included (issue 16: <= 1.10). It was
    # 1.113: the second recorded step's backward peaked with the first
    # step()'s freed AdamW temporaries still mapped in the persistent segment
    # (15 MiB), and its own step() grew that segment again. Now a hinted
    # phase gives back what it left free there, and only a step() that makes
    # state is hinted: 1.082 (the first step()'s state and temporaries beside
    # the dynamic pool's free memory).
    assert rep["peak_reserved_over_peak_allocated"] <= 1.10, rep


@needs_hf
def test_hf_bert_encoder_is_planned(tmp_path):
    rep, _ = _run(tmp_path, "--arch", "bert", "--size", "tiny", "--steps", "7", "--batch", "8", "--seq", "64")
    _check_planned(rep, 1.02)


def test_cnn_is_planned(tmp_path):
    # Not the tiny width: at 2 MiB allocated, PyTorch's 2 MiB small-pool segments alone are 5%.
    rep, _ = _run(tmp_path, "--arch", "cnn", "--steps", "6", "--batch", "8", "--seq", "64")
    _check_planned(rep, 1.02)


MLP_ARGS = ("--arch", "mlp", "--size", "tiny", "--steps", "6", "--batch", "8", "--seq", "32")


def test_many_small_tensors_are_planned(tmp_path):
    # Every tensor under 1 MiB (PyTorch's small pool): 24 residual MLP blocks.
    rep, _ = _run(tmp_path, *MLP_ARGS)
    _check_planned(rep, 1.02)


def test_many_small_tensors_stopped_planner_does_not_conflict(tmp_path):
    # A plan the search left early (as a loaded machine's clock stops it;
    # budget 0 gives such a plan on any machine): aligning the two phases
    # moved a slot of the first replay onto a recorded live-out that pinning
    # had left where it stood (1 conflict in every run before the fix; once in
    # a loaded CI with the default budget). Steady is not asserted: a stopped
    # search's plan is worse (1.02-1.13 x here, the static planner's matter).
    rep, _ = _run(tmp_path, *MLP_ARGS, conf="plan_budget_ms:0")
    assert rep["plan_conflicts"] == 0 and rep["plan_misses"] == 0 and rep["plan_hit_rate"] == 1.0, rep
    assert rep["planned_steps"] == 5, rep


def test_run_without_boundaries_says_so(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text("import torch\nm = torch.nn.Linear(64, 64)\nwith torch.no_grad():\n"
                      "    for _ in range(5):\n        y = m(torch.randn(8, 64))\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(tmp_path / "r.json"),
                        str(script)], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["planned_steps"] == 0 and rep["step_boundaries"] == 0
    for k in ("load_bytes", "plan_hit_rate", "address_stability", "steady_peak_reserved_bytes",
              "steady_peak_reserved_over_load", "peak_reserved_over_load"):
        assert rep[k] is None, k
    assert "no step boundary was seen" in rep["steady_reason"] and "--step-on" in rep["steady_reason"]


def test_run_step_on_plans_a_function_without_optimizer(tmp_path):
    # A serving loop: each serve() call is one step once named by --step-on.
    (tmp_path / "srv.py").write_text(
        "import torch\n"
        "def serve(m, x):\n    h = m(x)\n    return (h * 2).sum().item()\n")
    (tmp_path / "main.py").write_text(
        "import torch, srv\ntorch.set_num_threads(1)\ntorch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))\n"
        "with torch.no_grad():\n    print(sum(srv.serve(m, torch.ones(32, 256)) for _ in range(12)))\n")
    plain = subprocess.run([sys.executable, str(tmp_path / "main.py")], capture_output=True, text=True,
                           env=clean_env(), timeout=300, cwd=tmp_path)
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(tmp_path / "r.json"),
                        "--step-on", "srv.serve", str(tmp_path / "main.py")], capture_output=True, text=True,
                       env=clean_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["step_boundaries"] == 12
    # The steps are timed at the boundaries --step-on makes (was "steps": 0 and no mean).
    assert rep["steps"] == 12 and rep["mean_step_seconds"] > 0
    assert "/ steady peak allocated" in r.stderr and " 1 variants" not in r.stderr, r.stderr
    assert " 1 layouts" not in r.stderr, r.stderr
    # 12 serve() steps: 2 recorded, 10 replayed (the steps auto_steps keeps
    # open between the calls are another key, planned too), every request of
    # them at its planned place.
    assert rep["planned_steps"] >= 10 and rep["plan_hit_rate"] == 1.0
    assert rep["steady_reason"] is None


def test_run_step_on_unknown_name_is_a_clear_error(tmp_path):
    (tmp_path / "s.py").write_text("print('x')\n")
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--step-on", "nosuchmod.f",
                        str(tmp_path / "s.py")], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 2 and "cannot find 'nosuchmod.f'" in r.stderr, r.stderr


def test_cli_version_module_and_help(tmp_path):
    from torch_renaissance import __version__

    env = clean_env()
    v = subprocess.run([sys.executable, "-m", "torch_renaissance", "--version"], capture_output=True, text=True,
                       env=env)
    assert v.returncode == 0 and v.stdout.strip() == f"torch-renaissance {__version__}"
    h = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--help"], capture_output=True,
                       text=True, env=env)
    assert h.returncode == 0
    assert "optimizer.step()" in h.stdout and "--step-on" in h.stdout and "-m MODULE" in h.stdout
    assert "``" not in h.stdout  # not raw reStructuredText
    d = subprocess.run([sys.executable, "-m", "torch_renaissance", "demo", "--help"], capture_output=True,
                       text=True, env=env)
    assert "(default: 20)" in d.stdout and "(default: 128)" in d.stdout
    assert "(default: 0)" in d.stdout  # --seed: a default of 0 is shown too
    p = subprocess.run([sys.executable, "-m", "torch_renaissance", "plan", "--help"], capture_output=True,
                       text=True, env=env)
    assert p.stdout.count("default: 1.0") == 1  # --budget's default once
    # run -m: a module with arguments, found on the working directory, as python -m.
    (tmp_path / "mymod.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    m = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "-m", "mymod", "--flag", "1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert m.returncode == 0, m.stderr
    assert m.stdout.strip() == "args ['--flag', '1']"


def _run_script(tmp_path, text, name="s.py"):
    (tmp_path / name).write_text(text)
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(tmp_path / "r.json"),
                        str(tmp_path / name)], capture_output=True, text=True, env=clean_env(), timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads((tmp_path / "r.json").read_text())


_LOOP = ("m = torch.nn.Linear(256, 256)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
         "for i in range(8):\n{open}"
         "    loss = m(torch.randn(64, 256)).pow(2).mean()\n    loss.backward(); opt.step(); opt.zero_grad()\n")


def test_run_keeps_the_scripts_own_install_options(tmp_path):
    # Before: run installed the defaults first, so the script's own install
    # with options raised "already installed with a different configuration".
    out, rep = _run_script(tmp_path, "import torch\nimport torch_renaissance as tr\n"
                           "tr.install('cpu', max_variants=3, plan_budget_seconds=0.5)\n"
                           "print(tr.installed_config('cpu').max_variants, tr.installed_config('cpu').plan_budget_ms)\n"
                           + _LOOP.format(open=""))
    assert out.split() == ["3", "500"]
    # run's optimizer-step boundaries start once the script's install returned.
    assert rep["step_boundaries"] == 8
    assert rep["planned_steps"] >= 6 and rep["plan_hit_rate"] == 1.0 and rep["steady_reason"] is None, rep


@pytest.mark.parametrize("how", ["with", "decorator"])
def test_run_keeps_the_scripts_own_steps(tmp_path, how):
    # Before: the script's first tr.step() raised "a step is already open"
    # (run's optimizer-step boundary keeps one open).
    if how == "with":
        text = "import torch\nimport torch_renaissance as tr\n" + _LOOP.format(open="  with tr.step():\n").replace(
            "\n    loss", "\n      loss").replace("\n    loss.backward", "\n      loss.backward")
    else:
        text = ("import torch\nimport torch_renaissance as tr\nm = torch.nn.Linear(256, 256)\n"
                "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n@tr.planned\ndef it():\n"
                "    loss = m(torch.randn(64, 256)).pow(2).mean()\n    loss.backward(); opt.step(); opt.zero_grad()\n"
                "for i in range(8):\n    it()\n")
    text += "s = tr.memory_stats('cpu')\nprint(s['renaissance.steps'])\n"
    out, rep = _run_script(tmp_path, text)
    # The script's 8 steps, and run's one step before the first of them
    # (imports, the model): no nested step, no step split by opt.step().
    assert out.split() == ["9"]
    assert rep["step_boundaries"] == 8
    assert rep["planned_steps"] >= 6 and rep["plan_hit_rate"] == 1.0 and rep["steady_reason"] is None, rep


def test_calls_install_finds_the_forms_a_script_uses():
    from torch_renaissance.cli import _calls_install

    assert _calls_install("import torch_renaissance as tr\ntr.install('cpu', planning=False)\n")
    assert _calls_install("import torch_renaissance\ntorch_renaissance.install()\n")
    assert _calls_install("from torch_renaissance import install as inst\ninst('cpu')\n")
    assert _calls_install("from torch_renaissance import installer\ninstaller.install('cpu')\n")
    assert not _calls_install("import torch_renaissance as tr\nwith tr.step():\n    pass\n")
    assert not _calls_install("import pip\npip.install('x')\n")  # another module's install
    assert not _calls_install("def f(:\n")  # not Python: run installs as usual
