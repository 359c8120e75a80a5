"""torch-renaissance: run a PyTorch program on the planned arena, show the demo, plan a trace.

Commands (torch-renaissance COMMAND --help for each one's options):

  run SCRIPT [ARGS...]    run an unchanged PyTorch script as `python SCRIPT ARGS` would, with
  run -m MODULE [ARGS...] the allocator installed before its first tensor; every
                          optimizer.step() is a step boundary (--step-on adds others); prints a
                          memory report to stderr at exit (--report PATH: also as JSON)
  demo                    train the bundled GPT with PyTorch's CPU allocator, the dynamic pool
                          only, and the planned arena (one process each), numbers side by side
  plan TRACE              plan a recorded trace (PyTorch snapshot pickle or id,lower,upper,size
                          CSV): LOAD, greedy by size, our plan, PyTorch's peak reserved

Also: python -m torch_renaissance ...
"""
from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import runpy
import stat
import subprocess
import sys
import zipfile
from typing import List, Optional


def _vs_load(n, load):
    """``plan``'s comparison of ``n`` bytes with LOAD (bytes): ``"  (+1.85% vs LOAD)"``.

    A size above LOAD by less than 0.005% says how many bytes (``"  (+4 bytes over LOAD, under
    +0.01%)"``) rather than ``+0.00%``, which reads as "at LOAD" beside a search the clock
    stopped. Empty when ``n`` is None or LOAD is 0.
    """
    if n is None or not load:
        return ""
    tiny = _bytes_under_a_hundredth(n, load)
    if tiny is not None:
        return f"  (+{tiny} bytes over LOAD, under +0.01%)"
    return f"  ({100 * (n / load - 1):+.2f}% vs LOAD)"


def _bytes_under_a_hundredth(n, load) -> Optional[int]:
    """Bytes of ``n`` over ``load`` when above it by under 0.005% (which ``+.2f`` would
    print as ``+0.00%``, "at LOAD"), else None."""
    return n - load if n > load and 100 * (n / load - 1) < 0.005 else None


def _pct_cell(n, load) -> str:
    """``plan --device all``'s table cell for ``n`` bytes against LOAD: ``"+1.85%"``; as
    :func:`_vs_load`, a size above LOAD by under 0.005% in bytes (``"+4 B"``), not ``+0.00%``;
    ``"n/a"`` when ``n`` is None or LOAD is 0."""
    if n is None or not load:
        return "n/a"
    tiny = _bytes_under_a_hundredth(n, load)
    if tiny is not None:
        return f"+{_size(tiny)}"
    return f"{100 * (n / load - 1):+.2f}%"


