#!/usr/bin/env python3
"""Model slots (issue 7): switch latency and a 1,000-operation serving sequence,
side by side with plain PyTorch module loading.

Two processes (an allocator install is per process):

* ``slots``: ``torch_renaissance.install(device)`` and :class:`ModelSlots`;
* ``plain``: PyTorch's default allocator and plain modules.

Measured (sizes in bytes, times in milliseconds, medians):

1. Switch latency for stacks of square ``Linear`` layers of about 10 MB and
   100 MB of weights (``--full``: also 1 GB), weights in host memory:
   ``ModelSlots.load`` of another model of a loaded architecture (after
   ``unload``: the switch), ``ModelSlots.swap`` (new weights, same addresses),
   against ``module.load_state_dict`` into an existing module and a fresh
   device copy of a host module (``module.to(device)`` on a GPU; on the CPU,
   where ``.to("cpu")`` does nothing, ``copy.deepcopy``: the same allocation
   and copy). The device is synchronized inside every timed region. The
   allocations the arena counted during the ModelSlots switches are reported
   (they should be 0).
2. 1,000 seeded random load / unload / swap operations over 12 models of
   three architectures (``torch_renaissance.examples.serving`` at about 13,
   13 and 34 MB per model) with a forward every 10 operations: peak reserved
   (the arena's, or ``torch.cuda.max_memory_reserved``) and the peak increase of
   the process's resident memory (RSS, sampled after every operation), against
   the same sequence loading plain modules (``factory()`` under ``with
   device:`` + ``load_state_dict``, ``del`` to unload). The peak of live
   weight bytes (the models loaded at once) is the lower bound for both.

On a GPU (:func:`gpu_check`, called by ``benchmarks/gpu/bench_gpu.py``) the
slots process also captures one CUDA graph per architecture of the serving
examples and replays it for every model loaded into the captured slot set,
comparing each output with the plain module's.

Usage::

    python benchmarks/bench_model_slots.py                 # CPU, 10 MB and 100 MB
    python benchmarks/bench_model_slots.py --full          # and 1 GB
    python benchmarks/bench_model_slots.py --device cuda   # the same on a GPU
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, child_env, git_rev, last_result, machine, table as md  # noqa: E402
MB = 1000 * 1000
SIZES = {"10MB": (1024, 10 * MB), "100MB": (2048, 100 * MB), "1GB": (4096, 1000 * MB)}
REPS = {"10MB": 30, "100MB": 10, "1GB": 5}


# --- models and weights (host memory) -----------------------------------------------


def square_mlp(d: int, target: int):
    """Factory of Linear(d, d) layers with ReLU between, about ``target`` bytes."""
    import torch.nn as nn

    layers = max(1, round(target / (4 * (d * d + d))))

    def make():
        mods = []
        for i in range(layers):
            mods.append(nn.Linear(d, d))
            if i + 1 < layers:
                mods.append(nn.ReLU())
        return nn.Sequential(*mods)

    return make


def host_weights(factory, seed: int) -> dict:
    """A state_dict of ``factory``'s shapes, filled from a seeded generator (fast)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: (v.shape, v.dtype) for k, v in factory().state_dict().items()}
    return {k: torch.rand(s, generator=g, dtype=dt) * 0.05 if dt.is_floating_point
            else torch.zeros(s, dtype=dt) for k, (s, dt) in shapes.items()}


