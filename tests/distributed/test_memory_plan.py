"""MemoryPlan / Region / Slot: layout, identity (digest, first difference), one-buffer materialization."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_renaissance.memory_plan import (
    DEFAULT_ALIGNMENT,
    MaterializedPlan,
    MemoryPlan,
    plan_from_description,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _example() -> MemoryPlan:
    plan = MemoryPlan()
    plan.add_slot("params", "w", (7, 3), torch.float32)  # 84 B
    plan.add_slot("params", "b", (7,), torch.float32)  # 28 B
    plan.add_slot("params", "e", (0, 5), torch.float32)  # 0 B
    plan.add_slot("grads", "w", (7, 3), torch.float32)
    plan.add_slot("optim.step", "w", (), torch.int64)
    plan.add_slot("mixed", "h", (300,), torch.float16)  # 600 B
    plan.add_slot("mixed", "f", (5,), torch.float64, nbytes=100)
    return plan.finalize()


def test_layout_is_aligned_and_contiguous():
    plan = _example()
    assert plan.alignment == DEFAULT_ALIGNMENT == 256
    # Hand-computed layout: each slot starts on a 256 B boundary of its region,
    # each region is rounded up to 256 B and the next starts where it ends.
    params = plan.region("params")
    assert [(s.name, s.offset, s.nbytes) for s in params] == [("w", 0, 84), ("b", 256, 28), ("e", 512, 0)]
    assert (params.offset, params.nbytes) == (0, 512)
    assert plan.region_range("grads") == (512, 768)
    assert plan.region_range("optim.step") == (768, 1024)
    mixed = plan.region("mixed")
    assert [(s.offset, s.nbytes) for s in mixed] == [(0, 600), (768, 100)]
    assert (mixed.offset, mixed.nbytes) == (1024, 1024)
    assert plan.nbytes == 2048
    assert plan.slot_range("mixed", "f") == (1792, 1892)
    ends = [r.offset for r in plan.regions] + [plan.nbytes]
    assert all(r.end == nxt for r, nxt in zip(plan.regions, ends[1:]))
    for region in plan.regions:
        for slot in region:
            assert (region.offset + slot.offset) % 256 == 0


def test_custom_alignment_and_bad_alignment():
    plan = MemoryPlan(alignment=64)
    plan.add_slot("r", "a", (3,), torch.float32)
    plan.add_slot("r", "b", (3,), torch.float32)
    plan.finalize()
    assert [s.offset for s in plan.region("r")] == [0, 64]
    assert plan.nbytes == 128
    for bad in (0, 3, 100, -256, 1 << 31, 1 << 40):
        with pytest.raises(ValueError, match="power of two"):
            MemoryPlan(alignment=bad)
    # Was: int() of these, so 2.5 planned at 2 B and "256" was taken. A tester's
    # plan_fsdp(alignment=1 << 40) tried to allocate 4 TiB.
    for bad in (2.5, 256.0, "256", True):
        with pytest.raises(ValueError, match="alignment must be an integer number of bytes"):
            MemoryPlan(alignment=bad)
    assert MemoryPlan(alignment=1 << 30).alignment == 1 << 30


def test_building_errors():
    plan = MemoryPlan()
    plan.add_slot("r", "a", (2,), torch.float32)
    with pytest.raises(ValueError, match="already has a slot named 'a'"):
        plan.add_slot("r", "a", (2,), torch.float32)
    with pytest.raises(ValueError, match="already has a region"):
        plan.add_region("r")
    with pytest.raises(ValueError, match="negative"):
        plan.add_slot("r", "neg", (-1, 2), torch.float32)
    with pytest.raises(ValueError, match="smaller than"):
        plan.add_slot("r", "small", (4,), torch.float32, nbytes=15)
    with pytest.raises(RuntimeError, match="not finalized"):
        plan.nbytes
    with pytest.raises(RuntimeError, match="not finalized"):
        plan.materialize()
    plan.finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        plan.add_slot("r", "late", (1,), torch.float32)
    with pytest.raises(KeyError, match="no region 'nope'"):
        plan.region("nope")
    with pytest.raises(KeyError, match="no slot 'nope'"):
        plan.slot("r", "nope")


def test_digest_is_stable_and_sensitive():
    a, b = _example(), _example()
    assert a.digest() == b.digest()
    assert len(a.digest()) == 64
    # Any change to a shape, dtype, name or alignment changes the digest.
    variants = []
    for change in ("shape", "dtype", "name", "alignment"):
        p = MemoryPlan(alignment=128 if change == "alignment" else 256)
        p.add_slot("params", "v" if change == "name" else "w", (7, 4) if change == "shape" else (7, 3),
                   torch.float16 if change == "dtype" else torch.float32)
        variants.append(p.finalize().digest())
    base = MemoryPlan()
    base.add_slot("params", "w", (7, 3), torch.float32)
    assert base.finalize().digest() not in variants
    assert len(set(variants)) == 4


def test_digest_independent_of_hash_seed():
    """Same digest in a fresh interpreter with another PYTHONHASHSEED."""
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {REPO!r})
        import torch
        from torch_renaissance.memory_plan import MemoryPlan
        plan = MemoryPlan()
        for region, name, shape, dtype in [("params", "w", (7, 3), torch.float32),
                ("params", "b", (7,), torch.float32), ("grads", "w", (7, 3), torch.float32)]:
            plan.add_slot(region, name, shape, dtype)
        print(plan.finalize().digest())
        """
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = MemoryPlan()
    plan.add_slot("params", "w", (7, 3), torch.float32)
    plan.add_slot("params", "b", (7,), torch.float32)
    plan.add_slot("grads", "w", (7, 3), torch.float32)
    assert out.stdout.strip() == plan.finalize().digest()


