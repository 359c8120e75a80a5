"""DTensor placements -> per-rank local shapes, global offsets and slot shapes.

Follows DTensor's own rules (``torch/distributed/tensor/_utils.py``,
``_compute_local_shape_and_global_offset``; ``placement_types.py``,
``Shard.local_shard_size_and_offset``):

* ``Shard(d)`` splits dim ``d`` with ``torch.chunk`` semantics: chunk size
  ``ceil(n / k)``, so trailing shards may be short or empty;
* placements are applied left to right over the mesh dims (a 2-D mesh
  ``(Shard(0), Shard(0))`` first splits over mesh dim 0, then splits each piece
  over mesh dim 1);
* ``_StridedShard(d, split_factor=k)`` on mesh dim ``i`` (what FSDP2 writes on
  its data-parallel dim when tensor parallel already sharded dim ``d``,
  ``_fsdp_param.py``, ``_init_sharding_spec_tp``) splits *after* the mesh dims
  right of ``i`` that shard ``d`` (their sizes multiply to ``k``): the local
  shard is FSDP's ``torch.chunk`` of the tensor-parallel shard, one contiguous
  block of the global tensor;
* ``Replicate()`` and ``Partial()`` leave the local shape equal to the global one;
* an empty shard's global offset on the sharded dim is the global size of that
  dim (DTensor's convention).

A **slot** holds the largest local shard, which is the one at mesh coordinate
``(0, ..., 0)``: every sharded dim padded to the chunk size, i.e. dim ``d`` to
``ceil(n / prod(k))`` rows, exactly how FSDP2 pads its sharded parameter
(``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``: ``padded_sharded_size =
chunks[0].size()``). The slot therefore has the same size and offset on every
rank.

Invariants: for every coordinate, ``local_shape[i] <= slot_shape[i]``; the
shards of a dim tile ``[0, n)`` without overlap in rank-major order.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Union

import torch
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

try:  # private in torch 2.13; used only to reject it with a clear message
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # pragma: no cover - older/newer torch without it
    _StridedShard = ()  # type: ignore[assignment,misc]

__all__ = [
    "MeshLike",
    "ShardLayout",
    "all_gather_factor",
    "local_shape_and_offset",
    "mesh_shape_of",
    "normalize_placements",
    "shard_layouts",
    "slot_nbytes",
    "slot_shape",
]

#: A ``DeviceMesh`` or just a mesh shape (``(8,)``, ``(2, 2)``) for simulated ranks.
MeshLike = Union["torch.distributed.device_mesh.DeviceMesh", Sequence[int]]


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where one rank's local shard sits in the global tensor.

    Attributes:
        rank: global rank (for a mesh shape: the row-major index of the coordinate).
        coordinate: the rank's coordinate on the mesh.
        local_shape: shape of the rank's local tensor (unpadded).
        global_offset: per-dim offset of the local tensor in the global tensor.
    """

    rank: int
    coordinate: tuple[int, ...]
    local_shape: tuple[int, ...]
    global_offset: tuple[int, ...]


def mesh_shape_of(mesh: MeshLike) -> tuple[int, ...]:
    """The shape of a ``DeviceMesh`` or of a plain mesh-shape sequence."""
    shape = getattr(mesh, "shape", None)
    if shape is None or not hasattr(mesh, "mesh"):
        shape = mesh
    shape = tuple(int(s) for s in shape)  # type: ignore[union-attr]
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"mesh shape must be non-empty with sizes >= 1, got {shape}")
    return shape


