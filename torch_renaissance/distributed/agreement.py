"""Plan agreement: every rank checks, with one collective, that it has the same plan.

:func:`check_agreement` all-gathers a 33-byte record per rank (a status byte and
the sha256 of the plan's canonical description, see
:meth:`~torch_renaissance.memory_plan.MemoryPlan.digest`). If all records are
equal and no rank failed, that is the only collective. Otherwise every rank
knows it from the same gathered records, so all of them take the slow path
together: the descriptions (or error messages) are all-gathered, the first
differing slot is found, and **every** rank raises the same error. A rank that
could not build its plan passes its error in instead of raising alone, so its
peers never wait in a collective it will not join.

Payloads are JSON (never pickled), moved as ``uint8`` tensors on the group's
collective device (CPU for gloo, the current CUDA device for NCCL).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist

from ..memory_plan import MemoryPlan, _first_difference

__all__ = ["PlanMismatchError", "check_agreement"]

_OK, _FAILED = 0, 1


class PlanMismatchError(RuntimeError):
    """Ranks built different plans. Raised on every rank; names the first differing slot."""


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    get = getattr(dist.distributed_c10d, "_get_object_coll_device", None)
    if get is not None:
        try:
            return torch.device(get(group))
        except Exception:  # pragma: no cover - backend specific
            pass
    backend = dist.get_backend(group)
    if "nccl" in str(backend) and torch.cuda.is_available():  # pragma: no cover - GPU
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather(t: torch.Tensor, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return out


def _all_gather_bytes(
    payload: bytes, group: dist.ProcessGroup | None, device: torch.device
) -> list[bytes]:
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [int(s.item()) for s in _all_gather(size, group)]
    buf = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    if payload:
        buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    return [bytes(t[:n].cpu().tolist()) for t, n in zip(_all_gather(buf, group), sizes)]


def _global_ranks(group: dist.ProcessGroup | None) -> list[int]:
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def check_agreement(
    plan: MemoryPlan | None,
    group: dist.ProcessGroup | None = None,
    *,
    error: str | None = None,
) -> str:
    """Verify that every rank of ``group`` holds the same plan.

    Must be called by every rank of ``group`` (it is a collective).

    Args:
        plan: this rank's finalized plan (ignored when ``error`` is given).
        group: process group; default: the default (world) group.
        error: set instead of raising when this rank failed to build its plan;
            every rank then raises ``ValueError`` with this message.

    Returns:
        The common sha256 digest (hex).

    Raises:
        PlanMismatchError: on every rank, if the plans differ; the message names
            the ranks and, for each rank that differs from the majority layout,
            the first differing region/slot and the two values.
        ValueError: on every rank, if some rank passed ``error``.
    """
    if error is None and plan is None:
        raise ValueError("check_agreement needs a plan or an error")
    if error is None:
        payload = plan.canonical_json().encode("utf-8")
        status = _OK
    else:
        payload = json.dumps({"error": str(error)}, sort_keys=True).encode("utf-8")
        status = _FAILED
    digest = hashlib.sha256(payload).digest()
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        if error is not None:
            raise ValueError(error)
        return digest.hex()

    device = _collective_device(group)
    record = torch.tensor([status, *digest], dtype=torch.uint8, device=device)
    records = [bytes(r.cpu().tolist()) for r in _all_gather(record, group)]
    if all(r == records[0] for r in records) and records[0][0] == _OK:
        return digest.hex()

    # Slow path, taken by every rank together: gather the full descriptions.
    ranks = _global_ranks(group)
    payloads: list[dict[str, Any]] = [json.loads(p) for p in _all_gather_bytes(payload, group, device)]
    failed = [(ranks[i], p["error"]) for i, p in enumerate(payloads) if "error" in p]
    if failed:
        lines = [f"rank {r}: {msg}" for r, msg in failed]
        raise ValueError(
            f"plan could not be built on rank(s) {[r for r, _ in failed]}: " + "; ".join(lines)
        )
    counts = Counter(records)
    best = max(counts.values())
    # Reference layout: the most common one; ties go to the lowest rank.
    ref_index = next(i for i, r in enumerate(records) if counts[r] == best)
    agreeing = [ranks[i] for i, r in enumerate(records) if r == records[ref_index]]
    lines = []
    for i, p in enumerate(payloads):
        if records[i] != records[ref_index]:
            diff = _first_difference(p, payloads[ref_index])
            lines.append(
                f"rank {ranks[i]} differs from rank {ranks[ref_index]} at {diff} "
                f"(rank {ranks[i]}'s value first)"
            )
    raise PlanMismatchError(
        f"MemoryPlan differs across ranks (ranks {agreeing} share the reference layout): "
        + "; ".join(lines)
    )
