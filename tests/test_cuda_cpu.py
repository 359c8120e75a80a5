"""The CUDA entry points on a machine or build without CUDA: clear errors, env parsing.

The GPU behaviour itself is tested in tests/gpu (skipped without a GPU).
"""
from __future__ import annotations

import pytest

import torch_renaissance as tr
from torch_renaissance import auto, cuda


@pytest.mark.parametrize("value, expected", [
    ("", []), ("0", []), ("false", []), ("1", ["cuda"]), ("true", ["cuda"]),
    ("cuda", ["cuda"]), ("cpu", ["cpu"]), ("cpu,cuda", ["cpu", "cuda"]),
    (" CUDA , cpu ", ["cpu", "cuda"]), ("all", ["cpu", "cuda"]),
])
def test_devices_from_env(value, expected):
    assert auto.devices_from_env(value) == expected


def test_devices_from_env_rejects_unknown_entries():
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        auto.devices_from_env("cpu,gpu")


def test_symbols_are_the_documented_names():
    assert cuda.SYMBOLS["malloc"] == "torch_renaissance_cuda_malloc"
    assert cuda.SYMBOLS["free"] == "torch_renaissance_cuda_free"


@pytest.mark.skipif(cuda.is_built(), reason="this build has CUDA")
def test_install_cuda_without_cuda_build_raises_clearly():
    with pytest.raises(RuntimeError, match="built without CUDA"):
        tr.install("cuda")
    assert not tr.is_installed("cuda")
    with pytest.raises(RuntimeError, match="built without CUDA"):
        cuda.arena(0)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is available")
def test_mem_pool_without_cuda_raises_clearly():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        tr.mem_pool()
