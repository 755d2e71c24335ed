"""The forward pass: one pass per batch, feeding the in-pass reductions of every measurement.

Nothing here stores a full activation: every reduction (registered by a measurement, e.g.
:func:`thermo_lens.gain.residual_norms`) turns its tensor into the few numbers a metric needs
inside the hook and drops the rest, so a whole battery costs one forward pass per prompt batch
and memory linear in the number of tokens. :func:`collect` runs the pass and returns a
:class:`Collected`; measurements derive their results from it without running the model again
(``*_from_collected``). :func:`thermo_lens.run` (:mod:`thermo_lens.measure`) is the public front:
it picks the reductions of the measurements you name and builds their results from one pass.

User hooks passed as ``fwd_hooks`` run in the same pass *before* the reductions, so a reduction at
the same hook point sees the activation as the user's hook left it (e.g. after an ablation). Their
names are checked against the model's hook points before anything runs; each hook can read the
current batch from ``hook.ctx["batch"]`` (:class:`thermo_lens.tokens.BatchInfo`); a hook that
raises, returns something the host cannot use, or never runs gets a
:class:`~thermo_lens.errors.ThermoLensHookError` naming the hook, the batch and the fix. Hooks
already on the model (``model.add_hook``, ``with model.hooks(...)``, SAEs, PyTorch module hooks)
run too and are recorded beside the ``fwd_hooks`` (:func:`thermo_lens.attached.attached_hooks`).
The batch plan depends on the prompts' lengths and the settings, never on hooks.

:func:`collect_cached` records the same reductions from an existing ``ActivationCache`` (the
cached activations replayed through the reductions' hooks in forward order): no forward pass.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from thermo_lens import attached, cache_match
from thermo_lens.errors import (ThermoLensHookError, ThermoLensInputError, ThermoLensInputTypeError,
                                ThermoLensNumericsError)
from thermo_lens.inputs import as_model_prompts
from thermo_lens.model import ModelView, as_view
from thermo_lens.packed import PackedParts, Slabs, read_rows
from thermo_lens.provenance import Provenance, attached_records, describe_hook
from thermo_lens.settings import RunSettings
from thermo_lens.tokens import (HOST_BOS, MAX_PADDING, BatchInfo, TokenBatch, plan_batches, scope_rows, to_device,
                                token_batch)

__all__ = ["Recorder", "Collected", "Reduction", "collect", "collect_cached", "wrap_user_hooks"]

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
        # Each batch's results, packed into shared slabs as recorded (thermo_lens.packed: thousands of
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
        self._checks: list[tuple[str, Tensor, int]] = []
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
        self._checks.append((hook_name, torch.isfinite(values).sum(), n_real))

    def expect_finite_rows(self, hook_names: Sequence[str], values: Tensor, n_real: int) -> None:
        """:meth:`expect_finite` of ``values[i]`` at ``hook_names[i]`` for every row, counted with one
        op for all rows (e.g. a reduction's per-layer results finished together)."""
        if self._batch is None:
            raise RuntimeError("Recorder.expect_finite_rows used outside Recorder.batch(...)")
        counts = torch.isfinite(values).reshape(values.shape[0], -1).sum(1).unbind()
        self._checks += [(name, c, n_real) for name, c in zip(hook_names, counts)]

    def _flush(self) -> None:
        """End the batch: its pending results, in the order they were recorded, are concatenated per
        dtype and device into one flat tensor on that device (one op per dtype, no host sync). On the
        CPU they are stored now; on a device they wait for :meth:`finish` (one copy to the host per
        dtype for the whole pass). Its finiteness counts wait on their device too."""
        pending, self._pending = self._pending, []
        checks, self._checks = self._checks, []
        if checks:
            assert self._batch is not None
            self._check_batches.append((self._batch, [c[0] for c in checks], [c[2] for c in checks],
                                        torch.stack([c[1] for c in checks])))
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
        """``(hook_name, hook_fn)`` pairs for ``run_with_hooks``; the hooks return None."""
        hooks = []
        for hook_name, key, fn in self._reductions:
            def hook(act: Tensor, hook: Any = None, *, _key=key, _fn=fn, _name=hook_name) -> None:
                if self._batch is None:
                    raise RuntimeError("Recorder hook fired outside Recorder.batch(...)")
                self._fired.add(_key)
                # (under inference_mode, the pass's default, an activation has no graph to detach from)
                out = _fn(act.detach() if act.requires_grad else act, self._batch)
                if out is not None:  # None: a reduction that only keeps transient state
                    self._record(_key, out)
            hooks.append((hook_name, hook))
        return hooks

    def mask(self, device: torch.device) -> Tensor:
        """The current batch's ``[batch, pos]`` real-token mask on ``device`` (cached per batch)."""
        return self.per_batch(("mask", str(device)), lambda batch: to_device(batch.mask, device))

    def pad_mask(self, device: torch.device) -> Tensor:
        """The current batch's ``[batch, pos]`` padding mask (``~mask``) on ``device`` (cached per batch)."""
        return self.per_batch(("pad_mask", str(device)), lambda batch: ~self.mask(device))

    def n_real(self) -> int:
        """The current batch's number of real tokens (from the host's lengths: no device read)."""
        if self._batch is None:
            raise RuntimeError("Recorder.n_real used outside Recorder.batch(...)")
        return sum(self._batch.host_lengths)

    def scope_rows(self, token_scope: str, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """:func:`thermo_lens.tokens.scope_rows` of the current batch on ``device``: the scoped
        tokens' flat indices ``[n]``, their rows ``[n]`` and the per-row counts ``[batch, 1]``
        float64 (at least 1). Built on the host from the lengths, moved once per batch."""
        def build(batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor]:
            parts = scope_rows(batch.host_lengths, int(batch.tokens.shape[1]), token_scope)
            return tuple(to_device(t, device) for t in parts)  # type: ignore[return-value]
        return self.per_batch(("scope_rows", token_scope, str(device)), build)

    def per_batch(self, key: Any, build: Callable[[TokenBatch], Any]) -> Any:
        """``build(batch)`` for the current batch, computed once per batch under ``key`` and shared
        by every hook that asks (e.g. the mask on a device, the scoped rows of the attribution);
        dropped when the batch ends."""
        if self._batch is None:
            raise RuntimeError("Recorder.per_batch used outside Recorder.batch(...)")
        if key not in self._per_batch:
            self._per_batch[key] = build(self._batch)
        return self._per_batch[key]

    def per_pass(self, key: Any, build: Callable[[], Any]) -> Any:
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


class _BatchContext:
    def __init__(self, rec: Recorder, batch: TokenBatch):
        self.rec, self.batch_ = rec, batch

    def __enter__(self) -> Recorder:
        self.rec._batch = self.batch_
        self.rec._per_batch = {}
        return self.rec

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
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


# ---------------------------------------------------------------------------- memory
_MALLOC_TRIM: Any = None
# Batches between two trims: each trim makes the next batch fault its pages in again, so trimming
# after every batch cost ~10-20% of the pass on CPU; every 8th bounds the growth at a few batches'.
_TRIM_EVERY = 8


def _release_freed_memory() -> None:
    """Hand the pages that the last batch's activations freed back to the OS (glibc only).

    Why: each batch leaves a few small live tensors (its reductions) in the C heap between the
    large, freed activation blocks of varying sizes (length buckets), so glibc cannot shrink its
    heap and the process' resident memory grew with the number of prompts (measured: +0.6 MiB per
    prompt on a 6 x 384 GPT-2, 1.4 GiB at 2,000 prompts) although nothing but the small results
    stays alive. ``malloc_trim(0)`` returns the free pages inside the heap (``madvise``), not only
    its top. Called every :data:`_TRIM_EVERY` batches on CPU. A no-op where glibc is not the C library.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        _MALLOC_TRIM = False
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _MALLOC_TRIM = libc.malloc_trim
            _MALLOC_TRIM.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc (macOS, Windows, musl without it)
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


# ---------------------------------------------------------------------------- user hooks
class _Current:
    """The batch being run (set by :func:`collect` around each pass), and which user hooks fired."""

    def __init__(self) -> None:
        self.info: BatchInfo | None = None
        self.fired: set[int] = set()


_FIX = ("Fixes: index your source by the batch's prompts (rows = hook.ctx['batch'].prompt_index; "
        "real lengths hook.ctx['batch'].lengths), use thermo_lens.patch_from(model, clean_prompts, "
        "hook_names, positions=...), or run all prompts in one batch (batch_size=len(prompts)).")
_RETURN = ("A hook must return None (after editing the activation in place) or a tensor of the activation's "
           "shape, dtype family and device, as model.run_with_hooks expects.")


def _where(name: Any, fn: Callable, info: BatchInfo | None) -> str:
    rec = describe_hook(name, fn)
    at = rec.hook_point if isinstance(name, str) else f"{rec.hook_point} (matched {name!r})"
    if info is None:
        return f"user hook {rec.function} at {at}"
    return (f"user hook {rec.function} at {at} on batch {info.batch + 1}/{info.n_batches} "
            f"(prompts {info.prompt_index.tolist()}, lengths {info.lengths.tolist()}, padded width {info.width})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_return(res: Any, act: Any, where: Callable[[], str]) -> None:
    """A hook's return value must be usable as the activation: None, or a real tensor of its shape
    on its device (anything else fails deep inside the host, or silently on a meta tensor)."""
    if res is None:
        return
    if not isinstance(res, Tensor):
        raise ThermoLensHookError(f"{where()} returned a {type(res).__name__} ({_short(res)}). {_RETURN}")
    if res.is_meta:
        raise ThermoLensHookError(f"{where()} returned a meta tensor (shape {tuple(res.shape)}, no values). {_RETURN}")
    if isinstance(act, Tensor):
        if res.shape != act.shape:
            raise ThermoLensHookError(
                f"{where()} returned shape {tuple(res.shape)} for an activation of shape {tuple(act.shape)}; a hook "
                f"must return a tensor of the activation's shape (or None after editing it in place). {_FIX}")
        if res.device != act.device:
            raise ThermoLensHookError(
                f"{where()} returned a tensor on {res.device} for an activation on {act.device}. {_RETURN}")
        if res.is_floating_point() != act.is_floating_point():
            raise ThermoLensHookError(
                f"{where()} returned a {res.dtype} tensor for a {act.dtype} activation. {_RETURN}")


def wrap_user_hooks(hooks: Sequence[tuple[Any, Callable]], current: _Current) -> list[tuple[Any, Callable]]:
    """Wrap ``(name, fn)`` hooks so they see ``hook.ctx["batch"]``, fail with a clear error (a hook
    that raises, or returns something the host cannot use) and record that they fired
    (``current.fired`` holds their indices)."""
    out = []
    for index, (name, fn) in enumerate(hooks):
        def hook(act: Any, hook: Any = None, *, _fn: Callable = fn, _name: Any = name, _i: int = index) -> Any:
            info = current.info
            current.fired.add(_i)
            ctx = getattr(hook, "ctx", None) if hook is not None else None
            if isinstance(ctx, dict) and info is not None:
                ctx["batch"] = info

            def where() -> str:
                return _where(_name if isinstance(_name, str) else getattr(hook, "name", _name), _fn, info)
            try:
                res = _fn(act, hook=hook)
            except ThermoLensHookError:
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with the hook and batch named
                raise ThermoLensHookError(f"{where()} raised {type(e).__name__}: {e}. {_FIX}") from e
            finally:
                # TransformerLens keeps hook.ctx between runs: never leave a stale batch behind for
                # a later model.run_with_hooks call to read.
                if isinstance(ctx, dict):
                    ctx.pop("batch", None)
            _check_return(res, act, where)
            return res
        hook.__qualname__ = getattr(fn, "__qualname__", "hook")
        out.append((name, hook))
    return out


# ---------------------------------------------------------------------------- the pass
@dataclass(frozen=True)
class Collected:
    """What one pass over a prompt list recorded.

    Attributes:
        recorder: the reductions (``recorder.stack(name)``).
        lengths: ``[prompt]`` real token counts (BOS included when prepended).
        prompts: the prompt texts, in the caller's order.
        prepend_bos: the BOS mode used (``"host"`` recorded as what it resolved to;
            ``"tokens_as_given"`` for token-id input).
        truncated: per prompt, whether it was cut to ``n_ctx``.
        view: the :class:`ModelView`.
        row_prompt: ``[prompt]`` for each recorded row (batches may run in length order), the
            caller's index of its prompt; :meth:`stack` restores the caller's order.
        hooks: every hook active in the pass (:class:`thermo_lens.provenance.HookRecord`): the
            ``fwd_hooks`` first, then those already on the model (``add_hook``, ``model.hooks``,
            PyTorch module hooks, SAEs), detected before the pass.
        prompt_set, categories: the prompt set's name and one category per prompt.
        settings: the :class:`thermo_lens.settings.RunSettings` of the run.
        padding: how the padding of token ids given without a mask was found (``""`` otherwise).
        batch_plan: the caller's prompt indices of each batch, in the order they ran.
        origin: ``"forward pass"`` or ``"ActivationCache"`` (:func:`collect_cached`).
        cache_match: with a cache, how it was matched to the prompts and the model
            (:func:`thermo_lens.cache_match.match_cache`).
    """

    recorder: Recorder
    lengths: Tensor
    prompts: tuple[str, ...]
    prepend_bos: Any
    truncated: tuple[bool, ...]
    view: ModelView
    row_prompt: Tensor | None = None
    hooks: tuple = ()
    prompt_set: str = "custom"
    categories: tuple[str, ...] = ()
    settings: Any = None
    padding: str = ""
    batch_plan: tuple[tuple[int, ...], ...] = ()
    origin: str = "forward pass"
    cache_match: str = ""

    def stack(self, name: str) -> Tensor:
        """Reduction ``name`` as ``[index, prompt, ...]`` in the caller's prompt order."""
        data = self.recorder.stack(name)
        if self.row_prompt is None:
            return data
        return data[:, torch.argsort(self.row_prompt)]

    def batches(self, name: str) -> Iterable[tuple[Tensor, Tensor]]:
        """Reduction ``name`` batch by batch, as recorded: ``([index, batch, ...], lengths [batch])``,
        each batch padded only to its own longest prompt (possibly a view of the stored results: read
        it, never change it in place). Concatenate what you compute from them and put it back in the
        caller's order with :meth:`in_caller_order`."""
        keys = sorted(k for k in self.recorder._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.recorder.names)}")
        rows = self.lengths if self.row_prompt is None else self.lengths[self.row_prompt]
        start = 0
        lists = [self.recorder._parts[k] for k in keys]
        for i in range(min(len(p) for p in lists)):
            part = read_rows(self.recorder._slabs, lists, i)  # [index, batch, ...]
            size = part.shape[1]
            yield part, rows[start:start + size]
            start += size

    def in_caller_order(self, rows: Tensor, dim: int = 0) -> Tensor:
        """``rows`` (recording order along ``dim``, as from :meth:`batches`) in the caller's order."""
        if self.row_prompt is None:
            return rows
        return rows.index_select(dim, torch.argsort(self.row_prompt))

    def reduce(self, name: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """``fn`` applied per recorded batch (see :meth:`Recorder.reduce`), ``[index, prompt, ...]``
        in the caller's prompt order. Use it instead of :meth:`stack` when ``fn`` reduces the
        position dimension: no array is padded to the longest prompt of the run."""
        data = self.recorder.reduce(name, fn)
        if self.row_prompt is None:
            return data
        return data[:, torch.argsort(self.row_prompt)]

    @property
    def mask(self) -> Tensor:
        """``[prompt, pos]`` True on real tokens (pos up to the longest prompt)."""
        width = int(self.lengths.max())
        return torch.arange(width)[None, :] < self.lengths[:, None]

    @functools.cached_property
    def _model_metadata(self) -> dict[str, Any]:
        # Read once per pass (finding a dispatched model's device walks every module); each result
        # gets its own copy.
        return self.view.metadata()

    def provenance(self) -> Provenance:
        """The :class:`thermo_lens.provenance.Provenance` every result of this pass records."""
        return Provenance(prompts=tuple(self.prompts), lengths=self.lengths.to(torch.long).clone(),
                          truncated=tuple(bool(t) for t in self.truncated), prepend_bos=self.prepend_bos,
                          model=copy.deepcopy(self._model_metadata), hooks=tuple(self.hooks), prompt_set=self.prompt_set,
                          categories=tuple(self.categories), padding=self.padding, batch_plan=self.batch_plan,
                          origin=self.origin, cache_match=self.cache_match)


def collect(
    model: Any,
    prompts: Any,
    reductions: Sequence[Reduction],
    settings: Any = None,
    *,
    min_tokens: int = 1,
    internal_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    row_prompt: Sequence[int] | None = None,
    on_batch: Callable[[TokenBatch | None], None] | None = None,
    on_logits: Callable[[Tensor, TokenBatch], None] | None = None,
    **options: Any,
) -> Collected:
    """Run ``prompts`` through the model in padded batches with the given reductions.

    Args:
        model: a TransformerLens model or :class:`ModelView`.
        prompts: anything :func:`thermo_lens.inputs.as_prompts` takes (strings, a set name,
            ``{category: [...]}``, token ids).
        reductions: functions like :func:`residual_norms` that register hooks on a Recorder.
        settings: a :class:`thermo_lens.settings.RunSettings`; ``**options`` (``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks``, ``progress``, ``sort_by_length``)
            override its fields.
        min_tokens: minimum real tokens per prompt.
        internal_hooks: thermo-lens' own intervention hooks (run after the user's, not wrapped).
        row_prompt: for a prompt list that repeats the user's prompts (internal use), the user's
            index of each prompt, shown to user hooks as ``hook.ctx["batch"].prompt_index``.
        on_batch: called with each batch before it runs (``None`` after it ran), for internal hooks
            that act per row (``batch.prompt_index``: rows of ``prompts``).
        on_logits: when given, every pass runs to the logits and ``on_logits(logits, batch)`` gets
            them (``[batch, pos, d_vocab]``) after each batch.

    Before anything runs, every ``fwd_hooks`` name is checked against the model's hook points
    (:func:`thermo_lens.attached.check_hook_names`: a misspelt or out-of-range name is an error
    naming the closest valid ones), and the hooks already on the model (``model.add_hook``,
    ``with model.hooks(...)``, SAEs, PyTorch module hooks) are detected and recorded with the
    ``fwd_hooks`` (:func:`thermo_lens.attached.attached_hooks`). User hooks run in the same pass
    *before* the reductions, wrapped so that they can read ``hook.ctx["batch"]``
    (:class:`thermo_lens.tokens.BatchInfo`) and fail with an error naming the hook and batch (also
    for a return value the host cannot use); a ``fwd_hooks`` entry that never ran (a hook point the
    host does not fire) is an error. Prompts that fit one batch run as one batch in the caller's
    order; more run in length buckets of up to ``batch_size`` prompts that pad at most 10% of
    their positions (:func:`plan_batches`); the plan never depends on the hooks, and results come
    back in the caller's order either way.

    Every state measured is a block's, so unless a hook is registered past the blocks (e.g. at
    ``ln_final.*``, or a name filter), the pass ends after the last block's ``hook_resid_post``:
    the final norm and the unembedding (``d_model x d_vocab`` per token) never run
    (:meth:`ModelView.run`'s ``stop_after``; the numbers are those of a full forward).

    Raises:
        ThermoLensInputError: a hook name the model has no hook point for.
        ThermoLensNumericsError: a real token's residual norm or attention was NaN/inf; the
            message names the first hook point (layer) where it happened.
        thermo_lens.errors.ThermoLensHookError: a user hook failed, or never ran.
    """
    from tqdm.auto import tqdm  # imported on first use: a notebook's progress bar

    view = as_view(model)
    settings = RunSettings.resolve(settings, **options)
    attached.check_hook_names(view.model, [name for name, _ in settings.fwd_hooks], view.name)
    ps = as_model_prompts(view, prompts)
    if row_prompt is not None and len(row_prompt) != len(ps):
        raise ValueError("row_prompt needs one entry per prompt")
    # Tokenize everything once, first, so a bad prompt fails before any compute.
    everything = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos,
                             truncate=settings.truncate, min_tokens=min_tokens)
    for _, fn in settings.fwd_hooks:  # hooks that know what they were built for (a patch: its model, its BOS)
        check = getattr(fn, "thermo_lens_check", None)
        if callable(check):
            check(view=view, prepend_bos=everything.prepend_bos, settings=settings)
    # The plan depends on the lengths and settings only, never on the user's hooks: two runs that
    # differ by their hooks batch identically (a paired difference is then exactly the hooks'
    # effect). thermo-lens' own intervention passes stack copies of each prompt: caller's order.
    plan = plan_batches(everything.lengths, settings.batch_size,
                        sort_by_length=False if internal_hooks else settings.sort_by_length,
                        max_padding=None if internal_hooks else MAX_PADDING)
    # Each batch's padded ids are cut from the tokenized whole when it runs, not all up front: a long
    # run (thousands of prompts) then holds one batch's copy at a time.
    n_batches = len(plan)
    hidden = attached_records(attached.attached_hooks(view.model))  # before any hook of ours is registered
    rec = Recorder()
    # Nothing but the reductions' own hooks runs in this pass: no activation changes between two of
    # their reads (the attribution then needs no copy of a block's output to find a splice).
    rec.foreign_hooks = bool(settings.fwd_hooks or internal_hooks or hidden)
    for r in reductions:
        r(view, rec)
    current = _Current()
    user_index = None if row_prompt is None else torch.as_tensor(list(row_prompt), dtype=torch.long)
    hooks = wrap_user_hooks(settings.fwd_hooks, current) + list(internal_hooks) + rec.fwd_hooks()
    # Every state measured is a block's: when no hook is registered past the blocks, the pass ends
    # after the last block (the final norm and the unembedding, whose logits nothing reads, are skipped).
    # Hooks already on the model do not extend the pass: past the last block read they cannot change
    # a measured state (they are recorded all the same).
    stop_after = None if on_logits is not None else view.last_hook_needed([name for name, _ in hooks])
    show = settings.progress if settings.progress is not None else n_batches > 1
    # Counted in prompts, not batches: the bar's rate is prompts/s and its ETA holds for length-bucketed
    # batches of different sizes (a long run of thousands of prompts).
    # The device is looked up once for the pass: finding a dispatched model's execution device walks every module.
    with tqdm(total=sum(len(rows) for rows in plan), desc=f"thermo-lens {view.name}", unit="prompt",
              disable=not show, leave=False, smoothing=0.05) as bar, view.pinned_device() as device:
        for k, rows in enumerate(plan):
            batch = everything.select(rows)
            current.info = BatchInfo.of(batch, k, n_batches,
                                        None if user_index is None else user_index[batch.prompt_index])
            try:
                if on_batch is not None:
                    on_batch(batch)
                with rec.batch(batch):
                    logits = view.run(batch.tokens, batch.mask, hooks, stop_after=stop_after,
                                      return_logits=on_logits is not None)
                if on_logits is not None:
                    assert logits is not None, "ModelView.run(return_logits=True) returned no logits"
                    on_logits(logits, batch)
            finally:
                current.info = None
                if on_batch is not None:
                    on_batch(None)
            if k % _TRIM_EVERY == _TRIM_EVERY - 1 and device.type == "cpu":
                _release_freed_memory()
            _check_silent(view, rec)
            bar.update(len(batch.prompt_index))
    rec._per_pass.clear()  # e.g. a copy of W_O: not kept with the results
    _check_finite(view, rec)  # the results reach the host here, once for the pass
    never = [i for i in range(len(settings.fwd_hooks)) if i not in current.fired]
    if never:
        name, fn = settings.fwd_hooks[never[0]]
        raise ThermoLensHookError(
            f"{_where(name, fn, None)} never ran in {n_batches} batch(es): {view.name} "
            f"({view.host.describe()}) does not fire that hook point in a forward pass (e.g. hook_result needs "
            "model.set_use_attn_result(True), hook_attn_in model.set_use_attn_in(True)), so the result would "
            "record an intervention that did not happen. Enable the hook point or hook another one.")
    return Collected(
        recorder=rec,
        lengths=everything.lengths,
        prompts=tuple(ps.texts),
        prepend_bos=everything.prepend_bos,  # what "host" resolved to (True/False/"host:...")
        truncated=everything.truncated,
        view=view,
        row_prompt=everything.prompt_index[torch.as_tensor([i for rows in plan for i in rows], dtype=torch.long)],
        hooks=tuple(describe_hook(n, f) for n, f in settings.fwd_hooks) + hidden,
        prompt_set=ps.name,
        categories=tuple(ps.categories),
        settings=settings,
        padding=ps.padding,
        batch_plan=tuple(tuple(int(i) for i in rows) for rows in plan),
    )


def _check_pass(view: ModelView, rec: Recorder) -> None:
    """After a pass: every reduction's hook ran, and no real token was NaN/inf."""
    _check_silent(view, rec)
    _check_finite(view, rec)


def _check_silent(view: ModelView, rec: Recorder) -> None:
    """After a batch: every reduction's hook ran (host bookkeeping only: no device sync)."""
    silent = rec.silent_hooks()
    if silent:
        # Some hosts skip hook names they do not know without a word; never return a
        # result built from a partial set of states.
        raise ThermoLensInputError(
            f"{view.name} ({view.host.describe()}) never ran thermo-lens' hooks at "
            f"{', '.join(silent[:4])}{' ...' if len(silent) > 4 else ''}: its run_with_hooks "
            "skipped them, so nothing was measured. This host does not expose TransformerLens' "
            "standard hook names there; use a supported host (see thermo_lens.host)."
        )


def _check_finite(view: ModelView, rec: Recorder) -> None:
    """After a pass (:meth:`Recorder.finish`: the results and the finiteness counts reach the host
    here, once): no real token was NaN/inf; the error names the first hook point, in the first
    failing batch, and that batch's prompts."""
    rec.finish()
    if rec.nonfinite:
        batch = rec.nonfinite_batch
        first = rec.nonfinite[0]
        layer = first.split(".")[1] if first.startswith("blocks.") else "?"
        where = f"{first} (layer {layer})" if layer != "?" else first
        if first.endswith(".hook_resid_pre") and layer.isdigit() and int(layer) > 0:
            # x_l is read where block l reads it: name the block whose output it is
            l = int(layer)
            where = f"blocks.{l - 1}.hook_resid_post (layer {l - 1}), read at {first} where block {l} reads it,"
        hint = (f" in {str(view.dtype).replace('torch.', '')} this is often overflow: try float32 or bfloat16"
                if view.dtype in (torch.float16, torch.bfloat16) else
                " check the weights (e.g. a NaN/inf parameter) and any hooks you passed")
        raise ThermoLensNumericsError(
            f"{view.name} produced NaN/inf at {where} for prompt(s) "
            f"{batch.prompt_index.tolist() if batch is not None else '?'};{hint}."
        )


# ---------------------------------------------------------------------------- from a cache
def _cache_dict(cache: Any) -> dict[str, Tensor]:
    """``{hook name: activation}`` of an ``ActivationCache`` (or a dict like one)."""
    if getattr(cache, "has_batch_dim", True) is False:
        raise ThermoLensInputError(
            "this ActivationCache has no batch dimension (run_with_cache(..., remove_batch_dim=True)); "
            "make it without remove_batch_dim: thermo-lens reads [batch, pos, ...] activations")
    acts = getattr(cache, "cache_dict", None)
    if acts is None and isinstance(cache, Mapping):
        acts = cache
    if not isinstance(acts, Mapping) or not acts:
        raise ThermoLensInputTypeError(
            f"cache must be the ActivationCache of model.run_with_cache(tokens) (or a {{hook name: tensor}} dict), "
            f"got {type(cache).__name__}")
    return dict(acts)


def _cache_key(view: ModelView, acts: Mapping[str, Tensor], name: str) -> str | None:
    """The key under which ``acts`` holds the activation thermo-lens reads at hook ``name``: where
    an SAE is spliced in, its output (as :meth:`ModelView.run` reads it); else the name itself, or
    the bridge's canonical name of that alias."""
    candidates = []
    if attached.needs_resolving(view.model):
        candidates.append(attached.resolve_hook(view.model, name, view.name))
    candidates.append(name)
    hook_dict = getattr(view.model, "hook_dict", None)
    if isinstance(hook_dict, dict) and name in hook_dict:
        own = getattr(hook_dict[name], "name", None)
        if own:
            candidates.append(own)
    return next((c for c in candidates if c in acts), None)


def _names_filter_hint(names: Sequence[str]) -> str:
    """A ``names_filter`` for ``run_with_cache`` covering ``names``, by suffix (short) and exactly."""
    suffixes = sorted({n.rsplit(".", 1)[-1] if ".hook_sae_" in n else n.split(".", 2)[-1] if n.startswith("blocks.")
                       else n for n in names})
    return (f"_, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith({tuple(suffixes)!r})) "
            f"(exactly: names_filter={sorted(names)!r})")


def _position_dims(name: str) -> tuple[int, ...]:
    """The position dimensions of the activation at hook ``name`` (after the batch)."""
    base = name.rsplit(".", 1)[-1]
    return (2, 3) if base in ("hook_pattern", "hook_attn_scores") else (1,)


def _relayout(act: Tensor, name: str, starts: Tensor, width: int) -> Tensor:
    """``act`` as a right-padded batch of ``width`` positions: row ``b``'s real tokens start at
    ``starts[b]`` in the cache (left padding), at 0 here. Positions past a row's length are
    padding (masked by every reduction)."""
    dims = _position_dims(name)
    if not bool(starts.any()):
        for d in dims:
            act = act.narrow(d, 0, width)
        return act
    T = act.shape[dims[0]]
    idx = (starts[:, None] + torch.arange(width)[None, :]).clamp(max=T - 1).to(act.device)  # [batch, width]
    if dims == (1,):
        shape = (act.shape[0], width) + (1,) * (act.ndim - 2)
        return act.gather(1, idx.view(shape).expand(act.shape[0], width, *act.shape[2:]))
    B, H = act.shape[0], act.shape[1]
    q = act.gather(2, idx[:, None, :, None].expand(B, H, width, act.shape[3]))
    return q.gather(3, idx[:, None, None, :].expand(B, H, width, width))


def _cache_prompts(view: ModelView, prompts: Any, settings: RunSettings) -> tuple[Any, Tensor, Tensor]:
    """The prompts of a cache as :func:`token_batch` takes them, the position of each row's first
    real token in the cache, and the cache's ``[batch, pos]`` token ids. Token ids: as given (masked as
    :func:`thermo_lens.inputs.as_prompts` masks them). Texts: tokenized as ``run_with_cache`` did,
    ``model.to_tokens(texts)`` (one padded batch)."""
    from thermo_lens.inputs import PromptList

    ps = as_model_prompts(view, prompts)
    if ps.token_ids is not None:
        given = torch.as_tensor(prompts["input_ids"] if isinstance(prompts, Mapping) else prompts)
        given = given.reshape(-1, given.shape[-1]).to(torch.long)
        return ps, torch.as_tensor(ps.starts or (0,) * len(ps), dtype=torch.long), given
    if settings.prepend_bos not in ("host", True, False):
        raise ThermoLensInputError(
            f"with cache=, prompt texts are tokenized as run_with_cache tokenized them (model.to_tokens); "
            f"prepend_bos={settings.prepend_bos!r} has no to_tokens form: pass the tokens you cached instead")
    to_tokens = getattr(view.model, "to_tokens", None)
    if to_tokens is None:
        raise ThermoLensInputError(f"{view.name} has no to_tokens: pass the token ids the cache was made from")
    kw = {} if settings.prepend_bos == "host" else {"prepend_bos": bool(settings.prepend_bos)}

    def ids(x: Any) -> Tensor:
        return x[0] if isinstance(x, tuple) else x  # HookedEncoder: (tokens, token_type_ids, attention_mask)
    batch_ids = ids(to_tokens(list(ps.texts), move_to_device=False, **kw))
    rows, starts = [], []
    side = str(getattr(view.tokenizer, "padding_side", "right") or "right")
    for b, text in enumerate(ps.texts):
        own = [int(t) for t in ids(to_tokens(text, move_to_device=False, **kw))[0]]
        n = len(own)
        start = batch_ids.shape[1] - n if side == "left" else 0
        if batch_ids[b, start:start + n].tolist() != own:
            raise ThermoLensInputError(
                f"prompt {b}: model.to_tokens of the prompt list does not hold its own tokens at positions "
                f"{start}..{start + n - 1}; pass the token ids the cache was made from")
        rows.append(tuple(own))
        starts.append(start)
    bos = HOST_BOS if settings.prepend_bos == "host" else settings.prepend_bos
    # Token rows as the host made them; recorded with the BOS mode they were made under.
    tokens_ps = PromptList(texts=ps.texts, categories=ps.categories, name=ps.name, token_ids=tuple(rows),
                           starts=tuple(starts))
    return (tokens_ps, bos), torch.as_tensor(starts, dtype=torch.long), batch_ids.to(torch.long)


def collect_cached(
    model: Any,
    prompts: Any,
    cache: Any,
    reductions: Sequence[Reduction],
    settings: Any = None,
    *,
    min_tokens: int = 1,
    **options: Any,
) -> Collected:
    """What :func:`collect` records, from an existing ``ActivationCache``: no forward pass.

    ``cache`` is ``model.run_with_cache(tokens)``'s cache and ``prompts`` the tokens it was made
    from (a ``[batch, pos]`` tensor, masked as :func:`thermo_lens.inputs.as_prompts` masks it, or
    ``{"input_ids", "attention_mask"}``), or the prompt strings it was made from
    (``run_with_cache(prompts)``; tokenized again with ``model.to_tokens``, which is what
    ``run_with_cache`` ran). The cached activations are replayed through the reductions' hooks in
    forward order (each reduction is a plain ``(hook_name, fn)``; left-padded rows are moved to
    the right-padded layout the reductions read), so the numbers are the pass's, up to the float
    rounding of another batch shape.

    The cache must have been made from these tokens, by this model, with the pads masked
    (:func:`thermo_lens.cache_match.match_cache`: its embedding, ``cache.model`` and block 0's
    attention pattern are checked); the provenance records how it was matched.

    Raises:
        ThermoLensInputError: the cache lacks a hook the reductions read (the message lists them
            and a ``names_filter`` for ``run_with_cache``), its activations do not have the tokens'
            shape, it has no batch dimension, it was made from other tokens (other prompts, another
            order), by another model, or without the attention mask on attendable pads, or
            ``fwd_hooks`` were given (nothing runs: cache under your hooks instead,
            ``with model.hooks(fwd_hooks=...)``).
    """
    view = as_view(model)
    settings = RunSettings.resolve(settings, **options)
    if settings.fwd_hooks:
        raise ThermoLensInputError(
            "fwd_hooks cannot apply to a cache: no forward pass runs with cache=. Make the cache under your hooks "
            "(with model.hooks(fwd_hooks=hooks): _, cache = model.run_with_cache(tokens)), or drop cache= to run "
            "the hooks in thermo-lens' own pass")
    acts = _cache_dict(cache)
    laid, starts, cache_tokens = _cache_prompts(view, prompts, settings)
    width_cache = int(cache_tokens.shape[1])
    ps, bos = laid if isinstance(laid, tuple) else (laid, None)
    batch = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos, truncate=settings.truncate,
                        min_tokens=min_tokens)
    if bos is not None:
        from thermo_lens.tokens import resolve_host_bos

        resolved = (list(dict.fromkeys(resolve_host_bos(view, t, list(r)) for t, r in zip(ps.texts, ps.token_ids)))
                    if bos == HOST_BOS else [bos])
        bos = resolved[0] if len(resolved) == 1 else "host:" + "|".join(str(k) for k in resolved)
        batch = TokenBatch(tokens=batch.tokens, lengths=batch.lengths, prompt_index=batch.prompt_index,
                           prepend_bos=bos, truncated=batch.truncated)
    rec = Recorder()
    for r in reductions:
        r(view, rec)
    hooks = rec.fwd_hooks()
    keys = {name: _cache_key(view, acts, name) for name, _ in hooks}
    # where a host re-points a name (an SAE's output), the cache must hold the point it reads
    wanted = {name: (attached.resolve_hook(view.model, name, view.name) if attached.needs_resolving(view.model)
                     else name) for name in keys}
    missing = sorted({wanted[n] for n, k in keys.items() if k is None}, key=attached.forward_order)
    real = ((torch.arange(width_cache)[None, :] >= starts[:, None])
            & (torch.arange(width_cache)[None, :] < (starts + batch.lengths.to(torch.long))[:, None]))  # [batch, pos]
    checks = cache_match.check_hooks(view, cache_match.pads_attendable(view, real))
    if missing:
        raise ThermoLensInputError(
            f"the cache lacks {len(missing)} hook(s) these measurements read: {', '.join(missing[:6])}"
            f"{' ...' if len(missing) > 6 else ''} (it holds {len(acts)}). Cache them: "
            f"{_names_filter_hint(list(dict.fromkeys([*wanted.values(), *checks])))}")
    present = {name: key for name, key in keys.items() if key is not None}  # every key, after the check above
    B, width = len(ps), int(batch.tokens.shape[1])
    for name, key in present.items():
        act = acts[key]
        d = _position_dims(name)[0]
        if act.ndim <= d or act.shape[0] != B or act.shape[d] != width_cache:
            raise ThermoLensInputError(
                f"the cache's activation at {key} has shape {tuple(act.shape)}, but the prompts give {B} row(s) of "
                f"{width_cache} token positions: pass the tokens the cache was made from (model.to_tokens(prompts) "
                "as given to run_with_cache), with their attention mask if padded")
    matched = cache_match.match_cache(view, cache, acts, cache_tokens, real,
                                      _cache_key(view, acts, cache_match.PATTERN_HOOK))
    order = sorted(range(len(hooks)), key=lambda i: (attached.forward_order(hooks[i][0]), i))
    with torch.inference_mode(), rec.batch(batch):
        for i in order:
            name, fn = hooks[i]
            fn(_relayout(acts[present[name]], name, starts, width))
    rec._per_pass.clear()
    _check_pass(view, rec)
    sae = attached_records(h for h in attached.attached_hooks(view.model) if h.attached == "sae")
    return Collected(
        recorder=rec, lengths=batch.lengths, prompts=tuple(ps.texts), prepend_bos=batch.prepend_bos,
        truncated=batch.truncated, view=view, row_prompt=None, hooks=sae, prompt_set=ps.name,
        categories=tuple(ps.categories), settings=settings, padding=ps.padding,
        batch_plan=(tuple(range(B)),), origin="ActivationCache", cache_match=matched,
    )
