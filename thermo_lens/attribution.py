"""Exact per-head attribution of the residual stream's squared-norm change, block by block.

Block ``layer`` (0-based, ``blocks.{layer}``) of a pre-LN transformer (sequential or parallel
attention: GPT-2, GPT-NeoX/Pythia, LLaMA, GPT-J ...) adds its components to its input
``x_in = blocks.{layer}.hook_resid_pre``::

    x_out = x_in + sum_h z_h W_O^h + b_O + (mlp_out - b_out) + b_out

with ``z_h`` the head's ``hook_z`` row, ``W_O^h`` its ``[d_head, d_model]`` output matrix, ``b_O``
the attention output bias and ``b_out`` the MLP output bias. Since
``||x_out||^2 - ||x_in||^2 = <x_out - x_in, x_out + x_in>``, the change splits exactly into one
term per component ``c``: ``<c, x_out + x_in>`` per token, so

    ``head[..., h] = <z_h W_O^h, s>``,  ``mlp = <mlp_out - b_out, s>``,  ``bias = <b_O + b_out, s>``,
    ``total = ||x_out||^2 - ||x_in||^2``,  with ``s = x_out + x_in``,

and ``head.sum(-1) + mlp + bias == total`` up to float32 rounding, token by token and therefore
for every mean over tokens. The block gain is ``sqrt(||x_out||^2 / ||x_in||^2)``, so ``total > 0``
exactly when the block's gain exceeds 1 on that token.

What a term is, and is not (``thermo_lens.definitions`` §1). Writing ``x_out = x_in + sum_c c``,
``||x_out||^2 - ||x_in||^2 = sum_c (2 <c, x_in> + ||c||^2) + sum_{c != c'} <c, c'>``; the term
``<c, x_out + x_in>`` gives component ``c`` its own part and *half* of each cross term ``<c, c'>``:
it is the Shapley value of the squared-norm change when every component's output is held at its
value in this run. It is **not an ablation effect**: removing ``c`` (the others held fixed)
changes the squared norm by ``2 <c, x_in> + ||c||^2 + 2 sum_{c'} <c, c'>``, which differs from the
share by the other half of the cross terms, and in a real ablation later sublayers also react.
The two can have opposite signs: two heads that write opposite directions (``o_1 = -0.75 o_0``)
give head 0 a positive share although ablating it *raises* the norm
(``tests/test_attribution_share.py`` builds this on a model). Read a positive head term as "its
share of the block's growth", not as "the head expands the stream"; ablate to learn what
removing it does.

Computed inside the forward pass: per block, the hooks keep ``x_in``, ``z`` and ``mlp_out``
until ``hook_resid_post`` fires, reduce them to the per-token terms and drop them (nothing is
kept beyond one layer's transient activations). The head term is ``<z_h, s W_O^{hT}>``, so no
``[batch, pos, head, d_model]`` tensor is formed. Hook names (``hook_resid_pre``,
``attn.hook_z``, ``hook_mlp_out``, ``hook_resid_post``) exist on the TransformerLens 4
``TransformerBridge`` and on the legacy ``HookedTransformer``. User hooks run before the
reductions, so an ablated or patched run is attributed as it ran.

Post-LN blocks (BERT, OPT-350m) end in a LayerNorm, so ``x_out`` is not ``x_in`` plus the
components and no such identity exists: they raise. Each block's attribution is checked to
close (``closure``, the part of ``total`` the components do not explain, is recorded and must be
at float32 rounding level), so an architecture whose blocks add something else (e.g. extra
post-sublayer norms) fails loudly instead of giving wrong numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens import measure
from thermo_lens.inputs import Prompts
from thermo_lens.model import ModelView, as_view
from thermo_lens.passes import Collected, Recorder, Reduction
from thermo_lens.registry import BuildContext, Measurement, Metric, Option, register_measurement, register_metric
from thermo_lens.settings import RunOptions, RunSettings
from thermo_lens.tokens import TERM_SCOPES, TokenBatch, TokenScope, scope_mask
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.paired import PairedMixin
from thermo_lens.provenance import Provenance, ProvenanceFields
from thermo_lens.result import Result
from thermo_lens.validate import validates_own_inputs

__all__ = ["GainAttribution", "gain_attribution", "attribution_terms", "attribution_from_collected",
           "ATTRIBUTION_SCOPES", "ATTRIBUTION_DEFINITIONS"]

#: Token scopes of the attribution (means over the scope's real tokens of per-token terms).
ATTRIBUTION_SCOPES = TERM_SCOPES

#: Definition of every attribution term (``s = x_out + x_in`` of block ``layer``).
ATTRIBUTION_DEFINITIONS: dict[str, str] = {
    "head": "<z_h W_O^h, x_out + x_in>: head h's share of ||x_out||^2 - ||x_in||^2 of block layer",
    "mlp": "<mlp_out - b_out, x_out + x_in>: the MLP's share (its output bias in bias)",
    "bias": "<b_O + b_out, x_out + x_in>: the attention and MLP output biases' share",
    "total": "||x_out||^2 - ||x_in||^2, x_in = blocks.{layer}.hook_resid_pre, x_out = blocks.{layer}.hook_resid_post",
    "closure": "total - (sum_h head + mlp + bias): float32 rounding (checked)",
}

_CLOSURE_RTOL = 1e-3  # float32 / float64 models: the closure is ~1e-7 of the scale in practice
_CLOSURE_RTOL_HALF = 5e-2  # bfloat16 / float16 models (see attribution_from_collected)


def _check_scope(token_scope: Any) -> str:
    if token_scope == "frobenius":
        raise ThermoLensInputError(
            "token_scope='frobenius' is a ratio of whole-sequence norms, not a mean of per-token terms; "
            "for the attribution use token_scope='all' (the squared-norm change summed over tokens is "
            "n_tokens times the 'all' mean)")
    if token_scope not in ATTRIBUTION_SCOPES:
        raise ThermoLensInputError(
            f"unknown token_scope {token_scope!r}; choose one of {', '.join(map(repr, ATTRIBUTION_SCOPES))}")
    return token_scope


@functools.lru_cache(maxsize=None)
def attribution_terms(token_scope: str = "all_but_first") -> Reduction:
    """Reduction (for :func:`thermo_lens.passes.collect`) recording the scoped means, per block
    ``l``: ``("attr_head", l)`` ``[batch, head]``, ``("attr_mlp", l)``, ``("attr_bias", l)``,
    ``("attr_total", l)``, ``("attr_closure", l)`` and ``("attr_scale", l)`` (the scoped mean of
    ``||x_out||^2 + ||x_in||^2``, the size the closure is compared with), each ``[batch]`` float64."""
    _check_scope(token_scope)

    def reduction(view: ModelView, rec: Recorder) -> None:
        why = _not_splittable(view)
        if why:
            raise ThermoLensInputError(why)
        W_O = view.W_O()  # [layer, head, d_head, d_model] float32 (CPU)
        W_flat = W_O.reshape(view.n_layers, view.n_heads * view.d_head, view.d_model)
        H = view.n_heads
        # Per layer, once: the summed output biases b_O + b_out (the bias term's vector) and b_out
        # (taken off the MLP output), zero where the architecture has none.
        bias_vecs: list[tuple[Tensor, Tensor]] = []
        for l in range(view.n_layers):
            b_O, b_out = view.output_biases(l)  # [d_model] float32 CPU, or None
            zero = torch.zeros(view.d_model)
            b_out_v = zero if b_out is None else b_out
            bias_vecs.append(((zero if b_O is None else b_O) + b_out_v, b_out_v))

        def scoped_rows(batch: TokenBatch, dev: torch.device) -> tuple[Tensor, Tensor, Tensor]:
            """The batch's scoped rows ``[n]`` (flat ``(prompt, position)`` indices), the prompt of
            each, and the per-prompt counts ``[batch, 1]`` (at least 1)."""
            B, T = batch.tokens.shape
            rows = scope_mask(batch.lengths, T, token_scope, dev).reshape(B * T).nonzero().squeeze(1)
            prompt_of = rows // T
            n = torch.bincount(prompt_of, minlength=B).to(torch.float64).clamp_min(1.0)[:, None]
            return rows, prompt_of, n

        for l in range(view.n_layers):
            state: dict[str, Tensor] = {}

            def keep(x: Tensor, batch: TokenBatch, _key: str, _state: dict = state) -> None:
                _state[_key] = x  # transient: dropped when this block's hook_resid_post fires

            def finish(x_out: Tensor, batch: TokenBatch, _l: int = l, _state: dict = state) -> Tensor:
                missing = {"x_in", "z", "mlp_out"} - set(_state)
                if missing:
                    raise ThermoLensInputError(
                        f"{view.name} block {_l}: hook(s) {sorted(missing)} did not fire before "
                        f"blocks.{_l}.hook_resid_post; this architecture's block is not supported by gain_attribution")
                dev = x_out.device
                B, T, _ = x_out.shape
                # Only the scoped real tokens enter the means, so only they are reduced: padding,
                # position 0 (all_but_first) or all but the last token ("last") never reach the
                # s W_O^T matmul, the one d_model^2-per-token step here. index_select, not x[rows]:
                # the same rows, a fraction of advanced indexing's overhead. The rows are found once
                # per batch and shared by every layer (the Recorder drops them when the batch ends).
                rows, prompt_of, n = rec.per_batch(("attr_rows", str(dev)), functools.partial(scoped_rows, dev=dev))
                x_in = _state.pop("x_in").reshape(B * T, -1).index_select(0, rows).float()
                z = _state.pop("z").reshape(B * T, -1).index_select(0, rows).float()
                mlp_out = _state.pop("mlp_out").reshape(B * T, -1).index_select(0, rows).float()
                x_out = x_out.reshape(B * T, -1).index_select(0, rows).float()
                s = x_out + x_in  # [n, d_model]
                # s W_O^T for every head at once: one [n, d_model] x [d_model, head*d_head] matmul.
                u = s @ W_flat[_l].to(dev).mT
                head = torch.linalg.vecdot(z.view(-1, H, view.d_head), u.view(-1, H, view.d_head))  # [n, head]
                bias_vec, b_out = (v.to(dev) for v in bias_vecs[_l])
                mlp = torch.linalg.vecdot(mlp_out - b_out, s)
                bias = s @ bias_vec
                total = torch.linalg.vecdot(x_out - x_in, s)  # = ||x_out||^2 - ||x_in||^2 without cancellation
                scale = torch.linalg.vecdot(x_out, x_out) + torch.linalg.vecdot(x_in, x_in)
                # Per token |total - components| (its scoped mean: a cancellation across tokens
                # must not hide a block that does not close).
                closure = (total - head.sum(-1) - mlp - bias).abs()
                # Every per-token term, then one float64 per-prompt sum over the scoped rows.
                terms = torch.cat([head, torch.stack([mlp, bias, scale, closure, total], dim=1)], dim=1)
                means = torch.zeros(B, H + 5, dtype=torch.float64, device=dev).index_add_(
                    0, prompt_of, terms.double()) / n
                rec.put(("attr_head", _l), means[:, :H])
                for k, name in enumerate(("attr_mlp", "attr_bias", "attr_scale", "attr_closure")):
                    rec.put((name, _l), means[:, H + k])
                return means[:, H + 4]

            for hook, key in (("hook_resid_pre", "x_in"), ("attn.hook_z", "z"), ("hook_mlp_out", "mlp_out")):
                rec.add(f"blocks.{l}.{hook}", ("_attr_" + key, l),
                        lambda x, b, _f=keep, _k=key: _f(x, b, _k))  # type: ignore[misc]
            rec.add(f"blocks.{l}.hook_resid_post", ("attr_total", l), finish)

    return reduction


# ---------------------------------------------------------------------------- the result
@dataclass(frozen=True, repr=False, eq=False)
class GainAttribution(PairedMixin, ProvenanceFields, Result):
    """Per-head (and MLP, bias) shares of each block's squared-norm change.

    All terms are means over the scoped real tokens (:data:`ATTRIBUTION_SCOPES`) of per-token
    terms ``<c, x_out + x_in>`` of block ``layer`` (0-based, ``blocks.{layer}``), float64
    accumulations of float32 per-token terms; ``head.sum(-1) + mlp + bias == total`` up to
    float32 rounding (``closure``).

    Attributes:
        head: ``Float[Tensor, "prompt layer head"]`` ``<z_h W_O^h, x_out + x_in>``.
        mlp: ``Float[Tensor, "prompt layer"]`` ``<mlp_out - b_out, x_out + x_in>``.
        bias: ``Float[Tensor, "prompt layer"]`` ``<b_O + b_out, x_out + x_in>``.
        total: ``Float[Tensor, "prompt layer"]`` ``||x_out||^2 - ||x_in||^2``.
        closure: ``Float[Tensor, "prompt layer"]`` scoped mean of ``|total - components|`` per
            token (rounding; checked to be below ``1e-3`` of ``scale`` for float32 models, ``5e-2``
            for bfloat16/float16 ones, whose residual additions round to about 3 digits).
        scale: ``Float[Tensor, "prompt layer"]`` scoped mean of ``||x_out||^2 + ||x_in||^2``.
        token_scope: the token scope.
        provenance: prompts, lengths, BOS mode, model metadata and the user hooks of the run.
    """

    head: Tensor
    mlp: Tensor
    bias: Tensor
    total: Tensor
    closure: Tensor
    scale: Tensor
    token_scope: str
    provenance: Provenance

    @property
    def n_prompts(self) -> int:
        return int(self.head.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.head.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.head.shape[2])

    @property
    def mean_head(self) -> Float[Tensor, "layer head"]:
        """Head terms averaged over prompts (the ``[layer, head]`` heatmap)."""
        return self.head.mean(0)

    @property
    def relative_head(self) -> Float[Tensor, "prompt layer head"]:
        """Head terms divided by the block input's scoped mean ``||x_in||^2`` estimate
        ``(scale - total) / 2``: the head's share of the squared-norm change, relative to the
        stream it writes into (dimensionless, comparable across layers and models)."""
        norm_in_sq = (self.scale - self.total) / 2
        return self.head / norm_in_sq[..., None]

    def top_heads(self, k: int = 5, *, by: str = "mean") -> pd.DataFrame:
        """The ``k`` heads with the largest mean term (``by="mean"``: most expanding) or the
        largest absolute mean term (``by="abs"``); columns ``layer, head, head_term``."""
        m = self.mean_head
        key = m.abs() if by == "abs" else m
        if by not in ("mean", "abs"):
            raise ThermoLensInputError(f"by must be 'mean' or 'abs', got {by!r}")
        order = torch.argsort(key.flatten(), descending=True)[:k]
        H = self.n_heads
        return pd.DataFrame({"layer": (order // H).numpy(), "head": (order % H).numpy(),
                             "head_term": m.flatten()[order].numpy()})

    def to_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer, head): ``prompt, layer, head, head_term`` plus the
        definition columns. ``layer`` is the 0-based block index (merges with the spectral and
        sheaf frames on ``layer`` and ``head``)."""
        P, L, H = self.head.shape
        p, l, h = np.meshgrid(np.arange(P), np.arange(L), np.arange(H), indexing="ij")
        df = pd.DataFrame({"prompt": p.ravel(), "layer": l.ravel(), "head": h.ravel(),
                           "head_term": self.head.numpy().ravel()})
        df["token_scope"] = self.token_scope
        for k, v in self.provenance.columns().items():
            df[k] = v
        return df

    def layer_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer): ``heads`` (sum over heads), ``mlp``, ``bias``, ``total``,
        ``closure`` and the definition columns."""
        P, L = self.total.shape
        df = pd.DataFrame({"prompt": np.repeat(np.arange(P), L), "layer": np.tile(np.arange(L), P),
                           "heads": self.head.sum(-1).numpy().ravel(), "mlp": self.mlp.numpy().ravel(),
                           "bias": self.bias.numpy().ravel(), "total": self.total.numpy().ravel(),
                           "closure": self.closure.numpy().ravel()})
        df["token_scope"] = self.token_scope
        for k, v in self.provenance.columns().items():
            df[k] = v
        return df

    def __repr__(self) -> str:
        m = self.model
        lt = self.total.mean(0).tolist()
        shown = ", ".join(f"{v:.4g}" for v in lt[:12]) + (", ..." if len(lt) > 12 else "")
        top = self.top_heads(3)
        tops = ", ".join(f"L{r.layer}H{r.head} {r.head_term:+.4g}" for r in top.itertuples())
        return (f"GainAttribution({m.get('name')}: {self.n_prompts} prompts x {self.n_layers} layers x "
                f"{self.n_heads} heads; token_scope={self.token_scope!r}, BOS={self.prepend_bos!r}, "
                f"weights {self.weights}, {self.dtype})\n"
                f"  per block: ||x_out||^2 - ||x_in||^2 = sum_h head + mlp + bias (exact; max closure "
                f"{float((self.closure / self.scale).max()):.1e} of the scale)\n"
                f"  mean total by layer 0..{self.n_layers - 1}: [{shown}]\n"
                f"  most expanding heads: {tops}\n"
                f"  hooks: {self.provenance.hooks_text}")


def _not_splittable(view: ModelView) -> str | None:
    """Why a block of this model has no exact per-head split, or None."""
    if view.post_ln:
        return (f"{view.name} is post-LN ({view.model_type}): each block ends in a LayerNorm, so its output "
                "is not its input plus its heads and MLP and the squared-norm change has no exact per-head "
                "split; gain_attribution needs a pre-LN (or norm-free) model")
    return None


for _name, _symbol, _formula, _shape, _attr in (
    ("head_term", "<z_h W_O^h, x_out + x_in>", "head h's share of block layer's squared-norm change "
     "||x_out||^2 - ||x_in||^2 (a Shapley-style share of the change: cross terms split half and half; not an "
     "ablation effect), mean over the scope's tokens", "prompt layer head", "head"),
    ("mlp_term", "<mlp_out - b_out, x_out + x_in>", "the MLP's share (its output bias is in bias_term)",
     "prompt layer", "mlp"),
    ("bias_term", "<b_O + b_out, x_out + x_in>", "the attention and MLP output biases' share", "prompt layer", "bias"),
    ("norm_sq_change", "||x_out||^2 - ||x_in||^2", "the block's squared-norm change, x_in = blocks.{layer}."
     "hook_resid_pre, x_out = blocks.{layer}.hook_resid_post; = sum_h head_term + mlp_term + bias_term",
     "prompt layer", "total"),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape=_shape, result="GainAttribution",
                           section="gain", unit="squared residual norm", attr=_attr,
                           frame="to_frame" if _name == "head_term" else "layer_frame",
                           column=None if _name == "head_term" else _attr,
                           panel=_name == "head_term"))


def attribution_from_collected(collected: Collected, token_scope: str = "all_but_first") -> GainAttribution:
    """The :class:`GainAttribution` of a :func:`~thermo_lens.passes.collect` pass that ran
    :func:`attribution_terms` (pure; checks that every block closes)."""
    _check_scope(token_scope)
    if "attr_head" not in collected.recorder.names:
        raise ThermoLensInputError("this collection has no attribution terms: run collect(..., [attribution_terms(scope)])")
    head = collected.stack("attr_head").permute(1, 0, 2).contiguous()  # [P, L, H]
    get = {k: collected.stack(f"attr_{k}").T.contiguous() for k in ("mlp", "bias", "total", "closure", "scale")}
    view = collected.view
    rel = get["closure"] / get["scale"].clamp_min(torch.finfo(torch.float32).tiny)
    # The model adds its components in its own dtype: half-precision residual streams round each
    # addition to about 3 significant digits, so the identity closes only to that precision.
    rtol = _CLOSURE_RTOL if view.dtype in (torch.float32, torch.float64) else _CLOSURE_RTOL_HALF
    if bool((rel > rtol).any()):
        p, l = (int(i) for i in (rel > rtol).nonzero()[0])
        why = ("this architecture adds something else inside the block (e.g. post-sublayer norms)"
               if not collected.hooks else
               "a user hook changed an activation the components do not account for (e.g. at "
               f"blocks.{l}.hook_attn_out, hook_resid_mid or hook_resid_post; hooks: "
               + "; ".join(str(h) for h in collected.hooks) + "), or this architecture adds something else")
        raise ThermoLensInputError(
            f"{view.name}: block {l}'s output is not its input plus its heads, MLP and biases (prompt {p}: "
            f"unexplained {float(rel[p, l]):.2e} of ||x_out||^2 + ||x_in||^2): {why}; gain_attribution "
            "cannot split it. Hooks at hook_resid_pre, attn.hook_z and hook_mlp_out are attributed as they ran.")
    return GainAttribution(head=head, mlp=get["mlp"], bias=get["bias"], total=get["total"], closure=get["closure"],
                           scale=get["scale"], token_scope=token_scope, provenance=collected.provenance())


def _build(ctx: BuildContext, *, token_scope: str) -> GainAttribution:
    return attribution_from_collected(ctx.collected, token_scope)


register_measurement(Measurement(
    "attribution", title="Gain attribution", result="GainAttribution", section="gain",
    summary="each head's (and the MLP's and biases') exact share of each block's squared-norm change "
            "||x_out||^2 - ||x_in||^2",
    options={"token_scope": Option("all_but_first", _check_scope, "the tokens the per-token terms are averaged over")},
    reductions=lambda *, token_scope: [attribution_terms(token_scope)], build=_build,
    min_tokens=lambda *, token_scope: 2 if token_scope == "all_but_first" else 1,
    applies=_not_splittable, optional=True,
))


@validates_own_inputs
def gain_attribution(
    model: Any,
    prompts: Prompts,
    *,
    token_scope: TokenScope = "all_but_first",
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> GainAttribution:
    """Exact per-head attribution of each block's squared-norm change, in one forward pass.

    ``head[p, layer, h] = mean_t <z_h W_O^h, x_out + x_in>`` over the scoped real tokens of
    prompt ``p``, with ``mlp``, ``bias`` and ``total = mean_t ||x_out||^2 - ||x_in||^2`` likewise,
    so ``head.sum(-1) + mlp + bias == total`` (see the module docstring).

    Args:
        model: a pre-LN TransformerLens model (``TransformerBridge`` or legacy
            ``HookedTransformer``); post-LN models raise.
        prompts: anything :func:`thermo_lens.inputs.as_prompts` takes.
        token_scope: ``"all_but_first"`` (default), ``"all"`` or ``"last"``.
        settings, **run: run options (:class:`thermo_lens.RunSettings`): ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks`` (e.g. a patch or ablation; attributed as it
            ran), ``progress``.

    Returns:
        :class:`GainAttribution`.
    """
    _check_scope(token_scope)
    view = as_view(model)
    why = _not_splittable(view)
    if why:
        raise ThermoLensInputError(why)
    view.warn_if_processed("the residual norms differ from the raw model's", stacklevel=2)
    return measure.run(view, prompts, {"attribution": {"token_scope": token_scope}}, settings=settings, **run).attribution