def test_first_difference_names_the_slot():
    def build(shape_b, extra=False, dtype=torch.float32):
        p = MemoryPlan()
        p.add_slot("params", "a", (4, 4), torch.float32)
        p.add_slot("params", "b", shape_b, dtype)
        p.add_slot("params", "c", (2,), torch.float32)
        if extra:
            p.add_slot("grads", "a", (4, 4), torch.float32)
        return p.finalize()

    ref = build((4, 3))
    assert ref.first_difference(build((4, 3))) is None
    assert ref.first_difference(build((4, 3)).describe()) is None
    msg = build((4, 5)).first_difference(ref)
    assert msg == "region 'params', slot #1 'b': shape (4, 5) != (4, 3), nbytes 80 != 48"
    msg = build((4, 3), dtype=torch.float16).first_difference(ref)
    assert "slot #1 'b'" in msg and "dtype float16 != float32" in msg
    assert build((4, 3), extra=True).first_difference(ref) == (
        "region #1 'grads' is missing from the other plan"
    )
    assert ref.first_difference(build((4, 3), extra=True)) == (
        "region #1 'grads' exists only in the other plan"
    )


def test_materialize_one_buffer_and_views():
    plan = _example()
    mat = plan.materialize("cpu")
    assert isinstance(mat, MaterializedPlan)
    assert mat.buffer.dtype == torch.uint8 and mat.buffer.shape == (plan.nbytes,)
    assert torch.count_nonzero(mat.buffer) == 0
    base = mat.data_ptr()
    w = mat.slot_view("params", "w")
    assert w.shape == (7, 3) and w.dtype == torch.float32 and w.data_ptr() == base
    assert mat.slot_view("params", "b").data_ptr() == base + 256
    assert mat.slot_view("params", "e").shape == (0, 5)
    assert mat.slot_view("optim.step", "w").shape == () and mat.slot_view("optim.step", "w").dtype == torch.int64
    assert mat.slot_bytes("mixed", "f").numel() == 100
    # Every view aliases the one buffer.
    w.fill_(1.5)
    assert mat.buffer[0:84].view(torch.float32).eq(1.5).all()
    params = mat.region_view("params")
    assert params.dtype == torch.float32 and params.numel() * 4 == 512
    assert params[:21].eq(1.5).all() and params[21:].eq(0).all()
    mixed = mat.region_view("mixed")
    assert mixed.dtype == torch.uint8 and mixed.numel() == 1024  # mixed dtypes -> bytes
    assert mat.region_view("mixed", torch.float64).numel() == 128
    assert set(mat.views("params")) == {"w", "b", "e"}
    assert plan.materialize().buffer.data_ptr() != base  # a new allocation each time


def test_adopt_moves_storage_keeps_object():
    plan = MemoryPlan()
    plan.add_slot("params", "padded", (4, 3), torch.float32)
    plan.add_slot("params", "p", (5,), torch.float32)
    plan.add_slot("params", "empty", (0, 3), torch.float32)
    mat = plan.finalize().materialize()
    shard = torch.arange(9, dtype=torch.float32).view(3, 3)  # 3 of 4 padded rows
    param = torch.nn.Parameter(torch.randn(5))
    values = param.detach().clone()
    ident = id(param)
    mat.adopt("params", "padded", shard)
    mat.adopt("params", "p", param)
    mat.adopt("params", "empty", torch.empty(0, 3))
    assert shard.data_ptr() == mat.data_ptr() and mat.owns(shard)
    assert torch.equal(mat.slot_view("params", "padded")[:3], torch.arange(9.0).view(3, 3))
    assert mat.slot_view("params", "padded")[3].eq(0).all()
    assert id(param) == ident and isinstance(param, torch.nn.Parameter) and param.requires_grad
    assert torch.equal(param.detach(), values) and mat.owns(param)
    # The tensor and the slot are now one memory: writes show through both ways.
    with torch.no_grad():
        param.mul_(2)
    assert torch.equal(mat.slot_view("params", "p"), values * 2)
    param.sum().backward()  # autograd still works on the re-pointed parameter
    assert torch.equal(param.grad, torch.ones(5))


