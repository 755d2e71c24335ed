"""The forward pass: one pass per batch, feeding the in-pass reductions of every measurement.

Nothing here stores a full activation: every reduction (registered by a measurement, e.g.
:func:`thermo_lens.gain.residual_norms`) turns its tensor into the few numbers a metric needs
inside the hook and drops the rest, so a whole battery costs one forward pass per prompt batch
and memory linear in the number of tokens. :func:`collect` runs the pass and returns a
:class:`Collected`; measurements derive their results from it without running the model again
(``*_from_collected``). :func:`thermo_lens.run` (:mod:`thermo_lens.measure`) is the public front:
it picks the reductions of the measurements you name and builds their results from one pass.

User hooks passed as ``fwd_hooks`` run in the same pass *before* the reductions, so a reduction at
the same hook point sees the activation as the user's hook left it (e.g. after an ablation). With
user hooks, batches keep the caller's prompt order and each hook can read the current batch from
``hook.ctx["batch"]`` (:class:`thermo_lens.tokens.BatchInfo`); a hook that raises, or returns a
tensor of another shape, gets a :class:`~thermo_lens.errors.ThermoLensHookError` naming the hook,
the batch and the fix.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from thermo_lens.errors import ThermoLensHookError, ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.inputs import as_prompts
from thermo_lens.model import ModelView, as_view
from thermo_lens.provenance import Provenance, describe_hook
from thermo_lens.settings import RunSettings
from thermo_lens.tokens import MAX_PADDING, BatchInfo, TokenBatch, plan_batches, token_batch

__all__ = ["Recorder", "Collected", "Reduction", "collect", "wrap_user_hooks"]

Reduce = Callable[[Tensor, TokenBatch], Tensor]
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
        self._parts: dict[tuple[str, int], list[Tensor]] = defaultdict(list)
        self._fired: set[tuple[str, int]] = set()  # keys whose hook ran (some record nothing)
        self._batch: TokenBatch | None = None
        self._per_batch: dict[Any, Any] = {}  # values derived from the current batch (built once)
        self.nonfinite: list[str] = []  # hook names where a real token had NaN/inf

    def add(self, hook_name: str, key: tuple[str, int], fn: Reduce) -> None:
        self._reductions.append((hook_name, key, fn))

    def put(self, key: tuple[str, int], value: Tensor) -> None:
        """Record ``value`` (first dimension: the batch) under ``key`` from inside a reduction
        that produces several results at one hook point."""
        self._parts[key].append(value.to("cpu"))

    def fwd_hooks(self) -> list[tuple[str, Callable]]:
        """``(hook_name, hook_fn)`` pairs for ``run_with_hooks``; the hooks return None."""
        hooks = []
        for hook_name, key, fn in self._reductions:
            def hook(act: Tensor, hook: Any = None, *, _key=key, _fn=fn, _name=hook_name) -> None:
                if self._batch is None:
                    raise RuntimeError("Recorder hook fired outside Recorder.batch(...)")
                self._fired.add(_key)
                out = _fn(act.detach(), self._batch)
                if out is not None:  # None: a reduction that only keeps transient state
                    self._parts[_key].append(out.to("cpu"))
            hooks.append((hook_name, hook))
        return hooks

    def mask(self, device: torch.device) -> Tensor:
        """The current batch's ``[batch, pos]`` real-token mask on ``device`` (cached per batch)."""
        return self.per_batch(("mask", str(device)), lambda batch: batch.mask.to(device))

    def per_batch(self, key: Any, build: Callable[[TokenBatch], Any]) -> Any:
        """``build(batch)`` for the current batch, computed once per batch under ``key`` and shared
        by every hook that asks (e.g. the mask on a device, the scoped rows of the attribution);
        dropped when the batch ends."""
        if self._batch is None:
            raise RuntimeError("Recorder.per_batch used outside Recorder.batch(...)")
        if key not in self._per_batch:
            self._per_batch[key] = build(self._batch)
        return self._per_batch[key]

    def silent_hooks(self) -> list[str]:
        """Hook names whose reductions have recorded nothing (the host never ran those hooks)."""
        return sorted({h for h, key, _ in self._reductions if key not in self._fired})

    def batch(self, batch: TokenBatch) -> "_BatchContext":
        """Context manager that makes ``batch`` (its mask) visible to the reductions."""
        return _BatchContext(self, batch)

    @property
    def names(self) -> set[str]:
        return {k[0] for k in self._parts}

    def stack(self, name: str) -> Tensor:
        """All batches of reduction ``name`` concatenated, indices stacked on dim 0."""
        keys = sorted(k for k in self._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.names)}")
        return torch.stack([self._cat(self._parts[k]) for k in keys])

    def reduce(self, name: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Like :meth:`stack`, but ``fn`` (which must drop the position dimensions) is applied to
        each batch's own part first, so nothing is ever padded to the longest prompt of the
        whole run: memory follows each batch's real length (batches are length-bucketed)."""
        keys = sorted(k for k in self._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.names)}")
        return torch.stack([torch.cat([fn(p) for p in self._parts[k]], dim=0) for k in keys])

    @staticmethod
    def _cat(parts: list[Tensor]) -> Tensor:
        # Batches differ in padded length: pad every non-batch dimension (the position ones;
        # heads etc. agree) with NaN up to the largest batch, then concatenate the batches.
        shape = [max(p.shape[d] for p in parts) for d in range(1, parts[0].ndim)]
        padded = []
        for p in parts:
            pad: list[int] = []
            for d in reversed(range(1, p.ndim)):
                pad += [0, shape[d - 1] - p.shape[d]]
            padded.append(torch.nn.functional.pad(p, pad, value=float("nan")) if any(pad) else p)
        return torch.cat(padded, dim=0)


