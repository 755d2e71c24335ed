"""Checks that an ``ActivationCache`` was made from the given tokens, by the given model, with the
pads masked: what :func:`thermo_lens.core.passes.collect_cached` measures from a cache is refused
unless all three hold.

TransformerLens' cache records neither its tokens nor, for a plain dict, its model. What can be
checked exactly, without a forward pass:

* **model**: ``cache.model`` (TransformerLens' ``ActivationCache`` keeps the model that made it)
  is the given model, or holds exactly the same parameters;
* **tokens**: the cached embedding (``hook_embed``; the bridge's ``embed.hook_out``) equals the
  model's embedding module run on the given tokens, row by row: a cache of other prompts of the
  same length, of the same prompts in another order, or of a model with other embeddings differs
  there. A positive scalar factor is allowed (a host may apply an embedding multiplier, as
  Granite's does, outside the embedding module); another token's embedding is never a multiple of
  this one's;
* **pads**: where a pad could be attended (left padding, or any padding under an encoder's
  bidirectional attention), the cached attention pattern of block 0 gives the pads no weight. A
  cache made from a padded batch without its attention mask attended to the pads, and its numbers
  are not those of the prompts: it is refused (measuring it as the model saw it would report the
  prompts under a context they do not have).

The result's provenance records how the cache was matched (:attr:`Provenance.cache_match`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.hosts import ADAPTERS
from thermo_lens.core.model import ModelView

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["match_cache", "EMBED_HOOKS", "check_hooks"]

#: Where a cache may hold the embedding the tokens are checked against, in order of preference.
EMBED_HOOKS = tuple(dict.fromkeys(a.embed_hook for a in ADAPTERS))  # every host's, one each
#: The attention pattern a padded cache is checked at.
PATTERN_HOOK = "blocks.0.attn.hook_pattern"
# HF model types whose attention is bidirectional (every real token may attend every pad).
_ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert",
                            "ernie", "mpnet", "deberta", "deberta-v2", "megatron-bert", "nezha", "rembert"})


def _is_encoder(view: ModelView) -> bool:
    return view.adapter.bidirectional or view.model_type in _ENCODER_TYPES


def check_hooks(view: ModelView, padded_attendable: bool) -> list[str]:
    """The hooks a cache must hold for the checks besides those the measurements read."""
    return [view.adapter.embed_hook] + (
        [PATTERN_HOOK] if padded_attendable else [])


def pads_attendable(view: ModelView, real: Tensor) -> bool:
    """Whether a real token of some row could attend a pad: a pad before a real token (left
    padding), or any pad under bidirectional attention. ``real``: ``[batch, pos]`` bool."""
    if bool(real.all()):
        return False
    if _is_encoder(view):
        return True
    first_real = real.float().argmax(1)
    return bool((first_real > 0).any())


def _model_name(model: TransformerLensModel) -> str:
    cfg = getattr(model, "cfg", None)
    return str(getattr(cfg, "model_name", None) or type(model).__name__)


@runtime_checkable
class _HasParameters(Protocol):
    def named_parameters(self) -> Iterator[tuple[str, Tensor]]: ...


def _same_parameters(a: object, b: object) -> bool:
    """Whether two models hold exactly the same named parameters (meta tensors count as unknown)."""
    if not (isinstance(a, _HasParameters) and isinstance(b, _HasParameters)):
        return False  # not a module: nothing to compare
    try:
        pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    except Exception:  # noqa: BLE001 - not a module: nothing to compare
        return False
    if pa.keys() != pb.keys():
        return False
    for k, x in pa.items():
        y = pb[k]
        if x.shape != y.shape or x.dtype != y.dtype or x.is_meta or y.is_meta:
            return False
        if not torch.equal(x.detach(), y.detach().to(x.device)):
            return False
    return True


def _check_model(view: ModelView, cache: object) -> str:
    owner = getattr(cache, "model", None)
    if owner is None:
        return "model not recorded by the cache (a plain dict): checked through its embedding"
    if owner is view.model:
        return "made by this model (the same object)"
    if _same_parameters(owner, view.model):
        return "made by another model object with exactly the same parameters"
    raise ThermoLensInputError(
        f"this cache was made by another model ({_model_name(owner)}, a different object with other parameters) "
        f"than the one given ({view.name}): its activations are not this model's. Pass the model that made it, "
        "or make the cache with this one (_, cache = model.run_with_cache(tokens))")


def _embedding_of(view: ModelView, tokens: Tensor, like: Tensor) -> Tensor:
    embed = getattr(view.model, "embed", None)
    if embed is None:
        raise ThermoLensInputError(
            f"{view.name} has no embedding module (model.embed), so thermo-lens cannot check that the cache was made "
            "from these tokens; drop cache= to run the model on them")
    device = next((p.device for p in embed.parameters() if not p.is_meta), like.device)
    with torch.inference_mode():
        out = embed(tokens.to(device))
    out = out[0] if isinstance(out, tuple) else out
    return out.to(like.device)


def _rows_matching(cached: Tensor, ref: Tensor, multiplier: float | None) -> Tensor:
    """``[batch, batch]`` bool: cache row ``i`` equals the embedding of row ``j`` times one scale
    for the whole cache (an embedding multiplier is one number): 1, the model's
    ``embedding_multiplier``, or the ratio of the cache's norm to the embedding's (which a
    reordering of the rows keeps), whichever matches the most rows. Row by row (one row of float64
    at a time: a large cache is never copied whole); off the diagonal only for rows that fail."""
    B = cached.shape[0]
    eps = torch.finfo(cached.dtype).eps if cached.is_floating_point() else 0.0

    def row(t: Tensor, i: int) -> Tensor:
        return t[i].reshape(-1).double()
    sq_c = torch.stack([row(cached, i).square().sum() for i in range(B)])
    sq_r = torch.stack([row(ref, i).square().sum().to(sq_c.device) for i in range(B)])
    tol = [16 * eps * float(row(cached, i).abs().max().clamp_min(1e-30)) for i in range(B)]
    scales = [1.0, float((sq_c.sum() / sq_r.sum().clamp_min(1e-300)).sqrt())]
    if multiplier:
        scales.insert(1, float(multiplier))

    def same(i: int, j: int, scale: float) -> bool:
        return float((row(cached, i) - scale * row(ref, j).to(cached.device)).abs().max()) <= tol[i]
    best_scale, best = 1.0, -1
    for scale in scales:
        if scale > 0:
            n = sum(same(i, i, scale) for i in range(B))
            if n > best:
                best_scale, best = scale, n
    match = torch.zeros(B, B, dtype=torch.bool)
    for i in range(B):
        if same(i, i, best_scale):
            match[i, i] = True
        else:
            for j in range(B):
                match[i, j] = j != i and same(i, j, best_scale)
    return match


def _check_tokens(view: ModelView, acts: Mapping[str, Tensor], tokens: Tensor) -> str:
    present = [k for k in EMBED_HOOKS if k in acts]
    if not present:
        need = check_hooks(view, False)[0]
        raise ThermoLensInputError(
            f"the cache holds no embedding ({' or '.join(EMBED_HOOKS)}), so thermo-lens cannot check that it was made "
            f"from these tokens: cache {need!r} too (add it to names_filter), or drop cache=")
    ref = None
    for key in present:
        cached = acts[key]
        if cached.ndim != 3 or tuple(cached.shape[:2]) != tuple(tokens.shape):
            continue
        if ref is None:
            ref = _embedding_of(view, tokens, cached)
        if ref.shape != cached.shape:
            continue
        multiplier = getattr(getattr(view.model, "cfg", None), "embedding_multiplier", None)
        match = _rows_matching(cached, ref, multiplier if isinstance(multiplier, (int, float)) else None)
        if bool(match.diagonal().all()):
            return f"tokens matched exactly at {key} (the model's embedding of the given tokens)"
        bad = [int(i) for i in torch.nonzero(~match.diagonal()).flatten()]
        where = []
        for i in bad[:4]:
            other = [int(j) for j in torch.nonzero(match[i]).flatten()]
            where.append(f"row {i} holds prompt {other[0]}'s tokens" if other else f"row {i} matches none of them")
        order = " (the prompts are in another order)" if all(
            bool(match[i].any()) for i in bad) else ""
        raise ThermoLensInputError(
            f"the cache was not made from these tokens with this model: its embedding at {key} differs from "
            f"{view.name}'s embedding of the given tokens in {len(bad)} of {tokens.shape[0]} row(s): "
            f"{'; '.join(where)}{' ...' if len(bad) > 4 else ''}{order}. Pass the tokens (or texts) the cache was "
            "made from, in the same order, with the model that made it; or drop cache= to run the model on these")
    raise ThermoLensInputError(
        f"the cache's embedding at {present[0]} has shape {tuple(acts[present[0]].shape)}, not [batch, pos, d_model] "
        f"of the given tokens {tuple(tokens.shape)}: pass the tokens the cache was made from")


def _check_pads(view: ModelView, acts: Mapping[str, Tensor], key: str | None, real: Tensor) -> str:
    if bool(real.all()):
        return "no padding"
    if not pads_attendable(view, real):
        return "right padding under causal attention (no real token attends a pad)"
    if key is None or key not in acts:
        raise ThermoLensInputError(
            f"the prompts are padded and {view.name}'s real tokens could attend the pads, so thermo-lens checks that "
            f"the cache was made with the attention mask: cache {PATTERN_HOOK!r} too (add it to names_filter), or "
            "drop cache=")
    pattern = acts[key]
    if pattern.ndim != 4 or pattern.shape[0] != real.shape[0] or tuple(pattern.shape[2:]) != (real.shape[1],) * 2:
        raise ThermoLensInputError(
            f"the cache's attention pattern at {key} has shape {tuple(pattern.shape)}, not [batch, head, pos, pos] "
            f"of the given tokens {tuple(real.shape)}: pass the tokens the cache was made from")
    r = real.to(pattern.device)
    # per padded row: the weight each real query gives the pads, summed over pad keys ([head, query])
    leak = torch.zeros(real.shape[0], dtype=torch.float64)
    for b in torch.nonzero(~real.all(1)).flatten().tolist():
        to_pads = pattern[b][:, r[b], :][:, :, ~r[b]].double().sum(-1)
        leak[b] = float(to_pads.max()) if to_pads.numel() else 0.0
    worst = float(leak.max()) if leak.numel() else 0.0
    if not worst <= 1e-6:
        rows = [int(b) for b in torch.nonzero(~(leak <= 1e-6)).flatten()]
        kw = view.adapter.mask_keyword
        raise ThermoLensInputError(
            f"this cache was made without the attention mask on the pads: at {key} the real tokens of row(s) "
            f"{rows[:8]} give the pads up to {worst:.3g} of their attention, so its activations are not those of the "
            f"prompts. Make the cache with the mask (_, cache = model.run_with_cache(tokens, {kw}=mask), mask 1 on "
            "real tokens), or from one prompt at a time, or drop cache=")
    return f"pads masked (no attention to them at {key})"


def match_cache(view: ModelView, cache: object, acts: Mapping[str, Tensor], tokens: Tensor, real: Tensor,
                pattern_key: str | None) -> str:
    """Refuses a cache that was not made from ``tokens`` (``[batch, pos]``, as cached) by ``view``'s
    model with the pads (``~real``, ``[batch, pos]`` bool) masked; returns how it was matched,
    for the provenance. ``pattern_key``: the key of block 0's attention pattern in ``acts``."""
    parts = [_check_model(view, cache), _check_tokens(view, acts, tokens), _check_pads(view, acts, pattern_key, real)]
    return "; ".join(parts)
