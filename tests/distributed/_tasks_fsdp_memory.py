"""Rank-side tasks: plan_fsdp's memory against plain FSDP2 (loaded by path in the workers).

Run in pools whose ranks have torch_renaissance's CPU allocator installed, so
``memory_allocated`` / ``max_memory_allocated`` count every tensor byte. Each
task warms the process up with two plain steps, then trains the same seeded
model twice on the same batches, planned first and plain second (whatever the
planned run leaves behind can only make the plain numbers look smaller), and
returns per-rank numbers plus whether losses, final parameters and optimizer
state are bit-identical.

Also used by ``benchmarks/bench_fsdp_memory.py`` (bigger models, more steps).
"""
from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

import torch_renaissance as tr


def build_model(kind: str, size: str):
    """``(model, blocks, vocab, seq)``: a seeded model (random init, nothing downloaded)."""
    torch.manual_seed(0)
    if kind == "hf_gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        if size == "bench":  # the configuration
            cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128)
        else:
            cfg = GPT2Config(vocab_size=509, n_layer=2, n_embd=64, n_head=4, n_positions=32)
        model = GPT2LMHeadModel(cfg)
        return model, list(model.transformer.h), cfg.vocab_size, 32 if size != "bench" else 64
    if kind == "hf_llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        if size == "bench":
            cfg = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=128)
        else:
            cfg = LlamaConfig(vocab_size=503, hidden_size=64, intermediate_size=172,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=32)
        model = LlamaForCausalLM(cfg)
        return model, list(model.model.layers), cfg.vocab_size, 32 if size != "bench" else 64
    if kind == "gpt":
        from torch_renaissance.examples import gpt

        if size == "bench":
            cfg = gpt.GPTConfig()  # the demo's 4.2 M parameters
        elif size == "even":
            cfg = gpt.GPTConfig(vocab_size=512, seq_len=32, d_model=64, n_layer=2, n_head=4)
        else:
            cfg = gpt.GPTConfig(vocab_size=509, seq_len=32, d_model=64, n_layer=2, n_head=4)
        model = gpt.GPT(cfg)
        return model, list(model.blocks), cfg.vocab_size, cfg.seq_len
    raise ValueError(f"unknown model kind {kind!r}")


def _loss(kind: str, model, x: torch.Tensor) -> torch.Tensor:
    if kind.startswith("hf_"):
        return model(input_ids=x, labels=x).loss
    logits = model(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))


