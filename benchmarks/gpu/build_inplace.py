#!/usr/bin/env python3
"""Builds ``torch_renaissance._C`` in place, with its CUDA parts, for run_all.sh.

``TORCH_RENAISSANCE_CUDA=1 python setup.py build_ext --inplace``, made to work
on a machine whose Python environment we do not control:

* ``CUDA_HOME`` defaults to ``/usr/local/cuda`` when it holds the toolkit
  (torch otherwise takes the folder above the first ``nvcc`` on the PATH,
  which may be a wrapper);
* with setuptools older than 77, which rejects pyproject.toml's SPDX
  ``license`` string, the ``[project]`` table is not read: building the
  extension in place needs nothing from it (setup.py names the extension).

Exit status: setup.py's (non-zero when the CUDA build is impossible).
"""
from __future__ import annotations

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    os.environ["TORCH_RENAISSANCE_CUDA"] = "1"
    if not os.environ.get("CUDA_HOME") and os.path.exists("/usr/local/cuda/include/cuda.h"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    import setuptools
    import setuptools.dist

    major = int(setuptools.__version__.split(".")[0])
    print(f"build: setuptools {setuptools.__version__}, CUDA_HOME={os.environ.get('CUDA_HOME')}",
          flush=True)
    if major < 77:
        print("build: setuptools < 77 cannot read pyproject.toml's license field; "
              "building without the [project] metadata", flush=True)
        setuptools.dist.Distribution.parse_config_files = lambda self, *a, **k: None
    os.chdir(ROOT)
    sys.argv = ["setup.py", "build_ext", "--inplace"]
    try:
        runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"build: {e.code}", file=sys.stderr, flush=True)
            return e.code if isinstance(e.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
