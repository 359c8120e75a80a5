"""The communication slot pool of plan_fsdp, alone (no process group)."""
from __future__ import annotations

import gc

import torch

from torch_renaissance.distributed.fsdp import _SlotPool


def _live(flags: dict):
    """A content probe the test controls: live while flags[id(t)] is True."""
    return lambda t: t is not None and flags.get(id(t), False)


def test_dead_content_reuses_memory_still_referenced():
    pool, flags = _SlotPool(torch.device("cpu")), {}
    a, shared_a = pool.take(4096, (1024,), torch.float32, _live(flags))
    flags[id(a)] = True
    assert not shared_a and a._base is None and a.untyped_storage().nbytes() == 4096
    # a is still referenced and its content live: a second request gets a second slot.
    b, shared_b = pool.take(4096, (512,), torch.float64, _live(flags))
    assert not shared_b and b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    assert sum(len(v) for v in pool.slots.values()) == 2
    # a's content is consumed (still referenced): the next request takes its memory.
    flags[id(a)] = False
    c, shared_c = pool.take(4096, (2048,), torch.bfloat16, _live(flags))
    assert shared_c and c.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert c.dtype == torch.bfloat16 and c.shape == (2048,) and c.is_contiguous()
    assert pool.held_nbytes() == 2 * 4096


def test_idle_slot_holds_nothing_and_sizes_do_not_mix():
    pool, flags = _SlotPool(torch.device("cpu")), {}
    a, _ = pool.take(1024, (256,), torch.float32, _live(flags))
    ptr = a.data_ptr()
    view = a.view(16, 16)  # views keep the handed-out tensor (their _base) alive
    del a
    gc.collect()
    assert pool.held_nbytes() == 1024
    del view
    gc.collect()
    assert pool.held_nbytes() == 0  # no occupant left: the memory went back
    b, shared = pool.take(1024, (256,), torch.float32, _live(flags))
    assert not shared  # a fresh allocation (the old storage is gone)
    other, _ = pool.take(2048, (512,), torch.float32, _live(flags))
    assert set(pool.slots) == {1024, 2048} and other.data_ptr() != b.data_ptr()
    del ptr
