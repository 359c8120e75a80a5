"""Installing torch_renaissance as PyTorch's allocator, and its configuration.

Configuration comes from keyword arguments of :func:`install` and from the
environment variable ``TORCH_RENAISSANCE_CONF`` in PyTorch's
``PYTORCH_CUDA_ALLOC_CONF`` style: ``key:value,key:value``
(e.g. ``TORCH_RENAISSANCE_CONF=max_reserved_mb:4096,stream_policy:wait``).
Keyword arguments win over the environment. Numbers are plain ASCII integers
(decimal, or ``0x`` hexadecimal; no underscores, signs or other scripts' digits),
and a key may be given once per source (``max_reserved_mb`` and
``max_reserved_bytes`` are one key in two units).

Keys (units in the name):

=====================  =======  ================================================
key                    default  meaning
=====================  =======  ================================================
max_reserved_mb        0        limit on reserved memory in MiB (0: none)
max_reserved_bytes     0        the same in bytes (give one of the two)
expandable_segments    True     one growable segment per stream for large blocks
stream_policy          defer    ``defer`` (like PyTorch) or ``wait`` (stream-ordered)
planning               True     record, plan and replay marked steps
max_variants           8        variants (shape sets) kept, least recently used out
plan_budget_ms         250      planner search budget per plan, in milliseconds
=====================  =======  ================================================
"""
from __future__ import annotations

import os
import re
import threading
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

ENV_VAR = "TORCH_RENAISSANCE_CONF"


@dataclass(frozen=True)
class Config:
    """Parsed configuration of one installed arena (see the module docstring)."""

    max_reserved_bytes: int = 0
    expandable_segments: bool = True
    stream_policy: str = "defer"
    planning: bool = True
    max_variants: int = 8
    plan_budget_ms: int = 250

    def arena_kwargs(self) -> dict:
        """Keyword arguments for ``torch_renaissance._C.Arena`` / ``install_cpu``."""
        return {
            "max_reserved_bytes": self.max_reserved_bytes,
            "expandable_segments": self.expandable_segments,
            "stream_policy": self.stream_policy,
            "planning": self.planning,
            "max_variants": self.max_variants,
            "plan_budget_seconds": self.plan_budget_ms / 1000.0,
        }


_BOOL = {"1": True, "true": True, "yes": True, "on": True,
         "0": False, "false": False, "no": False, "off": False}


# What a number may look like in a config string: ASCII digits, or 0x and hex digits.
# int(text, 0) alone would also take "1_000", Unicode digits ("٣" is 3) and signs.
_NUMBER_RE = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]+", re.ASCII)
_ASCII_SPACE = " \t\n\r\f\v"


def _number(limit: int, minimum: int = 0):
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError  # a float byte count is a mistake, not something to round
        if isinstance(value, str):
            text = value.strip(_ASCII_SPACE)
            if not _NUMBER_RE.fullmatch(text):
                raise ValueError
            number = int(text, 0)  # refuses leading zeros ("010": octal or decimal?)
        else:
            number = value
        if not minimum <= number <= limit:
            raise ValueError
        return number
    return parse


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else _BOOL[str(value).strip().lower()]


def _policy(value: Any) -> str:
    policy = str(value).strip().lower()
    if policy not in ("defer", "wait"):
        raise ValueError
    return policy


# Every config key and its parser, in the order the error message lists them.
_KEYS = {
    "max_reserved_mb": _number(1 << 43),
    "max_reserved_bytes": _number(1 << 63),
    "expandable_segments": _flag,
    "stream_policy": _policy,
    "planning": _flag,
    "max_variants": _number(1 << 20, minimum=1),
    "plan_budget_ms": _number(3_600_000),
}


def _convert(key: str, value: Any) -> Any:
    """Converts one config value, raising ValueError naming the key."""
    parse = _KEYS.get(key)
    if parse is None:
        raise ValueError(f"torch_renaissance: unknown config key '{key}'; known keys: "
                         + ", ".join(_KEYS))
    try:
        return parse(value)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"torch_renaissance: bad value {value!r} for config key '{key}'") from None


