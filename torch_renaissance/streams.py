"""StreamManager: named compute / copy / communication streams with safe hand-offs.

PyTorch leaves stream safety to the user: a tensor made on one stream and used
on another needs an event wait *and* ``Tensor.record_stream`` so that the
allocator does not hand its memory out again too early
(``c10/cuda/CUDACachingAllocator.cpp``). The manager does both in one call,
``handoff``, and marks step boundaries where the arena records one *epoch
event* per (region, stream) instead of one event per block (docs/design.md).

Roles: ``compute`` (the stream the model runs on: the current stream when the
manager is made), ``h2d`` and ``d2h`` (copies), ``comm`` (collectives).
Streams come from PyTorch's device-generic ``torch.Stream`` / ``torch.Event``;
on the CPU every role is the trivial CPU stream and everything stays correct.
With a ``SimDevice`` (tests) the roles are simulated streams.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

ROLES = ("compute", "h2d", "d2h", "comm")


class UnknownRoleError(KeyError, ValueError):
    """A stream role that is not one of :data:`ROLES`.

    A ``KeyError`` (a lookup by role) and a ``ValueError`` (a bad argument) at once, so
    either ``except`` catches it; its message is printed as written (a plain ``KeyError``
    quotes it).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StreamManager:
    """Named streams of one device and safe tensor hand-offs between them.

    Args:
        device: ``"cuda"``, ``"cuda:N"``, ``"cpu"`` or a ``torch.device``
            (default: the current accelerator, else the CPU).
        sim: a ``torch_renaissance._C.SimDevice`` to drive simulated streams
            instead (tests); then ``arena`` is the ``_C.Arena`` on it.
        arena: the arena whose stream uses ``handoff`` registers and whose
            boundaries ``sync_point`` marks. Default: the installed arena of
            ``device`` when torch_renaissance is installed for it.

    Raises:
        ValueError: ``sim`` without ``arena``.
    """

    def __init__(self, device: Any = None, *, sim: Any = None, arena: Any = None) -> None:
        self._sim = sim
        self._arena = arena
        if sim is not None:
            if arena is None:
                raise ValueError("StreamManager(sim=...) needs the arena on that SimDevice")
            self.device = None
            self._streams = {"compute": 0, **{r: sim.new_stream() for r in ROLES[1:]}}
            # The innermost on() of each thread, as CUDA's current stream is per thread.
            self._local = threading.local()
            return
        if device is None:
            acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
            device = acc if acc is not None else "cpu"
        from torch_renaissance.installer import supported_device

        self.device = supported_device(device)
        if self.device.type != "cpu" and self.device.index is None:
            self.device = torch.device(self.device.type, torch.accelerator.current_device_index())
        if arena is None:
            from torch_renaissance import installer

            if installer.is_installed(self.device.type):
                self._arena = installer.get_arena(self.device)
        if self.device.type == "cpu":
            trivial = torch.Stream(device="cpu")
            self._streams = {r: trivial for r in ROLES}
        else:
            compute = torch.accelerator.current_stream(self.device.index)
            self._streams = {"compute": compute,
                             **{r: torch.Stream(device=self.device) for r in ROLES[1:]}}

    @property
    def trivial(self) -> bool:
        """True on the CPU, where every role is the same synchronous stream."""
        return self._sim is None and self.device.type == "cpu"

    def stream(self, role: str):
        """The stream of ``role`` (a ``torch.Stream``, or an int for SimDevice).

        Raises:
            UnknownRoleError: (a ``KeyError`` and a ``ValueError``) an unknown role; the
                message lists the roles.
        """
        try:
            return self._streams[role]
        except (KeyError, TypeError):  # TypeError: an unhashable role
            raise UnknownRoleError(f"unknown stream role {role!r}; roles: {', '.join(ROLES)}") from None

    @contextlib.contextmanager
    def on(self, role: str) -> Iterator[Any]:
        """Runs the enclosed work on ``role``'s stream; yields that stream."""
        s = self.stream(role)
        if self._sim is not None:
            prev = getattr(self._local, "role", "compute")
            self._local.role = role
            try:
                yield s
            finally:
                self._local.role = prev
        elif self.trivial:
            yield s
        else:
            with s:
                yield s

    def current(self) -> str:
        """The role whose stream is current in this thread (SimDevice: the thread's
        innermost ``on``; CUDA: the thread's current stream)."""
        if self._sim is not None:
            return getattr(self._local, "role", "compute")
        if self.trivial:
            return "compute"
        cur = torch.accelerator.current_stream(self.device.index)
        for role, s in self._streams.items():
            if s == cur:
                return role
        return "compute"

    def handoff(self, tensor: Any, to: str = "compute", *, from_: Optional[str] = None) -> Any:
        """Makes ``tensor``, produced on ``from_`` (default: the current role),
        safe to use on ``to``.

        The target stream waits, on the device, for an event recorded on the
        producer, and the allocator learns of the stream use (so the memory is
        not reused before ``to``'s work on it is done) — what
        ``record_stream`` does, without the caller calling it.

        Args:
            tensor: a tensor (any shape; zero-size is accepted), or with
                SimDevice the int address of an arena allocation.
            to: the consuming role.
            from_: the producing role.

        Returns:
            ``tensor``, for chaining.

        Raises:
            UnknownRoleError: (a ``KeyError``) an unknown role.
            TypeError: ``tensor`` is not a tensor (with SimDevice: not an int address).
            InvalidPointerError: with SimDevice, the address is not a live allocation
                of the arena; no event is recorded.
        """
        src = self.stream(self.current() if from_ is None else from_)
        dst = self.stream(to)
        if self._sim is not None:
            if isinstance(tensor, bool) or not isinstance(tensor, int):
                raise TypeError("StreamManager(sim=...).handoff takes the int address of an "
                                f"arena allocation, not {type(tensor).__name__}")
            if src != dst:
                if tensor:  # first: a freed or foreign address is refused before any event
                    self._arena.record_stream(tensor, dst)
                ev = self._sim.create_event()
                self._sim.record_event(ev, src)
                self._sim.stream_wait_event(dst, ev)
                self._sim.destroy_event(ev)
            return tensor
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"StreamManager.handoff takes a tensor, not {type(tensor).__name__}")
        if self.trivial or src == dst:
            return tensor
        self._order(src, dst)
        if tensor.numel() > 0:
            tensor.record_stream(dst)
        return tensor

    def _order(self, src: Any, dst: Any) -> None:
        """Makes ``dst`` wait, on the device, for the work enqueued on ``src``."""
        ev = torch.Event(device=self.device)
        ev.record(src)
        dst.wait_event(ev)

    def prefetch(self, iterable: Iterable[Any], to: Any = None) -> Iterator[Any]:
        """Iterates ``iterable``, copying each batch to ``to`` on the ``h2d``
        stream one step ahead of compute.

        Tensors (in any nesting of tuples, lists and dicts) are pinned and
        copied with ``non_blocking=True``; before a batch is yielded,
        ``compute`` waits once for its copies and every tensor's stream use is
        registered (``record_stream``). On the CPU this is a plain ``.to(to)``.

        Args:
            iterable: batches of tensors.
            to: the target device (default: the manager's device).

        Raises:
            ValueError: the manager is a simulated one (``sim=...``).
        """
        from torch.utils._pytree import tree_leaves, tree_map

        if self._sim is not None:
            raise ValueError("StreamManager(sim=...).prefetch: a simulated manager has no device "
                             "to copy batches to; prefetch takes a manager made for a device")
        target = torch.device(to) if to is not None else self.device
        copy = not self.trivial and target.type != "cpu"

        def move(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            if not copy:
                return x.to(target)
            src = x if x.is_pinned() or x.device.type != "cpu" else x.pin_memory()
            return src.to(target, non_blocking=True)

        def fetch(it: Iterator[Any]) -> Any:
            with self.on("h2d"):
                return tree_map(move, next(it))

        def hand(batch: Any) -> Any:
            if copy:  # one event for the whole batch, then the stream uses
                dst = self.stream("compute")
                self._order(self.stream("h2d"), dst)
                for t in tree_leaves(batch):
                    if isinstance(t, torch.Tensor) and t.numel() > 0:
                        t.record_stream(dst)
            return batch

        return self._prefetch(iter(iterable), fetch, hand)

    @staticmethod
    def _prefetch(it: Iterator[Any], fetch: Callable[[Iterator[Any]], Any],
                  hand: Callable[[Any], Any]) -> Iterator[Any]:
        """prefetch's generator: fetches batch i + 1 before yielding batch i."""
        try:
            nxt = fetch(it)
        except StopIteration:
            return
        while True:
            ready = hand(nxt)
            try:
                nxt = fetch(it)
            except StopIteration:
                yield ready
                return
            yield ready

    def sync_point(self) -> None:
        """A boundary: the arena records one event per (region, side stream)
        covering every block freed with stream uses since the last boundary.
        A no-op without an arena."""
        if self._arena is not None:
            self._arena.sync_point()
