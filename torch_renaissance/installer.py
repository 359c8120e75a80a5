"""Installing torch_renaissance as PyTorch's allocator, per device type, and
finding the arena that serves a device.

The configuration (keys, ``TORCH_RENAISSANCE_CONF``) is
:mod:`torch_renaissance.config`; loading the compiled extension is
:mod:`torch_renaissance.extension`.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import asdict
from typing import Any, Optional

import torch

from torch_renaissance.config import Config, make_config
from torch_renaissance.extension import extension

_lock = threading.Lock()
_installed: dict = {}  # device type or "cuda" -> (Config, arena or allocator handle)


def as_torch_device(device: Any) -> torch.device:
    """``torch.device(device)``, with an error that names the value.

    Raises:
        RuntimeError: torch cannot make a device of ``device`` (an integer is
            an accelerator index, which a machine without one refuses).
    """
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        # torch.device(None) answers with a list of its overloads.
        raise RuntimeError(f"torch_renaissance: {device!r} is not a device it can use "
                           f"(pass 'cpu', 'cuda' or 'cuda:N')")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"torch_renaissance: {device!r} is not a device it can use "
                           f"(pass 'cpu', 'cuda' or 'cuda:N'): {first}") from None


def supported_device(device: Any) -> torch.device:
    """:func:`as_torch_device`, refusing device types other than ``cpu`` and ``cuda``.

    Raises:
        RuntimeError: as :func:`as_torch_device`, or a device of another type
            (``meta``, ``mps``, ...).
    """
    dev = as_torch_device(device)
    if dev.type not in ("cpu", "cuda"):
        raise RuntimeError(f"torch_renaissance supports 'cpu' and 'cuda' devices, not '{dev.type}'")
    return dev


def _device_type(device: Any) -> str:
    return as_torch_device(device).type


def install(device: Any = "cpu", **config: Any) -> None:
    """Replaces PyTorch's allocator for ``device`` with a torch_renaissance arena.

    Install before the first tensor of that device: tensors made earlier keep
    freeing through their own allocator. Installing twice with the same
    configuration is a no-op with a warning.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device`` of those types.
            The CPU has one allocator per process, as in PyTorch (which makes
            ``torch.empty(3, device="cpu:1")`` on ``cpu``): ``"cpu:1"`` installs
            that one. For CUDA, one arena per device serves every index.
        **config: configuration keys (see the module docstring); they override
            ``TORCH_RENAISSANCE_CONF``.

    Raises:
        RuntimeError: already installed with a different configuration; or
            ``"cuda"`` when the extension was built without CUDA, or after CUDA
            memory was already allocated.
        ValueError: an unknown configuration key or a bad value.

    Source: ``c10::SetAllocator`` (c10/core/Allocator.h) for the CPU;
    ``torch/csrc/cuda/CUDAPluggableAllocator.h`` for CUDA.
    """
    kind = _device_type(device)
    cfg = make_config(**config)
    with _lock:
        if kind in _installed:
            old = _installed[kind][0]
            if old == cfg:
                warnings.warn(f"torch_renaissance is already installed for '{kind}' with this "
                              "configuration; install() did nothing", stacklevel=2)
                return
            raise RuntimeError(
                f"torch_renaissance is already installed for '{kind}' with a different "
                f"configuration ({_diff(old, cfg)}); the allocator of a process cannot be "
                "changed once tensors may hold its memory")
        if kind == "cpu":
            arena = extension().install_cpu(**cfg.arena_kwargs())
            _installed[kind] = (cfg, arena)
        elif kind == "cuda":
            from torch_renaissance import cuda as _cuda

            _installed[kind] = (cfg, _cuda.install(cfg))
        else:
            raise RuntimeError(f"torch_renaissance supports 'cpu' and 'cuda' devices, not '{kind}'")
        if cfg.planning:
            _hint_optimizer_state()


_optimizer_hooks: list = []


def _set_hint(on: bool) -> None:
    for kind in list(_installed):
        try:
            arena = active_arena(kind)
        except RuntimeError:  # CUDA initialized but unusable: nothing to hint
            continue
        if arena is not None:
            arena.set_persistent_hint(on)


def _hint_optimizer_state() -> None:
    """Marks each ``optimizer.step()`` that makes state as a phase whose allocations persist.

    Optimizers create their state (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``)
    inside their first ``step()``. While a step is recorded the arena packs
    what is allocated in that phase into a segment of its own, so that the
    state, which outlives every step, does not end up scattered where the
    plan of the next steps has to go around it; when the phase ends the
    arena gives back what it left free there (its foreach temporaries).
    A ``step()`` that makes no state is not hinted (``_makes_state``). Uses
    PyTorch's global optimizer step hooks (``torch.optim.optimizer``).
    """
    if _optimizer_hooks:
        return
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    _optimizer_hooks.append(register_optimizer_step_pre_hook(
        lambda opt, *a: _set_hint(_makes_state(opt))))
    _optimizer_hooks.append(register_optimizer_step_post_hook(lambda *a: _set_hint(False)))


def _makes_state(optimizer) -> bool:
    """True if ``optimizer.step()`` is about to create state: a parameter
    with a gradient has no state yet (PyTorch's optimizers make it lazily,
    in the first ``step()`` that sees the gradient). Only such a step is
    hinted: a later one allocates only its foreach temporaries, which die
    within it and belong in the dynamic pool's free memory, not in the
    persistent segment (issue 16)."""
    state = getattr(optimizer, "state", None)
    groups = getattr(optimizer, "param_groups", None)
    if state is None or groups is None:
        return True  # not a torch.optim.Optimizer: hint as before
    if len(state) >= sum(len(g.get("params", ())) for g in groups):
        return False  # every parameter has state (the steady case: no per-parameter scan)
    for group in groups:
        for p in group.get("params", ()):
            if getattr(p, "grad", None) is not None and not state.get(p):
                return True
    return False


def _diff(old: Config, new: Config) -> str:
    a, b = asdict(old), asdict(new)
    return ", ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k])


def is_installed(device: Any = "cpu") -> bool:
    """True if torch_renaissance serves allocations of ``device``'s type."""
    return _device_type(device) in _installed


