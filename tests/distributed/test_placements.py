"""Placements -> local shapes, global offsets and slots (DTensor's rules, FSDP2's padding)."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from torch_renaissance.distributed import (
    ShardedTensorSpec,
    local_shape_and_offset,
    normalize_placements,
    plan_sharded,
    shard_layouts,
    slot_nbytes,
    slot_shape,
)

from . import _tasks_placements as tasks


def test_shard0_6x256_over_4_ranks():
    layouts = shard_layouts((6, 256), (4,), (Shard(0),))
    assert [lay.local_shape for lay in layouts] == [(2, 256), (2, 256), (2, 256), (0, 256)]
    # DTensor's convention: an empty shard's offset is the global size of the dim.
    assert [lay.global_offset for lay in layouts] == [(0, 0), (2, 0), (4, 0), (6, 0)]
    assert [lay.rank for lay in layouts] == [0, 1, 2, 3]
    assert slot_shape((6, 256), (4,), (Shard(0),)) == (2, 256)
    assert slot_nbytes((6, 256), torch.float32, (4,), (Shard(0),)) == 2 * 256 * 4
    # Same slot (size and offset) on every rank: the plan has no rank input at all.
    spec = ShardedTensorSpec("w", (6, 256), torch.float32, (4,), (Shard(0),))
    plan = plan_sharded([spec])
    assert plan.slot("params", "w").nbytes == 2048 and plan.slot_range("params", "w") == (0, 2048)


def test_replicate_is_full_size_everywhere():
    layouts = shard_layouts((6, 256), (4,), (Replicate(),))
    assert all(lay.local_shape == (6, 256) and lay.global_offset == (0, 0) for lay in layouts)
    assert slot_nbytes((6, 256), torch.float32, (4,), (Replicate(),)) == 6 * 256 * 4
    assert slot_shape((6, 256), (4,), (Partial(),)) == (6, 256)


def test_two_rows_over_8_simulated_ranks():
    layouts = shard_layouts((2, 11), (8,), (Shard(0),))
    assert [lay.local_shape[0] for lay in layouts] == [1, 1, 0, 0, 0, 0, 0, 0]
    assert all(lay.local_shape == (0, 11) for lay in layouts[2:])  # ranks 2-7 empty
    assert slot_shape((2, 11), (8,), (Shard(0),)) == (1, 11)  # ceil(2 / 8) = 1 row
    assert slot_nbytes((2, 11), torch.bfloat16, (8,), (Shard(0),)) == 11 * 2


def test_zero_rows_every_slot_empty_and_handled():
    layouts = shard_layouts((0, 5), (4,), (Shard(0),))
    assert all(lay.local_shape == (0, 5) and lay.global_offset == (0, 0) for lay in layouts)
    assert slot_shape((0, 5), (4,), (Shard(0),)) == (0, 5)
    specs = [
        ShardedTensorSpec("empty", (0, 5), torch.float32, (4,), (Shard(0),)),
        ShardedTensorSpec("w", (7, 3), torch.float32, (4,), (Shard(0),)),
    ]
    plan = plan_sharded(specs)
    assert plan.slot("params", "empty").nbytes == 0
    assert plan.slot_range("params", "w") == (0, 24)  # a 0-byte slot takes no space
    assert plan.slot("all_gather", "").nbytes == 4 * 2 * 3 * 4
    mat = plan.materialize()
    local = torch.empty(0, 5)
    mat.adopt("params", "empty", local)
    assert mat.slot_view("params", "empty").shape == (0, 5) and local.shape == (0, 5)


@pytest.mark.parametrize("mesh_shape", [(4,), (8,), (3,), (2, 2), (2, 3), (3, 2)])
def test_matches_dtensor_rules_for_every_coordinate(mesh_shape):
    """Against DTensor's pure helper, for every coordinate of simulated meshes."""
    shapes = [(6, 256), (2, 9), (0, 5), (7, 3), (13, 5), (1,), (5, 7, 3), (176, 64), (64,)]
    checked = 0
    for shape in shapes:
        options = [Shard(0), Replicate(), Partial()] + [Shard(d) for d in range(1, len(shape))]
        for placements in itertools.product(options, repeat=len(mesh_shape)):
            pad = slot_shape(shape, mesh_shape, placements)
            for coord in itertools.product(*(range(k) for k in mesh_shape)):
                ref_shape, ref_offset = _compute_local_shape_and_global_offset(
                    shape, mesh_shape, list(coord), placements
                )
                mine = local_shape_and_offset(shape, mesh_shape, placements, coord)
                assert mine == (tuple(ref_shape), tuple(ref_offset)), (shape, placements, coord)
                assert all(a <= b for a, b in zip(mine[0], pad))
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("shape", [(7, 3), (13, 5), (6, 256), (2, 9), (1, 4), (0, 5), (64,), (176, 64)])
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_slot_is_fsdp2_padding(shape, world):
    """FSDP2 pads its shard to ``torch.chunk(...)[0]`` (``_fsdp_param.py``): ceil(N / world) rows."""
    chunks = torch.chunk(torch.empty(shape), world, dim=0)
    assert slot_shape(shape, (world,), (Shard(0),)) == tuple(chunks[0].shape)
    assert slot_shape(shape, (world,), (Shard(0),))[0] == -(-shape[0] // world)
    # HSDP (Replicate(), Shard(0)) pads over the shard dim only.
    assert slot_shape(shape, (2, world), (Replicate(), Shard(0))) == tuple(chunks[0].shape)


def test_unplannable_placements_raise_value_error_naming_the_tensor():
    from torch.distributed.tensor.placement_types import _StridedShard

    # A _StridedShard whose split factor is not the tensor-parallel sharding right of it.
    with pytest.raises(ValueError, match=r"layers\.0\.w: _S\(0, 2\) on mesh dim 1 has split "
                       r"factor 2, but .* have 1 ranks"):
        ShardedTensorSpec("layers.0.w", (8, 4), torch.float32, (2, 2),
                          (Shard(0), _StridedShard(0, split_factor=2))).slot_shape
    with pytest.raises(ValueError, match=r"bias: Shard\(1\) .* out of range for a 1-D tensor"):
        slot_shape((5,), (2,), (Shard(1),), name="bias")
    with pytest.raises(ValueError, match=r"w: 1 placements for a 2-D mesh"):
        normalize_placements((Shard(0),), 2, 2, name="w")
    with pytest.raises(ValueError, match=r"w: placement .* cannot be planned"):
        normalize_placements(("shard",), 2, 1, name="w")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="coordinate"):
        local_shape_and_offset((4,), (2,), (Shard(0),), (2,))
    assert normalize_placements((Shard(-1),), 3, 1) == (Shard(2),)


