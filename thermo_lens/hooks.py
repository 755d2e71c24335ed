"""Hook factories that reduce activations *inside* the forward pass, and the Recorder.

Nothing here stores a full activation: every hook turns its tensor into the few numbers a metric
needs (per-token float32 residual norms, per-prompt anisotropy sums, the attention pattern's
diagonal) and drops the rest, so the whole battery costs one forward pass per prompt batch and
memory linear in the number of tokens.

Typical use (what :func:`thermo_lens.residual_gain` does)::

    rec = collect(view, prompts, [residual_norms, anisotropy], prepend_bos=True,
                  fwd_hooks=[("blocks.0.attn.hook_z", ablate_head_3)])  # user hooks compose
    norms = rec.stack("resid_norm")        # [L+1, prompt, pos] float32, NaN on padding

User hooks passed as ``fwd_hooks`` are registered *before* the reductions, so a reduction at
the same hook point sees the activation as the user's hook left it (e.g. after an ablation).
With user hooks, batches keep the caller's prompt order and each hook can read the current batch
from ``hook.ctx["batch"]`` (:class:`thermo_lens.interventions.BatchInfo`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from thermo_lens.model import ModelView, TokenBatch, as_view
from thermo_lens.errors import ThermoLensInputError, ThermoLensNumericsError

__all__ = [
    "Recorder",
    "Collected",
    "ThermoLensNumericsError",
    "collect",
    "plan_batches",
    "residual_norms",
    "anisotropy",
    "attention_diagonal",
]

Reduce = Callable[[Tensor, TokenBatch], Tensor]
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


# ---------------------------------------------------------------------------- reductions
def _norms32(x: Tensor) -> Tensor:
    """Per-token L2 norms over d_model as float32. ``vector_norm(dtype=float32)`` reduces in float32
    without a full float32 copy; a float64 model reduces in float64 (vector_norm refuses to
    narrow) and is stored as float32."""
    if x.dtype == torch.float64:
        return torch.linalg.vector_norm(x, dim=-1).float()
    return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32)


def residual_norms(view: ModelView, rec: Recorder) -> None:
    """Per-token L2 norms of every residual state ``x_0 .. x_L``, in float32.

    Records ``("resid_norm", l)`` for ``l = 0..L``: ``[batch, pos]`` with NaN on padding, and
    marks a hook in ``rec.nonfinite`` when a real token's norm is NaN/inf; and
    ``("block_in_norm", l)`` for ``l = 0..L-1``, the norms of block ``l``'s input
    ``blocks.{l}.hook_resid_pre`` (equal to ``x_l`` unless a user hook changes it there).
    """
    for l, name in enumerate(view.resid_hook_names):
        def fn(x: Tensor, batch: TokenBatch, _name: str = name) -> Tensor:
            norms = _norms32(x)
            mask = rec.mask(norms.device)
            if not (torch.isfinite(norms) | ~mask).all():  # a real token's norm is NaN/inf
                rec.nonfinite.append(_name)
            return norms.masked_fill(~mask, float("nan"))
        rec.add(name, ("resid_norm", l), fn)
    # The input of block l as the block reads it (after any user hook at blocks.{l}.hook_resid_pre,
    # e.g. a patch): block l's gain is ||resid_post_l|| / ||resid_pre_l||. Records
    # ("block_in_norm", l) for l = 0..L-1, [batch, pos] float32 with NaN on padding.
    for l in range(view.n_layers):
        def fn_in(x: Tensor, batch: TokenBatch) -> Tensor:
            norms = _norms32(x)
            return norms.masked_fill(~rec.mask(norms.device), float("nan"))
        rec.add(f"blocks.{l}.hook_resid_pre", ("block_in_norm", l), fn_in)


def anisotropy(view: ModelView, rec: Recorder) -> None:
    """Per prompt and residual state, the mean pairwise cosine similarity of token states.

    Position 0 (the BOS / first token, whose norm and direction dominate) and padding are
    excluded. With unit vectors ``u_t`` over the ``m`` remaining tokens,
    ``mean_{i != j} u_i . u_j = (||sum_t u_t||^2 - m) / (m (m - 1))``: O(pos * d_model) per
    prompt, no ``pos x pos`` matrix. Records ``("anisotropy", l)``: ``[batch]`` float32, NaN when
    fewer than two tokens remain.
    """
    for l, name in enumerate(view.resid_hook_names):
        def fn(x: Tensor, batch: TokenBatch) -> Tensor:
            xf = x if x.dtype == torch.float32 else x.float()
            mask = rec.mask(x.device).clone()
            mask[:, 0] = False
            m = mask.sum(dim=1).float()
            u = xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(1e-30)
            # Zero the excluded rows in place (one temporary, not two); the sum over positions
            # runs in position order, so a prompt's value does not depend on its batch's padding.
            s = u.masked_fill_(~mask[..., None], 0.0).sum(dim=1)
            val = (s.pow(2).sum(-1) - m) / (m * (m - 1))
            return val.masked_fill(m < 2, float("nan"))
        rec.add(name, ("anisotropy", l), fn)


def attention_diagonal(view: ModelView, rec: Recorder) -> None:
    """Per layer, the attention pattern's diagonal ``A_ii`` and each head's total mass.

    The sheaf Laplacian trace needs only ``sum_i (1 - A_ii)`` per head (``thermo_lens.definitions`` §3),
    so the ``pos x pos`` pattern is reduced to its diagonal inside the hook. Records
    ``("attn_diag", l)``: ``[batch, head, pos]`` float32 (NaN on padded query positions) and
    ``("attn_mass", l)``: ``[batch, head]``, ``sum_{i,j real} A_ij`` (equals the number of real
    tokens for softmax attention: the reason the paper's printed trace formula is zero).
    """
    for l in range(view.n_layers):
        name = view.pattern_hook_name(l)

        def diag(a: Tensor, batch: TokenBatch, _name: str = name) -> Tensor:
            d = torch.diagonal(a, dim1=-2, dim2=-1).float()  # [batch, head, pos]
            mask = rec.mask(a.device)
            if not (torch.isfinite(d) | ~mask[:, None, :]).all():  # a real query's A_ii is NaN/inf
                rec.nonfinite.append(_name)
            return d.masked_fill(~mask[:, None, :], float("nan"))

        def mass(a: Tensor, batch: TokenBatch) -> Tensor:
            mask = rec.mask(a.device).to(a.dtype)
            if a.dtype in (torch.float32, torch.float64):
                # sum_i m_i sum_j A_ij m_j: a matrix-vector product per head, no [pos, pos] mask.
                rows = torch.matmul(a, mask[:, None, :, None]).squeeze(-1)  # [batch, head, pos]
                return (rows * mask[:, None, :]).sum(dim=-1, dtype=torch.float32)
            # half precision: mask and reduce in float32 (a product would round each row sum)
            pair = mask[:, None, :, None] * mask[:, None, None, :]
            return (a * pair).sum(dim=(-1, -2), dtype=torch.float32)

        rec.add(name, ("attn_diag", l), diag)
        rec.add(name, ("attn_mass", l), mass)


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

    def provenance(self) -> Any:
        """The :class:`thermo_lens.provenance.Provenance` every result of this pass records."""
        from thermo_lens.provenance import Provenance

        return Provenance(prompts=tuple(self.prompts), lengths=self.lengths.to(torch.long).clone(),
                          truncated=tuple(bool(t) for t in self.truncated), prepend_bos=self.prepend_bos,
                          model=self.view.metadata(), hooks=tuple(self.hooks), prompt_set=self.prompt_set,
                          categories=tuple(self.categories))


def batches(n: int, batch_size: int) -> Iterable[range]:
    for start in range(0, n, batch_size):
        yield range(start, min(n, start + batch_size))


#: Bucketing bound: a length bucket pads at most this fraction of its token positions.
MAX_PADDING = 0.10


def plan_batches(
    lengths: Sequence[int] | Tensor,
    batch_size: int,
    *,
    sort_by_length: bool = True,
    max_padding: float | None = MAX_PADDING,
) -> list[list[int]]:
    """The prompt indices of each padded forward batch :func:`collect` runs.

    ``sort_by_length=False``: the caller's order, ``batch_size`` prompts per batch.
    ``sort_by_length=True, max_padding=None``: prompts in order of token length (stable), then
    ``batch_size`` per batch. ``sort_by_length=True`` with ``max_padding``: length buckets; in
    length order, a batch is closed when it holds ``batch_size`` prompts or when adding the next
    (longest so far) prompt would make more than ``max_padding`` of the batch's positions padding.
    Every batch then pads at most ``max_padding`` of its positions (so does the whole run); the
    price is more, smaller batches when lengths are spread out.
    """
    n = [int(x) for x in lengths]
    if not sort_by_length:
        return [list(r) for r in batches(len(n), batch_size)]
    order = sorted(range(len(n)), key=lambda i: n[i])
    if max_padding is None:
        return [[order[k] for k in ks] for ks in batches(len(n), batch_size)]
    out: list[list[int]] = []
    cur: list[int] = []
    real = 0
    for i in order:
        if cur:
            width = n[i]  # sorted: the newcomer is the longest
            padded = (len(cur) + 1) * width
            if len(cur) >= batch_size or 1 - (real + n[i]) / padded > max_padding:
                out.append(cur)
                cur, real = [], 0
        cur.append(i)
        real += n[i]
    if cur:
        out.append(cur)
    return out


def token_batch(view: ModelView, prompts: Any, rows: Sequence[int], *, prepend_bos: Any, truncate: bool = False,
                min_tokens: int = 1) -> TokenBatch:
    """Tokenize ``prompts`` rows ``rows`` (a :class:`thermo_lens.inputs.Prompts`): texts with
    ``prepend_bos``, token ids exactly as given (BOS recorded as ``"tokens_as_given"``)."""
    from thermo_lens.settings import TOKENS_GIVEN

    if prompts.token_ids is None:
        return view.tokenize([prompts.texts[i] for i in rows], prepend_bos=prepend_bos, truncate=truncate,
                             min_tokens=min_tokens, prompt_index=list(rows))
    ids, truncated = [], []
    for i in rows:
        r = list(prompts.token_ids[i])
        truncated.append(len(r) > view.n_ctx)
        if len(r) > view.n_ctx:
            if not truncate:
                raise ThermoLensInputError(
                    f"prompt {i} is {len(r)} tokens long but {view.name} has a context of {view.n_ctx} "
                    f"tokens; shorten it, or pass truncate=True to keep its first {view.n_ctx} tokens.")
            r = r[: view.n_ctx]
        if len(r) < min_tokens:
            raise ThermoLensInputError(
                f"prompt {i} has {len(r)} token(s) as given; this measurement needs at least {min_tokens}.")
        ids.append(r)
    pad = getattr(view.tokenizer, "pad_token_id", None)
    pad = int(pad) if pad is not None else 0
    tokens = torch.full((len(ids), max(len(r) for r in ids)), pad, dtype=torch.long)
    for b, r in enumerate(ids):
        tokens[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    return TokenBatch(tokens=tokens, lengths=torch.tensor([len(r) for r in ids], dtype=torch.long),
                      prompt_index=torch.tensor(list(rows), dtype=torch.long), prepend_bos=TOKENS_GIVEN,
                      truncated=tuple(truncated))


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
    ``hook.ctx["batch"]`` (:class:`thermo_lens.interventions.BatchInfo`) and fail with an error
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
    from tqdm.auto import tqdm

    from thermo_lens.inputs import as_prompts
    from thermo_lens.interventions import BatchInfo, _Current, wrap_user_hooks
    from thermo_lens.provenance import describe_hook
    from thermo_lens.settings import RunSettings

    view = as_view(model)
    settings = RunSettings.resolve(settings, **options)
    ps = as_prompts(prompts, tokenizer=view.tokenizer)
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
                view.run(batch, hooks, stop_after=stop_after)
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