class _BatchContext:
    def __init__(self, rec: Recorder, batch: TokenBatch):
        self.rec, self.batch_ = rec, batch

    def __enter__(self) -> Recorder:
        self.rec._batch = self.batch_
        self.rec._per_batch = {}
        return self.rec

    def __exit__(self, *exc: Any) -> None:
        self.rec._batch = None
        self.rec._per_batch = {}


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
    """The batch being run (set by :func:`collect` around each pass)."""

    info: BatchInfo | None = None


_FIX = ("Fixes: index your source by the batch's prompts (rows = hook.ctx['batch'].prompt_index; "
        "real lengths hook.ctx['batch'].lengths), use thermo_lens.patch_from(model, clean_prompts, "
        "hook_names, positions=...), or run all prompts in one batch (batch_size=len(prompts)).")


def _where(name: Any, fn: Callable, info: BatchInfo | None) -> str:
    rec = describe_hook(name, fn)
    at = rec.hook_point if isinstance(name, str) else f"{rec.hook_point} (matched {name!r})"
    if info is None:
        return f"user hook {rec.function} at {at}"
    return (f"user hook {rec.function} at {at} on batch {info.batch + 1}/{info.n_batches} "
            f"(prompts {info.prompt_index.tolist()}, lengths {info.lengths.tolist()}, padded width {info.width})")


def wrap_user_hooks(hooks: Sequence[tuple[Any, Callable]], current: _Current) -> list[tuple[Any, Callable]]:
    """Wrap ``(name, fn)`` hooks so they see ``hook.ctx["batch"]`` and fail with a clear error."""
    out = []
    for name, fn in hooks:
        def hook(act: Any, hook: Any = None, *, _fn: Callable = fn, _name: Any = name) -> Any:
            info = current.info
            ctx = getattr(hook, "ctx", None) if hook is not None else None
            if isinstance(ctx, dict) and info is not None:
                ctx["batch"] = info
            try:
                res = _fn(act, hook=hook)
            except ThermoLensHookError:
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with the hook and batch named
                raise ThermoLensHookError(
                    f"{_where(_name if isinstance(_name, str) else getattr(hook, 'name', _name), _fn, info)} raised {type(e).__name__}: {e}. {_FIX}"
                ) from e
            finally:
                # TransformerLens keeps hook.ctx between runs: never leave a stale batch behind for
                # a later model.run_with_hooks call to read.
                if isinstance(ctx, dict):
                    ctx.pop("batch", None)
            if isinstance(res, Tensor) and isinstance(act, Tensor) and res.shape != act.shape:
                raise ThermoLensHookError(
                    f"{_where(_name if isinstance(_name, str) else getattr(hook, 'name', _name), _fn, info)} returned shape {tuple(res.shape)} "
                    f"for an activation of shape {tuple(act.shape)}; a hook must return a tensor of the "
                    f"activation's shape (or None after editing it in place). {_FIX}")
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
        hooks: the user hooks of the run (:class:`thermo_lens.provenance.HookRecord`).
        prompt_set, categories: the prompt set's name and one category per prompt.
        settings: the :class:`thermo_lens.settings.RunSettings` of the run.
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

    def stack(self, name: str) -> Tensor:
        """Reduction ``name`` as ``[index, prompt, ...]`` in the caller's prompt order."""
        data = self.recorder.stack(name)
        if self.row_prompt is None:
            return data
        return data[:, torch.argsort(self.row_prompt)]

    def batches(self, name: str) -> Iterable[tuple[Tensor, Tensor]]:
        """Reduction ``name`` batch by batch, as recorded: ``([index, batch, ...], lengths [batch])``,
        each batch padded only to its own longest prompt. Concatenate what you compute from them
        and put it back in the caller's order with :meth:`in_caller_order`."""
        keys = sorted(k for k in self.recorder._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.recorder.names)}")
        rows = self.lengths if self.row_prompt is None else self.lengths[self.row_prompt]
        start = 0
        for parts in zip(*(self.recorder._parts[k] for k in keys)):
            size = parts[0].shape[0]
            yield torch.stack(parts), rows[start:start + size]
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

    def provenance(self) -> Provenance:
        """The :class:`thermo_lens.provenance.Provenance` every result of this pass records."""
        return Provenance(prompts=tuple(self.prompts), lengths=self.lengths.to(torch.long).clone(),
                          truncated=tuple(bool(t) for t in self.truncated), prepend_bos=self.prepend_bos,
                          model=self.view.metadata(), hooks=tuple(self.hooks), prompt_set=self.prompt_set,
                          categories=tuple(self.categories))