def _tp_mlp(blocks, tp_mesh) -> None:
    """Megatron-style tensor parallel on every block's MLP (bundled GPT)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in blocks:
        parallelize_module(block.mlp, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _locals(tensors) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return [(t._local_tensor if isinstance(t, DTensor) else t).detach().clone() for t in tensors]


def _run(rank: int, world: int, kind: str, size: str, steps: int, planned: bool,
         tp: int, batch: int, reshard_after_forward: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_renaissance.distributed import plan_fsdp

    gc.collect()
    start = tr.memory_allocated()
    tr.reset_peak_memory_stats()
    if tp > 1:
        mesh2d = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        dp_mesh, tp_mesh = mesh2d["dp"], mesh2d["tp"]
        data_rank = dp_mesh.get_local_rank()  # the ranks of one TP group see one batch
    else:
        dp_mesh = init_device_mesh("cpu", (world,))
        data_rank = rank
    model, blocks, vocab, seq = build_model(kind, size)
    if tp > 1:
        _tp_mlp(blocks, tp_mesh)
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = plan_fsdp(model, opt) if planned else None
    gen = torch.Generator().manual_seed(100 + data_rank)
    losses, held, step_peaks = [], [], []
    build_peak = tr.max_memory_allocated() - start  # model, fully_shard, plan_fsdp
    for _ in range(steps):
        tr.reset_peak_memory_stats()
        x = torch.randint(0, vocab, (batch, seq), generator=gen)
        loss = _loss(kind, model, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del loss
        held.append(tr.memory_allocated() - start)  # between steps
        step_peaks.append(tr.max_memory_allocated() - start)
    peak = max([build_peak] + step_peaks)  # above the run's start
    params = _locals(model.parameters())
    state = [_locals([v for _, v in sorted(opt.state[p].items()) if torch.is_tensor(v)])
             for p in model.parameters()]
    out = {"losses": losses, "held": held, "peak": peak, "step_peaks": step_peaks, "params": params, "state": state}
    if plan is not None:
        out["state_padding"] = _state_padding(plan)
        out["stats"] = dict(plan.stats)
        out["plan_nbytes"] = plan.plan.nbytes
        out["regions"] = [r.name for r in plan.plan.regions]
        # Imported here: the workers have the repository on sys.path, the
        # test's own process imports this file as part of its package.
        from tests.distributed._tasks_fsdp import settled_comm_held

        out["comm_held_between_steps"] = settled_comm_held(plan)
        out["placements"] = sorted({", ".join(str(p) for p in s.placements) for s in plan.specs})
        plan.remove()
    del model, opt, plan
    gc.collect()
    return out


def _state_padding(plan) -> int:
    """Bytes the optimizer-state slots hold beyond this rank's unpadded states.

    The slots have one size on every rank (the largest shard, FSDP2's padding),
    while plain FSDP2's AdamW states have this rank's unpadded shard shape: a
    rank with a short last shard holds these bytes more (less than one row per
    state tensor). Computed from the parameters' shard shapes, each tensor
    rounded to the allocator's 64-byte blocks as plain FSDP2's are.
    """
    import math

    from torch_renaissance.distributed import optim_region

    def up(n: int) -> int:
        return -(-n // 64) * 64

    total = 0
    for e in plan._entries:
        for key, dtype in e.spec.states:
            slot = plan.plan.slot(optim_region(key), e.name)
            local = math.prod(e.fsdp_param.sharded_size) * dtype.itemsize
            total += up(slot.nbytes) - up(local)
    return total


def memory_compare(rank: int, world: int, kind: str, size: str = "test", steps: int = 3,
                   tp: int = 1, batch: int = 2, reshard_after_forward: bool = True,
                   repeats: int = 3) -> dict:
    """Planned, then plain, ``repeats`` times: held bytes per step, peaks, bit-identity.

    A step's peak allocated bytes depend on thread timing, not only on the
    allocator: gloo's worker threads allocate and free their own temporaries
    (up to one block's flat all-gather size) while the main thread runs, so
    plain FSDP2's own steady-step peak was seen to take three values spanning
    200 KB in eight runs of one configuration, and the bytes held between steps
    to differ by 192 B. Every pair is checked for bit-identical results; the
    memory numbers reported are, per step, the minimum over the repeats (the
    run least disturbed by the worker threads) for both sides alike, and the
    raw per-run lists are returned as ``*_runs`` for diagnosis.
    """
    if kind.startswith("hf_"):
        import transformers

        transformers.logging.set_verbosity_error()
    # Warm-up (2 plain steps, discarded): what a process allocates once, on the
    # first use of an op or path, must not land in either measured run.
    _run(rank, world, kind, size, min(steps, 2), False, tp, batch, reshard_after_forward)
    same = lambda a, b: len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))  # noqa: E731
    pairs = []
    for _ in range(repeats):
        planned = _run(rank, world, kind, size, steps, True, tp, batch, reshard_after_forward)
        plain = _run(rank, world, kind, size, steps, False, tp, batch, reshard_after_forward)
        pairs.append((planned, plain))
    first, _ = pairs[0]

    def per_step_min(side: int, key: str) -> list[int]:
        return [min(vals) for vals in zip(*(p[side][key] for p in pairs))]

    return {
        "losses_equal": all(a["losses"] == b["losses"] and a["losses"] == first["losses"] for a, b in pairs),
        "params_equal": all(same(a["params"], b["params"]) for a, b in pairs),
        "state_equal": all(all(same(x, y) for x, y in zip(a["state"], b["state"]))
                           and len(a["state"]) == len(b["state"]) and any(a["state"]) for a, b in pairs),
        "plain_held": per_step_min(1, "held"),
        "planned_held": per_step_min(0, "held"),
        "plain_peak": min(b["peak"] for _, b in pairs),
        "plain_step_peaks": per_step_min(1, "step_peaks"),
        "planned_step_peaks": per_step_min(0, "step_peaks"),
        "planned_peak": min(a["peak"] for a, _ in pairs),
        "plain_step_peaks_runs": [b["step_peaks"] for _, b in pairs],
        "planned_step_peaks_runs": [a["step_peaks"] for a, _ in pairs],
        "stats": first["stats"],
        "plan_nbytes": first["plan_nbytes"],
        "state_padding": first["state_padding"],
        "regions": first["regions"],
        "comm_held_between_steps": max(a["comm_held_between_steps"] for a, _ in pairs),
        "placements": first["placements"],
        "losses": first["losses"],
    }