def serving_archs():
    """The three serving architectures at benchmark size (factories, inputs)."""
    from torch_renaissance.examples import serving as S

    factories = {
        "mlp": lambda: S.MLP(64, 1024, 16, 4),
        "gnn": lambda: S.MessagePassingGNN(32, 512, 8, 4),
        "moe": lambda: S.MoEModel(32, 256, 1024, 16, 8),
    }
    return factories, {a: S.example_inputs(a) for a in factories}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> None:
    """``malloc_trim(0)`` where glibc has it (returns free heap pages to the OS)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def ms(seconds: list) -> float:
    return 1000 * statistics.median(seconds)


def sequence_ops(names: list, seed: int = 1234, n: int = 1000):
    """The seeded operation list: (op, name, version)."""
    rng = random.Random(seed)
    loaded: dict = {}
    ops = []
    for _ in range(n):
        free = [m for m in names if m not in loaded]
        op = rng.choice((["load"] if free else []) + (["unload", "swap"] if loaded else []))
        if op == "load":
            m = rng.choice(free)
            loaded[m] = rng.randrange(2)
        elif op == "unload":
            m = rng.choice(sorted(loaded))
            del loaded[m]
        else:
            m = rng.choice(sorted(loaded))
            loaded[m] ^= 1
        ops.append((op, m, loaded.get(m, 0)))
    return ops


# --- workers ----------------------------------------------------------------------


def worker(kind: str, part: str, device: str, sizes: list, threads: int = 0) -> dict:
    """One measurement (``part``: switch, sequence or graphs) of one kind, in
    its own process. Returns the numbers as a dict."""
    import torch

    dev = torch.device(device)
    torch.set_grad_enabled(False)
    if threads:
        torch.set_num_threads(threads)
    out: dict = {"kind": kind, "device": str(dev), "threads": torch.get_num_threads()}
    # Everything compared against is made first (host memory, default allocator).
    factories, inputs = serving_archs()
    names = [f"{a}{j}" for a in factories for j in range(4)]
    seq_weights, size_weights = {}, {}
    if part == "sequence":
        seq_weights = {m: [host_weights(factories[m[:3]], 100 * names.index(m) + v)
                           for v in range(2)] for m in names}
    elif part == "switch":
        for label in sizes:
            d, target = SIZES[label]
            f = square_mlp(d, target)
            size_weights[label] = (f, d, [host_weights(f, 7 * i + 1) for i in range(3)])
    if dev.type == "cuda":
        for w in list(seq_weights.values()) + [v[2] for v in size_weights.values()]:
            for sd in w:
                for k in sd:
                    sd[k] = sd[k].pin_memory()  # for both: what a server keeps
    gc.collect()
    trim_heap()  # free heap pages back to the OS: RSS counts from here
    base_rss = rss()
    import torch_renaissance

    tr = None  # the package when it is installed for the device
    if kind == "slots":
        try:
            torch_renaissance.install(device)
            tr = torch_renaissance
            out["allocator"] = "torch_renaissance"
        except Exception as e:  # noqa: BLE001 - e.g. a build without CUDA: measured natively
            out["allocator"] = f"PyTorch default ({type(e).__name__}: {e})"
    else:
        out["allocator"] = "PyTorch default"
    if part == "sequence":
        out["sequence"] = _sequence(torch, tr, kind, dev, factories, inputs, names, seq_weights,
                                    base_rss)
        return out
    if part == "graphs":
        out["graphs"] = _graph_check(torch, dev)
        return out
    out["switch"] = {}

    def allocations() -> int:
        return tr.memory_stats(dev)["allocation.all.allocated"] if tr else 0

    for label in sizes:
        f, d, srcs = size_weights[label]
        nbytes = sum(t.numel() * t.element_size() for t in srcs[0].values())
        reps = REPS[label]
        row = {"bytes": nbytes}
        x = torch.randn(8, d)
        if kind == "slots":
            slots = torch_renaissance.ModelSlots(dev)
            slots.register(label, f, (x,))
            slots.load("A", label, srcs[0])
            sync(torch, dev)
            loads, swaps, n_alloc = [], [], 0
            cur, other = "A", "B"
            for r in range(reps):
                slots.unload(cur)
                a0 = allocations()
                sync(torch, dev)
                t0 = time.perf_counter()
                slots.load(other, label, srcs[1 + r % 2])
                sync(torch, dev)
                loads.append(time.perf_counter() - t0)
                cur, other = other, cur
                t0 = time.perf_counter()
                slots.swap(cur, srcs[r % 2])
                sync(torch, dev)
                swaps.append(time.perf_counter() - t0)
                n_alloc += allocations() - a0
            row.update(load_ms=ms(loads), swap_ms=ms(swaps),
                       switch_allocations=n_alloc if tr else None)
            slots.unload(cur)
            slots.release_free()
            del slots
        else:
            m = f().to(dev).eval()
            m.load_state_dict(srcs[2])  # warm-up, as the first ModelSlots load
            lsd, fresh = [], []
            for r in range(reps):
                sync(torch, dev)
                t0 = time.perf_counter()
                m.load_state_dict(srcs[r % 3])
                sync(torch, dev)
                lsd.append(time.perf_counter() - t0)
            host = f().eval()
            host.load_state_dict(srcs[0])
            for r in range(reps):
                if dev.type == "cpu":
                    t0 = time.perf_counter()
                    c = copy.deepcopy(host)
                else:
                    h = copy.deepcopy(host)
                    for t in list(h.parameters()) + list(h.buffers()):
                        t.data = t.data.pin_memory()  # as the ModelSlots sources
                    sync(torch, dev)
                    t0 = time.perf_counter()
                    c = h.to(dev)  # the same module, moved
                    sync(torch, dev)
                fresh.append(time.perf_counter() - t0)
                del c
            row.update(load_state_dict_ms=ms(lsd), fresh_copy_ms=ms(fresh))
            del m, host
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        out["switch"][label] = row
        print(f"  [{kind}] {label}: {row}", file=sys.stderr, flush=True)

    return out


def _sequence(torch, tr, kind, dev, factories, inputs, names, weights, base_rss) -> dict:
    ops = sequence_ops(names)
    xs = {a: tuple(t.to(dev) for t in v) for a, v in inputs.items()}
    nbytes = {a: sum(t.numel() * t.element_size() for t in weights[f"{a}0"][0].values())
              for a in factories}
    live, live_peak = 0, 0
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    if tr is not None:
        tr.reset_peak_memory_stats(dev)
    peak_rss = 0
    t0 = time.perf_counter()
    if kind == "slots":
        import torch_renaissance

        slots = torch_renaissance.ModelSlots(dev)
        for a, f in factories.items():
            slots.register(a, f, xs[a])
        for i, (op, m, v) in enumerate(ops):
            if op == "load":
                slots.load(m, m[:3], weights[m][v])
            elif op == "unload":
                slots.unload(m)
            else:
                slots.swap(m, weights[m][v])
            if i % 10 == 0 and len(slots.models()):
                name = sorted(slots.models())[i % len(slots.models())]
                y = slots.forward(name, *xs[name[:3]])
                del y
            live = sum(nbytes[n[:3]] for n in slots.models())
            live_peak = max(live_peak, live)
            peak_rss = max(peak_rss, rss() - base_rss)
        held = slots.held_bytes
        acts = {a: slots.layout(a).activation_bytes for a in factories}
    else:
        models = {}
        for i, (op, m, v) in enumerate(ops):
            if op == "load":
                with dev:  # built on the device, then the weights copied in
                    mod = factories[m[:3]]()
                mod.load_state_dict(weights[m][v])
                models[m] = mod.eval()
            elif op == "unload":
                del models[m]
            else:
                models[m].load_state_dict(weights[m][v])
            if i % 10 == 0 and models:
                name = sorted(models)[i % len(models)]
                models[name](*xs[name[:3]])
            live = sum(nbytes[n[:3]] for n in models)
            live_peak = max(live_peak, live)
            peak_rss = max(peak_rss, rss() - base_rss)
        held, acts = None, None
    sync(torch, dev)
    seconds = time.perf_counter() - t0
    if tr is not None:
        peak_reserved = tr.memory_stats(dev)["reserved_bytes.all.peak"]
    elif dev.type == "cuda":
        peak_reserved = torch.cuda.max_memory_reserved(dev)
    else:
        peak_reserved = None
    return {"ops": len(ops), "seconds": seconds, "peak_reserved": peak_reserved,
            "peak_rss_increase": peak_rss, "peak_live_weight_bytes": live_peak,
            "slot_sets_held": held, "activation_bytes": acts}


def _graph_check(torch, dev) -> dict:
    """One CUDA graph per serving architecture, replayed for 4 models each."""
    import torch_renaissance
    from torch_renaissance.examples import serving as S

    res = {}
    slots = torch_renaissance.ModelSlots(dev)
    for a, factory in S.ARCHITECTURES.items():
        try:
            x = tuple(t.to(dev) for t in S.example_inputs(a))
            slots.register(a, factory, x)
            ws = [S.make_weights(a, 500 + j) for j in range(4)]
            refs = []
            for w in ws:
                m = factory()
                m.load_state_dict(w)
                refs.append(m.to(dev).eval()(*x))
            module = slots.load(f"{a}0", a, ws[0])
            addr = slots.slot_set_address(f"{a}0")
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(3):
                    module(*x)
            torch.cuda.current_stream(dev).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = module(*x)
            diffs, same_addr = [], []
            prev = f"{a}0"
            for j, w in enumerate(ws):
                if j:
                    slots.unload(prev)
                    prev = f"{a}{j}"
                    slots.load(prev, a, w)
                same_addr.append(slots.slot_set_address(prev) == addr)
                g.replay()
                torch.cuda.synchronize(dev)
                diffs.append(float((static_out - refs[j]).abs().max()))
            ok = all(same_addr) and all(d <= 1e-4 for d in diffs)
            res[a] = {"models": len(ws), "max_abs_diff": max(diffs), "same_slot_set": all(same_addr),
                      "ok": ok}
            slots.unload(prev)
        except Exception as e:  # noqa: BLE001 - reported per architecture
            res[a] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return res


# --- driver -----------------------------------------------------------------------


def run(device: str, sizes: list, timeout: float, graphs: bool = False, threads: int = 0) -> dict:
    """Runs every measurement in its own process; returns ``{"slots": {...},
    "plain": {...}}`` (an ``error`` entry where one failed or timed out)."""
    jobs = [("slots", "switch"), ("plain", "switch"), ("slots", "sequence"), ("plain", "sequence")]
    if graphs:
        jobs.append(("slots", "graphs"))
    results: dict = {"slots": {}, "plain": {}}
    t_end = time.monotonic() + timeout
    for i, (kind, part) in enumerate(jobs):
        budget = (t_end - time.monotonic()) / (len(jobs) - i)
        env = child_env()
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--part", part,
               "--device", device, "--sizes", ",".join(sizes), "--threads", str(threads)]
        try:
            p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=max(budget, 1))
            sys.stderr.write(p.stderr[-3000:])
            result = last_result(p.stdout)
            if p.returncode == 0 and result is not None:
                results[kind].update(result)
            else:
                results[kind].setdefault("error", []).append(
                    f"{part}: exit {p.returncode}: "
                    + (p.stderr.strip().splitlines() or ["?"])[-1][:300])
        except subprocess.TimeoutExpired:
            results[kind].setdefault("error", []).append(f"{part}: timed out after {budget:.0f} s")
    return results


def _fmt_mb(n) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


def table(results: dict, machine: str = "") -> str:
    """Both tables as Markdown."""

    s, p = results.get("slots", {}), results.get("plain", {})
    lines = []
    if machine:
        lines.append(machine)
    for who, r in (("ModelSlots", s), ("plain", p)):
        if "error" in r:
            lines.append(f"{who}: " + "; ".join(r["error"]))
    lines.append(f"device {s.get('device') or p.get('device')}, {s.get('threads') or p.get('threads')} "
                 f"intra-op thread(s); ModelSlots process: {s.get('allocator', '?')}; plain process: "
                 f"{p.get('allocator', '?')}")
    rows = []
    fresh = "new copy: .to(device)" if "cuda" in str(s.get("device") or p.get("device")) \
        else "new copy: deepcopy (CPU)"
    for label in SIZES:
        a, b = s.get("switch", {}).get(label), p.get("switch", {}).get(label)
        if not a and not b:
            continue
        nb = (a or b)["bytes"]

        def cell(d, k):
            return f"{d[k]:.2f}" if d and d.get(k) is not None else "n/a"

        allocs = a.get("switch_allocations") if a else None
        rows.append([f"{nb / MB:,.1f} MB", cell(a, "load_ms"), cell(a, "swap_ms"),
                     cell(b, "load_state_dict_ms"), cell(b, "fresh_copy_ms"),
                     "n/a" if allocs is None else str(allocs)])
    lines.append("")
    lines.append("Switch latency (ms, median; host weights)")
    lines.append(md(["weights", "ModelSlots load (switch)", "ModelSlots swap",
                     "load_state_dict", fresh, "allocations in switches"], rows))
    sa, pa = s.get("sequence"), p.get("sequence")
    lines.append("")
    lines.append("1,000 random load/unload/swap over 12 models (3 architectures), forward every 10")
    rows = []
    for who, r in (("ModelSlots + torch_renaissance", sa), ("plain modules, default allocator", pa)):
        if not r:
            rows.append([who] + ["n/a"] * 5)
            continue
        rows.append([who, _fmt_mb(r["peak_reserved"]), _fmt_mb(r["peak_rss_increase"]),
                     _fmt_mb(r["peak_live_weight_bytes"]),
                     _fmt_mb(r["slot_sets_held"]) if r.get("slot_sets_held") is not None else "-",
                     f"{r['seconds']:.2f}"])
    lines.append(md(["", "peak reserved", "peak RSS increase", "peak live weights",
                     "slot sets held (end)", "time (s)"], rows))
    if sa and sa.get("activation_bytes"):
        acts = sa["activation_bytes"]
        lines.append("activation plans (bytes of planned territory one forward occupies): "
                     + ", ".join(f"{a} {_fmt_mb(v)}" for a, v in acts.items()))
    g = s.get("graphs")
    if g:
        lines.append("")
        lines.append("CUDA graph captured once per architecture, replayed for every model: "
                     + "; ".join(f"{a}: " + (f"ok, {v['models']} models, max |diff| {v['max_abs_diff']:.1e}"
                                             if v.get("ok") else f"FAILED {v}") for a, v in g.items()))
    return "\n".join(lines)


def gpu_check(timeout: float = 120.0, sizes=None) -> dict:
    """The GPU part, for ``benchmarks/gpu/bench_gpu.py``: both workers on
    ``cuda`` plus the CUDA graph check. Returns ``{"skipped": reason}``
    without CUDA, else the results and the table text."""
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"no torch: {e}"}
    if not torch.cuda.is_available():
        return {"skipped": "CUDA is not available"}
    if sizes is None:
        sizes = ["10MB", "100MB", "1GB"] if timeout >= 150 else ["10MB", "100MB"]
    res = run("cuda", sizes, timeout, graphs=True)
    return {"results": res, "table": table(res)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--full", action="store_true", help="also the 1 GB model")
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["slots", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--part", choices=["switch", "sequence", "graphs"], help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for both workers")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads in the workers (default: 1 on the CPU, where "
                         "OpenMP threads spin-waiting on a shared machine swamp the copies; "
                         "PyTorch's default on a GPU)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    sizes = args.sizes.split(",") if args.sizes else (list(SIZES) if args.full else ["10MB", "100MB"])
    threads = args.threads if args.threads is not None else (0 if args.device.startswith("cuda") else 1)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.part, args.device, sizes, threads)),
              flush=True)
        return 0
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("CUDA is not available; nothing to do")
            return 0

    res = run(args.device, sizes, args.timeout, graphs=args.device.startswith("cuda"), threads=threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    print(f"Model slots benchmark — {machine()} — commit {git_rev()}")
    print(table(res))
    return 0 if all("error" not in r for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