def test_plan_regions_and_all_gather_size():
    """Regions in order, equal relative offsets across params/grads/state, AG = world x padded slots."""
    shapes = [(64, 64), (64,), (176, 64), (7, 3)]
    specs = [
        ShardedTensorSpec(f"p{i}", s, torch.float32, (4,), (Shard(0),), group="g",
                          states=(("exp_avg", torch.float32),))
        for i, s in enumerate(shapes)
    ]
    plan = plan_sharded(specs)
    assert [r.name for r in plan.regions] == ["params", "grads", "all_gather", "reduce_scatter", "optim.exp_avg"]
    expected = sum(-(-s[0] // 4) * 4 * (s[1] if len(s) > 1 else 1) * 4 for s in shapes)
    assert expected == 61792
    assert plan.slot("all_gather", "g").nbytes == expected
    assert plan.slot("reduce_scatter", "g").nbytes == expected
    rel = [[s.offset for s in plan.region(r)] for r in ("params", "grads", "optim.exp_avg")]
    assert rel[0] == rel[1] == rel[2]
    ag_bf16 = plan_sharded([
        ShardedTensorSpec("a", (7, 3), torch.float32, (4,), (Shard(0),), all_gather_dtype=torch.bfloat16),
    ])
    assert ag_bf16.slot("all_gather", "").dtype == torch.bfloat16
    assert ag_bf16.slot("all_gather", "").nbytes == 4 * 2 * 3 * 2


def test_2d_mesh_against_dtensor(world4):
    """(Shard(0), Shard(0)), (Replicate(), Shard(0)), ... on a real 2 x 2 gloo mesh."""
    problems = world4.run(tasks.compare_with_dtensor)
    assert problems == [[], [], [], []]


@pytest.mark.parametrize("dp,tp", [(2, 2), (2, 3), (4, 2), (3, 2)])
def test_fsdp_over_tensor_parallel_is_a_chunk_of_the_tp_chunk(dp, tp):
    """(_StridedShard(0, tp), Shard(0)) on (dp, tp): FSDP's torch.chunk of the TP shard."""
    from torch.distributed.tensor.placement_types import _StridedShard

    placements = (_StridedShard(0, split_factor=tp), Shard(0))
    for rows in (1, 5, 7, 12, 13, 31, 64):
        full = torch.arange(rows * 3).view(rows, 3)
        largest = (0, 3)
        for d, t in itertools.product(range(dp), range(tp)):
            tp_chunks = torch.chunk(full, tp, dim=0)
            tp_local = tp_chunks[t] if t < len(tp_chunks) else full[:0]
            dp_chunks = torch.chunk(tp_local, dp, dim=0)
            local = dp_chunks[d] if d < len(dp_chunks) else tp_local[:0]
            shape, offset = local_shape_and_offset((rows, 3), (dp, tp), placements, (d, t))
            assert shape == tuple(local.shape), (rows, d, t)
            if local.numel():  # one contiguous block of the global tensor
                assert offset == (int(local[0, 0]) // 3, 0), (rows, d, t)
                assert torch.equal(full[offset[0]:offset[0] + shape[0]], local)
            largest = max(largest, shape)
        assert slot_shape((rows, 3), (dp, tp), placements) == largest
    # RowwiseParallel weight under FSDP: (Shard(0), Shard(1)); dims split independently.
    assert slot_shape((7, 10), (dp, tp), (Shard(0), Shard(1))) == (-(-7 // dp), -(-10 // tp))
