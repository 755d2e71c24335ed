"""Replay from an ``ActivationCache``: the reductions read a cache instead of a forward pass.

:func:`collect_cached` records what :func:`thermo_lens.core.passes.collect` records, from the cache of
``model.run_with_cache`` on the same tokens: the cached activations are replayed through the
reductions' hooks in forward order by the :class:`Cached` runner, in one batch of the same
:class:`~thermo_lens.core.passes.one_pass.Pass` as every other pass (same checks, same provenance).

The ``cache=`` parameter of every public entry point is documented once here (:data:`CACHE_DOC`,
put into each docstring by :func:`documents_cache`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

import torch
from torch import Tensor

from thermo_lens.core import attached, cache_match
from thermo_lens.core.errors import ThermoLensInputError, ThermoLensInputTypeError
from thermo_lens.core.inputs import PromptList, as_model_prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.passes.collected import Collected
from thermo_lens.core.passes.one_pass import Hooks, Pass
from thermo_lens.core.passes.recorder import Recorder, Reduction
from thermo_lens.core.provenance import attached_records
from thermo_lens.core.settings import RunSettings
from thermo_lens.core.tokens import HOST_BOS, TokenBatch, token_batch

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["collect_cached", "Cached", "CACHE_DOC", "documents_cache"]

#: The ``cache=`` argument of every public entry point that measures in a pass (one definition).
CACHE_DOC = (
    "``None`` (the default: run the model), or an ``ActivationCache`` from ``model.run_with_cache`` on the "
    "same tokens (pass those tokens as ``prompts``, with their attention mask where padded, or the same prompt "
    "strings): measured from the cache, no forward pass (``fwd_hooks`` then refused: make the cache under your "
    "hooks); a cache lacking a hook the measurements read is an error listing the hooks to cache, and a cache "
    "made from other tokens, by another model or without the attention mask on pads is refused "
    "(:mod:`thermo_lens.core.cache_match`).")

#: The placeholder a docstring's ``cache:`` argument holds (:func:`documents_cache` fills it in).
CACHE_PLACEHOLDER = "<CACHE_DOC>"

F = TypeVar("F", bound=Callable[..., Any])


def documents_cache(fn: F) -> F:
    """Put :data:`CACHE_DOC` where ``fn``'s docstring says ``cache: <CACHE_DOC>`` (wrapped to the
    docstring's width, indented as its other argument descriptions)."""
    import textwrap

    doc = fn.__doc__
    if not doc:  # python -OO: no docstrings
        return fn
    line = next((ln for ln in doc.splitlines() if ln.strip() == f"cache: {CACHE_PLACEHOLDER}"), None)
    if line is None:
        raise AssertionError(f"{fn.__qualname__}: its docstring has no 'cache: {CACHE_PLACEHOLDER}' line")
    indent = line[:len(line) - len(line.lstrip())]
    body = textwrap.fill(f"cache: {CACHE_DOC}", width=100, initial_indent=indent,
                         subsequent_indent=indent + "    ")
    fn.__doc__ = doc.replace(line, body)
    return fn


def _cache_dict(cache: object) -> dict[str, Tensor]:
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


def _cache_prompts(view: ModelView, prompts: object,
                   settings: RunSettings) -> tuple[PromptList | tuple[PromptList, str | bool], Tensor, Tensor]:
    """The prompts of a cache as :func:`token_batch` takes them, the position of each row's first
    real token in the cache, and the cache's ``[batch, pos]`` token ids. Token ids: as given (masked as
    :func:`thermo_lens.core.inputs.as_prompts` masks them). Texts: tokenized as ``run_with_cache`` did,
    ``model.to_tokens(texts)`` (one padded batch)."""
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
    batch_ids = view.adapter.token_ids(to_tokens(list(ps.texts), move_to_device=False, **kw))
    rows, starts = [], []
    side = str(getattr(view.tokenizer, "padding_side", "right") or "right")
    for b, text in enumerate(ps.texts):
        own = [int(t) for t in view.adapter.token_ids(to_tokens(text, move_to_device=False, **kw))[0]]
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




