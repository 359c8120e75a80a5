"""GPU tests: each runs one case of ``_cases.py`` in a fresh Python process.

A fresh process per test because torch_renaissance must be installed before
CUDA is initialized, and because each check needs counters that nothing else
in the process has touched. Every test in this folder is marked ``gpu``; all
are skipped when no CUDA device is present, and fail (instead of skipping)
when a GPU is present but the extension was built without CUDA.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import clean_env  # tests/conftest.py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CASES = os.path.join(HERE, "_cases.py")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.version.cuda is not None and torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    have_gpu = _cuda_available()
    for item in items:
        if HERE in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not have_gpu:
                item.add_marker(skip)


class CaseError(AssertionError):
    pass


@pytest.fixture
def run_case():
    """``run_case(name, *args, env=None, timeout=90)`` -> the case's RESULT dict.

    The timeout (seconds) is per case, well inside the GPU check's budget, so
    one hanging case fails alone.

    Raises an assertion error with the case's output when it exits non-zero
    or prints no ``RESULT`` line.
    """
    from torch_renaissance import cuda as tr_cuda

    if not tr_cuda.is_built():
        pytest.fail("a CUDA device is present but torch_renaissance was built without CUDA: "
                    "rebuild with `pip install --no-build-isolation -e .` and CUDA_HOME set")

    def run(name: str, *args: str, env: dict | None = None, timeout: float = 90) -> dict:
        full_env = clean_env(env, drop=("TORCH_RENAISSANCE", "PYTORCH_CUDA_ALLOC_CONF",
                                        "PYTORCH_ALLOC_CONF"))
        try:
            p = subprocess.run([sys.executable, CASES, name, *args], cwd=REPO, env=full_env,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = b"".join(x if isinstance(x, bytes) else (x or "").encode()
                           for x in (e.stdout, e.stderr)).decode("utf-8", "replace")
            raise CaseError(f"case {name} timed out after {timeout} s\n{out[-6000:]}")
        out = p.stdout + p.stderr
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise CaseError(f"case {name} failed (exit {p.returncode}):\n{out[-6000:]}")
        return json.loads(lines[-1][len("RESULT "):])

    return run
