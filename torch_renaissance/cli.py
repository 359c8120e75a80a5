"""``torch-renaissance``: run a script on the planned arena, the demo, plan a trace.

Subcommands (``torch-renaissance <cmd> --help`` for options):

* ``run SCRIPT [ARGS...]`` runs an unchanged PyTorch script as ``python SCRIPT``
  would, with the allocator installed before its first tensor and every
  ``optimizer.step()`` as a step boundary; prints a memory report to stderr at
  exit (``--report PATH`` also writes it as JSON).
* ``demo`` trains the bundled GPT with PyTorch's default CPU allocator, the
  dynamic pool only, and the planned arena (one process each) and prints the
  numbers side by side.
* ``plan TRACE`` plans a recorded trace (PyTorch snapshot pickle or
  ``id,lower,upper,size`` CSV) and prints LOAD, greedy by size, our plan,
  PyTorch's recorded peak reserved and the planning time.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import stat
import subprocess
import sys
from typing import List, Optional


def _mib(n: Optional[float]) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------

def _print_report(rep: dict, out) -> None:
    lines = [
        "torch_renaissance memory report",
        f"  device                 {rep['device']}",
        f"  peak allocated         {_mib(rep['peak_allocated_bytes'])}",
        f"  peak reserved          {_mib(rep['peak_reserved_bytes'])}",
        f"  fragmentation          {100 * rep['fragmentation']:.1f}%  (1 - peak allocated / peak reserved)",
        f"  allocations            {rep['allocations']}",
        f"  out-of-memory errors   {rep['num_ooms']}",
    ]
    if rep["steps"]:
        lines.append(f"  optimizer steps        {rep['steps']}  (mean {1000 * rep['mean_step_seconds']:.1f} ms)")
        lines.append(f"  planned steps          {rep['planned_steps']}  (hits {rep['plan_hits']}, misses "
                     f"{rep['plan_misses']}, conflicts {rep['plan_conflicts']})")
        if rep["load_bytes"]:
            lines.append(f"  LOAD (lower bound)     {_mib(rep['load_bytes'])}  (peak reserved / LOAD "
                         f"{rep['peak_reserved_over_load']:.3f})")
        lines.append(f"  address stability      {100 * rep['address_stability']:.1f}%  (last step)")
    print("\n".join(lines), file=out, flush=True)


def _print_script_error(e: BaseException, script: str) -> None:
    """Prints a traceback starting at the script's own frames (as ``python SCRIPT``)."""
    import traceback

    tb = e.__traceback__
    target = os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb or e.__traceback__)


