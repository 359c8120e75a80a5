"""torch_renaissance behind ``torch.cuda``: install, per-device arenas, MemPools, the plain path.

Two ways to use the arena for CUDA memory:

* **Installed** (``torch_renaissance.install("cuda")`` before the first CUDA
  tensor): a C++ subclass of PyTorch's CUDA allocator interface
  (``c10::cuda::CUDACachingAllocator::CUDAAllocator``,
  ``csrc/torch/cuda_allocator.cpp`` and its neighbours ``cuda_*``) serves
  every CUDA tensor. PyTorch's own APIs keep working and report our numbers: ``torch.cuda.memory_stats``,
  ``memory_allocated``, ``max_memory_allocated``, ``reset_peak_memory_stats``,
  ``torch.accelerator.memory_stats``, ``torch.cuda.memory._snapshot()`` and
  the memory viewer, ``cacheInfo`` (so ``torch.backends.cudnn.benchmark``
  works), ``Tensor.record_stream``, CUDA graphs and ``torch.cuda.MemPool``.
* **Plain path** (no install): exported C functions for
  ``torch.cuda.memory.CUDAPluggableAllocator`` (see :func:`pluggable_allocator`),
  and :func:`mem_pool`, a ``torch.cuda.MemPool`` whose memory comes from our
  arena, for scoped use with ``torch.cuda.use_mem_pool``.

One arena per device, created on the first allocation of that device.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

import torch

#: Names of the exported C functions in the compiled extension (the plain path).
SYMBOLS = {
    "malloc": "torch_renaissance_cuda_malloc",        # void*(ssize_t, int, cudaStream_t)
    # The same, returning NULL when out of memory (for a MemPool over PyTorch's allocator).
    "malloc_or_null": "torch_renaissance_cuda_malloc_or_null",
    "free": "torch_renaissance_cuda_free",            # void(void*, ssize_t, int, cudaStream_t)
    "record_stream": "torch_renaissance_cuda_record_stream",  # void(void*, cudaStream_t)
    "empty_cache": "torch_renaissance_cuda_empty_cache",      # void()
}

_lock = threading.Lock()
_pluggable: dict = {}


def _ext():
    """The compiled extension, checked to have been built with CUDA."""
    from torch_renaissance.extension import extension as ext

    C = ext()
    if not getattr(C, "with_cuda", False):
        raise RuntimeError(
            "torch_renaissance was built without CUDA (the installed torch has no CUDA, or no "
            "CUDA toolkit was found at build time): rebuild it with a CUDA build of torch and "
            "CUDA_HOME set, e.g. `MAX_JOBS=2 pip install --no-build-isolation .` (or `make build`)")
    return C


def is_built() -> bool:
    """True if the compiled extension contains the CUDA allocator."""
    try:
        from torch_renaissance import _C
    except ImportError:
        return False
    return bool(getattr(_C, "with_cuda", False))


def install(cfg: Any) -> None:
    """Makes torch_renaissance the allocator behind ``torch.cuda`` (use :func:`torch_renaissance.install`).

    Swaps ``c10::cuda::CUDACachingAllocator``'s current allocator (what
    ``torch.cuda`` uses) and registers the same allocator as
    ``c10::GetAllocator(kCUDA)`` (what ``torch.accelerator`` and generic
    storage creation use; PyTorch's ``change_current_allocator`` does not).

    Args:
        cfg: a :class:`torch_renaissance.config.Config`.

    Raises:
        RuntimeError: the extension was built without CUDA, or CUDA was already
            initialized with PyTorch's allocator (call ``install("cuda")``
            before the first CUDA tensor, or set ``TORCH_RENAISSANCE=1`` and
            ``import torch_renaissance.auto`` first). Nothing changes then:
            existing CUDA tensors stay valid.
    """
    C = _ext()
    C.cuda_install(**cfg.arena_kwargs())


class DeviceArena:
    """The default arena of one CUDA device, every call made with that device current.

    Wraps ``torch_renaissance._C.Arena`` (same methods and properties). Calls
    that reach the device (events at ``sync_point`` / ``end_step``, giving
    memory back in ``empty_cache``) need its device current; they run inside
    ``torch.cuda.device(index)``, which switches the way PyTorch does and
    creates no CUDA context on the caller's device when it switches back.
    """

    __slots__ = ("_arena", "index")

    def __init__(self, arena: Any, index: int) -> None:
        self._arena = arena
        self.index = index

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._arena, name)
        if not callable(attr):
            return attr

        def on_device(*args: Any, **kwargs: Any) -> Any:
            with torch.cuda.device(self.index):
                return attr(*args, **kwargs)

        on_device.__name__ = name
        on_device.__doc__ = getattr(attr, "__doc__", None)
        return on_device

    def __repr__(self) -> str:
        return f"DeviceArena(cuda:{self.index})"


_arenas: dict = {}  # device index -> DeviceArena (the C++ arena lives for the process)


def arena(index: int) -> DeviceArena:
    """The default arena of ``cuda:index``, created on first use (see :class:`DeviceArena`).

    Args:
        index: the CUDA device index.

    Raises:
        RuntimeError: CUDA is not usable or the device does not exist.
    """
    index = int(index)
    a = _arenas.get(index)
    if a is None:
        with _lock:
            a = _arenas.get(index)
            if a is None:
                a = _arenas[index] = DeviceArena(_ext().cuda_arena(index), index)
    return a


def vmm_status(index: int = 0) -> str:
    """Whether ``cuda:index`` gets expandable segments (``"on (granularity …)"``) or why not."""
    return _ext().cuda_vmm_status(int(index))


def library_path() -> str:
    """Path of the compiled extension that exports :data:`SYMBOLS`."""
    from torch_renaissance import _C

    return _C.__file__


def pluggable_allocator():
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` served by torch_renaissance's arenas.

    The plain path, without :func:`torch_renaissance.install`: pass it to
    ``torch.cuda.memory.change_current_allocator`` before CUDA is initialized,
    or use :func:`mem_pool`. Arenas created through it take their configuration
    from ``TORCH_RENAISSANCE_CONF``. Where PyTorch allows it, ``record_stream``
    and ``empty_cache`` are wired too; PyTorch's statistics, snapshots and
    ``cacheInfo`` are not available on this path (PyTorch's
    ``CUDAPluggableAllocator`` does not forward them): use ``install("cuda")``
    for those.

    Returns:
        The same ``CUDAPluggableAllocator`` object on every call.

    Raises:
        RuntimeError: the extension was built without CUDA.
    """
    return _pluggable_for("malloc")


