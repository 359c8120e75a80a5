"""Plan agreement across ranks: one collective, and every rank raises on a mismatch."""
from __future__ import annotations

import pytest
import torch

from torch_renaissance.distributed import PlanMismatchError, ShardedTensorSpec, check_agreement, plan_sharded

from . import _tasks_fsdp as fsdp_tasks
from . import _tasks_placements as tasks


def test_agreement_single_process_without_process_group():
    from torch.distributed.tensor import Shard

    plan = plan_sharded([ShardedTensorSpec("w", (7, 3), torch.float32, (2,), (Shard(0),))])
    assert check_agreement(plan) == plan.digest()
    with pytest.raises(ValueError, match="boom"):
        check_agreement(None, error="boom")
    assert issubclass(PlanMismatchError, RuntimeError)


def test_agreeing_ranks_return_the_digest(world2):
    digests = world2.run(tasks.agreement_ok)
    assert len(set(digests)) == 1 and len(digests[0]) == 64


@pytest.mark.parametrize("world", [2, 4])
def test_disagreement_raises_on_every_rank_naming_the_slot(request, world):
    messages = request.getfixturevalue(f"world{world}").run(tasks.disagreement_generic)
    odd = world - 1
    for msg in messages:
        assert msg != "no error"
        assert f"rank {odd} differs from rank 0" in msg
        assert "region 'params', slot #1 'proj.weight'" in msg
        assert "(4, 6) != (4, 5)" in msg if world == 4 else "(7, 6) != (7, 5)" in msg
    assert len(set(messages)) == 1  # the same message everywhere


def test_disagreement_through_plan_fsdp(world2):
    messages = world2.run(fsdp_tasks.disagreement_fsdp)
    for msg in messages:
        assert "rank 1 differs from rank 0" in msg
        # (5, 14) vs (5, 13) over 2 ranks: padded slots (3, 14) vs (3, 13); the earlier
        # (14, 7) weight pads to (7, 7) either way, so it is not the first difference.
        assert "slot #4 '2.weight': shape (3, 14) != (3, 13), nbytes 168 != 156" in msg
    assert len(set(messages)) == 1


def test_non_chunk_split_raises_on_every_rank(world4):
    """Ranks 2 and 3 hold shards torch.chunk would not give; ranks 0 and 1 cannot see it
    locally, yet all four raise ValueError naming the parameter (no hang)."""
    messages = world4.run(tasks.non_chunk_split)
    for msg in messages:
        assert msg.startswith("ValueError: plan could not be built on rank(s) [2, 3]")
        assert "odd.weight: local shard (3, 3) at mesh coordinate (2,)" in msg
        assert "uneven non-chunk splits cannot be planned" in msg
    assert len(set(messages)) == 1
