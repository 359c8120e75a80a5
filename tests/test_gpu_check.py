"""benchmarks/gpu/run_all.sh's flow, without a GPU: a fake ``$PYTHON`` plays
torch, the build, the smoke case, pytest and the benchmarks, so the script's
own logic runs for real (the VMM fallback, the budget, the report, the log).
The table itself is printed by the real ``bench_gpu.py --report``."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu", "run_all.sh")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

FAKE = textwrap.dedent("""\
    #!/usr/bin/env bash
    # A fake python for run_all.sh. Records what each step saw in $FAKE_LOG.
    echo "$* VMM=${TORCH_RENAISSANCE_CUDA_VMM:-unset}" >> "$FAKE_LOG"
    case "$1" in
      -c)
        case "$2" in
          *"import torch, sys"*) echo "torch 2.11.0 CUDA 13.0 GPU available: True"; exit 0 ;;
          *"import xdist"*) exit 1 ;;
          *) exit 0 ;;
        esac ;;
      -) exec "$REAL_PYTHON" "$@" ;;
      benchmarks/gpu/build_inplace.py) exit 0 ;;
      tests/gpu/_cases.py)
        if [ "${TORCH_RENAISSANCE_CUDA_VMM:-}" = 0 ] || [ -n "${FAKE_SMOKE_OK:-}" ]; then
          echo 'RESULT {}'; exit 0
        fi
        echo "torch_renaissance: cuMemMap failed on cuda:0: operation not supported" >&2
        exit 1 ;;
      -m)
        sleep "${FAKE_TESTS_S:-0}"
        for a in "$@"; do case "$a" in --junitxml=*) xml="${a#--junitxml=}" ;; esac; done
        cat > "$xml" <<'XML'
    <testsuites><testsuite name="pytest">
    <testcase classname="tests.gpu.test_cuda_allocator" name="test_smoke"/>
    <testcase classname="tests.gpu.test_gpt_cuda" name="test_gpt">
    <skipped message="native is not deterministic here: two runs differ from step 3 on"/>
    </testcase></testsuite></testsuites>
    XML
        exit 0 ;;
      benchmarks/gpu/bench_gpu.py)
        if [ "$2" = "--report" ]; then exec "$REAL_PYTHON" "$@"; fi
        out="$3"
        cat > "$out/results.json" <<JSON
    {"gpu": "Fake H200", "configs": {"renaissance": {"vmm": "off: TORCH_RENAISSANCE_CUDA_VMM=0",
     "latency_ns": {"512B": 1000.0, "1MiB": 1100.0, "64MiB": 1200.0}}}}
    JSON
        exit 0 ;;
    esac
    echo "fake python: unexpected arguments: $*" >&2
    exit 99
    """)


def _script(tmp_path, env):
    """(command, environment, out dir) running run_all.sh with the fake python."""
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    out = tmp_path / "out"
    full = dict(os.environ, PYTHON=str(fake), REAL_PYTHON=sys.executable,
                FAKE_LOG=str(tmp_path / "calls.txt"), **env)
    full.pop("TORCH_RENAISSANCE_CUDA_VMM", None)
    full.pop("_TR_GPU_CHECK_INNER", None)
    return ["bash", SCRIPT, str(out)], full, out


def _start(tmp_path, **env):
    cmd, full, out = _script(tmp_path, env)
    p = subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    return p, out


def _run(tmp_path, **env):
    cmd, full, out = _script(tmp_path, env)
    p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=120)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    return p, out, calls


def test_smoke_failing_with_vmm_reruns_without_it_and_the_rest_follows(tmp_path):
    p, out, calls = _run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    smoke = [c for c in calls if c.startswith("tests/gpu/_cases.py smoke")]
    assert smoke == ["tests/gpu/_cases.py smoke VMM=unset", "tests/gpu/_cases.py smoke VMM=0"]
    # Every later step ran in that mode, and pytest serially (no xdist).
    pytest_call = next(c for c in calls if c.startswith("-m pytest"))
    assert pytest_call.endswith("VMM=0") and " -n " not in pytest_call
    assert next(c for c in calls if "bench_gpu.py --out" in c).endswith("VMM=0")
    # The table says so first; the GPT note is in the tests' status.
    table = p.stdout[p.stdout.index("total: "):]
    first = table.splitlines()[2]
    assert first.startswith("MODE: TORCH_RENAISSANCE_CUDA_VMM=0: the smoke case failed with "
                            "address ranges on")
    assert "native is not deterministic here" in table
    steps = json.loads((out / "steps.json").read_text())
    assert steps["smoke"].startswith("ok") and "with VMM: FAILED" in steps["smoke"]
    assert steps["tests"].startswith("ok") and "1 passed, 0 failed, 1 skipped" in steps["tests"]
    # The log is complete when the script has returned: all it printed.
    assert (out / "log.txt").read_text() == p.stdout


def test_out_of_time_prints_the_partial_table(tmp_path):
    # 28 s of budget, 20 of them kept for the report: the tests take the rest.
    p, out, calls = _run(tmp_path, TORCH_RENAISSANCE_GPU_BUDGET="28", FAKE_SMOKE_OK="1",
                         FAKE_TESTS_S="4")
    assert p.returncode == 1
    assert not any("bench_gpu.py --out" in c for c in calls)
    steps = json.loads((out / "steps.json").read_text())
    assert steps["benchmarks"] == "not run: no time"
    assert steps["build"].startswith("ok")
    log = (out / "log.txt").read_text()
    assert log == p.stdout
    assert "| benchmarks | not run: no time" in log
    # The metric rows are there, each saying why it has no number.
    row = next(line for line in log.splitlines() if line.startswith("| GPT step time (ms)"))
    assert row.count("not run: no time") == 3


def test_stopped_run_still_prints_its_table(tmp_path):
    # The run is stopped (SIGTERM to its whole process group) during the tests.
    p, out = _start(tmp_path, FAKE_SMOKE_OK="1", FAKE_TESTS_S="60")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "-m pytest" in (tmp_path / "calls.txt").read_text() if (tmp_path / "calls.txt").exists() else "":
            break
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGTERM)
    stdout, _ = p.communicate(timeout=60)
    assert p.returncode == 1
    steps = json.loads((out / "steps.json").read_text())
    assert steps["tests"].startswith("INTERRUPTED after")
    assert steps["benchmarks"] == "not run: no time"
    log = (out / "log.txt").read_text()
    assert "== interrupted after" in log
    assert "| tests      | INTERRUPTED after" in log
    assert log.rstrip().endswith(stdout.rstrip().splitlines()[-1])
