"""Train the bundled GPT on synthetic tokens with one allocator, print JSON.

Run as ``python -m torch_renaissance.examples.train_gpt --mode planned``.
Modes: ``default`` (PyTorch's CPU allocator), ``dynamic`` (torch_renaissance,
dynamic pool only) and ``planned`` (torch_renaissance, optimizer steps as step
boundaries). Prints ``STEP <i> <loss>`` per step and one ``RESULT <json>``
line at the end; ``torch-renaissance demo`` runs one process per mode.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=("default", "dynamic", "planned"), default="planned")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import torch_renaissance as tr

    if args.mode != "default":
        tr.install("cpu", planning=args.mode == "planned")
    from torch_renaissance.examples import gpt

    cfg = gpt.GPTConfig(seq_len=args.seq, d_model=args.d_model, n_layer=args.layers)
    model, opt = gpt.make(cfg, seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    if args.mode == "planned":
        tr.auto_steps(["cpu"])
    losses, times = [], []
    early_reserved = early_allocated = 0
    for i in range(args.steps):
        if i == 3 and args.mode != "default":
            # Steps 0 and 1 are recorded, step 2 is the first replay: from step
            # 3 on is the steady state. Keep the whole run's peaks too.
            early_reserved = tr.max_memory_reserved("cpu")
            early_allocated = tr.max_memory_allocated("cpu")
            tr.reset_peak_memory_stats("cpu")
        x, y = gpt.synthetic_batch(gen, args.batch, args.seq, cfg.vocab_size)
        t0 = time.perf_counter()
        loss = gpt.train_step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        # A batch kept until the next one exists would live across two steps
        # (served apart, at alternating addresses): drop it with its step.
        del x, y
        print(f"STEP {i} {losses[-1]:.6f}", flush=True)
    result = {
        "mode": args.mode,
        "steps": args.steps,
        "params": sum(q.numel() for q in model.parameters()),
        "losses": losses,
        "final_loss": losses[-1],
        # Skip the first steps (warm-up, recording) in the mean.
        "mean_step_seconds": sum(times[3:]) / max(1, len(times[3:])),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if args.mode != "default":
        tr.stop_auto_steps()
        rep = tr.stats.report("cpu", earlier_peaks=(early_allocated, early_reserved))
        for key in ("steps", "mean_step_seconds"):  # ours are measured around train_step
            rep.pop(key)
        result.update(rep)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
