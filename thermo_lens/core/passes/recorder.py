"""The recorder: the in-pass reductions' results, kept on their device until the pass ends.

A reduction (registered by a measurement, e.g. :func:`thermo_lens.measures.gain.residual_norms`) turns its
activation into the few numbers a metric needs inside the hook and drops the rest. Results stay on
the activations' device until the pass ends and go to the host once per pass, one copy per dtype;
finiteness checks are device counts read once, when the pass ends (:meth:`Recorder.finish`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence, TypeVar

import torch
from torch import Tensor

from thermo_lens.core.model import ModelView
from thermo_lens.core.packed import PackedParts, Slabs, read_all, read_rows
from thermo_lens.core.tokens import TokenBatch, scope_rows, to_device

__all__ = ["Recorder", "Reduction", "Reduce", "batch_mask"]

T = TypeVar("T")
Reduce = Callable[[Tensor, TokenBatch], "Tensor | None"]
#: A reduction registers its hooks on a Recorder: ``reduction(view, recorder)``.
Reduction = Callable[[ModelView, "Recorder"], None]


class Recorder:
    """Collects reductions computed in forward hooks, batch after batch.

    A reduction is registered with :meth:`add` under a ``(name, index)`` key (``index`` is
    usually the layer); its function maps ``(activation, batch)`` to a tensor whose first
    dimension is the batch. :meth:`stack` concatenates batches (padding position dimensions
    with NaN to the longest batch) and stacks indices: ``stack("resid_norm") -> [L+1, prompt, pos]``.
    """

    def __init__(self) -> None:
        self._reductions: list[tuple[str, tuple[str, int], Reduce]] = []
        # Each batch's results, packed into shared slabs as recorded (thermo_lens.core.packed: thousands of
        # small tensors left between freed activations fragmented the heap, ~40 KB per prompt).
        self._slabs = Slabs()
        self._parts: dict[tuple[str, int], PackedParts] = {}
        self._fired: set[tuple[str, int]] = set()  # keys whose hook ran (some record nothing)
        self._batch: TokenBatch | None = None
        self._per_batch: dict[Any, Any] = {}  # values derived from the current batch (built once)
        self._per_pass: dict[Any, Any] = {}  # values shared by the reductions for the whole pass
        # A batch's results, recorded when the batch ends (:meth:`_flush`): on a GPU, one copy to the
        # host per dtype instead of one per hook, each of which waited for the device (~200 a batch).
        self._pending: list[tuple[Any, Tensor]] = []
        # Batches whose results are still on a device (not the CPU): copied to the host together when
        # the pass ends (:meth:`finish`), one copy per dtype for the whole pass.
        self._waiting: list[_Waiting] = []
        # Finiteness checks of the current batch (:meth:`expect_finite`), and of the batches ended:
        # device counts read once, when the pass ends, never inside a hook or between batches.
        self._checks: list[tuple[list[str], Tensor, int]] = []  # (hook names, their counts [name], expected)
        self._check_batches: list[tuple[TokenBatch, list[str], list[int], Tensor]] = []
        self.nonfinite: list[str] = []  # hook names where a real token had NaN/inf (set by finish())
        self.nonfinite_batch: TokenBatch | None = None  # the first batch with one
        #: Whether hooks other than the reductions' may run in the pass (user ``fwd_hooks``, thermo-lens'
        #: intervention hooks, hooks already on the model): they may change an activation between two
        #: reads. :func:`collect` sets it False for a pass that runs the reductions' hooks alone.
        self.foreign_hooks = True
        #: Keep every batch's results on their device until the pass ends, as a pass on a GPU does,
        #: also on the CPU (where they are otherwise stored when the batch ends): the GPU's path, testable.
        self.defer_host_copy = False

    def add(self, hook_name: str, key: tuple[str, int], fn: Reduce) -> None:
        self._reductions.append((hook_name, key, fn))

    def registered(self) -> list[tuple[str, int]]:
        """The keys of the hooks registered so far (a reduction may find which of its hooks a
        filtering recorder kept, e.g. one block's in a sweep)."""
        return [key for _, key, _ in self._reductions]

    def put(self, key: tuple[str, int], value: Tensor) -> None:
        """Record ``value`` (first dimension: the batch) under ``key`` from inside a reduction
        that produces several results at one hook point (kept on its device until the batch ends)."""
        self._record(key, value)

    def put_rows(self, keys: Sequence[tuple[str, int]], values: Tensor) -> None:
        """:meth:`put` of ``values[i]`` under ``keys[i]``, for every row of ``values``, stored with one
        copy (e.g. the per-column means of a block's attribution terms, ``[column, batch]``)."""
        if len(keys) != values.shape[0]:
            raise ValueError(f"put_rows: {len(keys)} keys for {values.shape[0]} rows")
        self._record(list(keys), values)

    def _record(self, key: tuple[str, int] | list[tuple[str, int]], value: Tensor) -> None:
        """Inside a batch, keep ``value`` for :meth:`_flush`; outside one, store it now."""
        if self._batch is None:
            self._store(key, value.to("cpu"))
        else:
            self._pending.append((key, value))

    def _store(self, key: tuple[str, int] | list[tuple[str, int]], value: Tensor) -> None:
        """Pack a CPU ``value`` into the slabs under ``key`` (a list of keys: one per row)."""
        if isinstance(key, list):
            for k, handle in zip(key, self._slabs.put_rows(value)):
                self._part(k).append_handle(handle)
        else:
            self._part(key).append(value)

    def expect_finite(self, hook_name: str, values: Tensor, n_real: int) -> None:
        """Check, when the pass ends, that ``values`` (a reduction's result with NaN on padding only)
        holds ``n_real`` finite entries: one fewer is a real token's NaN/inf at ``hook_name``. The count
        stays on the device until :meth:`finish` (no host sync inside the hook)."""
        if self._batch is None:
            raise RuntimeError("Recorder.expect_finite used outside Recorder.batch(...)")
        self._checks.append(([hook_name], torch.isfinite(values).sum().reshape(1), n_real))

    def expect_finite_rows(self, hook_names: Sequence[str], values: Tensor, n_real: int) -> None:
        """:meth:`expect_finite` of ``values[i]`` at ``hook_names[i]`` for every row, counted with one
        op for all rows (e.g. a reduction's per-layer results finished together)."""
        if self._batch is None:
            raise RuntimeError("Recorder.expect_finite_rows used outside Recorder.batch(...)")
        # one count per row, kept as the vector (no op per row)
        self._checks.append((list(hook_names), torch.isfinite(values).reshape(values.shape[0], -1).sum(1), n_real))

    def _flush(self) -> None:
        """End the batch: its pending results, in the order they were recorded, are concatenated per
        dtype and device into one flat tensor on that device (one op per dtype, no host sync). On the
        CPU they are stored now; on a device they wait for :meth:`finish` (one copy to the host per
        dtype for the whole pass). Its finiteness counts wait on their device too."""
        pending, self._pending = self._pending, []
        checks, self._checks = self._checks, []
        if checks:
            assert self._batch is not None
            self._check_batches.append((self._batch, [name for c in checks for name in c[0]],
                                        [c[2] for c in checks for _ in c[0]],
                                        torch.cat([c[1] for c in checks]) if len(checks) > 1 else checks[0][1]))
        if not pending:
            return
        groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        large: list[tuple[Any, Tensor]] = []
        for i, (key, v) in enumerate(pending):
            if Slabs.small(v):
                groups.setdefault((v.dtype, v.device), []).append(i)
            else:
                large.append((key, v))  # kept as it is (a large result does not fragment the heap)
        # A batch with anything on a device waits for the pass's end whole (and so does every batch
        # after a waiting one): each key's parts are then stored in batch order.
        defer = self.defer_host_copy or bool(self._waiting) or any(v.device.type != "cpu" for _, v in pending)
        waiting = _Waiting(large=large)
        for idx in groups.values():
            flat = torch.cat([pending[i][1].reshape(-1) for i in idx])
            entries = [(pending[i][0], tuple(pending[i][1].shape)) for i in idx]
            if defer:
                waiting.flats.append((entries, flat))
            else:
                self._store_flat(entries, flat)
        if defer:
            self._waiting.append(waiting)
        else:
            for key, v in large:
                self._store(key, v)

    def _store_flat(self, entries: list[tuple[Any, tuple[int, ...]]], flat: Tensor) -> None:
        """Store a batch's flat CPU tensor of one dtype (its ``entries``: key and shape, in order)."""
        sizes = [math.prod(shape) for _, shape in entries]
        rows = [shape[0] if isinstance(key, list) else 1 for key, shape in entries]
        for (key, shape), handle in zip(entries, self._slabs.put_pieces(flat, sizes, rows)):
            if isinstance(key, list):
                for k, h in zip(key, self._slabs.row_handles(handle, len(key), shape[1:])):
                    self._part(k).append_handle(h)
            else:
                self._part(key).append_handle(self._slabs.shaped(handle, shape))

    def finish(self) -> None:
        """End the pass: the results still on a device go to the host, one copy per dtype and device
        for all batches, and the finiteness counts are read (one copy). Sets :attr:`nonfinite` (the
        hook names, in the first failing batch, where a real token was NaN/inf) and
        :attr:`nonfinite_batch`. Called by the pass (and by any read of the results)."""
        waiting, self._waiting = self._waiting, []
        if waiting:
            groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
            for w in waiting:
                for _, flat in w.flats:
                    groups.setdefault((flat.dtype, flat.device), []).append(flat)
            host = {g: iter(torch.cat(flats).to("cpu").split([f.numel() for f in flats]))
                    for g, flats in groups.items()}
            for w in waiting:
                for entries, flat in w.flats:
                    self._store_flat(entries, next(host[(flat.dtype, flat.device)]))
                for key, v in w.large:
                    self._store(key, v.to("cpu"))
        checks, self._check_batches = self._check_batches, []
        if checks and not self.nonfinite:
            counts = torch.cat([c[3].reshape(-1) for c in checks]).tolist()
            k = 0
            for batch, names, expected, _ in checks:
                got, k = counts[k:k + len(names)], k + len(names)
                bad = [n for n, g, e in zip(names, got, expected) if g != e]
                if bad:
                    self.nonfinite, self.nonfinite_batch = bad, batch
                    break

    def _part(self, key: tuple[str, int]) -> PackedParts:
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = PackedParts(self._slabs)
        return parts

    def fwd_hooks(self) -> list[tuple[str, Callable]]:
        """``(hook_name, hook_fn)`` pairs for ``run_with_hooks``, one per hook point: its hook runs every
        reduction registered there, in the order they were added, and returns None. (One hook, not one
        per reduction: a host may convert the activation for each hook it calls, e.g. the bridge's
        ``attn.hook_z`` view to ``[batch, pos, head, d_head]``, an op per hook and batch.)"""
        points: dict[str, list[tuple[tuple[str, int], Reduce]]] = {}
        for hook_name, key, fn in self._reductions:
            points.setdefault(hook_name, []).append((key, fn))
        hooks = []
        for hook_name, fns in points.items():
            def hook(act: Tensor, hook: object = None, *, _fns: list[tuple[tuple[str, int], Reduce]] = fns) -> None:
                batch = self._batch
                if batch is None:
                    raise RuntimeError("Recorder hook fired outside Recorder.batch(...)")
                # (under inference_mode, the pass's default, an activation has no graph to detach from)
                x = act.detach() if act.requires_grad else act
                for key, fn in _fns:
                    self._fired.add(key)
                    out = fn(x, batch)
                    if out is not None:  # None: a reduction that only keeps transient state
                        self._record(key, out)
            hooks.append((hook_name, hook))
        return hooks

    def mask(self, device: torch.device) -> Tensor:
        """The current batch's ``[batch, pos]`` real-token mask on ``device`` (cached per batch)."""
        return self.per_batch(("mask", str(device)), lambda batch: _on(batch_mask(batch), device))

    def pad_mask(self, device: torch.device) -> Tensor:
        """The current batch's ``[batch, pos]`` padding mask (``~mask``) on ``device`` (cached per batch)."""
        return self.per_batch(("pad_mask", str(device)), lambda batch: ~self.mask(device))

    def n_real(self) -> int:
        """The current batch's number of real tokens (from the host's lengths: no device read)."""
        if self._batch is None:
            raise RuntimeError("Recorder.n_real used outside Recorder.batch(...)")
        return sum(self._batch.host_lengths)

    def scope_rows(self, token_scope: str, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """:func:`thermo_lens.core.tokens.scope_rows` of the current batch on ``device``: the scoped
        tokens' flat indices ``[n]``, their rows ``[n]`` and the per-row counts ``[batch, 1]``
        float64 (at least 1). Built on the host from the lengths, moved once per batch."""
        def build(batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor]:
            parts = scope_rows(batch.host_lengths, int(batch.tokens.shape[1]), token_scope)
            return tuple(_on(t, device) for t in parts)  # type: ignore[return-value]
        return self.per_batch(("scope_rows", token_scope, str(device)), build)

    def per_batch(self, key: Hashable, build: Callable[[TokenBatch], T]) -> T:
        """``build(batch)`` for the current batch, computed once per batch under ``key`` and shared
        by every hook that asks (e.g. the mask on a device, the scoped rows of the attribution);
        dropped when the batch ends."""
        if self._batch is None:
            raise RuntimeError("Recorder.per_batch used outside Recorder.batch(...)")
        if key not in self._per_batch:
            self._per_batch[key] = build(self._batch)
        return self._per_batch[key]

    def per_pass(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()`` once for the whole pass under ``key``, shared by every reduction that asks
        (e.g. the model's ``W_O``, read by the attribution and by the head write norms)."""
        if key not in self._per_pass:
            self._per_pass[key] = build()
        return self._per_pass[key]

    def silent_hooks(self) -> list[str]:
        """Hook names whose reductions have recorded nothing (the host never ran those hooks)."""
        return sorted({h for h, key, _ in self._reductions if key not in self._fired})

    def batch(self, batch: TokenBatch) -> "_BatchContext":
        """Context manager that makes ``batch`` (its mask) visible to the reductions."""
        return _BatchContext(self, batch)

    @property
    def names(self) -> set[str]:
        self.finish()
        return {k[0] for k in self._parts}

    def stack(self, name: str) -> Tensor:
        """All batches of reduction ``name`` concatenated, indices stacked on dim 0."""
        self.finish()
        keys = sorted(k for k in self._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.names)}")
        lists = [self._parts[k] for k in keys]
        every = read_all(self._slabs, lists)  # batches of one shape, recorded alike: every part at once
        if every is not None:
            return every
        if len({len(p) for p in lists}) == 1:  # batch by batch, every index's part at once (packed.read_rows)
            return self._cat([read_rows(self._slabs, lists, i) for i in range(len(lists[0]))], dim=1)
        return torch.stack([self._cat(p) for p in lists])

    def reduce(self, name: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Like :meth:`stack`, but ``fn`` (which must drop the position dimensions) is applied to
        each batch's own part first, so nothing is ever padded to the longest prompt of the
        whole run: memory follows each batch's real length (batches are length-bucketed)."""
        self.finish()
        keys = sorted(k for k in self._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.names)}")
        return torch.stack([torch.cat([fn(p) for p in self._parts[k]], dim=0) for k in keys])

    @staticmethod
    def _cat(parts: Sequence[Tensor] | PackedParts, dim: int = 0) -> Tensor:
        # Batches (along dim) differ in padded length: pad every dimension after the batch's (the
        # position ones; heads etc. agree) with NaN up to the largest batch, then concatenate them.
        shape = [max(p.shape[d] for p in parts) for d in range(dim + 1, parts[0].ndim)]
        padded = []
        for p in parts:
            pad: list[int] = []
            for d in reversed(range(dim + 1, p.ndim)):
                pad += [0, shape[d - dim - 1] - p.shape[d]]
            padded.append(torch.nn.functional.pad(p, pad, value=float("nan")) if any(pad) else p)
        return torch.cat(padded, dim=dim)


def batch_mask(batch: TokenBatch) -> Tensor:
    """``batch.mask`` (``[batch, pos]``, True on real tokens), made once per batch and kept with it: the
    runner and the reductions share it (read it, never change it in place)."""
    got = batch.__dict__.get("_thermo_lens_mask")
    if got is None:
        got = batch.mask
        object.__setattr__(batch, "_thermo_lens_mask", got)  # (a frozen dataclass: not a field)
    return got


def _on(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` (:func:`to_device`; ``t`` itself, no op dispatched, where it is already there)."""
    return t if t.device == torch.device(device) else to_device(t, device)


class _BatchContext:
    def __init__(self, rec: Recorder, batch: TokenBatch):
        self.rec, self.batch_ = rec, batch

    def __enter__(self) -> Recorder:
        self.rec._batch = self.batch_
        self.rec._per_batch = {}
        return self.rec

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.rec._per_batch = {}
        if exc_type is None:
            self.rec._flush()
            self.rec._batch = None
        else:  # a failed batch records nothing
            self.rec._batch = None
            self.rec._pending = []
            self.rec._checks = []


@dataclass
class _Waiting:
    """One batch's results still on their device: per dtype, the keys and shapes of the flat tensor
    that holds them, and the large results kept as they are."""

    flats: list[tuple[list[tuple[Any, tuple[int, ...]]], Tensor]] = field(default_factory=list)
    large: list[tuple[Any, Tensor]] = field(default_factory=list)

