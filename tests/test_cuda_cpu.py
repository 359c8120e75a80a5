"""The CUDA entry points on a machine or build without CUDA: clear errors, env parsing.

The GPU behaviour itself is tested in tests/gpu (skipped without a GPU).
"""
from __future__ import annotations

import pytest

import torch_renaissance as tr
from torch_renaissance import auto, cuda


@pytest.mark.parametrize("value, expected", [
    ("", []), ("0", []), ("false", []), ("1", ["cuda"]), ("true", ["cuda"]),
    ("cuda", ["cuda"]), ("cpu", ["cpu"]), ("cpu,cuda", ["cpu", "cuda"]),
    (" CUDA , cpu ", ["cpu", "cuda"]), ("all", ["cpu", "cuda"]),
])
def test_devices_from_env(value, expected):
    assert auto.devices_from_env(value) == expected


def test_devices_from_env_rejects_unknown_entries():
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        auto.devices_from_env("cpu,gpu")


def test_symbols_are_the_documented_names():
    assert cuda.SYMBOLS["malloc"] == "torch_renaissance_cuda_malloc"
    assert cuda.SYMBOLS["free"] == "torch_renaissance_cuda_free"


@pytest.mark.skipif(cuda.is_built(), reason="this build has CUDA")
def test_install_cuda_without_cuda_build_raises_clearly():
    with pytest.raises(RuntimeError, match="built without CUDA"):
        tr.install("cuda")
    assert not tr.is_installed("cuda")
    with pytest.raises(RuntimeError, match="built without CUDA"):
        cuda.arena(0)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is available")
def test_mem_pool_without_cuda_raises_clearly():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        tr.mem_pool()


# --- torch_renaissance's CUDA stats functions go through torch.cuda ------------------


class _TorchCudaStub:
    """What the stats functions read from ``torch.cuda``, recorded."""

    def __init__(self, nested):
        self.nested = nested
        self.calls = []

    def current_device(self):
        return 0

    def memory_stats_as_nested_dict(self, index):
        self.calls.append(("stats", index))
        return self.nested

    def reset_peak_memory_stats(self, index):
        self.calls.append(("reset_peak", index))

    def reset_accumulated_memory_stats(self, index):
        self.calls.append(("reset_accumulated", index))

    def empty_cache(self):
        self.calls.append(("empty_cache",))


def test_cuda_stats_are_device_wide_and_resets_go_through_torch_cuda(monkeypatch):
    """With CUDA installed, PyTorch's keys come from torch.cuda (every arena of
    the device: graph pools and MemPools too, device-wide peaks), renaissance.*
    from the default arena; resets and empty_cache go through torch.cuda, so
    both views stay one."""
    import torch

    from torch_renaissance import _C, allocator

    arena = _C.Arena(_C.HostDevice())  # stands in for cuda:1's default arena
    p = arena.allocate(1 << 20)
    device_wide = arena.stats()
    device_wide = {k: v for k, v in device_wide.items() if k != "renaissance"}
    device_wide["allocated_bytes"] = {
        pool: {"current": 3 << 20, "peak": 5 << 20, "allocated": 9 << 20, "freed": 6 << 20}
        for pool in ("all", "small_pool", "large_pool")}
    stub = _TorchCudaStub(device_wide)
    monkeypatch.setattr(torch, "cuda", stub)
    monkeypatch.setitem(allocator._installed, "cuda", (None, None))
    monkeypatch.setattr(cuda, "arena", lambda index: arena)

    s = tr.memory_stats("cuda:1")
    assert stub.calls == [("stats", 1)]
    assert s["allocated_bytes.all.current"] == 3 << 20  # torch.cuda's, not the arena's 1 MiB
    assert tr.max_memory_allocated("cuda:1") == 5 << 20
    assert s["renaissance.planned_steps"] == arena.stats()["renaissance"]["planned_steps"]
    assert s["reserved_bytes.all.current"] == arena.stats()["reserved_bytes"]["all"]["current"]

    stub.calls.clear()
    tr.reset_peak_memory_stats("cuda:1")
    tr.reset_accumulated_memory_stats("cuda")  # the current device: 0
    tr.empty_cache("cuda:1")
    assert stub.calls == [("reset_peak", 1), ("reset_accumulated", 0), ("empty_cache",)]
    # The arena itself was not reset behind torch.cuda's back.
    assert arena.stats()["allocated_bytes"]["all"]["allocated"] == 1 << 20
    arena.deallocate(p)


class _StepArena:
    """Records the step calls auto_steps makes on a CUDA arena."""

    def __init__(self, name, log):
        self.name, self.log, self.in_step = name, log, False

    def begin_step(self, key=0):
        self.in_step = True
        self.log.append(("begin", self.name))

    def end_step(self):
        self.in_step = False
        self.log.append(("end", self.name))


def test_auto_steps_leave_cuda_alone_until_it_is_initialized(monkeypatch):
    """``torch-renaissance run --cuda`` must not initialize CUDA before the
    script (which may pick its device or CUDA_VISIBLE_DEVICES first); once
    CUDA is initialized, each boundary goes to the arena of the device current
    at that moment (torch.cuda.set_device(local_rank))."""
    import importlib

    import torch

    from torch_renaissance import allocator

    step = importlib.import_module("torch_renaissance.step")  # the package exports step()
    log = []
    arenas = {i: _StepArena(f"cuda:{i}", log) for i in range(2)}
    state = {"initialized": False, "device": 0}
    monkeypatch.setitem(allocator._installed, "cuda", (None, None))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["initialized"])

    def current_device():
        assert state["initialized"], "auto_steps initialized CUDA"
        return state["device"]

    monkeypatch.setattr(torch.cuda, "current_device", current_device)
    monkeypatch.setattr(cuda, "arena", lambda index: arenas[index])

    steps = step._AutoSteps(["cuda"])
    steps.start()
    assert log == []  # CUDA untouched
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    try:
        steps._boundary(opt, (), {})
        assert log == []  # still not initialized: nothing to mark
        state.update(initialized=True, device=1)  # the script ran set_device(1) and used CUDA
        steps._boundary(opt, (), {})
        assert log == [("begin", "cuda:1")]
        steps._boundary(opt, (), {})
        assert log[1:] == [("end", "cuda:1"), ("begin", "cuda:1")]
    finally:
        steps.stop()
    assert log[-1] == ("end", "cuda:1")
    assert all(name == "cuda:1" for _, name in log)  # cuda:0 was never touched


def test_cuda_arena_calls_run_with_its_device_current(monkeypatch):
    """get_arena('cuda:N') runs every call inside torch.cuda.device(N): the
    arena's device calls find their device current, switched the way
    PyTorch switches (no context left on the caller's device)."""
    import contextlib

    import torch

    from torch_renaissance import _C

    entered = []

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        yield

    inner = _C.Arena(_C.HostDevice())
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(cuda, "_ext", lambda: type("Ext", (), {"cuda_arena": staticmethod(lambda i: inner)}))
    a = cuda.arena(3)
    assert repr(a) == "DeviceArena(cuda:3)" and a.index == 3
    p = a.allocate(4096)
    a.deallocate(p)
    a.sync_point()
    assert entered == [3, 3, 3]
    assert a.in_step is False and a.rounding == inner.rounding  # properties pass through
    assert entered == [3, 3, 3]
    assert a.stats()["allocation"]["all"]["allocated"] == 1