class Cached:
    """A runner that replays an ``ActivationCache``: each thermo-lens hook gets its cached activation
    (``present[name]``: the cache's key for it), in forward order, moved from the cache's left-padded
    layout (``starts``: each row's first real position) to the pass's right-padded one. The pass is
    one batch of every cached row; nothing runs on the model."""

    def __init__(self, acts: Mapping[str, Tensor], present: Mapping[str, str], starts: Tensor) -> None:
        self.acts, self.present, self.starts = acts, present, starts

    def run_batch(self, view: ModelView, batch: TokenBatch, rows: Tensor, hooks: Hooks, *,
                  stop_after: str | None, return_logits: bool) -> Tensor | None:
        assert not return_logits, "a cache holds no logits"
        width = int(batch.tokens.shape[1])
        order = sorted(range(len(hooks)), key=lambda i: (attached.forward_order(hooks[i][0]), i))
        with torch.inference_mode():
            for i in order:
                name, fn = hooks[i]
                fn(_relayout(self.acts[self.present[name]], name, self.starts, width))
        return None


def collect_cached(
    model: TransformerLensModel | ModelView,
    prompts: object,
    cache: object,
    reductions: Sequence[Reduction],
    settings: RunSettings | Mapping[str, object] | None = None,
    *,
    min_tokens: int = 1,
    **options: object,
) -> Collected:
    """What :func:`collect` records, from an existing ``ActivationCache``: no forward pass.

    ``cache`` is ``model.run_with_cache(tokens)``'s cache and ``prompts`` the tokens it was made
    from (a ``[batch, pos]`` tensor, masked as :func:`thermo_lens.core.inputs.as_prompts` masks it, or
    ``{"input_ids", "attention_mask"}``), or the prompt strings it was made from
    (``run_with_cache(prompts)``; tokenized again with ``model.to_tokens``, which is what
    ``run_with_cache`` ran). The cached activations are replayed through the reductions' hooks in
    forward order (each reduction is a plain ``(hook_name, fn)``; left-padded rows are moved to
    the right-padded layout the reductions read), so the numbers are the pass's, up to the float
    rounding of another batch shape.

    The cache must have been made from these tokens, by this model, with the pads masked
    (:func:`thermo_lens.core.cache_match.match_cache`: its embedding, ``cache.model`` and block 0's
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
    bos: str | bool | None
    ps, bos = laid if isinstance(laid, tuple) else (laid, None)
    batch = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos, truncate=settings.truncate,
                        min_tokens=min_tokens)
    if bos is not None:  # texts, tokenized again: ps holds the token rows
        from thermo_lens.core.tokens import resolve_host_bos

        assert ps.token_ids is not None
        resolved = (list(dict.fromkeys(resolve_host_bos(view, t, list(r)) for t, r in zip(ps.texts, ps.token_ids)))
                    if bos == HOST_BOS else [bos])
        bos = resolved[0] if len(resolved) == 1 else "host:" + "|".join(str(k) for k in resolved)
        batch = TokenBatch(tokens=batch.tokens, lengths=batch.lengths, prompt_index=batch.prompt_index,
                           prepend_bos=bos, truncated=batch.truncated)
    rec = Recorder()
    for r in reductions:
        r(view, rec)
    names = [name for name, _ in rec.fwd_hooks()]
    keys = {name: _cache_key(view, acts, name) for name in names}
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
    B = len(ps)
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
    sae = attached_records(h for h in attached.attached_hooks(view.model) if h.attached == "sae")
    one = Pass(view=view, prompts=ps, tokens=batch, plan=[list(range(B))], settings=settings, recorder=rec,
               hidden=tuple(sae), row_order=False, origin="ActivationCache", cache_match=matched)
    return one.run(Cached(acts, present, starts))
