"""``import torch_renaissance.auto``: install torch_renaissance from the environment.

Put the import at the top of a program (before anything touches CUDA) and
control it without code changes:

=========================  ============================================================
``TORCH_RENAISSANCE``      ``1`` / ``true`` / ``cuda``: install for CUDA (when this
                           build has CUDA and a GPU is present); ``cpu``: for the CPU;
                           ``cpu,cuda`` or ``all``: both. Unset, empty or ``0``: nothing.
``TORCH_RENAISSANCE_CONF`` the arena configuration, ``key:value,...`` (see
                           :mod:`torch_renaissance.config`).
=========================  ============================================================

Importing twice does nothing more. Errors (a bad configuration, CUDA already
initialized) raise at import, so a misconfigured run stops at once instead of
running on PyTorch's allocator unnoticed.
"""
from __future__ import annotations

import os
from typing import List

from torch_renaissance.config import BOOL_WORDS as _BOOL

ENV_VAR = "TORCH_RENAISSANCE"


def devices_from_env(value: str | None = None) -> List[str]:
    """The device types ``TORCH_RENAISSANCE`` asks for.

    Args:
        value: the variable's value (default: read ``TORCH_RENAISSANCE``).

    Returns:
        A sub-list of ``["cpu", "cuda"]``, in that order.

    Raises:
        ValueError: an entry that is not a device type or a boolean.
    """
    raw = os.environ.get(ENV_VAR, "") if value is None else value
    text = raw.strip(" \t\r\n").lower()  # ASCII space only, as the config parser
    if text == "" or _BOOL.get(text) is False:
        return []
    wanted = set()
    for part in (p.strip(" \t\r\n") for p in text.split(",")):
        if _BOOL.get(part) is True or part == "cuda":
            wanted.add("cuda")
        elif part == "cpu":
            wanted.add("cpu")
        elif part == "all":
            wanted.update(("cpu", "cuda"))
        elif part:
            raise ValueError(f"torch_renaissance: {ENV_VAR}={raw!r}: '{part}' is not one of "
                             "1, cpu, cuda, all")
    return [d for d in ("cpu", "cuda") if d in wanted]


def install_from_env() -> List[str]:
    """Installs torch_renaissance for the devices ``TORCH_RENAISSANCE`` names.

    CUDA is skipped silently when this build has no CUDA or no GPU is
    present (so one environment serves CPU and GPU machines alike).

    Returns:
        The device types installed now or before.

    Raises:
        RuntimeError: CUDA was already initialized with PyTorch's allocator.
        ValueError: a bad ``TORCH_RENAISSANCE`` or ``TORCH_RENAISSANCE_CONF``.
    """
    import torch

    from torch_renaissance import cuda, installer

    done = []
    for device in devices_from_env():
        # device_count() asks NVML first, so it does not initialize the CUDA
        # driver in this process (is_available() would, and a later fork
        # whose child uses CUDA would then fail); install() needs no device.
        if device == "cuda" and not (cuda.is_built() and torch.cuda.device_count() > 0):
            continue
        if not installer.is_installed(device):
            installer.install(device)
        done.append(device)
    return done


installed = install_from_env()
