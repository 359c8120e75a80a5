"""CPU training step time and peak RSS under several allocators (issue 14 item 3).

Two models, each trained for a few steps in a process of its own per allocator:

* ``demo``: the bundled GPT of ``torch-renaissance demo`` (``examples/gpt.py``);
* ``hf-gpt2``: HF transformers' ``GPT2LMHeadModel`` built from a small ``GPT2Config`` (4 layers,
  256 wide, vocabulary 8,192; random weights, nothing downloaded), AdamW.

Allocators: PyTorch's default CPU allocator; torch_renaissance's dynamic pool (``install("cpu",
planning=False)``: the per-thread fronts' path) and planned arena (``auto_steps``: every step a
planned step); and the default allocator with jemalloc, tcmalloc and mimalloc preloaded, those
found on this machine (``ldconfig -p``, then the usual library folders; Debian packages
libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0). A missing one is reported as such, not
faked.

Alternated: ``--rounds`` rounds, each running every configuration once in turn, so a change of
machine load hits all of them alike; each process reports the median of its steps after the
first three (warm-up; for the planned arena, recording and planning), and the table gives, per
configuration, the median over the rounds (and the rounds' range) and the highest peak RSS
(``ru_maxrss``). Every child uses one intra-op thread (``--threads``) and deterministic MKL/OpenMP
threading, so the losses of all configurations must agree.

Run: ``python benchmarks/bench_demo.py [--rounds R] [--steps N] [--models demo,hf-gpt2]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _common import child_env, git_rev, last_result, machine, table

LIBRARIES = {
    "jemalloc": "libjemalloc.so.2",
    "tcmalloc": "libtcmalloc_minimal.so.4",
    "mimalloc": "libmimalloc.so.2",
}
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
MODES = ("default", "dynamic", "planned")


def find_library(soname: str) -> str | None:
    """The path of a shared library by its soname: ``ldconfig -p`` first, then SEARCH_DIRS."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
        for line in out.splitlines():
            name, _, path = line.strip().partition(" => ")
            if name.split(" ")[0] == soname and os.path.exists(path):
                return path
    except (OSError, subprocess.SubprocessError):
        pass
    for d in SEARCH_DIRS:
        path = os.path.join(d, soname)
        if os.path.exists(path):
            return path
    return None


# --------------------------------------------------------------------------- worker


def _build(model: str, batch: int, seq: int, seed: int):
    """(step function taking a generator and returning the loss, its model) for ``model``."""
    import torch

    torch.manual_seed(seed)
    if model == "demo":
        from torch_renaissance.examples import gpt

        cfg = gpt.GPTConfig(seq_len=seq, d_model=256, n_layer=4)
        net, opt = gpt.make(cfg, seed=seed)

        def step(gen):
            x, y = gpt.synthetic_batch(gen, batch, seq, cfg.vocab_size)
            return gpt.train_step(net, opt, x, y)

        return step
    if model == "hf-gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=8192, n_layer=4, n_embd=256, n_head=4, n_positions=seq)
        net = GPT2LMHeadModel(cfg)
        net.train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

        def step(gen):
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
            loss = net(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss)

        return step
    raise ValueError(f"unknown model {model!r}")


def worker(args) -> int:
    import resource

    import torch

    torch.set_num_threads(args.threads)
    import torch_renaissance as tr

    if args.mode != "default":
        tr.install("cpu", planning=args.mode == "planned")
    step = _build(args.model, args.batch, args.seq, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    if args.mode == "planned":
        tr.auto_steps(["cpu"])
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step(gen))
        times.append(time.perf_counter() - t0)
    if args.mode == "planned":
        tr.stop_auto_steps()
    print("RESULT " + json.dumps({
        "step_seconds": statistics.median(times[3:]),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "losses": losses,
    }), flush=True)
    return 0


# --------------------------------------------------------------------------- driver


def configurations() -> list[tuple[str, str, str | None]]:
    """(title, mode, preload path or "missing") of every configuration."""
    configs = [("PyTorch default", "default", None), ("torch_renaissance dynamic", "dynamic", None),
               ("torch_renaissance planned", "planned", None)]
    for name, soname in LIBRARIES.items():
        configs.append((f"default + {name}", "default", find_library(soname) or "missing"))
    return configs


def run_child(model: str, mode: str, preload: str | None, args) -> dict | None:
    env = child_env({"LD_PRELOAD": preload} if preload else None)
    env.update({"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--mode", mode,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
           "--threads", str(args.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    res = last_result(r.stdout)
    if res is None:
        print(f"{model} {mode} {preload or ''} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per child")
    p.add_argument("--models", default="demo,hf-gpt2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.steps < 4:
        p.error("--steps must be at least 4 (the first 3 are warm-up)")
    configs = configurations()
    models = [m for m in args.models.split(",") if m]
    results: dict = {(m, c[0]): [] for m in models for c in configs}
    for _ in range(args.rounds):
        for model in models:
            for title, mode, preload in configs:
                if preload == "missing":
                    continue
                res = run_child(model, mode, preload, args)
                if res is not None:
                    results[(model, title)].append(res)
                    print(f"  {model} / {title}: {1000 * res['step_seconds']:.1f} ms, "
                          f"peak RSS {res['peak_rss_bytes'] / 2**20:.1f} MiB", file=sys.stderr,
                          flush=True)
    print(f"CPU training step, {args.rounds} alternated rounds x {args.steps} steps (median of steps 4+), "
          f"batch {args.batch} x {args.seq}, {args.threads} intra-op thread(s) — {machine()} — "
          f"commit {git_rev()}")
    for model in models:
        rows, losses = [], set()
        best_other = None
        for title, mode, preload in configs:
            runs = results[(model, title)]
            if preload == "missing":
                rows.append([title, "not installed", "", "", ""])
                continue
            if not runs:
                rows.append([title, "failed", "", "", ""])
                continue
            ms = [1000 * r["step_seconds"] for r in runs]
            med = statistics.median(ms)
            rss = max(r["peak_rss_bytes"] for r in runs) / 2**20
            for r in runs:
                losses.add(tuple(round(x, 5) for x in r["losses"]))
            if not title.startswith("torch_renaissance"):
                best_other = med if best_other is None else min(best_other, med)
            rows.append([title, f"{med:.1f}", f"{min(ms):.1f} - {max(ms):.1f}", f"{rss:.1f}",
                         str(len(runs))])
        print(f"\n{model}")
        print(table(["allocator", "step (ms, median)", "range over rounds", "peak RSS (MiB)", "rounds"],
                    rows))
        if best_other is not None:
            print(f"best of the others: {best_other:.1f} ms")
        print(f"losses identical across configurations: {'yes' if len(losses) == 1 else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