def _pluggable_for(malloc: str):
    """The CUDAPluggableAllocator whose malloc is ``SYMBOLS[malloc]`` (one per symbol)."""
    with _lock:
        if malloc not in _pluggable:
            C = _ext()
            from torch_renaissance.config import make_config

            C.cuda_configure(**make_config().arena_kwargs())
            import ctypes

            alloc = torch.cuda.memory.CUDAPluggableAllocator(
                library_path(), SYMBOLS[malloc], SYMBOLS["free"])
            lib = ctypes.CDLL(library_path())
            inner = alloc.allocator()
            for setter, name in (("set_record_stream_fn", "record_stream"),
                                 ("set_reset_fn", "empty_cache")):
                fn = getattr(inner, setter, None)
                if fn is not None:
                    fn(ctypes.cast(getattr(lib, SYMBOLS[name]), ctypes.c_void_p).value)
            _pluggable[malloc] = alloc
        return _pluggable[malloc]


def mem_pool(device: Optional[Any] = None) -> "torch.cuda.MemPool":
    """A ``torch.cuda.MemPool`` backed by torch_renaissance's arena, for ``torch.cuda.use_mem_pool``.

    With torch_renaissance installed for CUDA, this is a plain
    ``torch.cuda.MemPool()``: our allocator serves it from a private arena.
    Otherwise PyTorch's allocator manages the pool's blocks and takes the
    pool's memory from our arena through a ``CUDAPluggableAllocator`` like
    :func:`pluggable_allocator`'s, whose malloc returns NULL when out of memory.

    Args:
        device: the CUDA device of the pool (default: the current device).

    Returns:
        The new ``torch.cuda.MemPool``.

    Raises:
        RuntimeError: the extension was built without CUDA, or CUDA is not available.

    Example::

        pool = torch_renaissance.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            buf = torch.empty(1 << 20, device="cuda")
    """
    from torch_renaissance import installer

    if not torch.cuda.is_available():
        raise RuntimeError("torch_renaissance.mem_pool() needs CUDA, which is not available")
    with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
        if installer.is_installed("cuda"):
            return torch.cuda.MemPool()
        # PyTorch's allocator treats NULL from a pool's allocator as "out of
        # memory" (it frees its cached blocks and retries, then raises).
        return torch.cuda.MemPool(_pluggable_for("malloc_or_null").allocator())