def cmd_run(args: argparse.Namespace) -> int:
    import torch_renaissance as tr

    devices = ["cpu"]
    if args.cuda:
        devices.append("cuda")
    script = args.script
    if not os.path.exists(script):
        print(f"torch-renaissance run: no such script: {script}", file=sys.stderr)
        return 2
    try:
        for d in devices:
            tr.install(d)
        # CUDA is not initialized here: the script may pick its device first.
        steps = tr.auto_steps(devices)
    except (ValueError, RuntimeError, ImportError) as e:
        print(f"torch-renaissance run: {e}", file=sys.stderr)
        return 2
    report_file = _open_report(args.report) if args.report else None
    if report_file is False:
        return 2
    sys.argv = [script] + list(args.args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    parent = os.getpid()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt as e:
        _print_script_error(e, script)
        code = 130  # as python does on Ctrl-C
    except BaseException as e:  # the script's own error: show it like python would
        _print_script_error(e, script)
        code = 1
    finally:
        # A child the script forked (os.fork()) that returned or exited through SystemExit
        # reports nothing: the report is the parent's, once.
        if os.getpid() == parent:
            code = _finish_run(tr, steps, devices, report_file, code)
    return code


def _finish_run(tr, steps, devices, report_file, code: int) -> int:
    """Stops the automatic steps, prints the report of every device the script used and
    writes ``--report``; the exit code (2 when the script succeeded and the report could
    not be written)."""
    tr.stop_auto_steps()
    times = steps.times
    # The first interval runs from the install to the first optimizer step:
    # imports, model building, the first step. Steps are counted from it,
    # the mean step time without it.
    # CUDA: the device the script left current; nothing to report when
    # the script never initialized CUDA.
    used = [d for d in devices if tr.installer.active_arena(d) is not None]
    if len(used) < len(devices):
        print("torch-renaissance run: the script did not use CUDA; no CUDA report",
              file=sys.stderr)
    reports = [tr.stats.report(d, times) for d in used]
    for rep in reports:
        _print_report(rep, sys.stderr)
    if report_file:
        code = _write_report(report_file, reports[0] if len(reports) == 1 else reports, code)
    return code


def _open_output(command: str, flag: str, path: str, consequence: str):
    """Opens an output file (``--report``, ``--json``) before any work is done (and
    before a script can change the working directory), without truncating it; False,
    with a one-line message ending in ``consequence``, when it cannot be written."""
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as e:
        reason = e.strerror or str(e)
        print(f"torch-renaissance {command}: {flag} {path}: cannot write: {reason}; {consequence}",
              file=sys.stderr)
        return False


def _open_report(path: str):
    """``--report PATH`` opened before the script runs; False: the script does not run."""
    return _open_output("run", "--report", path, "the script was not run")


def _write_json(f, data, code: int, command: str = "run", flag: str = "--report") -> int:
    """Writes ``data`` as JSON to a file from :func:`_open_output`; ``code``, or 2
    when ``code`` was 0 and the file could not be written (e.g. a full disk)."""
    try:
        with f:
            # A regular file is rewritten from its start. Not /dev/stdout, a pipe or a
            # device: truncating /dev/full fails with EINVAL and would hide the ENOSPC
            # that writing to it gives.
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                f.seek(0)
                f.truncate()
            json.dump(data, f, indent=2)
    except OSError as e:
        print(f"torch-renaissance {command}: {flag} {f.name}: cannot write: {e.strerror or e}",
              file=sys.stderr)
        return code or 2
    return code


def _write_report(f, report, code: int) -> int:
    """Writes the JSON report; the script's exit code, or 2 when the script succeeded
    and the report could not be written (e.g. a full disk)."""
    return _write_json(f, report, code)


# ---------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------

# MKL and OpenMP may use fewer threads than asked when the machine is busy
# (MKL_DYNAMIC is on by default), which changes how a matmul splits its sums
# and so the last bits of a loss: measured here, PyTorch's own allocator gave
# two different loss sequences in six runs of the demo's model under load, and
# one with these set. The demo compares allocators, so every run gets the
# same thread count.
DETERMINISTIC_THREADS = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}

DEMO_MODES = (
    ("default", "PyTorch default"),
    ("dynamic", "renaissance dynamic"),
    ("planned", "renaissance planned"),
)


def _demo_run(mode: str, args: argparse.Namespace, progress, task) -> dict:
    cmd = [sys.executable, "-m", "torch_renaissance.examples.train_gpt", "--mode", mode,
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
           "--seed", str(args.seed)]
    env = dict(os.environ)
    env.pop("TORCH_RENAISSANCE_CONF", None)
    env.update(DETERMINISTIC_THREADS)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    result = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("STEP "):
            progress.advance(task)
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0 or result is None:
        # The child's last line says what went wrong (e.g. the CPU allocator's "you tried
        # to allocate 640000000000 bytes" for --seq 100000); its traceback is noise here.
        last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
        raise _DemoFailed(f"the {mode} run failed (exit {proc.returncode})"
                          + (f": {last}" if last else ""))
    return result


