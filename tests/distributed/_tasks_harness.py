"""Rank-side tasks for the harness self-tests."""
from __future__ import annotations

import time

import torch.distributed as dist


def fail_on_rank1(rank: int, world: int) -> int:
    if rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    dist.barrier()  # rank 0 waits for a peer that never comes
    return rank


def sleep_forever(rank: int, world: int) -> None:
    time.sleep(3600)


def echo(rank: int, world: int, value: int) -> tuple[int, int, int]:
    return rank, world, value