def test_adopt_errors():
    plan = MemoryPlan()
    plan.add_slot("r", "s", (4,), torch.float32)
    mat = plan.finalize().materialize()
    with pytest.raises(ValueError, match="dtype float64"):
        mat.adopt("r", "s", torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not fit"):
        mat.adopt("r", "s", torch.zeros(5))
    with pytest.raises(ValueError, match="contiguous"):
        mat.adopt("r", "s", torch.zeros(4, 2)[:, 0])
    with pytest.raises(KeyError):
        mat.adopt("r", "missing", torch.zeros(4))


def test_empty_plan_and_description_round_trip():
    empty = MemoryPlan().finalize()
    assert empty.nbytes == 0 and empty.materialize().buffer.numel() == 0
    plan = _example()
    again = plan_from_description(plan.describe())
    assert again.digest() == plan.digest()
    broken = plan.describe()
    broken["regions"][0]["slots"][1]["offset"] = 100
    with pytest.raises(ValueError, match="not a finalized layout"):
        plan_from_description(broken)
    with pytest.raises(ValueError, match="malformed"):
        plan_from_description({"alignment": 256})


def test_alignment_smaller_than_item_size_is_refused():
    # Regression: MemoryPlan(1) put a float64 slot at byte 3 and slot_view failed in torch.
    plan = MemoryPlan(1)
    plan.add_slot("r", "bytes", (3,), torch.uint8)
    with pytest.raises(ValueError, match=r"slot 'f64'.*alignment of 1 B.*8 B items of float64"):
        plan.add_slot("r", "f64", (2,), torch.float64)
    assert [s.name for s in plan.region("r")] == ["bytes"]  # nothing added
    with pytest.raises(ValueError, match="slot 'e'"):  # also for an empty view
        MemoryPlan(4).add_slot("r", "e", (0,), torch.complex64)
    # An alignment of at least the item size works, whatever comes before the slot.
    plan = MemoryPlan(8)
    plan.add_slot("r", "bytes", (3,), torch.uint8)
    plan.add_slot("r", "f64", (2,), torch.float64)
    mat = plan.finalize().materialize()
    assert plan.slot_range("r", "f64") == (8, 24)
    view = mat.slot_view("r", "f64")
    assert view.dtype == torch.float64 and view.shape == (2,)
    assert view.data_ptr() == mat.data_ptr() + 8


def test_shapes_must_be_integers():
    # Regression: (2.7,) silently became (2,).
    plan = MemoryPlan()
    for bad in [(2.7,), (3, 2.0), ("3",), (True, 2), (torch.tensor(1.5),)]:
        with pytest.raises(ValueError, match=r"slot 'w'.*non-integer size"):
            plan.add_slot("r", "w", bad, torch.float32)
    with pytest.raises(ValueError, match=r"slot 'w'.*negative"):
        plan.add_slot("r", "w", (4, -1), torch.float32)
    with pytest.raises(ValueError, match=r"slot 'w'.*int64"):
        plan.add_slot("r", "w", (2**63, 0), torch.float32)
    with pytest.raises(ValueError, match=r"slot 'w'.*nbytes must be an integer"):
        plan.add_slot("r", "w", (4,), torch.float32, nbytes=16.5)
    with pytest.raises(TypeError, match="slot 'w'"):
        plan.add_slot("r", "w", 4, torch.float32)
    assert len(plan.region("r")) == 0
    # Integers of other types are fine and stored as int.
    s = plan.add_slot("r", "w", torch.Size([torch.tensor(2).item(), 3]), torch.float32)
    t = plan.add_slot("r", "t", (torch.tensor(5),), torch.float32, nbytes=torch.tensor(32))
    assert s.shape == (2, 3) and t.shape == (5,) and t.nbytes == 32
    assert all(type(d) is int for d in s.shape + t.shape) and type(t.nbytes) is int
    plan.finalize()
    assert plan_from_description(plan.describe()).digest() == plan.digest()


def test_plan_larger_than_int64_is_refused_at_finalize():
    # Regression: finalize accepted it and materialize raised a torch TypeError.
    plan = MemoryPlan()
    plan.add_slot("a", "w", (2**60,), torch.float32)  # 2**62 bytes
    plan.add_slot("b", "w", (2**62,), torch.uint8)  # 2**63 bytes in all: one too many
    with pytest.raises(ValueError, match=f"total size {2**63} bytes does not fit in int64"):
        plan.finalize()
    assert not plan.finalized
    with pytest.raises(RuntimeError, match="not finalized"):
        plan.materialize()
    one_slot = MemoryPlan()
    one_slot.add_slot("r", "huge", (2**40, 2**40), torch.float64)  # 2**83 bytes
    with pytest.raises(ValueError, match=f"total size {2**83} bytes"):
        one_slot.finalize()
    # The largest aligned size that fits is accepted (not materialized here).
    fits = MemoryPlan()
    fits.add_slot("a", "w", (2**60,), torch.float32)
    fits.add_slot("b", "w", (2**62 - 256,), torch.uint8)
    assert fits.finalize().nbytes == 2**63 - 256
