"""The demo GPT's CPU training step time and peak RSS under several allocators.

One process per configuration (an allocator is chosen per process):
PyTorch's default CPU allocator; torch_renaissance's dynamic pool; the planned
arena; and the default allocator with jemalloc, tcmalloc and mimalloc
preloaded (Debian packages libjemalloc2, libtcmalloc-minimal4,
libmimalloc2.0; a missing one is reported, not faked).
Run: ``python benchmarks/bench_demo.py [--steps N] [--batch B] [--seq T]``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _common import child_env, git_rev, last_result, machine, table

PRELOADS = {
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "mimalloc": "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
}


def run(mode: str, args, preload: str | None = None) -> dict | None:
    env = child_env({"LD_PRELOAD": preload} if preload else None)
    cmd = [sys.executable, "-m", "torch_renaissance.examples.train_gpt", "--mode", mode,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    result = last_result(r.stdout)
    if result is None:
        print(f"{mode} {preload or ''} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    configs = [("PyTorch default", "default", None), ("torch_renaissance dynamic", "dynamic", None),
               ("torch_renaissance planned", "planned", None)]
    for name, path in PRELOADS.items():
        configs.append((f"default + {name}", "default", path if os.path.exists(path) else "missing"))
    rows, losses = [], set()
    for title, mode, preload in configs:
        if preload == "missing":
            rows.append([title, "not installed", "", "", "", "", ""])
            continue
        res = run(mode, args, preload)
        if res is None:
            rows.append([title, "failed", "", "", "", "", ""])
            continue
        losses.add(tuple(res["losses"]))
        mib = lambda k: f"{res[k] / 2**20:.1f}" if res.get(k) else "n/a"
        rows.append([title, f"{1000 * res['mean_step_seconds']:.1f}", mib("peak_rss_bytes"),
                     mib("peak_reserved_bytes"),
                     f"{res['peak_reserved_over_load']:.3f}" if res.get("peak_reserved_over_load") else "n/a",
                     f"{res['steady_peak_reserved_over_load']:.3f}"
                     if res.get("steady_peak_reserved_over_load") else "n/a",
                     f"{res['final_loss']:.6f}"])
    print(f"Demo GPT ({args.steps} steps, batch {args.batch} x {args.seq}) — {machine()} — commit {git_rev()}")
    print(table(["allocator", "mean step (ms)", "peak RSS (MiB)", "peak reserved (MiB)",
                 "peak reserved / LOAD", "steady (from step 3) / LOAD", "final loss"], rows))
    print(f"losses identical across configurations: {'yes' if len(losses) == 1 else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
