"""Sheaf Laplacians from a model: the pattern reduction, the pure builder and the entry point."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Unpack

import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.passes import Collected, Recorder, collect
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import BosMode, TokenBatch, encode
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.measures.sheaf.operator import LayerSheafLaplacian, SheafLaplacian
from thermo_lens.measures.sheaf.validation import (
    _check_convention,
    _check_index,
    _check_W_V,
)

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel


def _pattern_key(layer: int, head: int | None) -> str:
    return f"attn_pattern.{layer}" if head is None else f"attn_pattern.{layer}.{head}"


def attention_pattern(layer: int, head: int | None = None) -> Callable[[ModelView, Recorder], None]:
    """Reduction (for :func:`thermo_lens.core.passes.collect`) that keeps one layer's full pattern.

    Records ``(f"attn_pattern.{layer}[.{head}]", 0)``: ``[batch, head, q, k]`` float32 (one head
    when ``head`` is given), NaN on padded rows and columns. The ``n x n`` pattern is what the
    Laplacian needs and what the trace does not: use it for a single layer, one prompt per batch
    (batches of different padded widths cannot be stacked), never for all layers.
    """

    def reduction(view: ModelView, rec: Recorder) -> None:
        name = view.pattern_hook_name(layer)

        def fn(a: Tensor, batch: TokenBatch) -> Tensor:
            p = (a[:, head: head + 1] if head is not None else a).float()
            mask = batch.mask.to(a.device)
            pair = (mask[:, :, None] & mask[:, None, :])[:, None]
            if not torch.isfinite(p.masked_select(pair)).all():
                rec.nonfinite.append(name)
            return p.masked_fill(~pair, float("nan"))

        rec.add(name, (_pattern_key(layer, head), 0), fn)

    return reduction


def laplacian_from_collected(
    collected: Collected,
    layer: int,
    head: int | None = None,
    *,
    prompt_index: int = 0,
    convention: str = "directed",
    W_V: Float[Tensor, "layer kv_head d_model d_head"] | None = None,
) -> SheafLaplacian | LayerSheafLaplacian:
    """Pure part of :func:`sheaf_laplacian`: the Laplacian from a pass that recorded the pattern.

    Args:
        collected: from :func:`thermo_lens.core.passes.collect` with :func:`attention_pattern`
            ``(layer, head)`` (or ``(layer)``, all heads) among its reductions.
        layer, head: the head (``None``: all heads, a :class:`LayerSheafLaplacian`).
        prompt_index: which prompt of ``collected``.
        convention: ``"directed"`` (the default) or ``"symmetrized"``.
        W_V: ``[layer, kv_head, d_model, d_head]`` value weights (default: read from the model).
    """
    convention = _check_convention(convention)
    view = collected.view
    layer = _check_index(layer, view.n_layers, "layer", f"the model has {view.n_layers} layers")
    if head is not None:
        head = _check_index(head, view.n_heads, "head", f"the model has {view.n_heads} heads per layer")
    names = collected.recorder.names
    key = _pattern_key(layer, head)
    if key not in names and _pattern_key(layer, None) in names:
        key, sel = _pattern_key(layer, None), head
    elif key in names:
        sel = 0 if head is not None else None
    else:
        raise ThermoLensInputError(
            f"this collection has no attention pattern of layer {layer}; run collect(...) with "
            f"thermo_lens.measures.sheaf.attention_pattern({layer}{', ' + str(head) if head is not None else ''}) "
            "among the reductions (the trace-only reductions keep just the diagonal)"
        )
    p = _check_index(prompt_index, len(collected.prompts), "prompt_index", f"{len(collected.prompts)} prompts were run")
    stacked = collected.stack(key)[0]  # batches of different widths are NaN-padded
    n = int(collected.lengths[p])
    pat = stacked[p, :, :n, :n]
    if W_V is None:
        W_V = view.W_V()
        view.warn_if_processed("||W_V||_F^2 and every sheaf trace differ from the raw model's", stacklevel=3)
    W_V = _check_W_V(W_V, view)[layer]
    kv = view.kv_head_of
    meta = dict(prompt=collected.prompts[p], prepend_bos=collected.prepend_bos, model=view.metadata(),
                tokens=_token_strings(view, collected.prompts[p], collected.prepend_bos, n))
    if head is not None:
        return SheafLaplacian.from_pattern(pat[sel] if sel is not None else pat[0], W_V[int(kv[head])], convention,
                                           layer=layer, head=head, kv_head=int(kv[head]), **meta)
    heads = tuple(
        SheafLaplacian.from_pattern(pat[h], W_V[int(kv[h])], convention, layer=layer, head=h, kv_head=int(kv[h]), **meta)
        for h in range(view.n_heads)
    )
    return LayerSheafLaplacian(heads=heads, layer=layer)


def _token_strings(view: ModelView, prompt: str, prepend_bos: BosMode, n: int) -> tuple[str, ...] | None:
    try:
        ids = encode(view, prompt, prepend_bos)[:n]
        return tuple(str(t) for t in view.tokenizer.convert_ids_to_tokens(ids))
    except Exception:  # noqa: BLE001 - token strings are a display nicety
        return None


def sheaf_laplacian(
    model: TransformerLensModel | ModelView,
    prompt: object,
    layer: int,
    head: int | None = None,
    *,
    convention: str = "directed",
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> SheafLaplacian | LayerSheafLaplacian:
    """The factored sheaf Laplacian of one head (or all heads) of one layer on one prompt.

    One forward pass keeps only that layer's pattern (``blocks.{layer}.attn.hook_pattern``, that
    head's ``n x n`` slice); ``W_V`` is the head's value matrix (its KV head under grouped-query
    attention). See the module docstring for the definition and conventions (D'Elia 2026,
    section 5; ``thermo_lens.definitions`` §3).

    Args:
        model: a TransformerLens model (``TransformerBridge``) or :class:`ModelView`.
        prompt: one prompt string.
        layer: block index (0-based; negative counts from the end).
        head: query head index; ``None`` gives a :class:`LayerSheafLaplacian` over all heads.
        convention: ``"directed"`` (the default; ``rho_ij = sqrt(A_ij) W_V``) or ``"symmetrized"``.
        settings, **run: run options (:class:`thermo_lens.RunSettings`): ``prepend_bos``
            (``"host"``, the default: as ``model.to_tokens``; ``True``, ``False`` or ``"tokenizer"``), ``truncate``, ``fwd_hooks`` (your own
            hooks, run in the same pass before the pattern is read; ``hook.ctx["batch"]``
            has prompt index 0).

    Returns:
        :class:`SheafLaplacian` (or :class:`LayerSheafLaplacian` when ``head is None``).
    """
    if not isinstance(prompt, str):
        raise ThermoLensInputError(
            f"sheaf_laplacian takes one prompt string, got {type(prompt).__name__}; for the traces "
            "of many prompts use sheaf_traces(model, prompts)"
        )
    convention = _check_convention(convention)
    view = as_view(model)
    layer = _check_index(layer, view.n_layers, "layer", f"{view.name} has {view.n_layers} layers")
    if head is not None:
        head = _check_index(head, view.n_heads, "head", f"{view.name} has {view.n_heads} heads per layer")
    run.setdefault("progress", False)
    got = collect(view, [prompt], [attention_pattern(layer, head)], settings, **run)
    return laplacian_from_collected(got, layer, head, convention=convention)