def _mib(n: Optional[float]) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def _size(n: Optional[float]) -> str:
    """Bytes in the unit that shows them: MiB from 1 MiB, KiB from 1 KiB, else bytes
    (one decimal; signed). For a sum and its parts, so that parts of a few KiB do not all
    print as ``0.0 MiB`` beside a total of ``0.1 MiB`` (a new user's report)."""
    if n is None:
        return "n/a"
    a = abs(n)
    if a >= 2**20:
        return _mib(n)
    if a >= 2**10:
        return f"{n / 2**10:.1f} KiB"
    return f"{int(n)} B"


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _ratio(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _print_report(rep: dict, out) -> None:
    lines = [
        "torch_renaissance memory report",
        f"  device                 {rep['device']}",
        f"  peak allocated         {_mib(rep['peak_allocated_bytes'])}",
        f"  peak reserved          {_mib(rep['peak_reserved_bytes'])}  (/ peak allocated "
        f"{_ratio(rep['peak_reserved_over_peak_allocated'])}; both over the whole run)",
        f"  fragmentation          {100 * rep['fragmentation']:.1f}%  (1 - peak allocated / peak reserved)",
        f"  allocations            {rep['allocations']}",
        f"  out-of-memory errors   {rep['num_ooms']}",
        f"  step boundaries        {rep.get('step_boundaries', rep['steps'])}"
        + (f"  (mean {1000 * rep['mean_step_seconds']:.1f} ms)" if rep["mean_step_seconds"] else ""),
    ]
    if rep["planned_steps"]:
        lines.append(f"  planned steps          {rep['planned_steps']}  (hits {rep['plan_hits']}, misses "
                     f"{rep['plan_misses']}, conflicts {rep['plan_conflicts']}, hit rate "
                     f"{100 * rep['plan_hit_rate']:.1f}%)")
        lines.append(f"  LOAD (lower bound)     {_mib(rep['load_bytes'])}  (the step's live bytes and those "
                     f"live outside it; planned territory {_mib(rep['plan_bytes'])}, "
                     f"{_plural(rep['variants'], 'variant')}, {_plural(rep['layouts'], 'layout')})")
        over = rep.get("address_stability_over") or "last step"
        lines.append(f"  address stability      {100 * rep['address_stability']:.1f}%  ({over})")
        lines.append(f"  plans made             {rep['plans']}  (planner time {rep['plan_seconds']:.2f} s)")
        if rep.get("give_ups"):
            lines.append(f"  not re-planned         {_plural(rep['give_ups'], 'structure')} whose replays kept "
                         f"outgrowing their slots (sizes that change every step, e.g. data-dependent MoE "
                         f"routing): frozen, the outgrown requests served by the dynamic pool")
    if rep["steady_reason"] is None:
        lines.append(f"  steady peak reserved   {_mib(rep['steady_peak_reserved_bytes'])}  (/ steady peak "
                     f"allocated {_ratio(rep['steady_peak_reserved_over_peak_allocated'])}, / LOAD "
                     f"{_ratio(rep['steady_peak_reserved_over_load'])}; {_steady_window(rep)})")
    else:
        lines.append(f"  steady state           n/a: {rep['steady_reason']}")
    lines.append(f"  reserved, not live     {_size(rep['reserved_bytes'] - rep['allocated_bytes'])} at "
                 f"{rep.get('reserved_where', 'exit')}: "
                 f"{_size(rep['territory_free_bytes'])} planned territory gaps, "
                 f"{_size(rep['dynamic_cache_bytes'])} dynamic pool cache, "
                 f"{_size(rep['persistent_free_bytes'])} persistent segment")
    if rep.get("above_load_bytes") is not None:
        # Its parts add up to it: the growth inside steps above the highest
        # steady boundary, then what that boundary's snapshot shows, then the
        # rest, named (a tester found most bytes unexplained when the parts
        # were taken at other moments).
        p = rep["above_load_parts"]
        lines.append(f"  above LOAD             {_size(rep['above_load_bytes'])} at the steady peak (steady peak "
                     f"reserved - LOAD) = {_size(p['within_step_bytes'])} reserved inside steps above the "
                     f"highest steady boundary (requests the plan did not serve) + at that boundary "
                     f"(step {p['boundary']}): {_size(p['plan_over_bound_bytes'])} plan over its bound (obstacles, "
                     f"slots shared by variants), {_size(p['dynamic_cache_bytes'])} dynamic pool cache, "
                     f"{_size(p['persistent_free_bytes'])} persistent segment free + {_size(p['rest_bytes'])} rest "
                     f"(not attributed: territory beyond its plan, LOAD of another layout; may be negative)")
    print("\n".join(lines), file=out, flush=True)


def _print_script_error(e: BaseException, script: Optional[str]) -> None:
    """Prints a traceback starting at the script's own frames (as ``python SCRIPT``)."""
    import traceback

    tb = e.__traceback__
    target = os.path.abspath(script) if script else None
    while target and tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if tb is None and isinstance(e, SyntaxError) and target \
            and e.filename and os.path.abspath(e.filename) == target:
        traceback.print_exception(type(e), e, None)  # the script did not compile: as python, no frames
        return
    traceback.print_exception(type(e), e, tb or e.__traceback__)


# The steady state starts after the first replayed step that no (re-)plan
# followed (as the demo: the recorded steps and the first replay behind).
# A plan made at the end of a replayed step (torch.compile's first outputs
# found to die: a re-plan at the end of the first replay) has a first replay
# of its own, with the old layout's live-outs where that plan put them, or a
# bridge around them: it is no steady step either (gpt2-compile: 1.137 with
# that step, 1.018 without). A loop that re-plans at every boundary starts
# its steady state after STEADY_AT_THE_LATEST replayed steps all the same.
STEADY_AFTER = 1
STEADY_AT_THE_LATEST = 4


def _steady_window(rep: dict) -> str:
    """Which steps the steady figures cover, in words (steps numbered from 1,
    step k ending at boundary k, as ``--plot`` numbers them)."""
    k, n = rep.get("steady_from_step"), rep.get("step_boundaries")
    if k is None:
        return "after the first replayed step"
    steps = f"step {k} to the end" if n is None or k > n else f"steps {k}-{n} and the end"
    return f"{steps}: after the recorded steps and each plan's first replay"


class _Recorder:
    """What ``run`` keeps at each step boundary: the steady-state reset and the timeline.

    Once a replayed step is over at whose end no plan was made (the
    recorded steps and each plan's first replay behind; STEADY_AFTER,
    STEADY_AT_THE_LATEST), it keeps the peaks so far and resets them, as the
    demo does; ``--plot`` samples (seconds, allocated, reserved) at every
    allocator event through a cheap poll at each boundary and in between.
    """

    def __init__(self, devices: List[str]) -> None:
        import time

        self.devices = devices
        self.earlier: dict = {}
        self.t0 = time.perf_counter()  # reset by start(), when the program starts
        self.samples: List[tuple] = []   # (seconds, allocated bytes, reserved bytes)
        self.boundaries: List[float] = []
        self.replayed_at: Optional[float] = None
        self.where: dict = {}  # device -> (reserved, allocated, where_reserved()) at the last boundary
        # device -> (same_address, comparable) when the steady state began:
        # address stability over the steady steps is the difference at the end.
        self.stable_from: dict = {}
        # device -> the steady boundary of highest reserved: (reserved, boundary
        # number, where_reserved(), plan over its bound) for above LOAD's parts.
        self.highest: dict = {}
        # device -> the first step of the steady state (numbered from 1 as the
        # plot's: step k ends at boundary k).
        self.steady_from: dict = {}
        # device -> renaissance.plans at the previous boundary.
        self.plans_before: dict = {}

    def start(self) -> None:
        """Marks the program's start: times and samples count from here."""
        import time

        self.t0 = time.perf_counter()

    def step_times(self) -> List[float]:
        """Seconds from the start to the first boundary, then between boundaries
        (every boundary: optimizer steps, ``step()``, ``--step-on`` calls)."""
        return [b - a for a, b in zip([0.0] + self.boundaries[:-1], self.boundaries)]

    def boundary(self) -> None:
        import time

        import torch_renaissance as tr

        now = time.perf_counter() - self.t0
        self.boundaries.append(now)
        for d in self.devices:
            a = tr.installer.active_arena(d)
            if a is None or d in self.earlier:
                continue
            s = tr.memory_stats(d)
            plans_before = self.plans_before.get(d, 0)
            self.plans_before[d] = s["renaissance.plans"]
            replayed = s["renaissance.planned_steps"]
            if replayed >= STEADY_AT_THE_LATEST or (
                    replayed >= STEADY_AFTER and s["renaissance.plans"] == plans_before):
                self.steady_from[d] = len(self.boundaries) + 1
                self.earlier[d] = (s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"])
                self.stable_from[d] = (s["renaissance.same_address"], s["renaissance.comparable"])
                tr.reset_peak_memory_stats(d)
                if self.replayed_at is None:
                    self.replayed_at = now
            if d in self.earlier:
                s = tr.memory_stats(d)
                where = tr.stats.where_reserved(d)
                self.where[d] = (s["reserved_bytes.all.current"], s["allocated_bytes.all.current"], where)
                if s["reserved_bytes.all.current"] > self.highest.get(d, (-1,))[0]:
                    over = max(0, s["renaissance.plan_bytes"] - s["renaissance.step_load_bytes"]
                               - s["renaissance.obstacle_bytes"])
                    self.highest[d] = (s["reserved_bytes.all.current"], len(self.boundaries), where, over)
        self.sample()

    def sample(self) -> None:
        import time

        import torch_renaissance as tr

        d = self.devices[0]
        if tr.installer.active_arena(d) is None:
            return
        a = tr.installer.get_arena(d)
        st = a.stats()
        self.samples.append((time.perf_counter() - self.t0, st["allocated_bytes"]["all"]["current"],
                             st["reserved_bytes"]["all"]["current"]))


def _sampler(rec: _Recorder, stop, period: float) -> None:
    while not stop.wait(period):
        rec.sample()


def plot_timeline(rec: _Recorder, path: str, title: str, load: Optional[int] = None,
                  peak_reserved: Optional[int] = None, peak_allocated: Optional[int] = None) -> dict:
    """Draws allocated and reserved bytes over time with the step boundaries (matplotlib).

    The samples (every 5 ms and at each boundary) can miss a short peak, so the
    exact peaks from the arena's stats (bytes) are drawn as lines and the
    highest reserved sample is marked; with few steps each step is numbered
    and the samples are dots, so a short script stays readable.

    Returns:
        What was drawn: ``{"peak_sample": (seconds, reserved bytes) or None,
        "steps_numbered": bool}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.5))
    mib = 2.0 ** 20
    ts = [t for t, _, _ in rec.samples]
    few = len(rec.samples) <= 200
    style = dict(marker="." if few else None, ms=3)
    ax.plot(ts, [a / mib for _, a, _ in rec.samples], label="allocated", lw=1, **style)
    ax.plot(ts, [r / mib for _, _, r in rec.samples], label="reserved", lw=1.5, **style)
    for i, b in enumerate(rec.boundaries):
        ax.axvline(b, color="0.75", lw=0.6, zorder=0, label="step boundary" if i == 0 else None)
    numbered = 0 < len(rec.boundaries) <= 40
    if numbered:  # step k (from 1, as the report) runs from boundary k-1 (the start for step 1) to boundary k
        for k, (a, b) in enumerate(zip([0.0] + rec.boundaries[:-1], rec.boundaries), start=1):
            ax.text((a + b) / 2, 1.0, str(k), transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=7, color="0.35")
    if load:
        ax.axhline(load / mib, color="k", ls="--", lw=0.8, label="LOAD (lower bound)")
    if peak_reserved:
        ax.axhline(peak_reserved / mib, color="tab:orange", ls=":", lw=1,
                   label=f"peak reserved {peak_reserved / mib:.1f} MiB (stats)")
    if peak_allocated:
        ax.axhline(peak_allocated / mib, color="tab:blue", ls=":", lw=1,
                   label=f"peak allocated {peak_allocated / mib:.1f} MiB (stats)")
    peak = None
    if rec.samples:
        t, _, r = max(rec.samples, key=lambda x: x[2])
        peak = (t, r)
        ax.plot([t], [r / mib], marker="v", color="tab:red", ms=8, ls="none",
                label=f"highest reserved sample ({t:.2f} s)")
    if rec.replayed_at is not None:
        ax.axvline(rec.replayed_at, color="tab:green", lw=1, label="steady state from here")
    ax.set_xlabel("seconds since the program started" + ("; step numbers on top" if numbered else ""))
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title, pad=14 if numbered else 6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"peak_sample": peak, "steps_numbered": numbered}


def _program_source(module: Optional[str], script: Optional[str]) -> Optional[str]:
    """The source text of the program run will run (None when it cannot be read)."""
    path = _program_file(module, script)
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def _calls_install(source: str) -> bool:
    """True if ``source`` calls torch_renaissance's ``install`` itself
    (``tr.install(...)``, ``torch_renaissance.install(...)``,
    ``from torch_renaissance import install``, ``installer.install(...)``)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    modules, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch_renaissance" or a.name.startswith("torch_renaissance."):
                    modules.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch_renaissance"):
            for a in node.names:
                if a.name == "install":
                    names.add(a.asname or a.name)
                elif a.name == "installer":
                    modules.add(a.asname or a.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in names:
            return True
        if isinstance(f, ast.Attribute) and f.attr == "install":
            root = f.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                return True
    return False


def cmd_run(args: argparse.Namespace) -> int:
    import threading

    import torch_renaissance as tr

    devices = ["cpu"]
    if args.cuda:
        devices.append("cuda")
    module = args.module
    script = None if module else args.script
    if module is None and script is None:
        print("torch-renaissance run: give a script or -m MODULE", file=sys.stderr)
        return 2
    problem = _program_problem(module, script) or _output_problem("--report", args.report) \
        or _output_problem("--plot", args.plot)
    if problem:
        print(f"torch-renaissance run: {problem}; the script was not run", file=sys.stderr)
        return 2
    if args.plot:
        args.plot = os.path.abspath(args.plot)  # the program may change the working directory
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("torch-renaissance run: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    rec = _Recorder(devices)
    # A program that installs torch_renaissance itself (with its options)
    # keeps its install: run installs nothing before it, and its boundaries
    # start once the program's install() returned. One that marks its own
    # steps (step(), @planned) keeps those: the first one stops run's
    # optimizer-step boundaries (torch_renaissance.step).
    source = _program_source(module, script)
    own_install = source is not None and _calls_install(source)
    holder: dict = {"steps": None}

    def start_steps() -> None:
        if holder["steps"] is None:
            ready = [d for d in devices if tr.installer.is_installed(d)]
            if ready:
                holder["steps"] = tr.auto_steps(ready)
                holder["steps"].on_boundary.append(rec.boundary)

    originals = (tr.install, tr.installer.install)
    try:
        if own_install:
            def install(device="cpu", **config):
                originals[1](device, **config)
                start_steps()

            install.__doc__ = originals[1].__doc__
            tr.install = tr.installer.install = install
        else:
            for d in devices:
                tr.install(d)
            # CUDA is not initialized here: the script may pick its device first.
            start_steps()
    except (ValueError, RuntimeError, ImportError) as e:
        print(f"torch-renaissance run: {e}", file=sys.stderr)
        return 2
    stepmod = importlib.import_module("torch_renaissance.step")
    stepmod.step_end_hooks.append(rec.boundary)
    report_made = bool(args.report) and not os.path.exists(args.report)
    report_file = _open_report(args.report) if args.report else None
    if report_file is False:
        return 2
    # Everything after the program is its own, "--" included, as with python
    # (main's _split_run ends run's options at the program).
    script_args = list(args.args)
    if module:
        sys.argv = [module] + script_args
        sys.path.insert(0, os.getcwd())
    else:
        # As python: argv[0] as given, __file__ absolute (python >= 3.9), the
        # script's folder, symbolic links resolved, first on sys.path (a zip
        # or a folder with __main__.py: runpy puts the path itself there).
        sys.argv = [script] + script_args
        if os.path.isfile(script) and not zipfile.is_zipfile(script):
            sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    code = 0
    stop = threading.Event()
    sampler = None
    rec.start()
    if args.plot:
        sampler = threading.Thread(target=_sampler, args=(rec, stop, 0.005), daemon=True)
        sampler.start()
    parent = os.getpid()
    ran = [False]  # whether the program started (a --step-on refusal comes before)
    refused = False
    try:
        # --step-on names may live in the script's own modules: resolved
        # once the script's folder is importable, before it runs.
        for name in args.step_on or ():
            own = _names_the_program(name, module, script)
            if own:
                raise ValueError(f"step_on: {own}")
            tr.step_on(name, devices[0], on_step_end=rec.boundary)
        ran[0] = True
        if report_file and _may_clear_early(args.report, report_made):
            _write_unfinished(report_file)
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _run_script(script)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt as e:
        _print_script_error(e, script)
        code = 130  # as python does on Ctrl-C
    except ValueError as e:
        if str(e).startswith("step_on:") and not ran[0]:
            why = str(e)[len("step_on:"):].lstrip()  # the option names it once
            print(f"torch-renaissance run: --step-on: {why}; the script was not run", file=sys.stderr)
            code = 2
            refused = True
        else:
            _print_script_error(e, script)
            code = 1
    except BaseException as e:  # the script's own error: show it like python would
        _print_script_error(e, script)
        code = 1
    finally:
        stop.set()
        if sampler is not None:
            sampler.join()
        tr.stop_auto_steps()
        tr.stop_step_on()
        tr.install, tr.installer.install = originals
        if rec.boundary in stepmod.step_end_hooks:
            stepmod.step_end_hooks.remove(rec.boundary)
        # A child the script forked (os.fork()) that returned or exited through SystemExit
        # reports nothing: the report is the parent's, once.
        if os.getpid() == parent and not refused:
            code = _finish_run(args, rec, report_file, code)
        elif refused and report_file:
            report_file.close()
            if report_made:  # made empty by run itself, for a run that did not happen
                try:
                    os.unlink(args.report)
                except OSError:
                    pass
    return code


def _script_path(script: str) -> str:
    """``script`` made absolute as python makes ``__file__``: joined to the working
    directory, not normalized (``os.path.abspath`` would drop a ``..`` that follows a
    symbolic link to a folder, naming another file than the kernel opens)."""
    return script if os.path.isabs(script) else os.path.join(os.getcwd(), script)


def _run_script(script: str) -> None:
    """Runs a script as ``python SCRIPT`` does. A source file runs in a fresh
    ``__main__`` module with an absolute ``__file__`` (python >= 3.9) that names its
    code (tracebacks), a ``SourceFileLoader`` as ``__loader__``, ``__spec__`` None, an
    empty ``__annotations__`` and ``sys.argv[0]`` left as given; that module stays
    ``__main__`` after it returns (atexit handlers and threads still find it).
    ``runpy.run_path`` sets both ``__file__`` and ``argv[0]`` to the one path it is
    given, and puts the old ``__main__`` back; it still runs what is not source (a
    ``.pyc``, a zip application, a folder with ``__main__.py``). The caller put the
    script's folder on ``sys.path``."""
    import builtins
    import importlib.machinery
    import importlib.util
    import io
    import types

    path = _script_path(script)
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        runpy.run_path(path, run_name="__main__")
        return
    with io.open_code(path) as f:
        source = f.read()
    if source[:len(importlib.util.MAGIC_NUMBER)] == importlib.util.MAGIC_NUMBER:
        runpy.run_path(path, run_name="__main__")  # compiled: runpy reads the .pyc
        return
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path),
                         __builtins__=builtins, __annotations__={})
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _program_problem(module: Optional[str], script: Optional[str]) -> Optional[str]:
    """Why the program cannot be run (as python says it), or None: a script that does not
    exist or is not a regular file (a directory, a FIFO, which would block), a module
    that cannot be found."""
    if script is not None:
        if not os.path.exists(script):
            return f"no such script: {script}"
        if os.path.isdir(script) and os.path.isfile(os.path.join(script, "__main__.py")):
            return None  # python runs a folder's __main__.py
        if not os.path.isfile(script):
            return (f"{script} is not a regular file (a directory without __main__.py, FIFO or "
                    "device); give a Python script")
        return None
    try:
        _main_spec(module)
    except ValueError as e:
        return str(e)
    return None


def _main_spec(module: str):
    """The module spec ``python -m MODULE`` runs as ``__main__`` (a package's
    ``__main__``), looked up with the working directory first on ``sys.path``, as
    python -m has it.

    Raises:
        ValueError: there is none, in python's words (``-m MODULE: ...``).
    """
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as e:  # a missing parent package; an empty name
            raise ValueError(f"-m {module}: {e}") from None
        if spec is None:
            raise ValueError(f"-m {module}: no module named {module!r}")
        if spec.submodule_search_locations is not None:  # a package: python runs its __main__
            try:
                main = importlib.util.find_spec(module + ".__main__")
            except (ImportError, ValueError):
                main = None
            if main is None:
                raise ValueError(f"-m {module}: no module named {module + '.__main__'!r}; "
                                 f"{module!r} is a package and cannot be directly executed")
            spec = main
        return spec
    finally:
        sys.path.pop(0)


def _output_problem(flag: str, path: Optional[str]) -> Optional[str]:
    """Why ``--report``/``--plot`` PATH cannot be written, checked before the program runs
    (it may take hours), in the words ``open`` would use: an empty path, a missing
    directory, a directory, one not writable."""
    if path is None:
        return None
    if not path:
        return f"{flag} needs a file path, got an empty one"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        reason = os.strerror(errno.ENOENT)
    elif os.path.isdir(path):
        reason = os.strerror(errno.EISDIR)
    elif not os.access(path if os.path.exists(path) else folder, os.W_OK):
        reason = os.strerror(errno.EACCES)
    else:
        return None
    return f"{flag} {path}: cannot write: {reason}"


def _names_the_program(name: str, module: Optional[str], script: Optional[str]) -> Optional[str]:
    """Why ``--step-on NAME`` cannot hook a function of the program itself, or None.

    Resolving NAME imports its module; when that module is the program (``serve.fn`` for
    ``run serve.py``, ``pk.__main__.fn`` for ``run -m pk``, or ``__main__``), importing it
    would run the whole program once before ``run`` runs it as ``__main__``, and the
    function hooked would not be the one the program calls. Prefixes are looked up from
    the shortest, so no lookup imports the program (finding ``main.K`` imports ``main``)."""
    import importlib.util

    if not isinstance(name, str):
        return None  # step_on's own TypeError
    if name.split(".", 1)[0] == "__main__":
        return (f"{name}: __main__ is the program itself; mark its steps with "
                "torch_renaissance.step(), or move the function into a module it imports")
    program = _program_file(module, script)
    if program is None:
        return None
    parts = name.split(".")
    for k in range(1, len(parts)):
        prefix = ".".join(parts[:k])
        try:
            spec = importlib.util.find_spec(prefix)
        except (ImportError, ValueError):
            return None  # step_on says what it cannot find
        if spec is None:
            return None  # not a module: neither is any longer prefix
        try:
            same = bool(spec.origin) and os.path.samefile(spec.origin, program)
        except OSError:
            same = False
        if same:
            return (f"{name}: {prefix} is the program being run, and importing it would run "
                    "it twice; mark its steps with torch_renaissance.step(), or move the "
                    "function into a module the program imports")
        if spec.submodule_search_locations is None:
            return None  # a plain module: what follows are its attributes
    return None


def _program_file(module: Optional[str], script: Optional[str]) -> Optional[str]:
    """The file ``run`` executes as ``__main__``: the script, the ``-m`` module's file,
    or a package's ``__main__.py``; None when it cannot be found."""
    if script:
        path = _script_path(script)
        return os.path.join(path, "__main__.py") if os.path.isdir(path) else path
    try:
        spec = _main_spec(module)
    except ValueError:
        return None
    return os.path.abspath(spec.origin) if spec.origin else None


def _finish_run(args: argparse.Namespace, rec: _Recorder, report_file, code: int) -> int:
    """Prints the report of every device the program used, writes ``--report`` and draws
    ``--plot``; the exit code (2 when the program succeeded and the report could not be
    written). Step times are the recorder's: every boundary, whatever made it."""
    import torch_renaissance as tr

    times = rec.step_times()
    devices = rec.devices
    # CUDA: the device the script left current; nothing to report when
    # the script never initialized CUDA.
    used = [d for d in devices if tr.installer.active_arena(d) is not None]
    if len(used) < len(devices):
        print("torch-renaissance run: the script did not use CUDA; no CUDA report",
              file=sys.stderr)
    # Step boundaries made by --step-on count too (the arena counts them).
    reports = []
    for d in used:
        n = len(rec.boundaries)  # optimizer steps and --step-on calls
        reason = None
        if n == 0 and args.step_on:
            reason = ("no step boundary was seen: no optimizer.step() and no call of "
                      + ", ".join(args.step_on) + " (--step-on)")
        elif n == 0:
            reason = ("no step boundary was seen: run makes each optimizer.step() one; for "
                      "inference give --step-on (e.g. transformers.GenerationMixin.generate)")
        rep = tr.stats.report(d, times, rec.earlier.get(d), reason)
        rep["step_boundaries"] = n
        rep["steady_from_step"] = rec.steady_from.get(d)
        if d in rec.where:  # at the last step boundary, not at exit (the program freed its tensors)
            res, alloc, where = rec.where[d]
            rep.update(reserved_bytes=res, allocated_bytes=alloc, territory_free_bytes=where["territory_free"],
                       dynamic_cache_bytes=where["dynamic_cache"], persistent_free_bytes=where["persistent_free"])
            rep["reserved_where"] = "last step boundary"
            st = tr.memory_stats(d)
            if rep["steady_peak_reserved_bytes"] is not None and rep["load_bytes"]:
                rep["above_load_bytes"] = rep["steady_peak_reserved_bytes"] - rep["load_bytes"]
                top, boundary, hw, over = rec.highest[d]
                parts = {
                    "within_step_bytes": rep["steady_peak_reserved_bytes"] - top,
                    "plan_over_bound_bytes": over,
                    "dynamic_cache_bytes": hw["dynamic_cache"],
                    "persistent_free_bytes": hw["persistent_free"],
                }
                parts["rest_bytes"] = rep["above_load_bytes"] - sum(parts.values())
                parts["boundary"] = boundary
                rep["above_load_parts"] = parts
                rep["plan_over_bound_bytes"] = over
            if d in rec.stable_from and rep["address_stability"] is not None:
                # Over the steady steps, not the last one only (a tester saw 100%
                # on a run that re-planned to its end, 11% on a run like it).
                same0, comparable0 = rec.stable_from[d]
                n = st["renaissance.comparable"] - comparable0
                rep["address_stability_last_step"] = rep["address_stability"]
                if n > 0:
                    rep["address_stability"] = (st["renaissance.same_address"] - same0) / n
                    rep["address_stability_over"] = "steady steps"
        else:
            rep["reserved_where"] = "exit"
        reports.append(rep)
    for rep in reports:
        _print_report(rep, sys.stderr)
    if report_file:
        code = _write_report(report_file, reports[0] if len(reports) == 1 else reports,
                             code)
    if args.plot and reports:
        rec.sample()
        first = reports[0]
        try:
            plot_timeline(rec, args.plot, f"torch-renaissance run {args.module or os.path.basename(args.script)}",
                          first["load_bytes"], first["peak_reserved_bytes"], first["peak_allocated_bytes"])
        except OSError as e:  # checked before the run; the folder may have gone since
            print(f"torch-renaissance run: --plot {args.plot}: cannot write: {e.strerror or e}",
                  file=sys.stderr)
            return code or 2
        print(f"torch-renaissance run: memory over time drawn to {args.plot}", file=sys.stderr)
    return code


def _open_output(command: str, flag: str, path: str, consequence: str):
    """Opens an output file (``--report``, ``--json``) before any work is done (and
    before a script can change the working directory), without truncating it; False,
    with a one-line message ending in ``consequence``, when it cannot be written."""
    try:
        if stat.S_ISFIFO(os.stat(path).st_mode):
            # A FIFO nobody reads would block open() until someone does: open it without
            # blocking (ENXIO: no reader), then write to it as to a file.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return os.fdopen(fd, "a", encoding="utf-8")
    except FileNotFoundError:
        pass
    except OSError as e:
        reason = "no process reads that FIFO" if e.errno == errno.ENXIO else (e.strerror or str(e))
        print(f"torch-renaissance {command}: {flag} {path}: cannot write: {reason}; {consequence}",
              file=sys.stderr)
        return False
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


UNFINISHED_REPORT = {
    "complete": False,
    "reason": "the program ended without returning to torch-renaissance run (os._exit(), a "
              "signal or a crash); no memory report was made",
}


def _may_clear_early(path: str, made: bool) -> bool:
    """Whether ``--report PATH`` may hold the unfinished report while the program runs:
    a file run made, an empty one, or one that holds JSON (an earlier report); never
    anything else (the script itself, a module it imports, a redirected stdout)."""
    if made:
        return True
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        if st.st_size == 0:
            return True
        if st.st_size > 1 << 20:
            return False
        with open(path, encoding="utf-8") as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


def _rewind_if_regular(f) -> bool:
    """Empties ``f`` and goes back to its start when it is a regular file (True); leaves
    anything else alone (False). Not /dev/stdout, a pipe or a device: truncating /dev/full
    fails with EINVAL and would hide the ENOSPC that writing to it gives.

    Raises:
        OSError: from ``fstat``, ``seek`` or ``truncate``.
    """
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        return False
    f.seek(0)
    f.truncate()
    return True


def _write_unfinished(f) -> None:
    """Puts :data:`UNFINISHED_REPORT` in a regular ``--report`` file as the program starts,
    so that a program ending where run cannot follow (``os._exit()``, a signal) leaves
    valid JSON saying so, not an empty file or an earlier run's report; the report
    replaces it when the program returns. Pipes and FIFOs get only the report."""
    try:
        if _rewind_if_regular(f):
            json.dump(UNFINISHED_REPORT, f)
            f.flush()
    except OSError:
        pass  # the report's own write says what is wrong


def _write_json(f, data, code: int, command: str = "run", flag: str = "--report") -> int:
    """Writes ``data`` as JSON to a file from :func:`_open_output`; ``code``, or 2
    when ``code`` was 0 and the file could not be written (e.g. a full disk)."""
    try:
        with f:
            _rewind_if_regular(f)
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
    # Only that device's trace is built; one without events or segments (one of
    # device_traces' empty lists) is refused like one past the list, not planned as
    # 0 buffers.
    try:
        return trace_mod.load_snapshot_devices(args.trace, devices=[args.device])
    except trace_mod.DeviceChoiceError as e:
        raise ValueError(f"{args.trace}: --device {args.device}: no data for that device in the "
                         f"snapshot (devices with data: {e.devices})") from None


def cmd_plan(args: argparse.Namespace) -> int:
    from torch_renaissance import trace as trace_mod
    from torch_renaissance.planner import plan_trace

    # --png's path before the planning (the budget may be long), as run's --report.
    png_problem = _output_problem("--png", args.png)
    if png_problem:
        print(f"torch-renaissance plan: {png_problem}; nothing was planned", file=sys.stderr)
        return 2
    try:
        traces = _load_for_plan(args)
    except (OSError, ValueError) as e:
        print(f"torch-renaissance plan: {e}", file=sys.stderr)
        return 2
    results = {}
    for dev, tr_ in traces.items():
        try:
            results[dev] = plan_trace(tr_, budget_seconds=args.budget, threads=args.threads)
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
        return _vs_load(n, res.load_bytes)

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
              f"{_pct_cell(o['greedy_bytes'], o['load_bytes']):>9} {_mib(o['plan_bytes']):>12} "
              f"{_pct_cell(o['plan_bytes'], o['load_bytes']):>9} "
              f"{_pct_cell(reserved, o['load_bytes']):>8}{mark} {o['plan_seconds']:>8.3f}")
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


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option's help (where there is one); descriptions keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        # By identity: a default of 0 (--seed) is shown; 0 == False would hide it.
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action)