def normalize_placements(
    placements: Sequence[Placement],
    ndim: int,
    mesh_ndim: int,
    *,
    name: str = "tensor",
) -> tuple[Placement, ...]:
    """Check placements and turn negative shard dims into positive ones.

    Args:
        placements: one placement per mesh dim.
        ndim: number of dims of the global tensor.
        mesh_ndim: number of mesh dims.
        name: what to call the tensor in error messages (e.g. a parameter FQN).

    Returns:
        The placements, ``Shard(d)`` with ``0 <= d < ndim``.

    Raises:
        ValueError: naming ``name`` and the reason, for a wrong number of
            placements, a shard dim out of range, a ``_StridedShard`` whose
            split factor is not the product of the mesh sizes right of it that
            shard the same dim, or an unknown placement type.
    """
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(
            f"{name}: {len(placements)} placements for a {mesh_ndim}-D mesh "
            f"({placements}); need one per mesh dim"
        )
    out: list[Placement] = []
    for i, p in enumerate(placements):
        if _StridedShard and isinstance(p, _StridedShard):
            d = p.dim
            if not -ndim <= d < ndim:
                raise ValueError(
                    f"{name}: {p} on mesh dim {i} is out of range for a {ndim}-D tensor"
                )
            out.append(_StridedShard(d + ndim, split_factor=p.split_factor) if d < 0 else p)
        elif isinstance(p, Shard):
            d = p.dim
            if not -ndim <= d < ndim:
                raise ValueError(
                    f"{name}: Shard({d}) on mesh dim {i} is out of range for a "
                    f"{ndim}-D tensor"
                )
            out.append(Shard(d + ndim) if d < 0 else p)
        elif isinstance(p, (Replicate, Partial)):
            out.append(p)
        else:
            raise ValueError(
                f"{name}: placement {p!r} on mesh dim {i} cannot be planned "
                "(supported: Shard(d), Replicate(), Partial())"
            )
    return tuple(out)


def _is_shard(p: Placement) -> bool:
    return isinstance(p, Shard) or bool(_StridedShard and isinstance(p, _StridedShard))


def _split_order(
    mesh_shape: Sequence[int], placements: Sequence[Placement], name: str
) -> list[int]:
    """Mesh dims in the order their shards are taken (``_StridedShard`` moved right)."""
    order = list(range(len(placements)))
    for i, p in enumerate(placements):
        if not (_StridedShard and isinstance(p, _StridedShard)):
            continue
        later = [j for j in range(i + 1, len(placements))
                 if _is_shard(placements[j]) and placements[j].dim == p.dim]
        factor = math.prod(mesh_shape[j] for j in later)
        if factor != p.split_factor:
            raise ValueError(
                f"{name}: {p} on mesh dim {i} has split factor {p.split_factor}, but the "
                f"mesh dims right of it that shard dim {p.dim} have {factor} ranks; "
                "only FSDP2's composition (data parallel over tensor parallel) can be planned"
            )
        if later:
            order.remove(i)
            order.insert(order.index(later[-1]) + 1, i)
    return order