def collect(
    model: Any,
    prompts: Any,
    reductions: Sequence[Reduction],
    settings: Any = None,
    *,
    min_tokens: int = 1,
    internal_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    row_prompt: Sequence[int] | None = None,
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

    User hooks run in the same pass *before* the reductions, wrapped so that they can read
    ``hook.ctx["batch"]`` (:class:`thermo_lens.tokens.BatchInfo`) and fail with an error
    naming the hook and batch. With user hooks, batches keep the caller's order. Without them
    (and with ``sort_by_length`` left unset or True) the batches are length buckets of up to
    ``batch_size`` prompts that pad at most 10% of their positions (:func:`plan_batches`);
    results come back in the caller's order either way.

    Every state measured is a block's, so unless a hook is registered past the blocks (e.g. at
    ``ln_final.*``, or a name filter), the pass ends after the last block's ``hook_resid_post``:
    the final norm and the unembedding (``d_model x d_vocab`` per token) never run
    (:meth:`ModelView.run`'s ``stop_after``; the numbers are those of a full forward).

    Raises:
        ThermoLensNumericsError: a real token's residual norm or attention was NaN/inf; the
            message names the first hook point (layer) where it happened.
        thermo_lens.interventions.ThermoLensHookError: a user hook failed.
    """
    from tqdm.auto import tqdm  # imported on first use: a notebook's progress bar

    view = as_view(model)
    settings = RunSettings.resolve(settings, **options)
    ps = as_prompts(prompts, tokenizer=view.tokenizer, vocab_size=view.d_vocab)
    if row_prompt is not None and len(row_prompt) != len(ps):
        raise ValueError("row_prompt needs one entry per prompt")
    # Tokenize everything once, first, so a bad prompt fails before any compute.
    everything = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos,
                             truncate=settings.truncate, min_tokens=min_tokens)
    # Length buckets only without any hooks: hooks that index the batch must see plain batches.
    plan = plan_batches(everything.lengths, settings.batch_size,
                        sort_by_length=settings.by_length and not internal_hooks,
                        max_padding=None if (settings.fwd_hooks or internal_hooks) else MAX_PADDING)
    tokenized = [everything.select(rows) for rows in plan]
    rec = Recorder()
    for r in reductions:
        r(view, rec)
    current = _Current()
    user_index = None if row_prompt is None else torch.as_tensor(list(row_prompt), dtype=torch.long)
    hooks = wrap_user_hooks(settings.fwd_hooks, current) + list(internal_hooks) + rec.fwd_hooks()
    # Every state measured is a block's: when no hook is registered past the blocks, the pass ends
    # after the last block (the final norm and the unembedding, whose logits nothing reads, are skipped).
    stop_after = view.last_hook_needed([name for name, _ in hooks])
    show = settings.progress if settings.progress is not None else len(tokenized) > 1
    for k, batch in enumerate(tqdm(tokenized, desc=f"thermo-lens {view.name}", unit="batch", disable=not show,
                                   leave=False)):
        current.info = BatchInfo.of(batch, k, len(tokenized),
                                    None if user_index is None else user_index[batch.prompt_index])
        try:
            with rec.batch(batch):
                view.run(batch.tokens, batch.mask, hooks, stop_after=stop_after)
        finally:
            current.info = None
        if k % _TRIM_EVERY == _TRIM_EVERY - 1 and view.device.type == "cpu":
            _release_freed_memory()
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
        if rec.nonfinite:
            first = rec.nonfinite[0]
            layer = first.split(".")[1] if first.startswith("blocks.") else "?"
            hint = (f" in {str(view.dtype).replace('torch.', '')} this is often overflow: try float32 or bfloat16"
                    if view.dtype in (torch.float16, torch.bfloat16) else
                    " check the weights (e.g. a NaN/inf parameter) and any hooks you passed")
            raise ThermoLensNumericsError(
                f"{view.name} produced NaN/inf at {first} (layer {layer}) for prompt(s) "
                f"{batch.prompt_index.tolist()};{hint}."
            )
    return Collected(
        recorder=rec,
        lengths=everything.lengths,
        prompts=tuple(ps.texts),
        prepend_bos=everything.prepend_bos,  # what "host" resolved to (True/False/"host:...")
        truncated=everything.truncated,
        view=view,
        row_prompt=torch.cat([b.prompt_index for b in tokenized]),
        hooks=tuple(describe_hook(n, f) for n, f in settings.fwd_hooks),
        prompt_set=ps.name,
        categories=tuple(ps.categories),
        settings=settings,
    )