class _DemoFailed(RuntimeError):
    """One of ``demo``'s child runs exited with an error (its message is one line)."""


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    json_file = _open_output("demo", "--json", args.json, "nothing was run") if args.json else None
    if json_file is False:
        return 2
    console = Console(width=None if sys.stdout.isatty() else 120)
    results = {}
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        for mode, title in DEMO_MODES:
            task = progress.add_task(title, total=args.steps)
            try:
                results[mode] = _demo_run(mode, args, progress, task)
            except _DemoFailed as e:
                progress.stop()
                print(f"torch-renaissance demo: {e}", file=sys.stderr)
                return 1

    # (printed name, value) per metric; the JSON keys are the printed names.
    def metrics(r: dict) -> list:
        planned = r["mode"] == "planned"
        mib = lambda k: None if r.get(k) is None else r[k] / 2**20
        return [
            ("mean step time (ms)", 1000 * r["mean_step_seconds"]),
            ("peak RSS (MiB)", mib("peak_rss_bytes")),
            ("peak allocated (MiB)", mib("peak_allocated_bytes")),
            ("peak reserved (MiB)", mib("peak_reserved_bytes")),
            ("fragmentation (%)", None if r.get("fragmentation") is None else 100 * r["fragmentation"]),
            ("peak reserved / LOAD", r.get("peak_reserved_over_load") if planned else None),
            ("steady peak reserved / LOAD", r.get("steady_peak_reserved_over_load") if planned else None),
            ("address stability (%)", 100 * r["address_stability"] if planned else None),
            ("plan hit rate (%)", 100 * r["plan_hit_rate"] if planned else None),
            ("final loss", r["final_loss"]),
        ]

    def text(name: str, v) -> str:
        if v is None:
            return "n/a"
        if name == "final loss":
            return f"{v:.6f}"
        if name.endswith("/ LOAD"):
            return f"{v:.3f}"
        return f"{v:.1f}"

    first = results["default"]
    table = Table(title=f"GPT ({first['params'] / 1e6:.1f} M params), {args.steps} CPU training steps, "
                        f"batch {args.batch} x {args.seq} tokens")
    table.add_column("")
    for _, title in DEMO_MODES:
        table.add_column(title, justify="right")
    table_rows = {m: metrics(results[m]) for m, _ in DEMO_MODES}
    for k, (name, _) in enumerate(table_rows["default"]):
        table.add_row(name, *(text(name, table_rows[m][k][1]) for m, _ in DEMO_MODES))
    console.print(table)
    same = len({tuple(r["losses"]) for r in results.values()}) == 1
    console.print(f"losses bit-identical across allocators: {'yes' if same else 'NO'}")
    code = 0 if same else 1
    if json_file:
        out = {title: dict(table_rows[m]) for m, title in DEMO_MODES}
        for m, title in DEMO_MODES:
            out[title]["losses"] = results[m]["losses"]
        code = _write_json(json_file, out, code, "demo", "--json")
    return code


# ---------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------

def _plan_json(tr_, res) -> dict:
    return {
        "buffers": len(tr_),
        "load_bytes": res.load_bytes,
        "greedy_bytes": res.greedy_bytes,
        "plan_bytes": res.plan_bytes,
        "lower_bound_bytes": res.lower_bound_bytes,
        "optimal": res.optimal,
        "stopped_by": res.stopped_by,
        "pytorch_reserved_bytes": tr_.pytorch_reserved_peak,
        # What PyTorch held when the snapshot was taken: the only reserved number of a
        # snapshot without segment events (its peak is then unknown).
        "pytorch_reserved_at_dump_bytes": tr_.pytorch_reserved_at_dump,
        "plan_seconds": res.seconds,
    }


def _load_for_plan(args: argparse.Namespace):
    """``{device or None: Trace}`` for ``plan``; raises ValueError/OSError with a CLI message."""
    from torch_renaissance import trace as trace_mod

    if args.device is None:
        try:
            return {None: trace_mod.load_trace(args.trace)}
        except trace_mod.DeviceChoiceError as e:
            raise ValueError(f"{args.trace}: the snapshot has data for devices {e.devices}; "
                             "choose one with --device N, or --device all") from None
    if not trace_mod.is_snapshot_file(args.trace):
        raise ValueError(f"{args.trace}: --device applies to PyTorch snapshots; "
                         "a CSV trace has no devices (drop --device)")
    if args.device == "all":
        return trace_mod.load_snapshot_devices(args.trace)
    # Every device with events or segments, read once: a device that has neither (one
    # of device_traces' empty lists) is refused like one past the list, not planned as
    # 0 buffers.
    with_data = trace_mod.load_snapshot_devices(args.trace)
    if args.device not in with_data:
        raise ValueError(f"{args.trace}: --device {args.device}: no data for that device in the "
                         f"snapshot (devices with data: {sorted(with_data)})")
    return {args.device: with_data[args.device]}


