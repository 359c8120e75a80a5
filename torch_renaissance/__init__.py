"""torch_renaissance: a planned-arena memory allocator for PyTorch.

One step's allocations are recorded, planned offline close to the lower bound
(LOAD) and replayed at the same addresses in later steps; everything else is
served by a best-fit dynamic pool. See README.md and docs/.

Quick use::

    import torch_renaissance as tr
    tr.install("cpu")            # before the first tensor
    for batch in data:
        with tr.step():          # or: torch-renaissance run train.py
            ...
    print(tr.memory_summary())
"""
from torch_renaissance.config import Config, parse_conf
from torch_renaissance.installer import get_arena, install, installed_config, is_installed
from torch_renaissance.stats import (
    empty_cache,
    export_snapshot,
    fragmentation,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from torch_renaissance.cuda import mem_pool
from torch_renaissance.memory_plan import MemoryPlan
from torch_renaissance.model_slots import ModelSlots
from torch_renaissance.step import auto_steps, planned, step, step_on, stop_auto_steps, stop_step_on
from torch_renaissance.streams import StreamManager

__version__ = "0.1.0"

__all__ = [
    "Config", "get_arena", "install", "installed_config", "is_installed", "parse_conf",
    "empty_cache", "export_snapshot", "fragmentation", "max_memory_allocated", "max_memory_reserved",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
    "auto_steps", "planned", "step", "step_on", "stop_auto_steps", "stop_step_on", "mem_pool", "MemoryPlan",
    "StreamManager", "ModelSlots",
]
