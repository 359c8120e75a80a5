"""Rank-side tasks for placement and agreement tests (loaded by path in workers)."""
from __future__ import annotations

import torch

ODD_SHAPES = [(7, 3), (13, 5), (5,), (3, 7, 2), (1, 4), (0, 5), (6, 256), (9, 9)]


def _placements_2d():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return [
        (Shard(0), Shard(0)),
        (Replicate(), Shard(0)),
        (Shard(0), Shard(1)),
        (Shard(1), Shard(0)),
        (Shard(-1), Replicate()),
        (Partial(), Shard(0)),
    ]


def compare_with_dtensor(rank: int, world: int) -> list[str]:
    """Local shapes/offsets vs DTensor's own, on a real 1-D and a 2 x 2 mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from torch_renaissance.distributed import local_shape_and_offset, shard_layouts, slot_shape

    problems: list[str] = []
    cases = []
    mesh1 = init_device_mesh("cpu", (world,))
    for shape in ODD_SHAPES:
        cases += [(mesh1, shape, (Shard(0),)), (mesh1, shape, (Replicate(),))]
    mesh2 = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "fsdp"))
    for shape in ODD_SHAPES:
        for placements in _placements_2d():
            if any(isinstance(p, Shard) and p.dim >= len(shape) for p in placements):
                continue
            cases.append((mesh2, shape, placements))
    for mesh, shape, placements in cases:
        coordinate = mesh.get_coordinate()
        ref = compute_local_shape_and_global_offset(shape, mesh, placements)
        mine = local_shape_and_offset(shape, mesh, placements, coordinate)
        if (tuple(ref[0]), tuple(ref[1])) != mine:
            problems.append(f"{shape} {placements} at {coordinate}: ours {mine} != DTensor {ref}")
        layouts = {layout.rank: layout for layout in shard_layouts(shape, mesh, placements)}
        if layouts[rank].local_shape != mine[0] or tuple(layouts[rank].coordinate) != tuple(coordinate):
            problems.append(f"{shape} {placements}: shard_layouts disagrees for rank {rank}")
        if not any(p.is_partial() for p in placements):
            torch.manual_seed(0)
            full = torch.randn(shape)
            dt = distribute_tensor(full, mesh, list(placements))
            if tuple(dt._local_tensor.shape) != mine[0]:
                problems.append(
                    f"{shape} {placements}: distribute_tensor local {tuple(dt._local_tensor.shape)} "
                    f"!= ours {mine[0]}"
                )
        pad = slot_shape(shape, mesh, placements)
        if any(a > b for a, b in zip(mine[0], pad)):
            problems.append(f"{shape} {placements}: local {mine[0]} exceeds slot {pad}")
    return problems


def disagreement_generic(rank: int, world: int) -> str:
    """Rank ``world - 1`` plans (13, 5) as (13, 6); every rank must raise, naming it."""
    from torch.distributed.tensor import Shard

    from torch_renaissance.distributed import (
        PlanMismatchError,
        ShardedTensorSpec,
        check_agreement,
        plan_sharded,
    )

    cols = 6 if rank == world - 1 else 5
    specs = [
        ShardedTensorSpec("embed.weight", (7, 3), torch.float32, (world,), (Shard(0),)),
        ShardedTensorSpec("proj.weight", (13, cols), torch.float32, (world,), (Shard(0),)),
        ShardedTensorSpec("proj.bias", (13,), torch.float32, (world,), (Shard(0),)),
    ]
    plan = plan_sharded(specs)
    try:
        check_agreement(plan)
    except PlanMismatchError as exc:
        return str(exc)
    return "no error"


def agreement_ok(rank: int, world: int) -> str:
    from torch.distributed.tensor import Shard

    from torch_renaissance.distributed import ShardedTensorSpec, check_agreement, plan_sharded

    specs = [ShardedTensorSpec("w", (13, 5), torch.bfloat16, (world,), (Shard(0),))]
    plan = plan_sharded(specs)
    digest = check_agreement(plan)
    assert digest == plan.digest()
    return digest


def non_chunk_split(rank: int, world: int) -> str:
    """A DTensor built with from_local(shape=...) whose shards are not torch.chunk's.

    Global (8, 3) over 4 ranks with local rows [2, 2, 3, 1]: ranks 0 and 1 hold
    what torch.chunk would give, ranks 2 and 3 do not. Every rank must raise.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from torch_renaissance.distributed import plan_dtensors

    mesh = init_device_mesh("cpu", (world,))
    rows = [2, 2, 3, 1][rank]
    good = DTensor.from_local(torch.zeros(2, 3), mesh, [Shard(0)], run_check=False)
    bad = DTensor.from_local(
        torch.zeros(rows, 3), mesh, [Shard(0)], run_check=False, shape=(8, 3), stride=(3, 1)
    )
    try:
        plan_dtensors({"ok.weight": good, "odd.weight": bad})
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"
