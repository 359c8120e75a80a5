"""plan_fsdp on FSDP2 (gloo, CPU): training unchanged, identical layout on every rank, regions."""
from __future__ import annotations

import pytest

from . import _tasks_fsdp as tasks

# Hand-computed: ceil(d0 / 4) * 4 * rest * 4 B for (64, 64), (64,), (176, 64), (7, 3).
AG_BYTES_WORLD4 = 16 * 4 * 64 * 4 + 16 * 4 * 4 + 44 * 4 * 64 * 4 + 2 * 4 * 3 * 4


def _pool(request, world):
    return request.getfixturevalue(f"world{world}")


@pytest.mark.parametrize("world", [2, 4])
def test_transformer_training_unchanged_and_layout_identical(request, world):
    """10 Adam steps with and without plan_fsdp: same losses and parameters, bit for bit."""
    results = _pool(request, world).run(tasks.train_compare, 10)
    for rank, r in enumerate(results):
        assert r["losses"] == r["base_losses"], f"rank {rank}"
        assert len(r["losses"]) == 10
        assert r["params_equal"] and r["full_equal"], f"rank {rank}"
        assert r["same_objects"], "nn.Parameter objects changed"
        # Held for the run: parameters and optimizer state only; the gradients
        # stay FSDP2's and the communication buffers are slots held while used.
        assert r["regions"] == ["params", "optim.exp_avg", "optim.exp_avg_sq"]
        assert r["comm_regions"] == ["all_gather", "reduce_scatter"]
        assert r["comm_held_after"] == 0
        assert not r["pending"] and r["stats"]["extensions"] == 1  # state placed after step 1
        # Each parameter (flat padded shard and unpadded local view), and its Adam
        # state, lies exactly at its slot.
        for name, p in r["placement"].items():
            assert p["sharded_data"] == p["local"] == p["slot"], name
            if p["exp_avg"] is not None:
                assert p["exp_avg"] == p["exp_avg_slot"], name
        # FSDP2's buffers came from the plan, never from fallbacks.
        assert r["stats"]["all_gather_fallbacks"] == r["stats"]["reduce_scatter_fallbacks"] == 0
        assert r["stats"]["all_gather_planned"] > 0 and r["stats"]["reduce_scatter_planned"] > 0
    # Every rank reports identical slot offsets (and the same digest).
    assert len({r["digest"] for r in results}) == 1
    assert all(r["description"] == results[0]["description"] for r in results)
    slots = [{n: (p["slot"], p["exp_avg_slot"]) for n, p in r["placement"].items()} for r in results]
    assert all(s == slots[0] for s in slots)
    if world == 4:  # ln weights (6,) over 4 ranks: rank 3 holds an empty shard, same slot
        assert results[3]["placement"]["ln_f.weight"]["exp_avg"] is None


@pytest.mark.parametrize("world", [2, 4])
def test_grads_region_covers_exactly_the_gradients(request, world):
    results = _pool(request, world).run(tasks.train_compare, 2, True)
    for rank, r in enumerate(results):
        assert r["losses"] == r["base_losses"] and r["params_equal"], f"rank {rank}"
        assert r["regions"] == ["params", "grads", "optim.exp_avg", "optim.exp_avg_sq"]
        g = r["grads_check"]
        # Byte-exact: the region is every gradient at its slot, zero elsewhere.
        assert g["equal"] and g["inside"], f"rank {rank}"
        assert g["dtype"] == "torch.float32"
        assert g["view_nbytes"] == g["region_nbytes"]
        assert g["starts_at_first_slot"] and g["ends_at_last_slot"]
        assert g["grad_bytes"] <= g["slot_bytes"] <= g["region_nbytes"]
    # Padded slots are the same on every rank even where the real shards differ.
    assert len({r["grads_check"]["slot_bytes"] for r in results}) == 1
    if world == 4:
        assert len({r["grads_check"]["grad_bytes"] for r in results}) > 1


def test_all_gather_accounting_world4(world4):
    results = world4.run(tasks.all_gather_accounting)
    assert AG_BYTES_WORLD4 == 61792
    for r in results:
        assert r["planned_spec"] == AG_BYTES_WORLD4
        assert r["planned_fsdp"] == {"<root>": AG_BYTES_WORLD4}
        # FSDP2's real all-gather output, without and with the shim.
        assert r["plain_outputs"] == [AG_BYTES_WORLD4]
        assert r["shim_outputs"] == [AG_BYTES_WORLD4]
        assert r["shim_in_slot"], "the all-gather output was not the planned slot"
        assert r["stats"]["all_gather_nbytes"] == AG_BYTES_WORLD4
        assert r["param_slots"] == [16 * 64 * 4, 16 * 4, 44 * 64 * 4, 2 * 3 * 4]
    assert [r["sharded_numel"][3] for r in results] == [6, 6, 6, 3]  # (7, 3): rows 2, 2, 2, 1


def test_region_range_operations_ddp_style(world2):
    """One all-reduce over the grads region, one foreach over params/grads regions."""
    for r in world2.run(tasks.ddp_style_region_ops):
        assert r["summed"] and r["updated"] and r["still_placed"]
        assert r["regions"] == ["params", "grads"]  # comm_buffers=False
        assert "already has an FSDPPlan" in r["twice"]
        assert r["removed"]


def test_mixed_precision_and_no_sync_accumulation(world2):
    """bf16 all-gather, fp32 reduce-scatter, reshard_after_forward=False, 2 micro-batches."""
    for r in world2.run(tasks.mixed_precision_accumulation):
        assert r["losses_equal"] and r["params_equal"]
        assert (r["ag_dtype"], r["rs_dtype"]) == ("torch.bfloat16", "torch.float32")
        assert r["stats"]["all_gather_fallbacks"] == r["stats"]["reduce_scatter_fallbacks"] == 0


def test_plan_after_warmup_places_existing_state(world2):
    for r in world2.run(tasks.place_existing_state):
        assert r["losses_equal"] and r["params_equal"]
        assert not r["pending"] and r["extensions"] == 0
        assert "optim.exp_avg" in r["regions"] and "optim.exp_avg_sq" in r["regions"]


def test_hsdp_2x2(world4):
    results = world4.run(tasks.hsdp_plan)
    for r in results:
        assert r["losses_equal"] and r["params_equal"] and r["momentum_region"]
        assert r["head_slot_shape"] == (7, 6)  # (13, 6) over the shard dim of size 2
        assert r["stats"]["all_gather_fallbacks"] == r["stats"]["reduce_scatter_fallbacks"] == 0
    assert len({r["digest"] for r in results}) == 1
