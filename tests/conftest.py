"""Shared fixtures: the reference data folder and a fresh HostDevice arena."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def data_dir() -> pathlib.Path:
    """``../shared/data`` next to the repository, or ``$TORCH_RENAISSANCE_DATA``."""
    env = os.environ.get("TORCH_RENAISSANCE_DATA")
    return pathlib.Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> pathlib.Path:
    d = data_dir()
    if not (d / "traces").is_dir():
        pytest.skip(f"reference traces not found at {d}")
    return d / "traces"


@pytest.fixture
def C():
    from torch_renaissance import _C

    return _C


@pytest.fixture
def arena(C):
    return C.Arena(C.HostDevice())


def clean_env(extra: dict | None = None, drop: tuple = ()) -> dict:
    """The environment for child processes: no allocator config (nor the
    names in ``drop``), the repo importable, plus ``extra``."""
    env = dict(os.environ)
    for key in ("TORCH_RENAISSANCE_CONF", *drop):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    # Same thread counts in every child, busy machine or not (see cli.DETERMINISTIC_THREADS).
    env.update({"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"})
    env.update(extra or {})
    return env


def run_report(script, report, conf: str = "plan_budget_ms:0", timeout: float = 300):
    """Runs ``script`` under ``python -m torch_renaissance run --report REPORT``
    with ``TORCH_RENAISSANCE_CONF=conf`` in a fresh process. Returns (the
    finished process (``subprocess.CompletedProcess``: stdout, stderr with
    the report's text), the report's JSON). Fails the test with the child's
    stderr when it exits non-zero."""
    import json
    r = subprocess.run([sys.executable, "-m", "torch_renaissance", "run", "--report", str(report), str(script)],
                       capture_output=True, text=True, env=clean_env({"TORCH_RENAISSANCE_CONF": conf}),
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r, json.loads(pathlib.Path(report).read_text())


def run_json(code: str, *args: str, timeout: float = 600):
    """Runs ``code`` in a fresh process; returns the JSON of its last stdout line."""
    import json

    r = run_python(code, *args, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``python -c code`` in a fresh process (allocator installs are per process)."""
    full_env = clean_env(env)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=str(REPO))
