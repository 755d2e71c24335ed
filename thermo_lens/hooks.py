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
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from thermo_lens.model import ModelView, TokenBatch, as_view

__all__ = [
    "Recorder",
    "Collected",
    "ThermoLensNumericsError",
    "collect",
    "residual_norms",
    "anisotropy",
    "attention_diagonal",
]

Reduce = Callable[[Tensor, TokenBatch], Tensor]
Reduction = Callable[[ModelView, "Recorder"], None]


class ThermoLensNumericsError(FloatingPointError):
    """The model produced NaN or inf; the message names the hook point (layer)."""


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
        self._batch: TokenBatch | None = None
        self.nonfinite: list[str] = []  # hook names where a real token had NaN/inf

    def add(self, hook_name: str, key: tuple[str, int], fn: Reduce) -> None:
        self._reductions.append((hook_name, key, fn))

    def fwd_hooks(self) -> list[tuple[str, Callable]]:
        """``(hook_name, hook_fn)`` pairs for ``run_with_hooks``; the hooks return None."""
        hooks = []
        for hook_name, key, fn in self._reductions:
            def hook(act: Tensor, hook: Any = None, *, _key=key, _fn=fn, _name=hook_name) -> None:
                if self._batch is None:
                    raise RuntimeError("Recorder hook fired outside Recorder.batch(...)")
                out = _fn(act.detach(), self._batch)
                self._parts[_key].append(out.to("cpu"))
            hooks.append((hook_name, hook))
        return hooks

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
        return self.rec

    def __exit__(self, *exc: Any) -> None:
        self.rec._batch = None


# ---------------------------------------------------------------------------- reductions
def _real_mask(batch: TokenBatch, device: torch.device) -> Tensor:
    return batch.mask.to(device)


def residual_norms(view: ModelView, rec: Recorder) -> None:
    """Per-token L2 norms of every residual state ``x_0 .. x_L``, in float32.

    Records ``("resid_norm", l)`` for ``l = 0..L``: ``[batch, pos]`` with NaN on padding, and
    marks a hook in ``rec.nonfinite`` when a real token's norm is NaN/inf.
    """
    for l, name in enumerate(view.resid_hook_names):
        def fn(x: Tensor, batch: TokenBatch, _name: str = name) -> Tensor:
            # vector_norm with dtype=float32 reduces in float32 without a full float32 copy.
            norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32)
            mask = _real_mask(batch, norms.device)
            if not torch.isfinite(norms[mask]).all():
                rec.nonfinite.append(_name)
            return norms.masked_fill(~mask, float("nan"))
        rec.add(name, ("resid_norm", l), fn)


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
            xf = x.float()
            u = xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(1e-30)
            mask = _real_mask(batch, x.device).clone()
            mask[:, 0] = False
            m = mask.sum(dim=1).float()
            s = (u * mask[..., None]).sum(dim=1)
            val = (s.pow(2).sum(-1) - m) / (m * (m - 1))
            return val.masked_fill(m < 2, float("nan"))
        rec.add(name, ("anisotropy", l), fn)


