"""Build torch_renaissance's compiled extension ``torch_renaissance._C``.

CPU-only build by default. The CUDA parts (``csrc/core/cuda_device.cpp``, the
torch glue ``csrc/torch/cuda_*.cpp`` and ``csrc/python/cuda_bindings.cpp``) are added when the installed torch was built
with CUDA and a CUDA toolkit is found (``CUDA_HOME`` or ``/usr/local/cuda``),
unless ``TORCH_RENAISSANCE_CUDA=0``; ``TORCH_RENAISSANCE_CUDA=1`` requires them.
``TORCH_RENAISSANCE_DEBUG=1`` (or ``2``, ``3``) makes a debug build at that
``TR_DEBUG`` level (``csrc/core/debug.h``): the lock-order checker of
``csrc/core/lock_order.h`` on (a lock taken out of order raises) and O(1)
assertions; at 3 the arena checks all its invariants after every public
operation. Use
``MAX_JOBS=2`` on small machines.
"""
from __future__ import annotations

import glob
import os

from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
# The torch CUDA glue is every csrc/torch/cuda_*.cpp (cuda_allocator.cpp lists
# them and their lock order); tools/check_cuda_build.py compiles the same set.
CUDA_ONLY = {
    "csrc/core/cuda_device.cpp",
    *sorted(glob.glob("csrc/torch/cuda_*.cpp", root_dir=ROOT)),
    "csrc/python/cuda_bindings.cpp",
}


def _want_cuda() -> bool:
    """True to build the CUDA parts. TORCH_RENAISSANCE_CUDA=0 turns them off;
    =1 requires them, raising SystemExit when torch has no CUDA or no CUDA
    toolkit is found (instead of a CPU-only build found out at import)."""
    flag = (os.environ.get("TORCH_RENAISSANCE_CUDA") or "").strip()
    if flag in ("0", "false", "False", "no"):
        return False
    import torch

    if flag in ("1", "true", "True", "yes"):
        if torch.version.cuda is None:
            raise SystemExit(f"TORCH_RENAISSANCE_CUDA=1, but torch {torch.__version__} "
                             "was built without CUDA")
        home = cpp_extension.CUDA_HOME
        if home is None or not os.path.exists(os.path.join(home, "include", "cuda.h")):
            raise SystemExit(f"TORCH_RENAISSANCE_CUDA=1, but no CUDA toolkit was found (CUDA_HOME="
                             f"{home!r} has no include/cuda.h): set CUDA_HOME, e.g. /usr/local/cuda")
        return True
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _debug_level() -> int:
    """The TR_DEBUG level from TORCH_RENAISSANCE_DEBUG: unset/0 -> 0, 1/true/yes -> 1,
    2 or 3 -> that level; anything else raises SystemExit."""
    flag = (os.environ.get("TORCH_RENAISSANCE_DEBUG") or "").strip()
    if flag in ("", "0", "false", "False", "no"):
        return 0
    if flag in ("1", "true", "True", "yes"):
        return 1
    if flag in ("2", "3"):
        return int(flag)
    raise SystemExit(f"TORCH_RENAISSANCE_DEBUG={flag!r}: use 0, 1, 2 or 3")


def _sources(with_cuda: bool) -> list[str]:
    files = []
    for pattern in ("csrc/core/*.cpp", "csrc/torch/*.cpp", "csrc/python/*.cpp"):
        files += sorted(glob.glob(pattern, root_dir=ROOT))
    return [f for f in files if with_cuda or f not in CUDA_ONLY]


def _extension():
    with_cuda = _want_cuda()
    ext = cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension
    macros = [("TR_WITH_CUDA", "1")] if with_cuda else []
    level = _debug_level()
    if level:
        macros += [("TR_LOCK_ORDER_CHECK", "1"), ("TR_DEBUG", str(level))]
    return ext(
        "torch_renaissance._C",
        _sources(with_cuda),
        include_dirs=[os.path.join(ROOT, "csrc")],
        define_macros=macros,
        extra_compile_args={"cxx": ["-O2", "-std=c++17", "-Wall", "-Wextra",
                                    "-fvisibility=hidden"]},
    )


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