def _chunk(size: int, num_chunks: int, index: int) -> tuple[int, int]:
    """Size and start of chunk ``index`` of ``size`` items split ``torch.chunk``-style."""
    chunk = -(-size // num_chunks)  # ceil
    start = min(chunk * index, size)
    return max(0, min(size, start + chunk) - start), start


def local_shape_and_offset(
    global_shape: Sequence[int],
    mesh: MeshLike,
    placements: Sequence[Placement],
    coordinate: Sequence[int],
    *,
    name: str = "tensor",
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Local shape and global offset at one mesh coordinate.

    Same result as DTensor's ``compute_local_shape_and_global_offset`` for the
    rank at ``coordinate``, without needing a process group, for ``Shard``,
    ``Replicate`` and ``Partial``. For an uneven ``_StridedShard`` (FSDP2 over
    TP on a dim the mesh does not divide) it gives the shard FSDP2 allocates,
    which DTensor's function reports differently in a few cases.

    Args:
        global_shape: shape of the global tensor.
        mesh: a ``DeviceMesh`` or a mesh shape.
        placements: one placement per mesh dim.
        coordinate: the rank's coordinate, one index per mesh dim.
        name: tensor name for error messages.

    Returns:
        ``(local_shape, global_offset)``, both with ``len(global_shape)`` entries.

    Raises:
        ValueError: for unplannable placements or an out-of-range coordinate.
    """
    global_shape = tuple(int(s) for s in global_shape)
    mesh_shape = mesh_shape_of(mesh)
    placements = normalize_placements(placements, len(global_shape), len(mesh_shape), name=name)
    coordinate = tuple(int(c) for c in coordinate)
    if len(coordinate) != len(mesh_shape) or any(
        not 0 <= c < k for c, k in zip(coordinate, mesh_shape)
    ):
        raise ValueError(f"{name}: coordinate {coordinate} is not on a mesh of shape {mesh_shape}")
    local = list(global_shape)
    offset = [0] * len(global_shape)
    for i in _split_order(mesh_shape, placements, name):
        k, c, p = mesh_shape[i], coordinate[i], placements[i]
        if not _is_shard(p):
            continue
        d = p.dim
        size, start = _chunk(local[d], k, c)
        local[d] = size
        # DTensor: an empty shard's offset on that dim is the global size.
        offset[d] = global_shape[d] if size == 0 else offset[d] + start
    return tuple(local), tuple(offset)


def _mesh_ranks(mesh: MeshLike) -> list[tuple[tuple[int, ...], int]]:
    shape = mesh_shape_of(mesh)
    mesh_tensor = getattr(mesh, "mesh", None)
    coords = list(itertools.product(*(range(k) for k in shape)))
    if mesh_tensor is None:
        return [(c, i) for i, c in enumerate(coords)]
    return [(c, int(mesh_tensor[c].item())) for c in coords]


def shard_layouts(
    global_shape: Sequence[int],
    mesh: MeshLike,
    placements: Sequence[Placement],
    *,
    name: str = "tensor",
) -> list[ShardLayout]:
    """Every rank's local shape and global offset.

    Args:
        global_shape: shape of the global tensor.
        mesh: a ``DeviceMesh`` (ranks from ``mesh.mesh``) or a mesh shape
            (simulated ranks ``0 .. prod(shape) - 1`` in row-major order).
        placements: one placement per mesh dim.
        name: tensor name for error messages.

    Returns:
        One :class:`ShardLayout` per mesh coordinate, in row-major coordinate order.
    """
    return [
        ShardLayout(rank, coord, *local_shape_and_offset(global_shape, mesh, placements, coord, name=name))
        for coord, rank in _mesh_ranks(mesh)
    ]


def slot_shape(
    global_shape: Sequence[int],
    mesh: MeshLike,
    placements: Sequence[Placement],
    *,
    name: str = "tensor",
) -> tuple[int, ...]:
    """Shape of the slot that holds any rank's local shard.

    The largest local shard (the one at coordinate ``(0, ..., 0)``): each sharded
    dim is ``ceil(n / prod(mesh sizes sharding it))``, i.e. FSDP2's padding of
    dim 0 to ``ceil(n / world)`` rows. Replicated/partial dims keep full size.
    """
    mesh_shape = mesh_shape_of(mesh)
    local, _ = local_shape_and_offset(
        global_shape, mesh_shape, placements, (0,) * len(mesh_shape), name=name
    )
    return local


def slot_nbytes(
    global_shape: Sequence[int],
    dtype: torch.dtype,
    mesh: MeshLike,
    placements: Sequence[Placement],
    *,
    name: str = "tensor",
) -> int:
    """Bytes of :func:`slot_shape` at ``dtype`` (same on every rank)."""
    return math.prod(slot_shape(global_shape, mesh, placements, name=name)) * dtype.itemsize


def all_gather_factor(mesh: MeshLike, placements: Sequence[Placement]) -> int:
    """How many slots an all-gather of the sharded mesh dims concatenates.

    The product of the mesh sizes of the dims with a ``Shard`` placement (FSDP:
    the shard world size; HSDP ``(Replicate(), Shard(0))``: the size of mesh
    dim 1). An all-gather buffer is this factor times the padded slots.
    """
    mesh_shape = mesh_shape_of(mesh)
    return math.prod(k for k, p in zip(mesh_shape, placements) if _is_shard(p))
