"""Packed storage for the small per-batch results a pass keeps (:class:`thermo_lens.core.passes.Recorder`).

Why: a pass over thousands of prompts keeps a few dozen small tensors per batch (each reduction's
``[batch, ...]`` result) while every batch allocates and frees activations of varying sizes. Each
small tensor kept is a separate C-heap allocation placed between the freed activation blocks, so the
allocator can neither return those pages nor reuse the gaps for the next, larger batch: the
process' resident memory grew by about 40 KB per prompt (GPT-2 6 x 384; 469 MiB at 10,000 prompts)
although the results themselves hold a few hundred bytes per prompt. Here each small result is
copied into a shared 1 MiB slab as it is recorded and the original is freed with its batch: the
heap keeps a few large blocks instead of tens of thousands of small ones.

Reading a part gives a view into its slab (read it, never write to it in place).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Iterator, TypeAlias, Union, overload

import torch
from torch import Tensor

#: Where a part lies in the slabs: ``(slab, byte offset, bytes, dtype, shape)``.
SlabHandle: TypeAlias = tuple[int, int, int, torch.dtype, tuple[int, ...]]
#: What :meth:`Slabs.put` returns: a slab handle, or the tensor itself when it is kept as it is.
Handle: TypeAlias = Union[Tensor, SlabHandle]

__all__ = ["Slabs", "PackedParts", "read_rows"]

_ALIGN = 64
_OFFSET_BITS = 40  # a location: slab << 40 | byte offset (a whole batch kept as one block may exceed a slab)


class Slabs:
    """Byte slabs that small CPU tensors are packed into, one after the other.

    Tensors larger than a quarter of a slab (or empty, or not on the CPU) are kept as they are: a
    large allocation does not fragment the heap. A batch's results arrive as one flat tensor per
    dtype (:meth:`put_pieces`): copied into a slab at once when small, else kept whole (one block
    of its own, listed with the slabs); each result is then a handle into it, read back as a view
    with one op (:meth:`get`).
    """

    SIZE = 1 << 20

    def __init__(self) -> None:
        self._slabs: list[Tensor] = []  # uint8: SIZE-byte slabs, and whole batch tensors too large for one
        self._cur = -1  # the slab being filled
        self._used = self.SIZE  # the first put opens a slab
        self._typed: dict[tuple[int, torch.dtype], Tensor] = {}  # a slab viewed as a dtype (cached)

    @classmethod
    def small(cls, t: Tensor) -> bool:
        """Whether ``t`` is small enough for a slab (non-empty, at most a quarter of one), wherever it is."""
        return 0 < t.numel() * t.element_size() <= cls.SIZE // 4

    def _packs(self, t: Tensor) -> bool:
        """Whether ``t`` goes into a slab (small, non-empty, on the CPU)."""
        return t.device.type == "cpu" and self.small(t)

    def put(self, t: Tensor) -> Handle:
        """Store ``t`` (copied into a slab when small); returns the handle :meth:`get` takes."""
        if not self._packs(t):
            return t
        nbytes = t.numel() * t.element_size()
        off = self._copy_in(t, nbytes)
        return (self._cur, off, nbytes, t.dtype, tuple(t.shape))

    def put_rows(self, t: Tensor) -> Sequence[Handle]:
        """Store every row ``t[i]`` of ``t`` (``[rows, ...]``) as :meth:`put` stores it, with one copy
        for all of them when ``t`` is small; returns one handle per row."""
        if not self._packs(t):
            return [self.put(row) for row in t]
        nbytes = t.numel() * t.element_size()
        off = self._copy_in(t, nbytes)
        return self.row_handles((self._cur, off, nbytes, t.dtype, tuple(t.shape)), t.shape[0], tuple(t.shape[1:]))

    def put_pieces(self, flat: Tensor, sizes: list[int], rows: list[int] | None = None) -> list[SlabHandle]:
        """Store the 1-D CPU tensor ``flat``, the concatenation of pieces of ``sizes`` elements, with
        at most one copy; returns a flat handle per piece (give it its shape with :meth:`shaped` or
        :meth:`row_handles`). ``flat`` is copied into a slab when small; else kept whole, its own
        block (cloned first when it is a view of a larger tensor, which it must not pin)."""
        nbytes = flat.numel() * flat.element_size()
        if flat.numel() and self.small(flat):
            off = self._copy_in(flat, nbytes)
            k = self._cur
        else:
            if flat.untyped_storage().nbytes() != nbytes:
                flat = flat.clone()
            self._slabs.append(flat.view(torch.uint8))
            k, off = len(self._slabs) - 1, 0
        out: list[SlabHandle] = []
        item = flat.element_size()
        for n in sizes:
            out.append((k, off, n * item, flat.dtype, (n,)))
            off += n * item
        return out

    @staticmethod
    def shaped(handle: SlabHandle, shape: tuple[int, ...]) -> SlabHandle:
        """A flat handle of :meth:`put_pieces` with the piece's shape."""
        return handle[:4] + (tuple(shape),)

    @staticmethod
    def row_handles(handle: SlabHandle, n: int, shape: tuple[int, ...]) -> list[SlabHandle]:
        """One handle per row of the piece under ``handle`` (``n`` rows of ``shape``)."""
        k, off, nbytes, dtype = handle[:4]
        step = nbytes // n if n else 0
        return [(k, off + i * step, step, dtype, tuple(shape)) for i in range(n)]

    def _copy_in(self, t: Tensor, nbytes: int) -> int:
        """Copy ``t`` (``nbytes``, at most a slab) to the end of the current slab, or of a new one;
        returns its offset there."""
        off = -(-self._used // _ALIGN) * _ALIGN
        if off + nbytes > self.SIZE:
            self._slabs.append(torch.empty(self.SIZE, dtype=torch.uint8))
            self._cur = len(self._slabs) - 1
            off = 0
        flat = t.detach() if t.requires_grad else t  # (a recorded result has no graph: no op then)
        flat = flat if flat.ndim == 1 else flat.reshape(-1)  # (a batch's results arrive flat)
        if flat.stride(0) != 1:  # (a strided view, or one element of a strided view)
            flat = flat.clone(memory_format=torch.contiguous_format)
        self._slabs[self._cur][off:off + nbytes].copy_(flat.view(torch.uint8))
        self._used = off + nbytes
        return off

    def get(self, handle: Handle) -> Tensor:
        """The tensor stored under ``handle`` (a view into its slab: one op)."""
        if isinstance(handle, Tensor):
            return handle
        k, off, nbytes, dtype, shape = handle
        typed = self.typed(k, dtype)
        return typed.as_strided(shape, _contiguous_strides(shape), typed.storage_offset() + off // dtype.itemsize)

    def typed(self, k: int, dtype: torch.dtype) -> Tensor:
        """Slab ``k`` viewed as ``dtype`` (made once per slab and dtype)."""
        typed = self._typed.get((k, dtype))
        if typed is None:
            typed = self._typed[(k, dtype)] = self._slabs[k].view(dtype)
        return typed

    @property
    def nbytes(self) -> int:
        """Bytes held by the slabs (and the whole batch tensors kept with them)."""
        return sum(s.numel() for s in self._slabs)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element strides of a contiguous tensor of ``shape`` (a size-0 dimension counted as 1)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


class PackedParts:
    """A list of per-batch tensors (``append``, ``len``, iteration, indexing) stored in ``slabs``.

    The bookkeeping is compact too: each entry is one int64 location (slab and offset) and its
    shape's int64s in two arrays, not a Python tuple per tensor (a pass over 10,000 prompts records
    ~230,000 parts; a tuple per handle held ~2 KB per prompt of Python heap, two thirds of the
    results' own size). A part's dtype and number of dimensions are those of its first tensor; a
    tensor that differs (packed all the same), or that the slabs keep as it is (large, or not on
    the CPU), has its handle kept aside.
    """

    def __init__(self, slabs: Slabs) -> None:
        self._slabs = slabs
        self._loc = array("q")  # slab << _OFFSET_BITS | offset, or -1 - (index into _kept)
        self._shape = array("q")  # ndim entries per tensor
        self._kept: list[Handle] = []
        self._dtype: torch.dtype | None = None
        self._ndim = 0

    def append(self, t: Tensor) -> None:
        self.append_handle(self._slabs.put(t))

    def append_handle(self, handle: Handle) -> None:
        """Append a part already stored in this list's slabs (a handle of :meth:`Slabs.put` or
        :meth:`Slabs.put_rows`), or a tensor they keep as it is."""
        dtype, shape = (handle.dtype, tuple(handle.shape)) if isinstance(handle, Tensor) else handle[3:]
        if self._dtype is None:
            self._dtype, self._ndim = dtype, len(shape)
        if isinstance(handle, Tensor) or dtype != self._dtype or len(shape) != self._ndim:
            self._loc.append(-1 - len(self._kept))
            self._kept.append(handle)  # a tensor, or a full handle into the slabs
            self._shape.extend([0] * self._ndim)
        else:
            self._loc.append((handle[0] << _OFFSET_BITS) | handle[1])
            self._shape.extend(shape)

    def _get(self, i: int) -> Tensor:
        loc = self._loc[i]
        if loc < 0:
            return self._slabs.get(self._kept[-1 - loc])
        assert self._dtype is not None
        shape = tuple(self._shape[i * self._ndim:(i + 1) * self._ndim])
        k, off = loc >> _OFFSET_BITS, loc & ((1 << _OFFSET_BITS) - 1)
        nbytes = math.prod(shape) * self._dtype.itemsize
        return self._slabs.get((k, off, nbytes, self._dtype, shape))

    def handle(self, i: int) -> tuple[int, int, torch.dtype, tuple[int, ...]] | None:
        """Part ``i``'s place in the slabs, ``(slab, byte offset, dtype, shape)``, without reading it;
        None for a part kept aside (see the class)."""
        loc = self._loc[i]
        if loc < 0:
            return None
        assert self._dtype is not None
        return (loc >> _OFFSET_BITS, loc & ((1 << _OFFSET_BITS) - 1), self._dtype,
                tuple(self._shape[i * self._ndim:(i + 1) * self._ndim]))

    def __len__(self) -> int:
        return len(self._loc)

    def __iter__(self) -> Iterator[Tensor]:
        return (self._get(i) for i in range(len(self)))

    @overload
    def __getitem__(self, i: int) -> Tensor: ...
    @overload
    def __getitem__(self, i: slice) -> list[Tensor]: ...

    def __getitem__(self, i: int | slice) -> Tensor | list[Tensor]:
        if isinstance(i, slice):
            return [self._get(j) for j in range(len(self))[i]]
        return self._get(range(len(self))[i])  # (negative indices; IndexError past the end)

    def __repr__(self) -> str:
        return f"PackedParts({len(self)} tensors)"


def read_rows(slabs: Slabs, lists: list[PackedParts], i: int) -> Tensor:
    """``torch.stack([parts[i] for parts in lists])``, as one view where it can be: when part ``i`` of
    every list lies in the same slab with the same dtype and shape, at evenly spaced offsets (the rows
    of one recorded tensor, e.g. a reduction's per-layer results recorded together with
    ``Recorder.put_rows``), it is read with one op instead of one per list (a pass's results are read
    by name, each name a few dozen lists). Read it, never write to it in place."""
    places = [parts.handle(i) for parts in lists]
    first = places[0]
    if first is not None and len(places) > 1 and all(p is not None for p in places):
        k, off, dtype, shape = first
        step = places[1][1] - off  # type: ignore[index]
        size = math.prod(shape) * dtype.itemsize
        if step >= size and step % dtype.itemsize == 0 and all(
                p[0] == k and p[1] == off + j * step and p[2] == dtype and p[3] == shape  # type: ignore[index]
                for j, p in enumerate(places)):
            typed = slabs.typed(k, dtype)
            return typed.as_strided((len(places), *shape), (step // dtype.itemsize, *_contiguous_strides(shape)),
                                    typed.storage_offset() + off // dtype.itemsize)
    return torch.stack([parts[i] for parts in lists])


def read_all(slabs: Slabs, lists: list[PackedParts]) -> Tensor | None:
    """``torch.cat([read_rows(slabs, lists, i) for i in batches], dim=1)`` with two ops (one strided view of
    every batch's rows, then one copy that joins the batches), when every part of every list lies in one
    slab with one dtype and shape, at offsets evenly spaced along the lists and along the batches (a
    pass whose batches had the same shape recorded the same results at the same places); else None."""
    n = len(lists[0]) if lists else 0
    if n < 2 or any(len(parts) != n for parts in lists):
        return None
    first = lists[0].handle(0)
    if first is None:
        return None
    k, off, dtype, shape = first
    item = dtype.itemsize
    step = (lists[1].handle(0) or (None, off))[1] - off if len(lists) > 1 else 0
    b_step = (lists[0].handle(1) or (None, off))[1] - off
    size = math.prod(shape) * item
    if b_step < size * len(lists) or step % item or b_step % item or (len(lists) > 1 and step < size):
        return None
    for j, parts in enumerate(lists):
        for i in range(n):
            h = parts.handle(i)
            if h is None or h[0] != k or h[1] != off + j * step + i * b_step or h[2] != dtype or h[3] != shape:
                return None
    typed = slabs.typed(k, dtype)
    rows = typed.as_strided((len(lists), n, *shape), (step // item, b_step // item, *_contiguous_strides(shape)),
                            typed.storage_offset() + off // item)
    return rows.reshape(len(lists), n * shape[0], *shape[1:]) if shape else rows