def attention_diagonal(view: ModelView, rec: Recorder) -> None:
    """Per layer, the attention pattern's diagonal ``A_ii`` and each head's total mass.

    The sheaf Laplacian trace needs only ``sum_i (1 - A_ii)`` per head (METHODS.md section 3),
    so the ``pos x pos`` pattern is reduced to its diagonal inside the hook. Records
    ``("attn_diag", l)``: ``[batch, head, pos]`` float32 (NaN on padded query positions) and
    ``("attn_mass", l)``: ``[batch, head]``, ``sum_{i,j real} A_ij`` (equals the number of real
    tokens for softmax attention: the reason the paper's printed trace formula is zero).
    """
    for l in range(view.n_layers):
        name = view.pattern_hook_name(l)

        def diag(a: Tensor, batch: TokenBatch, _name: str = name) -> Tensor:
            d = torch.diagonal(a, dim1=-2, dim2=-1).float()  # [batch, head, pos]
            mask = _real_mask(batch, a.device)
            if not torch.isfinite(d.transpose(1, 2)[mask]).all():
                rec.nonfinite.append(_name)
            return d.masked_fill(~mask[:, None, :], float("nan"))

        def mass(a: Tensor, batch: TokenBatch) -> Tensor:
            mask = _real_mask(batch, a.device).to(a.dtype)
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
        prompts: the prompts, in the caller's order.
        prepend_bos: the BOS mode used.
        truncated: per prompt, whether it was cut to ``n_ctx``.
        view: the :class:`ModelView`.
        row_prompt: ``[prompt]`` for each recorded row (batches run in length order), the
            caller's index of its prompt; :meth:`stack` restores the caller's order.
    """

    recorder: Recorder
    lengths: Tensor
    prompts: tuple[str, ...]
    prepend_bos: Any
    truncated: tuple[bool, ...]
    view: ModelView
    row_prompt: Tensor | None = None

    def stack(self, name: str) -> Tensor:
        """Reduction ``name`` as ``[index, prompt, ...]`` in the caller's prompt order."""
        data = self.recorder.stack(name)
        if self.row_prompt is None:
            return data
        return data[:, torch.argsort(self.row_prompt)]

    @property
    def mask(self) -> Tensor:
        """``[prompt, pos]`` True on real tokens (pos up to the longest prompt)."""
        width = int(self.lengths.max())
        return torch.arange(width)[None, :] < self.lengths[:, None]


def batches(n: int, batch_size: int) -> Iterable[range]:
    for start in range(0, n, batch_size):
        yield range(start, min(n, start + batch_size))


def collect(
    model: Any,
    prompts: Sequence[str],
    reductions: Sequence[Reduction],
    *,
    prepend_bos: Any,
    batch_size: int = 8,
    truncate: bool = False,
    min_tokens: int = 1,
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    progress: bool | None = None,
    sort_by_length: bool = True,
) -> Collected:
    """Run ``prompts`` through the model in padded batches with the given reductions.

    Args:
        model: a TransformerLens model or :class:`ModelView`.
        prompts: the prompt strings (validated; see :meth:`ModelView.tokenize`).
        reductions: functions like :func:`residual_norms` that register hooks on a Recorder.
        prepend_bos: ``True``, ``False`` or ``"tokenizer"`` (explicit; recorded).
        batch_size: prompts per forward pass.
        truncate: cut prompts longer than the context instead of raising.
        min_tokens: minimum real tokens per prompt.
        fwd_hooks: the user's own ``(hook_name, fn)`` hooks, run in the same pass *before* the
            reductions (ablations, patching).
        progress: show a progress bar (default: when there is more than one batch).
        sort_by_length: batch prompts in order of token length, so a batch holds prompts of
            similar length and little padding (about 1.7x faster on the paper's prompts). Results
            come back in the caller's order either way; only user hooks that index the batch see
            the difference (``False`` keeps the caller's order in every batch).

    Raises:
        ThermoLensNumericsError: a real token's residual norm or attention was NaN/inf; the
            message names the first hook point (layer) where it happened.
    """
    from tqdm.auto import tqdm

    view = as_view(model)
    from thermo_lens.model import validate_prompts

    prompts = validate_prompts(prompts)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    # Tokenize everything once, first, so a bad prompt fails before any compute.
    everything = view.tokenize(prompts, prepend_bos=prepend_bos, truncate=truncate, min_tokens=min_tokens)
    order = list(range(len(prompts)))
    if sort_by_length:
        order.sort(key=lambda i: int(everything.lengths[i]))
    tokenized = [everything.select([order[k] for k in ks]) for ks in batches(len(prompts), batch_size)]
    rec = Recorder()
    for r in reductions:
        r(view, rec)
    hooks = list(fwd_hooks) + rec.fwd_hooks()
    show = progress if progress is not None else len(tokenized) > 1
    for batch in tqdm(tokenized, desc=f"thermo-lens {view.name}", unit="batch", disable=not show, leave=False):
        with rec.batch(batch):
            view.run(batch, hooks)
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
        prompts=tuple(prompts),
        prepend_bos=prepend_bos,
        truncated=everything.truncated,
        view=view,
        row_prompt=torch.cat([b.prompt_index for b in tokenized]),
    )
