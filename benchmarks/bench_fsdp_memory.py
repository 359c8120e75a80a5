"""plan_fsdp vs plain FSDP2: allocated bytes held between steps and peak, side by side.

    python benchmarks/bench_fsdp_memory.py [--steps 10] [--only NAME ...]

Each configuration starts its own gloo ranks (CPU processes) with torch_renaissance's
CPU allocator installed, trains the same seeded model with ``plan_fsdp(model, opt)``
and without it on the same batches (AdamW, ``zero_grad(set_to_none=True)``), and
prints, for the rank with the highest plain peak, the allocated bytes held after the
last step and the peak above the run's start. Results must be bit-identical; the
script says so per row. Configurations are the ones of issue 17 (HF GPT-2 with
n_layer 4, n_embd 256; a small HF Llama; the bundled GPT) and FSDP2 over a 2 x 2
(dp, tp) mesh with tensor-parallel MLPs. Models come from configs: nothing is
downloaded. Numbers are in MiB (2**20 bytes).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.distributed import _tasks_fsdp_memory as tasks  # noqa: E402
from tests.distributed._harness import WorkerPool  # noqa: E402

# name -> (world, kind, tp, batch)
CONFIGS = {
    "hf_gpt2_w2": (2, "hf_gpt2", 1, 2),
    "hf_gpt2_w4": (4, "hf_gpt2", 1, 2),
    "hf_llama_w2": (2, "hf_llama", 1, 2),
    "gpt_w2": (2, "gpt", 1, 4),
    "gpt_w4": (4, "gpt", 1, 4),
    "gpt_tp_2x2": (4, "gpt", 2, 4),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=None)
    args = parser.parse_args()
    has_hf = importlib.util.find_spec("transformers") is not None
    names = args.only or list(CONFIGS)
    mib = 2.0 ** 20
    header = (f"{'configuration':<14} {'held plain':>11} {'held planned':>13} "
              f"{'peak plain':>11} {'peak planned':>13} {'peak ratio':>10}  identical")
    print(header)
    print("-" * len(header))
    for name in names:
        world, kind, tp, batch = CONFIGS[name]
        if kind.startswith("hf_") and not has_hf:
            print(f"{name:<14} skipped: transformers is not installed")
            continue
        t0 = time.perf_counter()
        pool = WorkerPool(world, allocator="cpu")
        try:
            results = pool.run(tasks.memory_compare, kind, "bench", args.steps, tp, batch,
                               True, 1, timeout=1800)  # one planned/plain pair
        finally:
            pool.close()
        r = max(results, key=lambda r: r["plain_peak"])
        identical = all(x["losses_equal"] and x["params_equal"] and x["state_equal"]
                        for x in results)
        print(f"{name:<14} {r['plain_held'][-1] / mib:>11.1f} {r['planned_held'][-1] / mib:>13.1f} "
              f"{r['plain_peak'] / mib:>11.1f} {r['planned_peak'] / mib:>13.1f} "
              f"{r['planned_peak'] / r['plain_peak']:>10.3f}  {'yes' if identical else 'NO'}"
              f"   ({time.perf_counter() - t0:.0f} s; AG shared {r['stats']['all_gather_shared']}"
              f"/{r['stats']['all_gather_planned']}, RS shared "
              f"{r['stats']['reduce_scatter_shared']}/{r['stats']['reduce_scatter_planned']})",
              flush=True)


if __name__ == "__main__":
    main()
