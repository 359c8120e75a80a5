"""Third-party models run unchanged under ``torch-renaissance run`` vs PyTorch's CPU allocator (issue 16).

Each row runs ``benchmarks/models/hf_train.py`` (an ordinary loop: ``out = model(**batch)``,
``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``) alternately with plain ``python``
(PyTorch's default CPU allocator) and under ``torch-renaissance run --report``, ``--repeats``
times each, and prints: losses bit-identical, plan hit rate, address stability, peak reserved /
peak allocated for the whole run and for the steady state (after the recorded steps and each plan's first replay),
the plans made and the planner's time over the run (on the training thread, at the steps that make them), the
wall-time ratio of the whole processes (ours / PyTorch's, medians of the alternated runs; imports
and model building included) and peak RSS of both.

    python benchmarks/bench_models.py [--rows gpt2,llama,bert,t5,vit-bf16-2t,cnn,mlp,lstm,gru,gpt2-var,llama-var,bert-var,t5-var,
                                                    gpt2-compile,llama-eval5,qwen2moe-eager,generate,generate-keyed]
                                      [--steps 30] [--repeats 1]

Needs ``transformers`` (models are built from configs with random init; nothing is downloaded).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "models" / "hf_train.py"
ROWS = {
    "gpt2": ["--arch", "gpt2"],
    "llama": ["--arch", "llama"],
    "bert": ["--arch", "bert", "--batch", "8"],
    "t5": ["--arch", "t5"],
    "cnn": ["--arch", "cnn", "--batch", "8"],
    "vit-bf16-2t": ["--arch", "vit", "--batch", "16", "--bf16", "--threads", "2"],
    "mlp": ["--arch", "mlp", "--batch", "8", "--seq", "64"],
    "lstm": ["--arch", "lstm", "--batch", "16", "--seq", "32"],
    "gru": ["--arch", "gru", "--batch", "16", "--seq", "32"],
    "gpt2-var": ["--arch", "gpt2", "--seq-range", "32", "256"],
    "llama-var": ["--arch", "llama", "--seq-range", "32", "256"],
    "bert-var": ["--arch", "bert", "--batch", "8", "--seq-range", "32", "256"],
    "t5-var": ["--arch", "t5", "--seq-range", "32", "256"],
    "gpt2-compile": ["--arch", "gpt2", "--compile"],
    # Step structures that change (issue 16): a no_grad eval every 5 steps, eager MoE routing.
    "llama-eval5": ["--arch", "llama", "--eval-every", "5"],
    "qwen2moe-eager": ["--arch", "qwen2moe", "--experts", "eager"],
    "generate": ["--arch", "gpt2", "--generate", "16,64,128", "--new-tokens", "32", "--rounds", "4"],
    "generate-keyed": ["--arch", "gpt2", "--generate", "16,64,128", "--new-tokens", "32", "--rounds", "4",
                       "--keyed"],
}


def _child(cmd, env):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return wall


def run_row(name: str, steps: int, repeats: int) -> dict:
    extra = ROWS[name] + ["--steps", str(steps)]
    env = dict(os.environ)
    env.pop("TORCH_RENAISSANCE_CONF", None)
    env.update({"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"})  # cli.DETERMINISTIC_THREADS
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    ours, base, rss_ours, rss_base = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        rep_path, la, lb = f"{d}/r.json", f"{d}/a.json", f"{d}/b.json"
        run_opts = ["--step-on", "transformers.GenerationMixin.generate"] if name == "generate" else []
        for _ in range(repeats):  # alternated, so load drifts hit both alike
            for mode in ("base", "ours"):
                timing = f"{d}/t_{mode}.json"
                if mode == "base":
                    cmd = [sys.executable, str(HERE / "models" / "_timed.py"), timing, str(SCRIPT), *extra,
                           "--losses", lb]
                else:
                    cmd = [sys.executable, str(HERE / "models" / "_timed.py"), timing, "--run",
                           "--report", rep_path, *run_opts, str(SCRIPT), *extra, "--losses", la]
                _child(cmd, env)
                t = json.load(open(timing))
                (base if mode == "base" else ours).append(t["seconds"])
                (rss_base if mode == "base" else rss_ours).append(t["peak_rss_bytes"])
        rep = json.load(open(rep_path))
        same = json.load(open(la)) == json.load(open(lb))
    return {
        "row": name, "identical": same, "report": rep,
        "wall_ratio": statistics.median(ours) / statistics.median(base),
        "rss_ours": max(rss_ours), "rss_base": max(rss_base),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--repeats", type=int, default=1, help="alternated runs per allocator")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    a = p.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("bench_models: transformers is not installed (pip install transformers)", file=sys.stderr)
        return 2
    rows = []
    fmt = lambda v, f="{:.3f}": "n/a" if v is None else f.format(v)
    print(f"{'row':<14} {'losses':<10} {'hit rate':>8} {'stab':>6} {'res/alloc':>9} {'steady':>7} "
          f"{'variants':>8} {'confl':>5} {'plans':>5} {'plan s':>6} {'wall ours/pt':>12} {'RSS ours':>9} "
          f"{'RSS pt':>8}")
    for name in a.rows.split(","):
        r = run_row(name, a.steps, a.repeats)
        rows.append(r)
        rep = r["report"]
        hit = rep["plan_hit_rate"]
        print(f"{name:<14} {'identical' if r['identical'] else 'DIFFER':<10} "
              f"{fmt(None if hit is None else 100 * hit, '{:.1f}%'):>8} "
              f"{fmt(None if rep['address_stability'] is None else 100 * rep['address_stability'], '{:.1f}%'):>6} "
              f"{fmt(rep['peak_reserved_over_peak_allocated']):>9} "
              f"{fmt(rep['steady_peak_reserved_over_peak_allocated']):>7} {rep['variants']:>8} {rep['plan_conflicts']:>5} "
              f"{rep['plans']:>5} {rep['plan_seconds']:>6.2f} {r['wall_ratio']:>12.3f} {r['rss_ours'] / 2**20:>8.0f}M {r['rss_base'] / 2**20:>7.0f}M", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