def installed_config(device: Any = "cpu") -> Optional[Config]:
    """The configuration ``device``'s type was installed with, or None."""
    entry = _installed.get(_device_type(device))
    return entry[0] if entry else None


def resolve_device(device: Any = None) -> "torch.device":
    """The device torch_renaissance serves for ``device``, with its index for CUDA.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``. None
            means CUDA's current device when CUDA is installed, else the CPU.

    Raises:
        RuntimeError: torch_renaissance is not installed for that device.
    """
    dev = installed_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def installed_device(device: Any = None) -> "torch.device":
    """``device`` as a ``torch.device`` (None: ``cuda`` when CUDA is installed,
    else ``cpu``), checked to be installed; unlike :func:`resolve_device` it
    leaves a CUDA index unset and so never initializes CUDA.

    Raises:
        RuntimeError: not a CPU or CUDA device, or torch_renaissance is not
            installed for it.
    """
    if device is None:
        device = "cuda" if "cuda" in _installed else "cpu"
    dev = supported_device(device)
    if dev.type not in _installed:
        raise RuntimeError(f"torch_renaissance is not installed for '{dev.type}': call "
                           f"torch_renaissance.install('{dev.type}') first")
    return dev


def active_arena(device: Any):
    """The arena of ``device`` if it may hold allocations, else None: a CUDA
    arena only once CUDA is initialized (before that nothing was allocated
    there, and looking it up would initialize CUDA, e.g. before a script run
    by ``torch-renaissance run --cuda`` picked its device).

    Raises:
        RuntimeError: torch_renaissance is not installed for ``device``.
    """
    if installed_device(device).type == "cuda" and not torch.cuda.is_initialized():
        return None
    return get_arena(device)


def get_arena(device: Any = None):
    """The arena serving ``device`` (a ``torch_renaissance._C.Arena``): for
    CUDA, the device's default arena (graph pools and MemPools have their own).

    Args:
        device: as for :func:`resolve_device`.

    Raises:
        RuntimeError: torch_renaissance is not installed for that device.
    """
    dev = resolve_device(device)
    if dev.type == "cpu":
        return _installed["cpu"][1]
    from torch_renaissance import cuda as _cuda

    return _cuda.arena(dev.index)
