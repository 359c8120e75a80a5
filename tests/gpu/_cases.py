"""GPU test cases, one per process: ``python tests/gpu/_cases.py NAME [ARGS]``.

Each case measures and prints ``RESULT <json>`` as its last line; the tests in
this folder assert on those numbers. Nothing here runs at import time, so the
file is safe to import anywhere; pytest does not collect it (leading ``_``).
"""
from __future__ import annotations

import copy
import gc
import json
import os
import sys

MiB = 1 << 20


def _install(**config):
    import torch_renaissance as tr

    tr.install("cuda", **config)
    return tr


# --- smoke (run_all.sh's first step after the build) -------------------------------


def case_smoke() -> dict:
    """Install, 3 allocations, stats, one record_stream, one CUDA-graph capture.

    Raises AssertionError naming what is wrong; about 10 s with the imports.
    """
    tr = _install()
    import torch

    from torch_renaissance import cuda as tr_cuda

    sizes = (512, 3 * MiB, 64 * MiB)
    bufs = [torch.ones(n, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda.synchronize()
    total = sum(int(b.sum().item()) for b in bufs)
    assert total == sum(sizes), f"the buffers hold {total} ones, expected {sum(sizes)}"
    allocated = torch.cuda.memory_allocated()
    assert allocated == sum(sizes), f"memory_allocated() is {allocated}, expected {sum(sizes)}"
    assert torch.cuda.memory_reserved() >= allocated
    assert tr.memory_allocated("cuda") == allocated
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        doubled = bufs[2] * 2
    bufs[2].record_stream(side)
    del bufs[2]
    torch.cuda.current_stream().wait_stream(side)
    assert int(doubled[:1024].sum().item()) == 2048
    del doubled
    static_x = torch.ones(1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as torch.cuda.graph's docs ask
        static_y = static_x * 3
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        static_y = static_x * 3
    static_x.fill_(2.0)
    g.replay()
    torch.cuda.synchronize()
    got = float(static_y.sum().item())
    assert got == 6.0 * 1024, f"the replayed graph computed {got}, expected {6.0 * 1024}"
    del g, static_y
    torch.cuda.empty_cache()
    return {"vmm": tr_cuda.vmm_status(torch.cuda.current_device()), "allocated": allocated,
            "reserved": torch.cuda.memory_reserved()}


# --- statistics ---------------------------------------------------------------


def case_stats() -> dict:
    tr = _install()
    import torch

    out = {}
    bufs = [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    del bufs[1]
    torch.cuda.synchronize()
    out["cuda_allocated"] = torch.cuda.memory_allocated()
    out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    out["cuda_stats_allocated"] = torch.cuda.memory_stats()["allocated_bytes.all.current"]
    acc = getattr(torch, "accelerator", None)
    out["accelerator_allocated"] = (acc.memory_allocated() if acc and hasattr(acc, "memory_allocated")
                                    else None)
    out["accelerator_max_allocated"] = (acc.max_memory_allocated()
                                        if acc and hasattr(acc, "max_memory_allocated") else None)
    out["ours_allocated"] = tr.memory_allocated("cuda")
    torch.cuda.reset_peak_memory_stats()
    out["cuda_max_after_reset"] = torch.cuda.max_memory_allocated()
    out["accelerator_max_after_reset"] = (acc.max_memory_allocated()
                                          if acc and hasattr(acc, "max_memory_allocated") else None)
    out["reserved"] = torch.cuda.memory_reserved()
    return out


def case_cudnn() -> dict:
    _install()
    import torch

    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(64, 64, 3).cuda()
    x = torch.randn(8, 64, 128, 128, device="cuda")
    y = conv(x)
    torch.cuda.synchronize()
    info = torch.cuda.memory.mem_get_info()
    return {"shape": list(y.shape), "finite": bool(torch.isfinite(y).all()),
            "free": info[0]}


# --- record_stream -------------------------------------------------------------------


def case_record_stream() -> dict:
    _install()
    import torch

    out = {}
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    n = 16 * MiB
    # Map the memory of both streams before the side stream sleeps: growing
    # a segment (cuMemMap / cuMemSetAccess) may wait for the device, which
    # would end the sleep before the check. Main's 3n free block then holds
    # x at its start; freed, x joins the free rest, so an allocator that
    # ignored record_stream would hand x's address out again at once.
    with torch.cuda.stream(side):
        warm_side = torch.empty(n, dtype=torch.uint8, device="cuda")
    warm_main = torch.empty(3 * n, dtype=torch.uint8, device="cuda")
    del warm_side, warm_main
    x = torch.ones(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(2e9))  # ~1 s of GPU time: the side stream is busy
        y = x * 2  # uses x on the side stream
    x.record_stream(side)
    addr = x.data_ptr()
    del x
    # Written at once on the main stream: if it were x's memory, y would
    # read zeros.
    z = torch.zeros(n, dtype=torch.uint8, device="cuda")
    out["side_busy_at_check"] = not side.query()
    out["same_address_while_busy"] = z.data_ptr() == addr
    side.synchronize()
    out["y_ok"] = bool((y == 2).all())
    return out


def case_record_stream_copy() -> dict:
    _install()
    import torch

    out = {}
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    # A side-stream D2H copy whose source is freed and refilled on the main stream.
    numel = 256 * MiB // 4
    src = torch.ones(numel, dtype=torch.float32, device="cuda")
    host = torch.empty(numel, dtype=torch.float32, pin_memory=True)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(2e9))
        host.copy_(src, non_blocking=True)
    src.record_stream(side)
    del src
    refill = torch.full((numel,), float("nan"), dtype=torch.float32, device="cuda")
    side.synchronize()
    torch.cuda.synchronize()
    out["host_all_ones"] = bool((host == 1).all())
    out["host_nan_count"] = int(torch.isnan(host).sum())
    out["refill_nan"] = bool(torch.isnan(refill).all())
    return out


# --- out of memory --------------------------------------------------------------------


def case_oom() -> dict:
    _install()
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    out = {"total": total, "errors": []}
    for size in (2 * total, 2 ** 62):
        try:
            torch.empty(size, dtype=torch.uint8, device="cuda")
            out["errors"].append({"size": size, "type": None, "message": ""})
        except Exception as e:  # noqa: BLE001 - the type is what we check
            out["errors"].append({"size": size, "type": type(e).__name__,
                                  "is_oom": isinstance(e, torch.OutOfMemoryError),
                                  "message": str(e)})
    x = torch.ones(MiB, device="cuda")
    out["after"] = float(x.sum().item())
    return out


# --- install --------------------------------------------------------------------------


def case_install_late() -> dict:
    import torch

    t = torch.zeros(4, device="cuda")  # CUDA initialized with PyTorch's allocator
    out = {}
    try:
        _install()
        out["raised"] = None
    except Exception as e:  # noqa: BLE001
        out["raised"] = type(e).__name__
        out["message"] = str(e)
    t.add_(1)
    out["tensor_ok"] = float(t.sum().item()) == 4.0
    import torch_renaissance as tr

    out["installed"] = tr.is_installed("cuda")
    return out


def case_install_first() -> dict:
    tr = _install()
    import torch

    before = tr.get_arena("cuda").stats()["allocation"]["all"]["allocated"]
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    after = tr.get_arena("cuda").stats()
    return {"allocations_before": before,
            "allocations_after": after["allocation"]["all"]["allocated"],
            "ours_allocated": after["allocated_bytes"]["all"]["current"],
            "cuda_allocated": torch.cuda.memory_allocated(),
            "x_size": x.numel()}


def case_auto() -> dict:
    import torch_renaissance.auto as auto  # noqa: F401 - installs from TORCH_RENAISSANCE
    import torch

    import torch_renaissance as tr

    x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    return {"installed": auto.installed, "ours_allocated": tr.memory_allocated("cuda"),
            "cuda_allocated": torch.cuda.memory_allocated(), "n": x.numel()}


# --- snapshots, MemPool, plain path ------------------------------------------------------


def case_snapshot() -> dict:
    _install()
    import torch

    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 3 * MiB, 40 * MiB)]
    snap = torch.cuda.memory._snapshot()
    segs = snap["segments"]
    blocks = [b for s in segs for b in s["blocks"]]
    live = sorted(b["size"] for b in blocks if b["state"] == "active_allocated")
    tiles = all(sum(b["size"] for b in s["blocks"]) == s["total_size"] for s in segs)
    ptrs = {t.data_ptr() for t in keep}
    addrs = {b["address"] for b in blocks if b["state"] == "active_allocated"}
    from torch.cuda import _memory_viz

    text = _memory_viz.segsum(snap)
    return {"segments": len(segs), "live_sizes": live, "tiles": tiles,
            "pointers_found": sorted(ptrs - addrs) == [], "allocated": torch.cuda.memory_allocated(),
            "viz_chars": len(text)}


def case_mem_pool(installed: str) -> dict:
    import torch

    import torch_renaissance as tr

    if installed == "1":
        tr.install("cuda")
    pool = tr.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.ones(8 * MiB, dtype=torch.uint8, device="cuda")
    b = torch.ones(MiB, dtype=torch.uint8, device="cuda")
    out = {"a_ok": int(a.sum().item()) == 8 * MiB, "b_ok": int(b.sum().item()) == MiB}
    # The pool's memory came from our arena either way.
    from torch_renaissance import cuda as tr_cuda

    arena = tr_cuda.arena(torch.cuda.current_device())
    out["arena_reserved"] = arena.stats()["reserved_bytes"]["all"]["current"]
    out["pools"] = tr.cuda._ext().cuda_private_pool_count(torch.cuda.current_device())
    del a
    del pool
    gc.collect()
    torch.cuda.synchronize()
    out["pools_after"] = tr.cuda._ext().cuda_private_pool_count(torch.cuda.current_device())
    return out


def case_pool_peaks() -> dict:
    """Device-wide peaks with a private pool: the peak of the sum, as PyTorch keeps it."""
    tr = _install()
    import torch

    a = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del a  # the default arena's peak: 64 MiB
    pool = tr.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        b = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")  # the pool's peak: 64 MiB
    out = {"max_allocated": torch.cuda.max_memory_allocated(),
           "max_allocated_accel": torch.accelerator.max_memory_allocated(),
           "allocated": torch.cuda.memory_allocated()}
    del b
    torch.cuda.reset_peak_memory_stats()
    out["max_after_reset"] = torch.cuda.max_memory_allocated()
    del pool
    gc.collect()
    out["allocated_end"] = torch.cuda.memory_allocated()
    return out


def case_pluggable() -> dict:
    import torch

    from torch_renaissance import cuda as tr_cuda

    alloc = tr_cuda.pluggable_allocator()
    torch.cuda.memory.change_current_allocator(alloc)
    x = torch.ones(5 * MiB, dtype=torch.uint8, device="cuda")
    arena = tr_cuda.arena(torch.cuda.current_device())
    stats = arena.stats()
    ok = int(x.sum().item()) == 5 * MiB
    del x
    return {"ok": ok, "ours_allocated": stats["allocated_bytes"]["all"]["current"],
            "after_free": arena.stats()["allocated_bytes"]["all"]["current"]}


def case_multi_gpu() -> dict:
    tr = _install()
    import torch

    n = torch.cuda.device_count()
    x = torch.empty(2 * MiB, dtype=torch.uint8, device=f"cuda:{n - 1}")
    with torch.cuda.device(n - 1):
        y = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    return {"devices": n,
            "last": tr.memory_allocated(f"cuda:{n - 1}"),
            "last_torch": torch.cuda.memory_allocated(n - 1),
            "first_torch": torch.cuda.memory_allocated(0),
            "x_device": x.device.index, "y_device": y.device.index}


# --- CUDA graphs ------------------------------------------------------------------------


def case_graph() -> dict:
    _install()
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256)).cuda()
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    topt = torch.optim.SGD(twin.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    static_x = torch.randn(64, 256, device="cuda")
    static_y = torch.randn(64, 256, device="cuda")

    def eager_step(m, o, x, y):
        o.zero_grad(set_to_none=True)
        loss = loss_fn(m(x), y)
        loss.backward()
        o.step()
        return loss.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager_step(model, opt, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        eager_step(twin, topt, static_x, static_y)

    def capture():
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        # Captured on the warm-up stream: cuBLAS's workspace for it exists
        # already, so none is allocated inside (and pins) the first pool.
        with torch.cuda.graph(g, stream=side):
            loss = loss_fn(model(static_x), static_y)
            loss.backward()
            opt.step()
        return g, loss

    g, static_loss = capture()
    gen = torch.Generator(device="cuda").manual_seed(1)
    max_diff = 0.0
    for _ in range(100):
        x = torch.randn(64, 256, device="cuda", generator=gen)
        y = torch.randn(64, 256, device="cuda", generator=gen)
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
        eager = eager_step(twin, topt, x, y)
        max_diff = max(max_diff, float((static_loss - eager).abs().item()))
    param_diff = max(float((p - q).abs().max().item())
                     for p, q in zip(model.parameters(), twin.parameters()))
    torch.cuda.synchronize()
    reserved = []
    pools = []
    count = __import__("torch_renaissance").cuda._ext().cuda_private_pool_count
    for _ in range(10):
        del g, static_loss
        g, static_loss = capture()
        g.replay()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        pools.append(count(0))
    return {"max_loss_diff": max_diff, "param_diff": param_diff, "reserved": reserved,
            "pools": pools}


# --- the bundled GPT, planned, vs PyTorch's allocator ---------------------------------------


def case_gpt(mode: str, steps: str = "20") -> dict:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    import torch_renaissance as tr

    if mode == "planned":
        tr.install("cuda")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    from torch_renaissance.examples import gpt

    cfg = gpt.GPTConfig()
    model, opt = gpt.make(cfg, seed=0, device="cuda")
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(int(steps)):
        x, y = gpt.synthetic_batch(gen, 8, cfg.seq_len, cfg.vocab_size, device="cuda")
        if mode == "planned":
            with tr.step("cuda"):
                losses.append(gpt.train_step(model, opt, x, y))
        else:
            losses.append(gpt.train_step(model, opt, x, y))
    out = {"losses": [float.hex(v) for v in losses]}
    if mode == "planned":
        s = tr.memory_stats("cuda")
        out["planned_steps"] = s["renaissance.planned_steps"]
        out["last_step_hits"] = s["renaissance.last_step_hits"]
        out["last_step_allocations"] = s["renaissance.last_step_allocations"]
        out["address_stability"] = s["renaissance.address_stability"]
    return out


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CASES:
        print(f"usage: _cases.py {{{','.join(sorted(CASES))}}} [args]", file=sys.stderr)
        return 2
    result = CASES[argv[0]](*argv[1:])
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
