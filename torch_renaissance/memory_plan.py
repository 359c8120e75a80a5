"""Region/slot blueprints: a ``MemoryPlan`` and its one-buffer materialization.

A :class:`MemoryPlan` is an ordered list of named **regions**, each an ordered
list of **slots** (the words of ``docs/design.md``). A slot is a planned place for
one tensor: a name, a byte offset inside its region, a capacity in bytes and
the shape/dtype of the typed view it gives. :meth:`MemoryPlan.finalize` lays the
regions out back to back, so the whole plan is one byte range and every region
is one contiguous sub-range of it.

Uses: the distributed layer (``torch_renaissance.distributed``) builds one plan
that is identical on every rank (sharded parameters, gradients, optimizer
states, communication buffers); the same type serves "model slots" (one weight
region with a slot per parameter/buffer, shared by many models of one
architecture).

Invariants kept here:

* After :meth:`MemoryPlan.finalize`, every slot offset and every region offset
  is a multiple of ``alignment`` (256 bytes by default), regions are contiguous
  (region ``i + 1`` starts where region ``i`` ends), slots of one region
  never overlap and the total size fits in int64.
* ``alignment`` is a multiple of every slot's dtype item size (checked by
  :meth:`Region.add_slot`), so every slot can be viewed as its dtype; shapes
  are tuples of non-negative ``int``.
* A finalized plan is immutable; :meth:`MemoryPlan.digest` is a sha256 of a
  canonical JSON description, so it depends only on the layout (names, offsets,
  sizes, shapes, dtypes, alignment), never on Python hash seeds, dict order or
  the process.
* :meth:`MemoryPlan.materialize` makes exactly one allocation (a flat ``uint8``
  tensor of :attr:`MemoryPlan.nbytes` bytes, zero-filled, from whatever
  allocator is installed for the device); every view it hands out aliases it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

import torch

__all__ = [
    "DEFAULT_ALIGNMENT",
    "MaterializedPlan",
    "MemoryPlan",
    "Region",
    "Slot",
    "plan_from_description",
]

#: Default alignment of slot and region offsets, in bytes.
DEFAULT_ALIGNMENT = 256

# Largest size (in bytes or elements) a tensor can have: sizes are int64 in torch.
_INT64_MAX = (1 << 63) - 1

_FORMAT = "torch_renaissance.memory_plan/1"


#: Largest alignment accepted, in bytes (1 GiB; a CUDA VMM granule is 2 MiB). A larger one
#: pads every slot to that many bytes: ``1 << 40`` would back a plan with terabytes.
MAX_ALIGNMENT = 1 << 30


def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _as_int(value: Any) -> int | None:
    """Return ``value`` as an ``int`` if it is an integer, else ``None``.

    Accepts ``int``, NumPy integers and integer 0-d tensors (``operator.index``);
    refuses ``bool`` and whatever ``int()`` would truncate or parse (``2.7``,
    ``"3"``).
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (for messages and exported plans)."""
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


@dataclasses.dataclass(frozen=True)
class Slot:
    """A planned place for one tensor inside a region.

    Attributes:
        name: identifier of the slot, unique inside its region (for example a
            parameter's fully qualified name).
        nbytes: capacity in bytes; at least ``prod(shape) * dtype.itemsize``
            (a slot may be larger than its typed view, e.g. the maximum over
            ranks or variants).
        shape: shape of the typed view :meth:`MaterializedPlan.slot_view` gives.
        dtype: dtype of that view.
        offset: byte offset of the slot from the start of its region (set by
            :meth:`MemoryPlan.finalize`; 0 before).
    """

    name: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int = 0

    @property
    def numel(self) -> int:
        """Number of elements of the typed view."""
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        """Byte offset one past the slot, relative to its region."""
        return self.offset + self.nbytes

    def describe(self) -> dict[str, Any]:
        """Canonical, JSON-serializable description (used by the digest)."""
        return {
            "name": self.name,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
        }


class Region:
    """A named, contiguous part of a plan holding one class of tensors.

    Slots are kept in insertion order; that order is the layout order. Create
    regions with :meth:`MemoryPlan.add_region` (or implicitly with
    :meth:`MemoryPlan.add_slot`).

    Attributes:
        name: region name (``"params"``, ``"grads"``, ``"optim.exp_avg"``, ...).
        offset: byte offset of the region from the start of the plan (after
            :meth:`MemoryPlan.finalize`).
        nbytes: size of the region in bytes, including alignment padding after
            its last slot (after finalize).
    """

    def __init__(self, name: str, plan: "MemoryPlan") -> None:
        self.name = name
        self._plan = plan
        self._slots: dict[str, Slot] = {}
        self.offset = 0
        self.nbytes = 0

    def add_slot(
        self,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        nbytes: int | None = None,
    ) -> Slot:
        """Append a slot to this region.

        Args:
            name: slot name, unique in this region.
            shape: shape of the slot's typed view (non-negative integer sizes).
            dtype: dtype of the typed view; its item size must divide the plan's
                ``alignment``, so that every slot can be viewed as its dtype.
            nbytes: capacity in bytes; defaults to ``prod(shape) * itemsize``
                and must not be smaller than that.

        Returns:
            The new :class:`Slot` (its ``offset`` is set at finalize).

        Raises:
            RuntimeError: if the plan is already finalized.
            ValueError: if the name is taken, a size in ``shape`` is negative,
                not an integer (``2.7``) or past int64, ``nbytes`` is not an
                integer or is too small for ``shape``/``dtype``, or the plan's
                alignment is smaller than ``dtype``'s item size.
        """
        self._plan._check_mutable()
        if not isinstance(name, str):
            raise TypeError(f"slot name must be str, got {type(name).__name__}")
        if name in self._slots:
            raise ValueError(f"region {self.name!r} already has a slot named {name!r}")
        try:
            dims = tuple(shape)
        except TypeError:
            raise TypeError(
                f"slot {name!r}: shape must be a sequence of ints, got {type(shape).__name__}"
            ) from None
        checked = tuple(_as_int(s) for s in dims)
        for given, dim in zip(dims, checked):
            if dim is None:
                raise ValueError(
                    f"slot {name!r}: shape {dims!r} has a non-integer size {given!r}"
                )
        shape = checked
        if any(s < 0 for s in shape):
            raise ValueError(f"slot {name!r}: negative size in shape {shape}")
        if any(s > _INT64_MAX for s in shape):
            raise ValueError(f"slot {name!r}: a size in shape {shape} does not fit in int64")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"slot {name!r}: dtype must be a torch.dtype, got {dtype!r}")
        alignment = self._plan.alignment
        if alignment % dtype.itemsize:
            raise ValueError(
                f"slot {name!r}: the plan's alignment of {alignment} B is smaller than the "
                f"{dtype.itemsize} B items of {dtype_name(dtype)}, so the slot could not be "
                f"viewed as {dtype_name(dtype)}; use MemoryPlan(alignment="
                f"{max(alignment, dtype.itemsize)}) or more"
            )
        needed = math.prod(shape) * dtype.itemsize
        if nbytes is None:
            nbytes = needed
        checked_nbytes = _as_int(nbytes)
        if checked_nbytes is None:
            raise ValueError(f"slot {name!r}: nbytes must be an integer, got {nbytes!r}")
        nbytes = checked_nbytes
        if nbytes < needed:
            raise ValueError(
                f"slot {name!r}: nbytes={nbytes} is smaller than shape {shape} of "
                f"{dtype_name(dtype)} needs ({needed} bytes)"
            )
        slot = Slot(name=name, nbytes=nbytes, shape=shape, dtype=dtype)
        self._slots[name] = slot
        return slot

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The slots in layout order."""
        return tuple(self._slots.values())

    def slot(self, name: str) -> Slot:
        """The slot called ``name``.

        Raises:
            KeyError: if there is no such slot.
        """
        try:
            return self._slots[name]
        except KeyError:
            raise KeyError(f"region {self.name!r} has no slot {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[Slot]:
        return iter(self._slots.values())

    @property
    def dtype(self) -> torch.dtype | None:
        """The common dtype of all slots, or ``None`` if empty or mixed."""
        dtypes = {s.dtype for s in self._slots.values()}
        return dtypes.pop() if len(dtypes) == 1 else None

    @property
    def end(self) -> int:
        """Byte offset one past the region, relative to the plan."""
        return self.offset + self.nbytes

    def _layout(self, offset: int, alignment: int) -> None:
        cursor = 0
        for name, slot in self._slots.items():
            self._slots[name] = dataclasses.replace(slot, offset=cursor)
            cursor = _align_up(cursor + slot.nbytes, alignment)
        self.offset = offset
        self.nbytes = cursor

    def describe(self) -> dict[str, Any]:
        """Canonical, JSON-serializable description (used by the digest)."""
        return {
            "name": self.name,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "slots": [s.describe() for s in self._slots.values()],
        }

    def __repr__(self) -> str:
        return (
            f"Region({self.name!r}, offset={self.offset}, nbytes={self.nbytes}, "
            f"slots={len(self._slots)})"
        )


PlanDescription = Mapping[str, Any]


class MemoryPlan:
    """An ordered set of regions of slots, laid out as one byte range.

    Build it with :meth:`add_region` / :meth:`add_slot`, then call
    :meth:`finalize` to compute offsets. After that the plan is read-only and
    can be hashed (:meth:`digest`), compared (:meth:`first_difference`) and
    backed by memory (:meth:`materialize`).

    Args:
        alignment: alignment of every slot and region offset, in bytes (a power
            of two in ``[1, 2**30]``, and at least the item size of every slot's
            dtype). Default: 256.

    Raises:
        ValueError: ``alignment`` is not an integer (``2.5``, ``"256"``, ``True``), not a
            power of two, or above :data:`MAX_ALIGNMENT`.

    Example::

        >>> plan = MemoryPlan()
        >>> plan.add_slot("params", "w", (7, 3), torch.float32)
        >>> plan.add_slot("params", "b", (7,), torch.float32)
        >>> plan.finalize().slot_range("params", "b")
        (256, 284)
    """

    def __init__(self, alignment: int = DEFAULT_ALIGNMENT) -> None:
        given = alignment
        try:  # ints and numpy integers; not 2.5, "256" or True
            alignment = None if isinstance(given, bool) else operator.index(given)
        except TypeError:
            alignment = None
        if alignment is None:
            raise ValueError(f"alignment must be an integer number of bytes, got {given!r}")
        if alignment < 1 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise ValueError(f"alignment must be a power of two in [1, 2**30] bytes, got "
                             f"{alignment}")
        self.alignment = alignment
        self._regions: dict[str, Region] = {}
        self._finalized = False
        self._nbytes = 0

    # -- building ---------------------------------------------------------------

    def _check_mutable(self) -> None:
        if self._finalized:
            raise RuntimeError("MemoryPlan is finalized; build a new plan to change it")

    def add_region(self, name: str) -> Region:
        """Append an empty region.

        Args:
            name: region name, unique in the plan.

        Returns:
            The new :class:`Region`.

        Raises:
            RuntimeError: if the plan is finalized.
            ValueError: if the name is taken.
        """
        self._check_mutable()
        if not isinstance(name, str):
            raise TypeError(f"region name must be str, got {type(name).__name__}")
        if name in self._regions:
            raise ValueError(f"plan already has a region named {name!r}")
        region = Region(name, self)
        self._regions[name] = region
        return region

    def add_slot(
        self,
        region: str,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        nbytes: int | None = None,
    ) -> Slot:
        """Append a slot to ``region``, creating the region if needed.

        See :meth:`Region.add_slot` for the arguments and errors.
        """
        self._check_mutable()
        target = self._regions.get(region)
        if target is None:
            target = self.add_region(region)
        return target.add_slot(name, shape, dtype, nbytes)

    def finalize(self) -> "MemoryPlan":
        """Lay the regions out back to back and freeze the plan.

        Slots get offsets inside their region in insertion order, each aligned
        to :attr:`alignment`; each region's size is rounded up to the alignment
        so the next region starts aligned right after it. Idempotent.

        Returns:
            ``self``, for chaining.

        Raises:
            ValueError: if the plan's total size does not fit in int64 (the
                size of the flat tensor :meth:`materialize` allocates); the plan
                then stays unfinalized.
        """
        if self._finalized:
            return self
        cursor = 0
        for region in self._regions.values():
            region._layout(cursor, self.alignment)
            cursor += region.nbytes
        if cursor > _INT64_MAX:
            raise ValueError(
                f"MemoryPlan: total size {cursor} bytes does not fit in int64 (at most "
                f"2**63 - 1 bytes); a tensor that large cannot be allocated"
            )
        self._nbytes = cursor
        self._finalized = True
        return self

    # -- reading ----------------------------------------------------------------

    @property
    def finalized(self) -> bool:
        """Whether :meth:`finalize` has been called."""
        return self._finalized

    def _check_finalized(self) -> None:
        if not self._finalized:
            raise RuntimeError("MemoryPlan is not finalized; call finalize() first")

    @property
    def nbytes(self) -> int:
        """Total size of the plan in bytes (after finalize)."""
        self._check_finalized()
        return self._nbytes

    @property
    def regions(self) -> tuple[Region, ...]:
        """The regions in layout order."""
        return tuple(self._regions.values())

    def region(self, name: str) -> Region:
        """The region called ``name``.

        Raises:
            KeyError: if there is no such region.
        """
        try:
            return self._regions[name]
        except KeyError:
            known = ", ".join(repr(n) for n in self._regions) or "none"
            raise KeyError(f"plan has no region {name!r} (regions: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    def slot(self, region: str, name: str) -> Slot:
        """The slot ``name`` of region ``region``."""
        return self.region(region).slot(name)

    def slot_range(self, region: str, name: str) -> tuple[int, int]:
        """Absolute byte range ``[start, end)`` of a slot inside the plan."""
        self._check_finalized()
        reg = self.region(region)
        slot = reg.slot(name)
        start = reg.offset + slot.offset
        return start, start + slot.nbytes

    def region_range(self, name: str) -> tuple[int, int]:
        """Absolute byte range ``[start, end)`` of a region inside the plan."""
        self._check_finalized()
        reg = self.region(name)
        return reg.offset, reg.end

    # -- identity ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Canonical, JSON-serializable description of the finalized layout.

        Returns:
            ``{"format", "alignment", "nbytes", "regions": [{"name", "offset",
            "nbytes", "slots": [{"name", "offset", "nbytes", "shape",
            "dtype"}]}]}`` with offsets and sizes in bytes.
        """
        self._check_finalized()
        return {
            "format": _FORMAT,
            "alignment": self.alignment,
            "nbytes": self._nbytes,
            "regions": [r.describe() for r in self._regions.values()],
        }

    def canonical_json(self) -> str:
        """The description as compact JSON with sorted keys (what is hashed)."""
        return json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """Stable sha256 (hex) of :meth:`canonical_json`.

        Equal on two processes exactly when the layouts are equal, independent
        of ``PYTHONHASHSEED`` and dict order.
        """
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def first_difference(
        self, other: Union["MemoryPlan", PlanDescription]
    ) -> str | None:
        """Name the first place where this plan and ``other`` differ.

        Regions and slots are compared in layout order, so the first reported
        slot is the cause (later slots usually differ only by offset).

        Args:
            other: another finalized plan, or a :meth:`describe` result (for
                example one received from another rank).

        Returns:
            ``None`` when the layouts are equal, else a one-line message such as
            ``"region 'params', slot #2 'l1.weight': shape (4, 3) != (4, 5), nbytes
            48 != 80"`` (values of this plan first).
        """
        mine = self.describe()
        theirs = other.describe() if isinstance(other, MemoryPlan) else other
        return _first_difference(mine, theirs)

    # -- memory -----------------------------------------------------------------

    def materialize(self, device: torch.device | str | None = None) -> "MaterializedPlan":
        """Back the plan with one zero-filled flat ``uint8`` tensor.

        The tensor comes from whatever allocator is installed for ``device``
        (torch_renaissance's arena when it is installed).

        Args:
            device: where to allocate; default: CPU.

        Returns:
            A :class:`MaterializedPlan` over a buffer of :attr:`nbytes` bytes.
        """
        self._check_finalized()
        buffer = torch.zeros(self._nbytes, dtype=torch.uint8, device=device)
        return MaterializedPlan(self, buffer)

    def __repr__(self) -> str:
        size = f"{self._nbytes} B" if self._finalized else "not finalized"
        regions = ", ".join(f"{r.name}[{len(r)}]" for r in self._regions.values())
        return f"MemoryPlan({size}, alignment={self.alignment}, regions=[{regions}])"


def format_shape(shape: Sequence[int]) -> str:
    """A shape as Python writes the tuple: ``(3,)``, ``(2, 4)``, ``()``."""
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _slot_fields_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    parts = []
    for key in ("shape", "dtype", "nbytes", "offset"):
        if a.get(key) != b.get(key):
            va, vb = a.get(key), b.get(key)
            if key == "shape":
                va, vb = format_shape(va or ()), format_shape(vb or ())
            parts.append(f"{key} {va} != {vb}")
    return ", ".join(parts)


def _first_difference(mine: PlanDescription, theirs: PlanDescription) -> str | None:
    if mine == theirs:
        return None
    if mine.get("alignment") != theirs.get("alignment"):
        return f"alignment {mine.get('alignment')} != {theirs.get('alignment')}"
    regions_a = list(mine.get("regions", ()))
    regions_b = list(theirs.get("regions", ()))
    for i in range(max(len(regions_a), len(regions_b))):
        if i >= len(regions_a):
            return f"region #{i} {regions_b[i]['name']!r} exists only in the other plan"
        if i >= len(regions_b):
            return f"region #{i} {regions_a[i]['name']!r} is missing from the other plan"
        ra, rb = regions_a[i], regions_b[i]
        if ra["name"] != rb["name"]:
            return f"region #{i}: name {ra['name']!r} != {rb['name']!r}"
        slots_a, slots_b = list(ra.get("slots", ())), list(rb.get("slots", ()))
        for j in range(max(len(slots_a), len(slots_b))):
            if j >= len(slots_a):
                return (
                    f"region {ra['name']!r}, slot #{j} {slots_b[j]['name']!r} "
                    "exists only in the other plan"
                )
            if j >= len(slots_b):
                return (
                    f"region {ra['name']!r}, slot #{j} {slots_a[j]['name']!r} "
                    "is missing from the other plan"
                )
            sa, sb = slots_a[j], slots_b[j]
            if sa["name"] != sb["name"]:
                return f"region {ra['name']!r}, slot #{j}: name {sa['name']!r} != {sb['name']!r}"
            if sa != sb:
                return f"region {ra['name']!r}, slot #{j} {sa['name']!r}: " + _slot_fields_diff(sa, sb)
        if ra.get("offset") != rb.get("offset") or ra.get("nbytes") != rb.get("nbytes"):
            return (
                f"region {ra['name']!r}: offset {ra.get('offset')} != {rb.get('offset')}, "
                f"nbytes {ra.get('nbytes')} != {rb.get('nbytes')}"
            )
    if mine.get("nbytes") != theirs.get("nbytes"):
        return f"plan nbytes {mine.get('nbytes')} != {theirs.get('nbytes')}"
    if mine.get("format") != theirs.get("format"):
        return f"format {mine.get('format')!r} != {theirs.get('format')!r}"
    return "descriptions differ"  # unreachable for well-formed descriptions


class MaterializedPlan:
    """A finalized :class:`MemoryPlan` backed by one flat ``uint8`` buffer.

    Every view returned aliases :attr:`buffer`; nothing here allocates except
    the tensors passed to :meth:`adopt` being copied *into* the buffer.

    Args:
        plan: a finalized plan.
        buffer: a contiguous 1-D ``uint8`` tensor of ``plan.nbytes`` bytes.

    Attributes:
        plan: the plan.
        buffer: the flat ``uint8`` tensor, shape ``(plan.nbytes,)``.
    """

    def __init__(self, plan: MemoryPlan, buffer: torch.Tensor) -> None:
        plan._check_finalized()
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise ValueError("buffer must be a contiguous 1-D uint8 tensor")
        if buffer.numel() != plan.nbytes:
            raise ValueError(f"buffer has {buffer.numel()} bytes, plan needs {plan.nbytes}")
        self.plan = plan
        self.buffer = buffer

    @property
    def device(self) -> torch.device:
        """Device of the buffer."""
        return self.buffer.device

    def data_ptr(self) -> int:
        """Address of byte 0 of the plan."""
        return self.buffer.data_ptr()

    def slot_bytes(self, region: str, name: str) -> torch.Tensor:
        """The slot's full capacity as a 1-D ``uint8`` view of ``slot.nbytes``."""
        start, end = self.plan.slot_range(region, name)
        return self.buffer[start:end]

    def slot_view(self, region: str, name: str) -> torch.Tensor:
        """Typed view of a slot: shape ``slot.shape``, dtype ``slot.dtype``.

        The view starts at the slot's first byte; when the capacity exceeds the
        view, the rest of the slot is not covered by it.
        """
        slot = self.plan.slot(region, name)
        start, _ = self.plan.slot_range(region, name)
        nbytes = slot.numel * slot.dtype.itemsize
        return self.buffer[start : start + nbytes].view(slot.dtype).view(slot.shape)

    def views(self, region: str) -> dict[str, torch.Tensor]:
        """Typed views of every slot of ``region``, by slot name, in layout order."""
        return {s.name: self.slot_view(region, s.name) for s in self.plan.region(region)}

    def region_view(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """One flat view over a whole region, alignment padding included.

        Args:
            name: region name.
            dtype: dtype of the view; default: the region's common slot dtype,
                or ``uint8`` when its slots have mixed dtypes.

        Returns:
            A 1-D tensor covering exactly ``[region.offset, region.end)`` bytes.

        Raises:
            ValueError: if the region size is not a multiple of ``dtype``'s size.
        """
        region = self.plan.region(name)
        if dtype is None:
            dtype = region.dtype or torch.uint8
        if region.nbytes % dtype.itemsize or region.offset % dtype.itemsize:
            raise ValueError(
                f"region {name!r} ({region.nbytes} B at {region.offset}) is not a whole "
                f"number of {dtype_name(dtype)} elements"
            )
        return self.buffer[region.offset : region.end].view(dtype)

    def adopt(self, region: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Move ``tensor``'s storage into a slot, keeping the tensor object.

        The values are copied to the start of the slot and ``tensor`` is
        re-pointed there with ``Tensor.set_`` (same Python object, same shape,
        strides and dtype; its ``data_ptr()`` becomes the slot's address). Other
        references to the old storage keep the old memory. A tensor smaller than
        the slot occupies its first bytes (e.g. an unpadded shard in a padded
        slot).

        Args:
            region: region name.
            name: slot name.
            tensor: a contiguous plain tensor on the buffer's device with the
                slot's dtype and at most ``slot.nbytes`` bytes.

        Returns:
            ``tensor`` (re-pointed).

        Raises:
            TypeError: for tensor subclasses (pass a DTensor's ``_local_tensor``).
            ValueError: on a dtype, device, size or contiguity mismatch.
        """
        slot = self.plan.slot(region, name)
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(
                f"slot {region}/{name}: adopt() takes plain tensors, got "
                f"{type(tensor).__name__} (pass the local tensor of a DTensor)"
            )
        if tensor.dtype != slot.dtype:
            raise ValueError(
                f"slot {region}/{name}: dtype {dtype_name(tensor.dtype)} != slot dtype "
                f"{dtype_name(slot.dtype)}"
            )
        if tensor.device != self.buffer.device:
            raise ValueError(
                f"slot {region}/{name}: tensor on {tensor.device}, plan on {self.buffer.device}"
            )
        if not tensor.is_contiguous():
            raise ValueError(f"slot {region}/{name}: tensor must be contiguous")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > slot.nbytes:
            raise ValueError(
                f"slot {region}/{name}: tensor of {nbytes} B does not fit in {slot.nbytes} B"
            )
        start, _ = self.plan.slot_range(region, name)
        itemsize = tensor.element_size()
        if start % itemsize:
            raise ValueError(f"slot {region}/{name}: offset {start} not aligned to {itemsize}")
        with torch.no_grad():
            dst = self.buffer[start : start + nbytes].view(tensor.dtype).view(tensor.shape)
            if tensor.data_ptr() != dst.data_ptr():
                dst.copy_(tensor)
            tensor.set_(
                self.buffer.untyped_storage(),
                (self.buffer.storage_offset() + start) // itemsize,
                tensor.shape,
                tensor.stride(),
            )
        return tensor

    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s bytes lie inside this plan's buffer."""
        n = tensor.numel() * tensor.element_size()
        base = self.buffer.data_ptr()
        return tensor.device == self.buffer.device and (
            base <= tensor.data_ptr() and tensor.data_ptr() + n <= base + self.buffer.numel()
        )

    def __repr__(self) -> str:
        return f"MaterializedPlan({self.plan!r}, device={self.buffer.device})"


def plan_from_description(description: PlanDescription) -> MemoryPlan:
    """Rebuild a finalized plan from :meth:`MemoryPlan.describe` output.

    Raises:
        ValueError: if the description is malformed or its offsets do not match
            the layout :meth:`MemoryPlan.finalize` produces.
    """
    try:
        plan = MemoryPlan(alignment=int(description["alignment"]))
        for region in description["regions"]:
            reg = plan.add_region(str(region["name"]))
            for slot in region["slots"]:
                reg.add_slot(
                    str(slot["name"]),
                    [int(s) for s in slot["shape"]],
                    _dtype_from_name(str(slot["dtype"])),
                    int(slot["nbytes"]),
                )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed plan description: {exc!r}") from None
    plan.finalize()
    diff = _first_difference(plan.describe(), description)
    if diff is not None:
        raise ValueError(f"plan description is not a finalized layout: {diff}")
    return plan