def cmd_plan(args: argparse.Namespace) -> int:
    from torch_renaissance import trace as trace_mod
    from torch_renaissance.planner import plan_trace

    try:
        traces = _load_for_plan(args)
    except (OSError, ValueError) as e:
        print(f"torch-renaissance plan: {e}", file=sys.stderr)
        return 2
    results = {}
    for dev, tr_ in traces.items():
        try:
            results[dev] = plan_trace(tr_, budget_seconds=args.budget)
        except (ValueError, TypeError, OverflowError) as e:
            where = args.trace if dev is None else f"{args.trace} (device {dev})"
            print(f"torch-renaissance plan: {where}: cannot plan: {e}", file=sys.stderr)
            return 2
    if args.device == "all":
        return _plan_all(args, traces, results)
    tr_, res = traces[next(iter(traces))], results[next(iter(results))]
    out = _plan_json(tr_, res)
    png_error = None
    if args.png:
        try:
            trace_mod.plot_plan(tr_, res.offsets, args.png, title=os.path.basename(args.trace))
        except ImportError as e:
            png_error = str(e)
        except OSError as e:  # the plan is still printed below
            png_error = f"{args.png}: cannot write: {e.strerror or e}"
    if png_error:
        print(f"torch-renaissance plan: --png: {png_error}", file=sys.stderr)
    if args.json:
        print(json.dumps(out))
        return 2 if png_error else 0

    def vs(n):
        return "" if n is None or not res.load_bytes else f"  ({100 * (n / res.load_bytes - 1):+.2f}% vs LOAD)"

    print(f"trace              {args.trace}" + ("" if args.device is None else f"  (device {args.device})"))
    print(f"buffers            {out['buffers']}")
    print(f"LOAD               {_mib(res.load_bytes)}  ({res.load_bytes} bytes)")
    print(f"greedy by size     {_mib(res.greedy_bytes)}{vs(res.greedy_bytes)}"
          + ("" if res.greedy_bytes is not None else "  (not finished within the budget)"))
    print(f"torch_renaissance  {_mib(res.plan_bytes)}{vs(res.plan_bytes)}  [{res.method}]"
          + ("  (optimal)" if res.optimal else ""))
    if tr_.pytorch_reserved_peak is None and tr_.pytorch_reserved_at_dump is not None:
        dump = tr_.pytorch_reserved_at_dump
        print(f"PyTorch reserved   {_mib(dump)}{vs(dump)}  (when the snapshot was taken; "
              "no segment events, so no peak)")
    else:
        print(f"PyTorch reserved   {_mib(tr_.pytorch_reserved_peak)}{vs(tr_.pytorch_reserved_peak)}")
    print(f"planning time      {res.seconds:.3f} s  (stopped by: {_STOPPED[res.stopped_by]})")
    if args.png and not png_error:
        print(f"packing drawn to   {args.png}")
    return 2 if png_error else 0


_STOPPED = {"bound": "the lower bound", "work": "the work count", "clock": "the wall clock",
            "done": "nothing left to try"}