RUN_DESCRIPTION = """\
Runs SCRIPT (or -m MODULE) as python would, with torch_renaissance installed as PyTorch's CPU
allocator (and CUDA's with --cuda) before the program's first tensor. The program is not changed.

Where step boundaries come from: every optimizer.step() ends one step and starts the next
(PyTorch's global optimizer step hook; with several optimizers, the first one seen); each
outermost call of a function named by --step-on is one step too (inference: generate(), a
serving function). Steps 1 and 2 are recorded, the plan is made at the end of step 2, later
steps replay it. A program with no boundary runs on the dynamic pool, unplanned; the report says so.
A program that calls torch_renaissance.install() itself keeps its options (run installs
nothing before it), and one that marks its own steps (torch_renaissance.step(), @planned) keeps
them (its first step ends run's optimizer-step boundaries).

Options of run come before SCRIPT; everything after SCRIPT (or MODULE) goes to the program.
At exit a memory report goes to stderr: whole-run peaks, the steady state (peaks after the first
replayed step that no (re-)plan followed), LOAD (the lower bound), and where reserved bytes that
hold nothing are."""


def build_parser() -> argparse.ArgumentParser:
    from torch_renaissance import __version__

    p = argparse.ArgumentParser(prog="torch-renaissance", description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--version", action="version", version=f"torch-renaissance {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run a PyTorch program on the planned arena", description=RUN_DESCRIPTION,
                       formatter_class=_HelpFormatter)
    r.add_argument("--report", metavar="PATH", default=None, help="also write the report as JSON to PATH")
    r.add_argument("--cuda", action="store_true", help="also install the CUDA allocator")
    r.add_argument("--step-on", metavar="NAME", action="append", default=None,
                   help="make each outermost call of NAME (module.function or module.Class.method, "
                        "e.g. transformers.GenerationMixin.generate) one step; repeatable")
    r.add_argument("--plot", metavar="PATH", default=None,
                   help="draw allocated and reserved bytes over time, with step boundaries, to PATH "
                        "(PNG; needs matplotlib)")
    r.add_argument("-m", dest="module", metavar="MODULE", default=None,
                   help="run library module MODULE as a script (as python -m); ends run's options")
    r.add_argument("script", nargs="?", default=None, help="the Python script to run")
    r.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script or module")
    r.set_defaults(fn=cmd_run)

    d = sub.add_parser("demo", help="train the bundled GPT under three allocators",
                       description="Trains the bundled GPT (random init, synthetic tokens) with PyTorch's "
                                   "default CPU allocator, the dynamic pool only, and the planned arena, "
                                   "one process each, and prints the numbers side by side.",
                       formatter_class=_HelpFormatter)
    d.add_argument("--steps", type=_int_at_least(4, " (steps 1-3 record, plan and replay, counted "
                                                     "from 1 as the arena counts them; the mean step "
                                                     "time is over steps 4 on)"),
                   default=20, help="training steps per run")
    d.add_argument("--batch", type=_int_at_least(1), default=4, help="sequences per batch")
    d.add_argument("--seq", type=_int_at_least(1), default=128, help="tokens per sequence")
    d.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    d.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON to PATH")
    d.set_defaults(fn=cmd_demo)

    q = sub.add_parser("plan", help="plan a recorded trace and compare",
                       description="Plans every buffer of a recorded trace and prints LOAD, greedy by size, "
                                   "our plan, PyTorch's recorded peak reserved and the planning time.",
                       formatter_class=_HelpFormatter)
    q.add_argument("trace", help="a PyTorch memory snapshot pickle or an id,lower,upper,size CSV file")
    q.add_argument("--budget", type=_budget, default=1.0,
                   help="planning time budget in seconds of wall time (0-3600); "
                        "the plan is the same on every machine unless the wall clock stopped "
                        "the search")
    q.add_argument("--device", type=_device, default=None, metavar="N|all",
                   help="the device of a multi-device PyTorch snapshot, or 'all' (one row per "
                        "device and the totals)")
    q.add_argument("--threads", type=int, choices=(1, 2), default=2,
                   help="CPU threads for the search: 2 runs a second thread beside the other "
                        "phases (the branch and bound at the lower bound on traces up to 1,500 "
                        "buffers, the peak-first passes on larger ones); 1 keeps everything on "
                        "one thread (the two may give different plans)")
    q.add_argument("--png", metavar="PATH", default=None, help="draw the packing (address x time) to PATH")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(fn=cmd_plan)
    return p


_RUN_VALUED = ("--report", "--step-on", "--plot")


def _split_run(argv: List[str]) -> tuple:
    """``run``'s own options, then the program: (options, script, module, program args).

    The first token that is not one of run's options (or -m MODULE) ends them, as
    with python: everything after it belongs to the program.
    """
    i = 0
    while i < len(argv):
        t = argv[i]
        if t == "-m":
            if i + 1 >= len(argv):
                return argv[:i + 1], None, None, []  # argparse reports the missing MODULE
            return argv[:i], None, argv[i + 1], argv[i + 2:]
        if t.startswith("-m") and not t.startswith("--"):  # -mMODULE, as python takes it
            return argv[:i], None, t[2:], argv[i + 1:]
        if t in _RUN_VALUED:
            i += 2
            continue
        if t == "--":
            return argv[:i], (argv[i + 1] if i + 1 < len(argv) else None), None, argv[i + 2:]
        if t.startswith("-") and t != "-":
            i += 1
            continue
        return argv[:i], t, None, argv[i + 1:]
    return argv, None, None, []


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv[:1] == ["run"]:
        opts, script, module, rest = _split_run(argv[1:])
        args = parser.parse_args(["run", *opts])
        args.script, args.module, args.args = script, module, rest
        if script is None and module is None:
            print("torch-renaissance run: give a script or -m MODULE (see run --help)", file=sys.stderr)
            return 2
        return args.fn(args)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
