"""CUDA graphs, torch.cuda.MemPool, snapshots and the plain CUDAPluggableAllocator path."""
from __future__ import annotations

import pytest

MiB = 1 << 20

pytestmark = pytest.mark.gpu


def test_cuda_graph_replays_like_eager_and_recapture_does_not_grow(run_case):
    r = run_case("graph")
    # 100 replays with new inputs give the eager twin's losses and parameters.
    assert r["max_loss_diff"] <= 1e-5
    assert r["param_diff"] <= 1e-5
    # Re-capturing 10 times frees each old graph's pool: reserved does not grow.
    reserved = r["reserved"]
    assert len(reserved) == 10
    assert max(reserved) <= reserved[0]
    # Each re-capture's old pool goes away: the live graph's pool, plus at most
    # one that a library's workspace allocated during a capture keeps alive.
    pools = r["pools"]
    assert max(pools) <= 2 and pools[-1] == pools[0]


def test_snapshot_shows_our_segments(run_case):
    r = run_case("snapshot")
    assert r["segments"] >= 1
    assert r["tiles"] is True  # blocks tile each segment, as the viewer assumes
    assert r["pointers_found"] is True
    # 512 B, 3 MiB and 40 MiB, each rounded to 512 B (all already are).
    assert r["live_sizes"] == [512, 3 * MiB, 40 * MiB]
    assert r["allocated"] == 512 + 3 * MiB + 40 * MiB
    assert r["viz_chars"] > 0


@pytest.mark.parametrize("installed", ["1", "0"])
def test_mem_pool_scoped_allocations(run_case, installed):
    r = run_case("mem_pool", installed)
    assert r["a_ok"] is True and r["b_ok"] is True
    # The pool's 8 MiB came from our arena on both paths.
    assert r["arena_reserved"] >= (MiB if installed == "1" else 8 * MiB)
    assert r["pools"] == (1 if installed == "1" else 0)
    assert r["pools_after"] == 0


def test_peaks_with_a_private_pool_are_device_wide(run_case):
    r = run_case("pool_peaks")
    # 64 MiB in the default arena, freed, then 64 MiB in a MemPool: the device
    # never held more than 64 MiB (the sum of the two arenas' peaks is 128).
    assert r["allocated"] == 64 * MiB
    assert r["max_allocated"] == 64 * MiB
    assert r["max_allocated_accel"] == 64 * MiB
    assert r["max_after_reset"] == 0
    assert r["allocated_end"] == 0


def test_pluggable_allocator_plain_path(run_case):
    r = run_case("pluggable")
    assert r["ok"] is True
    assert r["ours_allocated"] == 5 * MiB
    assert r["after_free"] == 0
