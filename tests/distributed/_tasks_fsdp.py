"""Rank-side tasks for the FSDP2 tests (loaded by path in the worker processes).

Only absolute imports here: workers load this file outside the test package.
Every task is ``fn(rank, world_size, ...)`` and returns plain, picklable data.
"""
from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, FF, SEQ = 13, 6, 2, 7, 7


def settled_comm_held(plan, timeout_s: float = 10.0) -> int:
    """``plan.comm_held_nbytes()`` once the last collective has let go of its buffers.

    gloo runs each collective on a worker thread, which drops its reference
    to the work (and so to the reduce-scatter input) just after it wakes the
    caller. On a loaded machine that can come after the caller reads the
    count (seen once: 199,936 bytes on one rank of four, under a load of 5-9
    on 2 cores). So the count is read until it is 0, for at most
    ``timeout_s`` seconds: a slot the plan itself kept stays held, and the
    test still fails.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        held = plan.comm_held_nbytes()
        if held == 0 or time.monotonic() > deadline:
            return held
        gc.collect()
        time.sleep(0.01)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, FF)
        self.fc2 = nn.Linear(FF, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (y.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for y in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, DIM))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    """Uneven shapes on purpose: (13, 6), (7, 6), (18, 6), (7,), (6, 7), (6,) ..."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.1)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _sharded_transformer(world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = TinyTransformer()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, VOCAB, (3, SEQ), generator=g)


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _train(world: int, rank: int, steps: int, planned: bool, grads: bool = False):
    from torch_renaissance.distributed import plan_fsdp

    model = _sharded_transformer(world)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    params_before = [id(p) for p in model.parameters()]
    plan = plan_fsdp(model, opt, grads=grads) if planned else None
    losses, grads_check = [], None
    for step in range(steps):
        loss = _loss(model, _batch(rank, step))
        loss.backward()
        if grads and plan is not None and step == steps - 1:
            grads_check = _check_grads_region(model, plan)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    same_objects = [id(p) for p in model.parameters()] == params_before and all(
        p is q for p, q in zip(model.parameters(), opt.param_groups[0]["params"])
    )
    locals_ = {n: p._local_tensor.detach().clone() for n, p in model.named_parameters()}
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    return model, opt, plan, losses, locals_, full, same_objects, grads_check


