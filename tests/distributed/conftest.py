"""Fixtures for the distributed tests: pools of gloo ranks on CPU, started once per session."""
from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch.distributed as dist  # noqa: E402

from ._harness import close_pools, get_pool  # noqa: E402

@pytest.fixture(scope="session")
def _pools():
    yield get_pool
    close_pools()


def _world(pools, n: int, allocator=None):
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    return pools(n, allocator)


@pytest.fixture
def world2(_pools):
    """A pool of 2 gloo ranks: ``world2.run(fn, *args)`` -> results by rank."""
    return _world(_pools, 2)


@pytest.fixture
def world4(_pools):
    """A pool of 4 gloo ranks: ``world4.run(fn, *args)`` -> results by rank."""
    return _world(_pools, 4)


@pytest.fixture
def world2_arena(_pools):
    """2 gloo ranks with torch_renaissance's CPU allocator installed (memory stats)."""
    return _world(_pools, 2, "cpu")


@pytest.fixture
def world4_arena(_pools):
    """4 gloo ranks with torch_renaissance's CPU allocator installed (memory stats)."""
    return _world(_pools, 4, "cpu")
