"""Helpers shared by the benchmark scripts: the data folder and table printing."""
from __future__ import annotations

import os
import pathlib
import platform
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]


def data_dir() -> pathlib.Path:
    """``../shared/data`` beside the repository, or ``$TORCH_RENAISSANCE_DATA``."""
    env = os.environ.get("TORCH_RENAISSANCE_DATA")
    return pathlib.Path(env) if env else REPO.parent / "shared" / "data"


def machine() -> str:
    """One line naming the machine the numbers come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (it also reads well in a terminal)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "?"
