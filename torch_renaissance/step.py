"""Step boundaries: record -> plan -> replay.

A *step* is one repetition of a training or inference loop. The arena records
every step's allocations; at the end of the second step whose allocation
sizes it has not seen before, it plans them (``csrc/core/step_planner.cpp``)
and later steps replay at the planned offsets. Mark steps with:

* ``with torch_renaissance.step():`` around one iteration;
* ``@torch_renaissance.planned`` on a function that runs one iteration;
* :func:`auto_steps` (what ``torch-renaissance run`` does): every
  ``optimizer.step()`` ends a step and starts the next, through PyTorch's
  global optimizer step post hook (``torch.optim.optimizer``);
* :func:`step_on` (``torch-renaissance run --step-on NAME``): every outermost
  call of a named function or method is one step, for loops without an
  optimizer (``transformers.GenerationMixin.generate``, a serving function).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Iterator, List, Optional, Tuple, TypeVar

from torch_renaissance.installer import active_arena, get_arena, installed_device, is_installed

F = TypeVar("F", bound=Callable[..., Any])

_keys: dict = {}
_keys_lock = threading.Lock()

# Called with no arguments after each step a program marks itself (step(),
# @planned) ended: torch-renaissance run's report keeps its steady state at
# those boundaries when the program marks its own steps.
step_end_hooks: List[Callable[[], None]] = []


def _key_id(key: Hashable) -> int:
    """A stable small integer for a step key (0 is the default key)."""
    if key is None:
        return 0
    with _keys_lock:
        return _keys.setdefault(key, len(_keys) + 1)


@contextlib.contextmanager
def step(device: Any = None, key: Hashable = None) -> Iterator[None]:
    """Marks one step of a loop on ``device``'s arena.

    Args:
        device: as for :func:`torch_renaissance.memory_stats`.
        key: names the kind of step when one program runs several (a training
            step and an evaluation step, or the forwards of different models):
            steps are recorded, planned and matched per key, so they do not
            take each other for variants. Any hashable; default: one kind.

    Raises:
        RuntimeError: torch_renaissance is not installed for ``device``, or
            steps are nested, or automatic steps are on for that arena.
    """
    arena = get_arena(device)
    if _auto is not None and arena in _auto.open:
        # The program marks its own steps (under torch-renaissance run, which
        # made optimizer steps the boundaries): its steps win, for good.
        _defer_auto_steps()
    if arena.in_step:
        raise RuntimeError("torch_renaissance.step(): a step is already open on this arena "
                           "(steps do not nest; with `torch-renaissance run`, optimizer steps "
                           "already mark them)")
    arena.begin_step(_key_id(key))
    try:
        yield
    finally:
        arena.end_step()
        for fn in step_end_hooks:
            fn()


def planned(fn: Optional[F] = None, *, device: Any = None, key: Hashable = None):
    """Decorator: every call of ``fn`` is one planned step.

    Usable as ``@planned`` or ``@planned(device="cuda", key="eval")``. The
    first two calls are recorded (served by the dynamic pool); from the third
    call on, the allocations replay at planned, stable addresses. ``key``
    defaults to the function itself, so two decorated functions are planned
    apart.

    Raises:
        TypeError: ``fn`` is not callable (``@planned(5)``), or is a generator or
            coroutine function: its call
            returns at once and its body runs later, outside the step (use
            ``with torch_renaissance.step():`` inside it instead).
    """
    def wrap(f: F) -> F:
        if not callable(f):
            raise TypeError(f"torch_renaissance.planned decorates a function, not "
                            f"{type(f).__name__} (use @planned or @planned(key=...))")
        if inspect.isgeneratorfunction(f) or inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            kind = "generator" if inspect.isgeneratorfunction(f) else "coroutine"
            raise TypeError(f"torch_renaissance.planned: {getattr(f, '__qualname__', f)!s} is a {kind} "
                            "function; its body would run after the call returns, outside the step. "
                            "Use `with torch_renaissance.step():` inside it instead")
        k = key if key is not None else f

        @functools.wraps(f)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with step(device, k):
                return f(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap


class _AutoSteps:
    """Optimizer-step boundaries for every installed arena (one per device type).

    A CUDA device is looked up at each boundary, never before CUDA is
    initialized (so ``torch-renaissance run --cuda`` does not initialize CUDA
    before the script, which may pick its device or set
    ``CUDA_VISIBLE_DEVICES`` first): the boundary goes to the arena of the
    device current at that moment (``torch.cuda.set_device(local_rank)``).
    """

    def __init__(self, devices: List[Any]) -> None:
        self.devices = [installed_device(d) for d in devices]  # raises if not installed
        self.open: List[Any] = []  # arenas in which this object opened the step
        self.times: List[float] = []
        self._last = time.perf_counter()
        self._handle = None
        self._marker: Optional[weakref.ref] = None
        # Called with no arguments at each boundary, after the step ended and
        # before the next begins (torch-renaissance run's steady-state reset).
        self.on_boundary: List[Callable[[], None]] = []
        self.deferred = False  # the program marks its own steps (step(), @planned)

    def _begin(self) -> None:
        self.open = []
        for d in self.devices:
            a = active_arena(d)  # CUDA: none until initialized; the next boundary looks again
            if a is not None and not a.in_step:
                a.begin_step()
                self.open.append(a)

    def start(self) -> None:
        self._begin()
        self._last = time.perf_counter()
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._boundary)

    def _boundary(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # With several optimizers (a GAN, separate parameter groups) one
        # iteration steps each of them: the first optimizer seen marks the
        # boundary, so that one step is one iteration.
        if self._marker is None:
            self._marker = weakref.ref(optimizer)
        elif self._marker() is not optimizer:
            if self._marker() is not None:
                return
            self._marker = weakref.ref(optimizer)
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now
        self._end()
        for fn in self.on_boundary:
            fn()
        self._begin()

    def _end(self) -> None:
        for a in self.open:
            if a.in_step:
                a.end_step()
        self.open = []

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._end()


_auto: Optional[_AutoSteps] = None


def auto_steps(devices: Optional[List[Any]] = None) -> _AutoSteps:
    """Makes every ``optimizer.step()`` a step boundary (idempotent).

    Args:
        devices: the installed devices whose arenas get the boundaries
            (default: every installed device type).

    Returns:
        The handle; ``handle.times`` holds seconds between optimizer steps.
    """
    global _auto
    if _auto is None:
        if devices is None:
            devices = [d for d in ("cpu", "cuda") if is_installed(d)]
        _auto = _AutoSteps(devices)
        _auto.start()
    return _auto


def _defer_auto_steps() -> None:
    """Ends the step :func:`auto_steps` keeps open and stops making optimizer
    steps boundaries (the program marks its own); ``stop_auto_steps`` still
    returns the times measured so far."""
    if _auto is not None and _auto._handle is not None:
        _auto._handle.remove()
        _auto._handle = None
        _auto._end()
        _auto.deferred = True


def stop_auto_steps() -> Optional[List[float]]:
    """Stops automatic boundaries; returns the measured step times (seconds)."""
    global _auto
    if _auto is None:
        return None
    _auto.stop()
    times, _auto = _auto.times, None
    return times


def _resolve(name: str) -> Tuple[Any, str, Callable[..., Any]]:
    """``package.module.Attr.attr`` -> (owner object, attribute name, the function)."""
    import importlib

    if not isinstance(name, str):
        raise TypeError(f"step_on: the name must be a str such as 'package.module.function', "
                        f"not {type(name).__name__}")
    parts = name.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        raise ValueError(f"step_on: {name!r} is not a dotted name (give module.function or "
                         "module.Class.method)")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:-1]:
                owner = getattr(owner, attr)
            fn = getattr(owner, parts[-1])
        except AttributeError:
            break
        if not callable(fn):
            raise ValueError(f"step_on: {name} is not callable")
        return owner, parts[-1], fn
    raise ValueError(f"step_on: cannot find {name!r} (give module.function or module.Class.method)")


_step_on: dict = {}


def step_on(name: str, device: Any = None, on_step_end: Optional[Callable[[], None]] = None) -> None:
    """Makes every outermost call of the function or method ``name`` one step.

    For loops without an optimizer step (inference, serving): with
    ``transformers.GenerationMixin.generate`` each ``generate()`` call, KV
    cache included, is one planned step. Calls inside an open step (nested
    calls, or a step opened by other means) add nothing. Each wrapped name is
    its own step key, so its steps are matched only with each other. Under
    :func:`auto_steps`, a call splits the step it keeps open as long as no
    optimizer step has been seen (a program without an optimizer).

    Args:
        name: ``package.module.function`` or ``package.module.Class.method``.
        device: as for :func:`step`; default: the installed device (CPU first).
        on_step_end: called with no arguments after each such step ended.

    Raises:
        TypeError: ``name`` is not a str, or ``on_step_end`` is not callable.
        ValueError: ``name`` is not a dotted name, cannot be imported or is not callable.
        RuntimeError: torch_renaissance is not installed for ``device``.
    """
    if on_step_end is not None and not callable(on_step_end):
        raise TypeError(f"step_on: on_step_end must be callable or None, not "
                        f"{type(on_step_end).__name__}")
    owner, attr, fn = _resolve(name)
    if name in _step_on:
        return
    if device is None:
        device = next((d for d in ("cpu", "cuda") if is_installed(d)), None)
        if device is None:
            raise RuntimeError("step_on: torch_renaissance is not installed (call install() first)")
    installed_device(device)  # raises if not installed
    key = _key_id(("step_on", name))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        arena = active_arena(device)
        # The step auto_steps keeps open until the first optimizer step makes
        # way (a program without an optimizer); once optimizer steps are the
        # boundaries, a call inside one of them is part of it.
        auto = _auto if (_auto is not None and not _auto.times and arena in _auto.open) else None
        if arena is None or (arena.in_step and auto is None):
            return fn(*args, **kwargs)
        if auto is not None:
            arena.end_step()
            auto.open.remove(arena)
        arena.begin_step(key)
        try:
            return fn(*args, **kwargs)
        finally:
            if arena.in_step:
                arena.end_step()
                if on_step_end is not None:
                    on_step_end()
            if auto is not None and _auto is auto and not arena.in_step:
                arena.begin_step()
                auto.open.append(arena)

    _step_on[name] = (owner, attr, fn)
    setattr(owner, attr, wrapper)


def stop_step_on() -> None:
    """Undoes every :func:`step_on` (restores the original functions)."""
    for owner, attr, fn in _step_on.values():
        setattr(owner, attr, fn)
    _step_on.clear()