def _check_grads_region(model: nn.Module, plan) -> dict:
    """Independent check that region_view("grads") is exactly the gradients plus zero padding."""
    region = plan.plan.region("grads")
    view = plan.region_view("grads")
    as_bytes = view.view(torch.uint8)
    expected = torch.zeros_like(as_bytes)
    base = view.data_ptr()
    grad_bytes, inside = 0, True
    for name, p in model.named_parameters():
        local = p.grad._local_tensor
        nbytes = local.numel() * local.element_size()
        grad_bytes += nbytes
        slot = region.slot(name)
        offset = local.data_ptr() - base if local.numel() else slot.offset
        inside &= offset == slot.offset and offset + nbytes <= region.nbytes
        expected[slot.offset : slot.offset + nbytes] = local.contiguous().view(-1).view(torch.uint8)
    first = region.slots[0]
    last = region.slots[-1]
    align = plan.plan.alignment
    return {
        "equal": bool(torch.equal(as_bytes, expected)),
        "inside": bool(inside),
        "dtype": str(view.dtype),
        "view_nbytes": view.numel() * view.element_size(),
        "region_nbytes": region.nbytes,
        "grad_bytes": grad_bytes,
        "slot_bytes": sum(s.nbytes for s in region.slots),
        "starts_at_first_slot": first.offset == 0 and base == plan.storage.data_ptr() + region.offset,
        "ends_at_last_slot": region.nbytes == -(-(last.offset + last.nbytes) // align) * align,
    }


def train_compare(rank: int, world: int, steps: int = 10, grads: bool = False) -> dict:
    """Plain FSDP2 vs FSDP2 + plan_fsdp: losses, parameters, placement, grads region."""
    _, _, _, base_losses, base_locals, base_full, _, _ = _train(world, rank, steps, False)
    model, opt, plan, losses, locals_, full, same_objects, grads_check = _train(
        world, rank, steps, True, grads
    )
    storage = plan.storage
    placement = {}
    for e in plan._entries:
        fp = e.fsdp_param
        start, _ = plan.plan.slot_range("params", e.name)
        placement[e.name] = {
            "slot": start,
            "sharded_data": fp._sharded_param_data.data_ptr() - storage.data_ptr(),
            "local": (fp.sharded_param._local_tensor.data_ptr() - storage.data_ptr())
            if fp.sharded_param._local_tensor.numel() else start,
            "exp_avg": opt.state[e.param]["exp_avg"]._local_tensor.data_ptr() - storage.data_ptr()
            if fp.sharded_param._local_tensor.numel() else None,
            "exp_avg_slot": plan.plan.slot_range("optim.exp_avg", e.name)[0],
        }
    return {
        "base_losses": base_losses,
        "losses": losses,
        "params_equal": all(torch.equal(base_locals[n], locals_[n]) for n in base_locals),
        "full_equal": all(torch.equal(base_full[n], full[n]) for n in base_full),
        "same_objects": same_objects,
        "digest": plan.digest,
        "description": plan.plan.describe(),
        "placement": placement,
        "grads_check": grads_check,
        "stats": dict(plan.stats),
        "regions": [r.name for r in plan.plan.regions],
        "comm_regions": [r.name for r in plan.comm_plan.regions],
        "comm_held_after": settled_comm_held(plan),
        "pending": plan.optimizer_state_pending,
    }


class AGModule(nn.Module):
    """One FSDP parameter group with shapes (64, 64), (64,), (176, 64), (7, 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(64, 64) * 0.1)
        self.b1 = nn.Parameter(torch.randn(64) * 0.1)
        self.w2 = nn.Parameter(torch.randn(176, 64) * 0.1)
        self.w3 = nn.Parameter(torch.randn(7, 3) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.w1.t() + self.b1)
        return (h @ self.w2.t()).sum() + self.w3.sum()


def all_gather_accounting(rank: int, world: int) -> dict:
    """Planned vs FSDP2's actual all-gather output bytes, with and without the shim."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_renaissance.distributed import PARAMS, ShardedTensorSpec, plan_fsdp, plan_sharded
    from torch.distributed.tensor import Shard

    seen: list[tuple[int, int]] = []
    original = dist.all_gather_single

    def spy(output_tensor, input_tensor, *args, **kwargs):
        seen.append((output_tensor.numel() * output_tensor.element_size(), output_tensor.data_ptr()))
        return original(output_tensor, input_tensor, *args, **kwargs)

    mesh = init_device_mesh("cpu", (world,))
    shapes = [(64, 64), (64,), (176, 64), (7, 3)]
    specs = [
        ShardedTensorSpec(f"p{i}", s, torch.float32, (world,), (Shard(0),))
        for i, s in enumerate(shapes)
    ]
    planned_only = plan_sharded(specs).slot("all_gather", "").nbytes

    def run(with_plan: bool):
        torch.manual_seed(0)
        model = AGModule()
        fully_shard(model, mesh=mesh)
        plan = plan_fsdp(model) if with_plan else None
        seen.clear()
        dist.all_gather_single = spy
        try:
            model(torch.randn(5, 64)).backward()
        finally:
            dist.all_gather_single = original
        return model, plan, list(seen)

    _, _, plain_seen = run(False)
    model, plan, shim_seen = run(True)
    ag_slot = plan.comm_plan.slot("all_gather", "<root>")
    return {
        "planned_spec": planned_only,
        "planned_fsdp": plan.all_gather_nbytes(),
        "plain_outputs": [n for n, _ in plain_seen],
        "shim_outputs": [n for n, _ in shim_seen],
        # Served by the slots (outside the held plan buffer), never a fallback.
        "shim_in_slot": plan.stats["all_gather_planned"] == len(shim_seen)
        and not any(plan.storage.buffer.data_ptr() <= ptr < plan.storage.buffer.data_ptr()
                    + plan.plan.nbytes for _, ptr in shim_seen),
        "ag_slot": (ag_slot.shape, str(ag_slot.dtype)),
        "stats": dict(plan.stats),
        "param_slots": [s.nbytes for s in plan.plan.region(PARAMS).slots],
        "sharded_numel": [p._local_tensor.numel() for p in model.parameters()],
    }


def disagreement_fsdp(rank: int, world: int) -> str:
    """Rank 1 builds its model with a different shape; every rank must raise."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_renaissance.distributed import PlanMismatchError, plan_fsdp

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    rows = 13 if rank != 1 else 14
    model = nn.Sequential(nn.Linear(3, 7), nn.Linear(7, rows), nn.Linear(rows, 5))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    try:
        plan_fsdp(model)
    except PlanMismatchError as exc:
        return str(exc)
    return "no error"


def hsdp_plan(rank: int, world: int, steps: int = 4) -> dict:
    """HSDP (Replicate(), Shard(0)) on a 2 x 2 mesh: slots follow the shard dim only."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_renaissance.distributed import plan_fsdp

    def build():
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        torch.manual_seed(0)
        model = TinyTransformer(layers=1)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    results = []
    for planned in (False, True):
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        plan = plan_fsdp(model, opt) if planned else None
        losses = []
        for step in range(steps):
            loss = _loss(model, _batch(rank, step))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        results.append((losses, {n: p.full_tensor() for n, p in model.named_parameters()}, plan))
    (l0, p0, _), (l1, p1, plan) = results
    head = plan.plan.slot("params", "head.weight")
    return {
        "losses_equal": l0 == l1,
        "params_equal": all(torch.equal(p0[n], p1[n]) for n in p0),
        "head_slot_shape": head.shape,
        "digest": plan.digest,
        "stats": dict(plan.stats),
        "momentum_region": "optim.momentum_buffer" in plan.plan,
    }


def ddp_style_region_ops(rank: int, world: int) -> dict:
    """Range operations over regions: one all-reduce over all grads, one foreach over params."""
    from torch_renaissance.distributed import plan_fsdp

    model = _sharded_transformer(world)
    plan = plan_fsdp(model, comm_buffers=False, grads=True)
    _loss(model, _batch(rank, 0)).backward()
    region = plan.region_view("grads")
    # Independent reference: every rank's grads region, gathered and summed.
    gathered = [torch.empty_like(region) for _ in range(world)]
    dist.all_gather(gathered, region.clone())
    expected = torch.stack(gathered).sum(0)
    dist.all_reduce(region)  # one collective over every gradient of this rank
    summed = torch.equal(region, expected) and all(
        p.grad._local_tensor.data_ptr() == plan.slot_view("grads", n).data_ptr()
        for n, p in model.named_parameters() if p._local_tensor.numel()
    )
    before = {n: p._local_tensor.clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        torch._foreach_add_([plan.region_view("params")], [plan.region_view("grads")], alpha=-0.5)
    updated = all(
        torch.equal(p._local_tensor, before[n] - 0.5 * p.grad._local_tensor)
        for n, p in model.named_parameters()
    )
    # FSDP2's own re-padding hook (reset_sharded_param) runs on load_state_dict:
    # the parameters must stay in their slots.
    model.load_state_dict(model.state_dict())
    still_placed = all(
        plan.storage.owns(p._local_tensor) for p in model.parameters() if p._local_tensor.numel()
    )
    try:
        plan_fsdp(model)
        twice = "no error"
    except RuntimeError as exc:
        twice = str(exc)
    # remove(): hooks and comms go, tensors stay; FSDP2 then hands out fresh grads.
    plan.remove()
    model.zero_grad(set_to_none=True)
    copies = plan.stats["grad_copies"]
    _loss(model, _batch(rank, 1)).backward()
    removed = (
        plan.stats["grad_copies"] == copies
        and not any(plan.storage.owns(p.grad._local_tensor) for p in model.parameters()
                    if p._local_tensor.numel())
        and getattr(model, "_torch_renaissance_fsdp_plan", None) is None
    )
    return {
        "summed": summed,
        "updated": updated,
        "still_placed": still_placed,
        "twice": twice,
        "removed": removed,
        "regions": [r.name for r in plan.plan.regions],
        "numel": region.numel(),
    }


def place_existing_state(rank: int, world: int, steps: int = 6) -> dict:
    """plan_fsdp after a warm-up step: existing Adam state and grads are placed at once."""
    from torch_renaissance.distributed import plan_fsdp

    out = []
    for planned in (False, True):
        model = _sharded_transformer(world)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses, plan = [], None
        for step in range(steps):
            if planned and step == 1:
                plan = plan_fsdp(model, opt)
            loss = _loss(model, _batch(rank, step))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            losses.append(loss.item())
        out.append((losses, {n: p._local_tensor.clone() for n, p in model.named_parameters()}, plan))
    (l0, p0, _), (l1, p1, plan) = out
    return {
        "losses_equal": l0 == l1,
        "params_equal": all(torch.equal(p0[n], p1[n]) for n in p0),
        "pending": plan.optimizer_state_pending,
        "regions": [r.name for r in plan.plan.regions],
        "grad_copies": plan.stats["grad_copies"],
        "extensions": plan.stats["extensions"],
    }


def mixed_precision_accumulation(rank: int, world: int, steps: int = 4) -> dict:
    """bf16 all-gather / fp32 reduce, two micro-batches per step (first without sync)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torch_renaissance.distributed import plan_fsdp

    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh("cpu", (world,))
    runs = []
    for planned in (False, True):
        torch.manual_seed(0)
        model = TinyTransformer(layers=2)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        plan = plan_fsdp(model, opt) if planned else None
        losses = []
        for step in range(steps):
            for micro in range(2):
                model.set_requires_gradient_sync(micro == 1)
                loss = _loss(model, _batch(rank, 2 * step + micro)).float()
                loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        runs.append((losses, {n: p._local_tensor.clone() for n, p in model.named_parameters()}, plan))
    (l0, p0, _), (l1, p1, plan) = runs
    return {
        "losses_equal": l0 == l1,
        "params_equal": all(torch.equal(p0[n], p1[n]) for n in p0),
        "ag_dtype": str(plan.comm_plan.slot("all_gather", "blocks.0").dtype),
        "rs_dtype": str(plan.comm_plan.slot("reduce_scatter", "blocks.0").dtype),
        "stats": dict(plan.stats),
    }