def parse_conf(text: str) -> dict:
    """Parses ``key:value,key:value`` (PyTorch's allocator-config style).

    Args:
        text: the string, e.g. ``"max_reserved_mb:4096,planning:False"``.

    Returns:
        dict of converted values, keyed by config key.

    Raises:
        ValueError: an entry without ``:``, an unknown key, a bad value (numbers are
            ASCII decimal or ``0x`` hexadecimal), or a key given twice (also
            ``max_reserved_mb`` with ``max_reserved_bytes``).
    """
    out: dict = {}
    for part in text.split(","):
        part = part.strip(_ASCII_SPACE)
        if not part:
            continue
        if ":" not in part:
            raise ValueError(f"torch_renaissance: config entry '{part}' is not key:value "
                             f"(in {ENV_VAR}={text!r})")
        key, value = (s.strip(_ASCII_SPACE) for s in part.split(":", 1))
        if key in out:
            raise ValueError(f"torch_renaissance: config key '{key}' is given twice "
                             f"(in {ENV_VAR}={text!r}); give it once")
        out[key] = _convert(key, value)
    _check_one_limit(out, f"in {ENV_VAR}={text!r}")
    return out


def _check_one_limit(values: dict, where: str) -> None:
    if "max_reserved_mb" in values and "max_reserved_bytes" in values:
        raise ValueError("torch_renaissance: config keys 'max_reserved_mb' and "
                         f"'max_reserved_bytes' are the same limit in two units ({where}); "
                         "give one")


def make_config(**overrides: Any) -> Config:
    """Builds a :class:`Config` from ``TORCH_RENAISSANCE_CONF`` and keyword overrides.

    Raises:
        ValueError: unknown key, bad value, a key given twice in the environment, or
            both units of the reserved limit in one source (the message names it).
    """
    values = parse_conf(os.environ.get(ENV_VAR, ""))
    _check_one_limit(overrides, "as keyword arguments")
    for key, value in overrides.items():
        values[key] = _convert(key, value)
        # A limit given as a keyword replaces the environment's, in either unit.
        other = {"max_reserved_mb": "max_reserved_bytes", "max_reserved_bytes": "max_reserved_mb"}.get(key)
        if other and other not in overrides:
            values.pop(other, None)
    mb = values.pop("max_reserved_mb", None)
    if "max_reserved_bytes" not in values and mb is not None:
        values["max_reserved_bytes"] = mb << 20
    return Config(**values)


_lock = threading.Lock()
_installed: dict = {}  # device type or "cuda" -> (Config, arena or allocator handle)


def _ext():
    """The compiled extension; a clear ImportError when it was not built."""
    try:
        from torch_renaissance import _C
    except ImportError as e:  # pragma: no cover - exercised only on broken installs
        raise ImportError(
            "torch_renaissance's compiled extension is missing: build it with "
            "`pip install --no-build-isolation .` (or `make build`)") from e
    return _C


def _device_type(device: Any) -> str:
    if isinstance(device, torch.device):
        return device.type
    return torch.device(device).type


def install(device: Any = "cpu", **config: Any) -> None:
    """Replaces PyTorch's allocator for ``device`` with a torch_renaissance arena.

    Install before the first tensor of that device: tensors made earlier keep
    freeing through their own allocator. Installing twice with the same
    configuration is a no-op with a warning.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device`` of those types.
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
            arena = _ext().install_cpu(**cfg.arena_kwargs())
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
    """Marks every ``optimizer.step()`` as a phase whose allocations persist.

    Optimizers create their state (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``)
    inside their first ``step()``. While a step is recorded the arena packs
    what is allocated in that phase into a segment of its own, so that the
    state, which outlives every step, does not end up scattered where the
    plan of the next steps has to go around it. Uses PyTorch's global
    optimizer step hooks (``torch.optim.optimizer``).
    """
    if _optimizer_hooks:
        return
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    _optimizer_hooks.append(register_optimizer_step_pre_hook(lambda *a: _set_hint(True)))
    _optimizer_hooks.append(register_optimizer_step_post_hook(lambda *a: _set_hint(False)))


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
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type not in ("cpu", "cuda"):
        raise RuntimeError(f"torch_renaissance supports 'cpu' and 'cuda' devices, not '{dev.type}'")
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
