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


def child_env(extra: dict | None = None, drop: tuple = ()) -> dict:
    """Environment for a benchmark subprocess: the repository importable, no
    ``TORCH_RENAISSANCE_CONF`` (nor the names in ``drop``), plus ``extra``."""
    env = dict(os.environ)
    for key in ("TORCH_RENAISSANCE_CONF", *drop):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    # Same thread counts in every child, busy machine or not (see cli.DETERMINISTIC_THREADS).
    env.update({"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"})
    env.update(extra or {})
    return env


def last_result(stdout: str) -> dict | None:
    """The JSON of the last ``RESULT {...}`` line a worker printed, or None
    (also when that line was cut off, as by a timeout)."""
    import json

    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    try:
        return json.loads(lines[-1][len("RESULT "):]) if lines else None
    except json.JSONDecodeError:
        return None


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
                              text=True, timeout=20).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def per_op_table(benchmarks: list[dict]) -> str:
    """A Markdown table of pytest-benchmark results per operation.

    ``benchmarks``: dicts shaped like the entries of ``--benchmark-json``'s ``"benchmarks"``
    (``group``, ``name``, ``stats.median`` in seconds, ``extra_info`` with ``ops_per_call``,
    ``unit`` and ``baseline``). Per row: the median divided by the operations per call, in ns,
    (in ns, us or ms) and the ratio to the group's baseline (the benchmark marked baseline).
    """
    rows = []
    groups: dict = {}
    for b in benchmarks:
        info = b.get("extra_info", {})
        if "ops_per_call" not in info:
            continue
        groups.setdefault(b.get("group") or "", []).append(b)
    for group in sorted(groups):
        items = groups[group]
        per = {id(b): b["stats"]["median"] / b["extra_info"]["ops_per_call"] * 1e9 for b in items}
        base = next((b for b in items if b["extra_info"].get("baseline")), None)
        for b in sorted(items, key=lambda b: (not b["extra_info"].get("baseline"), b["name"])):
            ratio = "baseline" if b is base else (f"{per[id(b)] / per[id(base)]:.2f} x" if base else "")
            extra = ", ".join(f"{k}={v}" for k, v in sorted(b["extra_info"].items())
                              if k not in ("ops_per_call", "unit", "baseline"))
            rows.append([group, b["name"], _duration(per[id(b)]), b["extra_info"]["unit"], ratio,
                         extra])
    return table(["group", "benchmark", "median per op", "op", "vs baseline", "notes"], rows)


def _duration(ns: float) -> str:
    if ns < 10_000:
        return f"{ns:,.1f} ns"
    if ns < 10_000_000:
        return f"{ns / 1e3:,.1f} us"
    return f"{ns / 1e6:,.1f} ms"