def _plan_all(args: argparse.Namespace, traces, results) -> int:
    """``plan --device all``: one row (JSON object) per device and the totals."""
    if args.png:
        print("torch-renaissance plan: --png draws one device; use --device N with it", file=sys.stderr)
        return 2
    per = {dev: _plan_json(traces[dev], results[dev]) for dev in traces}

    def total(key):
        vals = [o[key] for o in per.values()]
        return None if any(v is None for v in vals) else sum(vals)

    totals = {k: total(k) for k in ("buffers", "load_bytes", "greedy_bytes", "plan_bytes",
                                    "lower_bound_bytes", "pytorch_reserved_bytes",
                                    "pytorch_reserved_at_dump_bytes", "plan_seconds")}
    totals["optimal"] = all(o["optimal"] for o in per.values())
    # The total's PyTorch column: each device's peak reserved, or its reserved bytes at
    # dump time where the snapshot has no segment events (marked), so that the sum is
    # compared with the sum of the LOADs of the same devices.
    if totals["pytorch_reserved_bytes"] is None:
        each = [o["pytorch_reserved_bytes"] if o["pytorch_reserved_bytes"] is not None
                else o["pytorch_reserved_at_dump_bytes"] for o in per.values()]
        totals["pytorch_reserved_at_dump_bytes"] = (None if any(v is None for v in each)
                                                    else sum(each))
    if args.json:
        print(json.dumps({"devices": [{"device": d, **o} for d, o in per.items()], "total": totals}))
        return 0

    def pct(n, load):
        return "n/a" if n is None or not load else f"{100 * (n / load - 1):+.2f}%"

    print(f"trace  {args.trace}")
    print(f"{'device':>8} {'buffers':>8} {'LOAD':>12} {'greedy':>9} {'plan':>12} {'plan/LOAD':>9} "
          f"{'PyTorch':>9} {'seconds':>8}")
    rows = [(str(d), o) for d, o in per.items()] + [("total", totals)]
    at_dump = False
    for name, o in rows:
        reserved, mark = o["pytorch_reserved_bytes"], " "
        if reserved is None and o["pytorch_reserved_at_dump_bytes"] is not None:
            reserved, mark, at_dump = o["pytorch_reserved_at_dump_bytes"], "*", True
        print(f"{name:>8} {o['buffers']:>8} {_mib(o['load_bytes']):>12} "
              f"{pct(o['greedy_bytes'], o['load_bytes']):>9} {_mib(o['plan_bytes']):>12} "
              f"{pct(o['plan_bytes'], o['load_bytes']):>9} "
              f"{pct(reserved, o['load_bytes']):>8}{mark} {o['plan_seconds']:>8.3f}")
    if at_dump:
        print("* PyTorch's reserved bytes when the snapshot was taken (no segment events, so no peak)")
    return 0


def _device(text: str):
    if text == "all":
        return "all"
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a device index (0, 1, ...) or 'all', got {text!r}")
    return int(text)


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 3600.0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, got {text}")
    return value


def _int_at_least(minimum: int, why: str = ""):
    def parse(text: str) -> int:
        digits = text[1:] if text[:1] in ("+", "-") else text
        if not (digits.isascii() and digits.isdigit()):  # int() would take "1_0" and "٣"
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, got {value}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torch-renaissance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a PyTorch script on the planned arena")
    r.add_argument("--report", metavar="PATH", help="also write the report as JSON")
    r.add_argument("--cuda", action="store_true", help="also install the CUDA allocator")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_run)

    d = sub.add_parser("demo", help="train the bundled GPT under three allocators")
    d.add_argument("--steps", type=_int_at_least(4, " (steps 0-2 record, plan and replay; the "
                                                     "mean step time is over steps 3 on)"),
                   default=20)
    d.add_argument("--batch", type=_int_at_least(1), default=4)
    d.add_argument("--seq", type=_int_at_least(1), default=128)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    d.set_defaults(fn=cmd_demo)

    q = sub.add_parser("plan", help="plan a recorded trace and compare")
    q.add_argument("trace")
    q.add_argument("--budget", type=_budget, default=1.0,
                   help="planning time budget in seconds of wall time (0-3600; default: 1.0); "
                        "the plan is the same on every machine unless the wall clock stopped "
                        "the search")
    q.add_argument("--device", type=_device, default=None, metavar="N|all",
                   help="the device of a multi-device PyTorch snapshot, or 'all' (one row per "
                        "device and the totals)")
    q.add_argument("--png", metavar="PATH", help="draw the packing (address x time)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(fn=cmd_plan)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
