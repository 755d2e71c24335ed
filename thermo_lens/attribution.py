"""Exact per-head attribution of the residual stream's squared-norm change, block by block.

Block ``layer`` (0-based, ``blocks.{layer}``) maps its input ``x_in = x_layer`` to its output
``x_out = x_{layer+1}`` (the residual states of :mod:`thermo_lens.gain`). Since
``||x_out||^2 - ||x_in||^2 = <x_out - x_in, s>`` with ``s = x_out + x_in``, any exact split of
``x_out - x_in`` into components ``c`` splits the squared-norm change exactly into one term per
component, ``<c, s>`` per token. In a pre-LN block (sequential or parallel attention: GPT-2,
GPT-NeoX/Pythia, LLaMA, GPT-J ...)::

    x_out = x_in + sum_h z_h W_O^h + b_O + (mlp_out - b_out) + b_out

so ``head[..., h] = <z_h W_O^h, s>``, ``mlp = <mlp_out - b_out, s>``, ``bias = <b_O + b_out, s>``,
``total = ||x_out||^2 - ||x_in||^2`` and ``head.sum(-1) + mlp + bias == total`` up to float32
rounding, token by token and therefore for every mean over tokens. The block gain is
``sqrt(||x_out||^2 / ||x_in||^2)``, so ``total > 0`` exactly when the block's gain exceeds 1 on
that token.

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
removing it does. With frozen norms (below) the same holds with each norm's scale held too.

Other block layouts (:mod:`thermo_lens.layout`, ``thermo_lens.definitions`` §7) are exact the
same way once every norm's per-token scale is frozen at its value in the pass (one scalar per
token, so the norm is a linear map of its input, plus its bias):

* **multiplier** (Granite): every component is scaled by the model's ``alpha`` before it is added;
* **sandwich** (Gemma-2/3, OLMo-2): the attention output passes through ``N_a``, the MLP output
  through ``N_m`` before the add; head ``h`` adds ``r_a g_a * (z_h W_O^h)``, exactly;
* **post-LN** (BERT, MiniLM, OPT-350m): ``x_out = L_2(L_1(x_in + A) + M)`` is affine in ``x_in``
  and the components; ``norm = <T x_in - x_in, s>`` (``T`` the two frozen norms' linear part) is
  the rescaling of the incoming stream, and the norms' biases join ``bias``;
* **mixture of experts** (Mixtral): the MLP term splits further into one term per expert,
  ``expert[..., e] = <w_e E_e(x), .>`` (router weight times expert output);
* **SAEs** spliced into the stream (SAELens ``add_sae`` at ``hook_resid_*``, ``hook_attn_out``,
  ``hook_mlp_out`` or ``attn.hook_z``): the SAE's change ``sae(x) - x`` is a component (``sae``),
  its error term's share with ``use_error_term`` is ``sae_error``, and the heads, MLP and biases
  are read at the SAE's input.

In every case each term is ``<c, u_c>`` with ``u_c`` the transpose of the (frozen, linear) map
from where ``c`` is written to ``x_out``, applied to ``s``; ``u_c = s`` for a pre-LN block.

Computed inside the forward pass: per block, the hooks keep ``x_in``, ``z``, the MLP output, the
norms' scales (``hook_scale``) and SAE activations until ``x_out``'s hook fires, reduce them to
the per-token terms and drop them. The head term is ``<z_h, u W_O^{hT}>``, so no
``[batch, pos, head, d_model]`` tensor is formed. User hooks run before the reductions, so an
ablated or patched run is attributed as it ran.

Each block's attribution is checked to close (``closure``, the part of ``total`` the components
do not explain, must be at float32 rounding level), so anything the layout does not describe (a
user hook that edits an activation between the components and the stream, an SAE inside a norm)
fails loudly, naming the hook or SAE, instead of giving wrong numbers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens import attached, measure
from thermo_lens.inputs import Prompts
from thermo_lens.layout import BlockLayout, NormSite
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
           "ATTRIBUTION_SCOPES", "ATTRIBUTION_DEFINITIONS", "sae_sites"]

#: Token scopes of the attribution (means over the scope's real tokens of per-token terms).
ATTRIBUTION_SCOPES = TERM_SCOPES

#: Definition of every attribution term (``s = x_out + x_in`` of block ``layer``; ``u_c`` the
#: transpose of the frozen map from where component ``c`` is written to ``x_out``, applied to ``s``;
#: ``u_c = s`` in a pre-LN block).
ATTRIBUTION_DEFINITIONS: dict[str, str] = {
    "head": "<z_h W_O^h, u_attn>: head h's share of ||x_out||^2 - ||x_in||^2 of block layer",
    "mlp": "<mlp_out - b_out, u_mlp>: the MLP's share (its output bias in bias)",
    "bias": "<b_O, u_attn> + <b_out, u_mlp> (+ the norms' biases, post-LN and sandwich): the constant vectors' share",
    "norm": "<T x_in - x_in, x_out + x_in>: post-LN only, the rescaling of the incoming stream by the block's "
            "LayerNorms (T their frozen linear part); 0 for other layouts",
    "sae": "<sae(x) - x, u_sae>: the change of the SAEs spliced into the block's stream; 0 without SAEs",
    "sae_error": "<error term, u_sae>: the part of sae from SAEs with use_error_term (their reconstruction's "
                 "part is sae - sae_error)",
    "expert": "<w_e(t) E_e(x_t), u_mlp>: mixture of experts, expert e's share (sums to mlp; a dense MLP is one "
              "expert with weight 1)",
    "total": "||x_out||^2 - ||x_in||^2, x_in = x_layer, x_out = x_{layer+1} (the gain's residual states)",
    "closure": "total - (sum_h head + mlp + bias + norm + sae): float32 rounding (checked)",
}

_CLOSURE_RTOL = 1e-3  # float32 / float64 models: the closure is ~1e-7 of the scale in practice
_CLOSURE_RTOL_HALF = 5e-2  # bfloat16 / float16 models (see attribution_from_collected)
_SAE_SITE = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|"
                       r"hook_mlp_out|attn\.hook_z)$")


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


# ---------------------------------------------------------------------------- SAEs
@dataclass(frozen=True)
class _SAESite:
    hook: str  # where the SAE sits (its wrapper's name)
    layer: int  # the block whose stream it changes
    where: str  # "start", "mid", "attn_out", "mlp_out", "z", "end": which adjoint applies
    error_term: bool


def sae_sites(view: ModelView) -> tuple[list[_SAESite], list[str]]:
    """The attached SAEs that change a block's residual stream (each a component of that block),
    and the descriptions of the others: SAEs whose change acts inside a component (e.g. at
    ``mlp.hook_post``: the MLP term includes it), before block 0, or transcoders (read at one hook,
    written at another: the component they replace is read at their output)."""
    sites: list[_SAESite] = []
    other: list[str] = []
    names = view.resid_hook_names
    for rec in attached.sae_records(view.model):
        hook = rec["hook"]
        m = _SAE_SITE.match(hook)
        if rec.get("hook_out", hook) != hook:
            other.append(f"transcoder {hook} -> {rec['hook_out']} (its output is read as the component it replaces)")
            continue
        if m is None:
            other.append(f"SAE at {hook} (inside a component, whose term includes its effect)")
            continue
        k, rest = int(m.group(1)), m.group(2)
        if rest == "hook_resid_pre":
            if k == 0:
                other.append(f"SAE at {hook} (before block 0: x_0 is its output)")
                continue
            layer, where = (k - 1, "end") if names[k] == hook else (k, "start")
        else:
            layer = k
            where = {"hook_resid_mid": "mid", "hook_resid_post": "end", "hook_attn_out": "attn_out",
                     "hook_mlp_out": "mlp_out", "attn.hook_z": "z"}[rest]
        sites.append(_SAESite(hook=hook, layer=layer, where=where, error_term=bool(rec["use_error_term"])))
    return sites, other


# ---------------------------------------------------------------------------- the reduction
def _norm_T(site: NormSite, g: Tensor, r: Tensor, v: Tensor) -> Tensor:
    """The transpose of the frozen norm's linear part ``y -> r * g * P y`` applied to ``v``
    ``[n, d]`` (``r`` ``[n, 1]``): ``P (r * g * v)``."""
    w = v * (r * g)
    return w - w.mean(-1, keepdim=True) if site.centered else w


def _vec_dot(a: Tensor, b: Tensor) -> Tensor:
    return torch.linalg.vecdot(a, b)


@dataclass
class _BlockPlan:
    """What block ``layer``'s reduction reads (``reads``: ``(hook name, key)``) and its constants."""

    layer: int
    reads: list[tuple[str, str]]
    W_O: Tensor  # [head * d_head, d_model] float32
    b_O: Tensor  # [d_model] (zero where the block has none)
    b_out: Tensor
    norms: dict[str, tuple[Tensor, Tensor | None]]  # module -> (g, beta)
    sites: list[_SAESite]
    experts: Any = None


def _plan(view: ModelView) -> list[_BlockPlan]:
    layout: BlockLayout = view.layout
    L, H, d = view.n_layers, view.n_heads, view.d_model
    W_flat = view.W_O().reshape(L, H * view.d_head, d)
    sites, _ = sae_sites(view)
    wrappers = set(attached.sae_wrappers(view.model))
    names = view.resid_hook_names

    def sae_hook(hook: str, which: str) -> str:
        """``<hook>.hook_sae_<which>`` at the SAE wrapper's real hook point (SAETransformerBridge
        keys its SAEs by TransformerLens' alias, ``blocks.1.hook_mlp_out``, and hooks them at the
        aliased point, ``blocks.1.mlp.hook_out``)."""
        out = attached.resolve_hook(view.model, hook, view.name)
        base = out[: -len(".hook_sae_output")] if isinstance(out, str) and out.endswith(".hook_sae_output") else hook
        return f"{base}.hook_sae_{which}"

    plans = []
    for l in range(L):
        block = view.model.blocks[l]
        b_O, b_out = view.output_biases(l)
        zero = torch.zeros(d)
        mine = [s for s in sites if s.layer == l]
        z_hook, mlp_hook = f"blocks.{l}.attn.hook_z", f"blocks.{l}.{layout.mlp_hook}"
        # A component read where an SAE sits is read at the SAE's input (the SAE is its own term).
        z_hook = sae_hook(z_hook, "input") if z_hook in wrappers else z_hook
        mlp_hook = sae_hook(mlp_hook, "input") if mlp_hook in wrappers else mlp_hook
        reads = [(names[l], "x_in"), (z_hook, "z"), (mlp_hook, "mlp_out")]
        reads += [(f"blocks.{l}.{n.scale_hook}", "scale:" + n.module) for n in layout.norm_sites]
        experts = None
        if layout.moe is not None:
            moe = layout.moe
            reads += [(f"blocks.{l}.{moe.input_hook}", "moe_in"), (f"blocks.{l}.{moe.indices_hook}", "moe_idx"),
                      (f"blocks.{l}.{moe.weights_hook}", "moe_w")]
            experts = getattr(getattr(block.mlp, "original_component", None), "experts", None)
        for i, site in enumerate(mine):
            reads += [(sae_hook(site.hook, "input"), f"sae_in:{i}"), (sae_hook(site.hook, "output"), f"sae_out:{i}")]
            if site.error_term:
                reads.append((sae_hook(site.hook, "error"), f"sae_err:{i}"))
        plans.append(_BlockPlan(
            layer=l, reads=reads, W_O=W_flat[l], b_O=zero if b_O is None else b_O,
            b_out=zero if b_out is None else b_out, norms={n.module: n.params(block) for n in layout.norm_sites},
            sites=mine, experts=experts))
    return plans


def _block_terms(view: ModelView, plan: _BlockPlan, take: Any, x_out: Tensor) -> Tensor:
    """``[n, head + 8 (+ expert)]`` per-token terms of one block from its scoped activations
    (``take(key)`` -> ``[n, ...]`` float32): heads, then mlp, bias, norm, sae, sae_error, scale,
    closure, total, then the experts' terms."""
    layout: BlockLayout = view.layout
    H, dev = view.n_heads, x_out.device
    x_in, z, mlp_out = take("x_in"), take("z"), take("mlp_out")
    s = x_out + x_in  # [n, d_model]
    b_O, b_out = plan.b_O.to(dev), plan.b_out.to(dev)
    r = {m: 1.0 / take("scale:" + m).clamp_min(torch.finfo(torch.float32).tiny) for m in plan.norms}
    zero = torch.zeros_like(s[:, 0])
    bias = zero.clone()

    def through(site: NormSite | None, v: Tensor) -> Tensor:
        """``v`` pulled back through ``site``'s frozen linear part (identity for None); the site's
        bias share ``<beta, v>`` joins ``bias``."""
        nonlocal bias
        if site is None:
            return v
        g, beta = plan.norms[site.module]
        if beta is not None:
            bias = bias + v @ beta.to(dev)
        return _norm_T(site, g.to(dev), r[site.module], v)

    alpha = float(layout.multiplier)
    L1, L2 = layout.stream_norms if layout.stream_norms else (None, None)
    u2 = through(L2, s)  # adjoint where the MLP's contribution enters the stream
    v_m = alpha * through(layout.mlp_norm, u2)
    u1 = through(L1, u2)  # adjoint where the attention's contribution enters (and at x_in)
    v_a = alpha * through(layout.attn_norm, u1)
    if layout.mlp_norm is not None and layout.mlp_hook.endswith("hook_normalized"):
        mlp_out = mlp_out / r[layout.mlp_norm.module]  # HookedTransformer: M / scale
    # v_a W_O^T for every head at once: one [n, d_model] x [d_model, head*d_head] matmul.
    u = v_a @ plan.W_O.to(dev).mT
    head = _vec_dot(z.view(-1, H, view.d_head), u.view(-1, H, view.d_head))  # [n, head]
    mlp = _vec_dot(mlp_out - b_out, v_m)
    bias = bias + v_a @ b_O + v_m @ b_out
    norm = _vec_dot(x_in, u1 - s) if layout.stream_norms else zero
    adjoint = {"start": u1, "mid": u2, "attn_out": u1, "mlp_out": u2, "end": s, "z": u}
    sae, sae_err = zero.clone(), zero.clone()
    for i, site in enumerate(plan.sites):
        v = adjoint[site.where]
        sae = sae + _vec_dot(take(f"sae_out:{i}") - take(f"sae_in:{i}"), v)
        if site.error_term:
            sae_err = sae_err + _vec_dot(take(f"sae_err:{i}"), v)
    total = _vec_dot(x_out - x_in, s)  # = ||x_out||^2 - ||x_in||^2 without cancellation
    scale = _vec_dot(x_out, x_out) + _vec_dot(x_in, x_in)
    # Per token |total - components| (its scoped mean: a cancellation across tokens must not
    # hide a block that does not close).
    closure = (total - head.sum(-1) - mlp - bias - norm - sae).abs()
    parts = [head, torch.stack([mlp, bias, norm, sae, sae_err, scale, closure, total], dim=1)]
    if layout.moe is not None:
        parts.append(_expert_terms(take, plan.experts, layout.moe.n_experts, v_m))
    return torch.cat(parts, dim=1)


@functools.lru_cache(maxsize=None)
def attribution_terms(token_scope: str = "all_but_first") -> Reduction:
    """Reduction (for :func:`thermo_lens.passes.collect`) recording the scoped means, per block
    ``l``: ``("attr_head", l)`` ``[batch, head]``, ``("attr_mlp", l)``, ``("attr_bias", l)``,
    ``("attr_norm", l)``, ``("attr_sae", l)``, ``("attr_sae_error", l)``, ``("attr_total", l)``,
    ``("attr_closure", l)`` and ``("attr_scale", l)`` (the scoped mean of
    ``||x_out||^2 + ||x_in||^2``, the size the closure is compared with), each ``[batch]``
    float64, and for a mixture of experts ``("attr_expert", l)`` ``[batch, expert]``."""
    _check_scope(token_scope)

    def scoped_rows(batch: TokenBatch, dev: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The batch's scoped rows ``[n]`` (flat ``(prompt, position)`` indices), the prompt of
        each, and the per-prompt counts ``[batch, 1]`` (at least 1)."""
        B, T = batch.tokens.shape
        rows = scope_mask(batch.lengths, T, token_scope, dev).reshape(B * T).nonzero().squeeze(1)
        prompt_of = rows // T
        n = torch.bincount(prompt_of, minlength=B).to(torch.float64).clamp_min(1.0)[:, None]
        return rows, prompt_of, n

    def reduction(view: ModelView, rec: Recorder) -> None:
        why = _not_splittable(view)
        if why:
            raise ThermoLensInputError(why)
        H, names = view.n_heads, view.resid_hook_names
        for plan in _plan(view):
            state: dict[str, Tensor] = {}

            def keep(x: Tensor, batch: TokenBatch, _key: str, _state: dict = state) -> None:
                _state[_key] = x  # transient: dropped when this block's x_out fires

            def finish(x_out: Tensor, batch: TokenBatch, _plan: _BlockPlan = plan, _state: dict = state) -> Tensor:
                missing = {k for _, k in _plan.reads} - set(_state)
                if missing:
                    silent = sorted({h for h, k in _plan.reads if k in missing})
                    hint = ("; SAELens' SAETransformerBridge stops running a hook point after an SAE there is "
                            "removed (reset_saes): boot the model again" if view.host.kind == "bridge"
                            and attached.needs_resolving(view.model) else
                            f"; this block ({view.layout.describe()}) is not laid out as TransformerLens hooks it")
                    raise ThermoLensInputError(
                        f"{view.name} block {_plan.layer}: the host never ran the hook point(s) {', '.join(silent)} "
                        f"before {names[_plan.layer + 1]}, so the block cannot be attributed{hint}")
                dev = x_out.device
                B, T, _ = x_out.shape
                # Only the scoped real tokens enter the means, so only they are reduced: padding,
                # position 0 (all_but_first) or all but the last token ("last") never reach the
                # u W_O^T matmul, the one d_model^2-per-token step here. index_select, not x[rows]:
                # the same rows, a fraction of advanced indexing's overhead. The rows are found once
                # per batch and shared by every layer (the Recorder drops them when the batch ends).
                rows, prompt_of, n = rec.per_batch(("attr_rows", str(dev)), functools.partial(scoped_rows, dev=dev))

                def take(key: str, raw: bool = False) -> Tensor:
                    t = _state.pop(key).reshape(B * T, -1).index_select(0, rows)
                    return t if raw else t.float()

                terms = _block_terms(view, _plan, take, x_out.reshape(B * T, -1).index_select(0, rows).float())
                _state.clear()
                # Every per-token term, then one float64 per-prompt sum over the scoped rows.
                means = torch.zeros(B, terms.shape[1], dtype=torch.float64, device=dev).index_add_(
                    0, prompt_of, terms.double()) / n
                rec.put(("attr_head", _plan.layer), means[:, :H])
                for k, key in enumerate(("mlp", "bias", "norm", "sae", "sae_error", "scale", "closure")):
                    rec.put((f"attr_{key}", _plan.layer), means[:, H + k])
                if terms.shape[1] > H + 8:
                    rec.put(("attr_expert", _plan.layer), means[:, H + 8:])
                return means[:, H + 7]

            for hook, key in plan.reads:
                rec.add(hook, ("_attr_" + key, plan.layer), lambda x, b, _f=keep, _k=key: _f(x, b, _k))  # type: ignore[misc]
            rec.add(names[plan.layer + 1], ("attr_total", plan.layer), finish)

    return reduction


def _expert_terms(take: Any, experts: Any, E: int, v_m: Tensor) -> Tensor:
    """``[n, expert]``: ``<w_e(t) E_e(x_t), v_m>`` per scoped token, each chosen expert's output
    recomputed from the experts' input with the model's own experts module (one call per routing
    slot: the cost of the MoE's own forward)."""
    x = take("moe_in", raw=True)  # the model's dtype
    idx = take("moe_idx", raw=True).long()  # [n, top_k]
    w = take("moe_w", raw=True).gather(1, idx)  # [n, top_k] of the [n, expert] routing weights
    out = torch.zeros(x.shape[0], E, dtype=torch.float32, device=v_m.device)
    for k in range(idx.shape[1]):
        i_k = idx[:, k:k + 1]
        if isinstance(experts, torch.nn.ModuleList):  # one module per expert
            y = torch.cat([experts[int(e)](x[j:j + 1]) for j, e in enumerate(i_k[:, 0].tolist())]) * w[:, k:k + 1]
        else:  # transformers 5's fused experts: experts(x, top_k_index, top_k_weights)
            y = experts(x, i_k, w[:, k:k + 1].to(x.dtype))
        out.scatter_add_(1, i_k, _vec_dot(y.float(), v_m)[:, None])
    return out


# ---------------------------------------------------------------------------- the result
@dataclass(frozen=True, repr=False, eq=False)
class GainAttribution(PairedMixin, ProvenanceFields, Result):
    """Per-head (and MLP, bias, norm, SAE, expert) shares of each block's squared-norm change.

    All terms are means over the scoped real tokens (:data:`ATTRIBUTION_SCOPES`) of per-token
    terms ``<c, u_c>`` of block ``layer`` (0-based, ``blocks.{layer}``; see the module docstring and
    :data:`ATTRIBUTION_DEFINITIONS`), float64 accumulations of float32 per-token terms;
    ``head.sum(-1) + mlp + bias + norm + sae == total`` up to float32 rounding (``closure``).
    For a pre-LN model without SAEs ``norm`` and ``sae`` are 0 and ``u_c = x_out + x_in``.

    Attributes:
        head: ``Float[Tensor, "prompt layer head"]`` ``<z_h W_O^h, u_attn>``.
        mlp: ``Float[Tensor, "prompt layer"]`` ``<mlp_out - b_out, u_mlp>``.
        bias: ``Float[Tensor, "prompt layer"]`` ``<b_O, u_attn> + <b_out, u_mlp>`` plus, post-LN and
            sandwich, the norms' biases carried to ``x_out``.
        total: ``Float[Tensor, "prompt layer"]`` ``||x_out||^2 - ||x_in||^2``.
        closure: ``Float[Tensor, "prompt layer"]`` scoped mean of ``|total - components|`` per
            token (rounding; checked to be below ``1e-3`` of ``scale`` for float32 models, ``5e-2``
            for bfloat16/float16 ones, whose residual additions round to about 3 digits).
        scale: ``Float[Tensor, "prompt layer"]`` scoped mean of ``||x_out||^2 + ||x_in||^2``.
        token_scope: the token scope.
        provenance: prompts, lengths, BOS mode, model metadata (its ``block_layout``) and the
            user hooks of the run.
        norm: ``Float[Tensor, "prompt layer"]`` post-LN: ``<T x_in - x_in, x_out + x_in>``, the
            incoming stream's rescaling by the block's LayerNorms; 0 for other layouts.
        sae: ``Float[Tensor, "prompt layer"]`` ``<sae(x) - x, u_sae>`` summed over the SAEs
            spliced into the block's stream; 0 without SAEs.
        sae_error: ``Float[Tensor, "prompt layer"]`` the part of ``sae`` from the error terms of
            SAEs with ``use_error_term`` (``sae - sae_error`` is their reconstructions' part).
        expert: ``Float[Tensor, "prompt layer expert"]`` mixture of experts: expert ``e``'s share
            ``<w_e E_e(x), u_mlp>`` (router weight times expert output; ``expert.sum(-1) == mlp``);
            a dense MLP is one expert chosen with weight 1 (``[prompt, layer, 1]``, equal to ``mlp``).
    """

    head: Tensor
    mlp: Tensor
    bias: Tensor
    total: Tensor
    closure: Tensor
    scale: Tensor
    token_scope: str
    provenance: Provenance
    norm: Tensor | None = None
    sae: Tensor | None = None
    sae_error: Tensor | None = None
    expert: Tensor | None = None

    #: 2: the norm, sae, sae_error and expert terms (results stored under 1 read them as 0 / None).
    schema_version = 2

    def __post_init__(self) -> None:
        for name in ("norm", "sae", "sae_error"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, torch.zeros_like(self.total))
        if self.expert is None:  # schema 1, or a dense MLP: one expert, router weight 1
            object.__setattr__(self, "expert", self.mlp[..., None].clone())

    @property
    def n_experts(self) -> int:
        """Experts per MLP (1 for a dense MLP)."""
        assert self.expert is not None
        return int(self.expert.shape[-1])

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
    def block_layout(self) -> str:
        """The block layout the terms follow (``thermo_lens.definitions`` §7), e.g. ``"pre-LN"``."""
        lay = self.model.get("block_layout") or {}
        return str(lay.get("description", "pre-LN" if not self.model.get("post_ln") else "post-LN"))

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
        return self._definition_columns(df)

    def _definition_columns(self, df: pd.DataFrame) -> pd.DataFrame:
        df["token_scope"] = self.token_scope
        df["block_layout"] = self.block_layout
        for k, v in self.provenance.columns().items():
            df[k] = v
        return df

    def layer_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer): ``heads`` (sum over heads), ``mlp``, ``bias``, ``norm``,
        ``sae``, ``sae_error``, ``total``, ``closure`` and the definition columns."""
        P, L = self.total.shape
        assert self.norm is not None and self.sae is not None and self.sae_error is not None
        df = pd.DataFrame({"prompt": np.repeat(np.arange(P), L), "layer": np.tile(np.arange(L), P),
                           "heads": self.head.sum(-1).numpy().ravel(), "mlp": self.mlp.numpy().ravel(),
                           "bias": self.bias.numpy().ravel(), "norm": self.norm.numpy().ravel(),
                           "sae": self.sae.numpy().ravel(), "sae_error": self.sae_error.numpy().ravel(),
                           "total": self.total.numpy().ravel(), "closure": self.closure.numpy().ravel()})
        return self._definition_columns(df)

    def expert_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer, expert): ``expert_term`` and the definition columns (a dense
        MLP is expert 0, router weight 1)."""
        assert self.expert is not None
        P, L, E = self.expert.shape
        p, l, e = np.meshgrid(np.arange(P), np.arange(L), np.arange(E), indexing="ij")
        df = pd.DataFrame({"prompt": p.ravel(), "layer": l.ravel(), "expert": e.ravel(),
                           "expert_term": self.expert.numpy().ravel()})
        return self._definition_columns(df)

    def __repr__(self) -> str:
        m = self.model
        lt = self.total.mean(0).tolist()
        shown = ", ".join(f"{v:.4g}" for v in lt[:12]) + (", ..." if len(lt) > 12 else "")
        top = self.top_heads(3)
        tops = ", ".join(f"L{r.layer}H{r.head} {r.head_term:+.4g}" for r in top.itertuples())
        parts = ["sum_h head", "mlp", "bias"]
        assert self.norm is not None and self.sae is not None
        if bool((self.norm != 0).any()):
            parts.append("norm")
        if bool((self.sae != 0).any()) or m.get("saes"):
            parts.append("sae")
        saes = m.get("saes") or []
        lines = [f"GainAttribution({m.get('name')}: {self.n_prompts} prompts x {self.n_layers} layers x "
                 f"{self.n_heads} heads; {self.block_layout}; token_scope={self.token_scope!r}, "
                 f"BOS={self.prepend_bos!r}, weights {self.weights}, {self.dtype})",
                 f"  per block: ||x_out||^2 - ||x_in||^2 = {' + '.join(parts)} (exact; max closure "
                 f"{float((self.closure / self.scale).max()):.1e} of the scale)"]
        if self.n_experts > 1:
            lines.append(f"  mlp = sum over {self.n_experts} experts of expert (router weight x expert output)")
        lines += [f"  mean total by layer 0..{self.n_layers - 1}: [{shown}]",
                  f"  most expanding heads: {tops}"]
        if saes:
            lines.append("  SAEs: " + "; ".join(
                f"{r['hook']} (d_sae={r['d_sae']}{', error term' if r['use_error_term'] else ''})" for r in saes))
        lines.append(f"  hooks: {self.provenance.hooks_text}")
        return "\n".join(lines)


def _not_splittable(view: ModelView) -> str | None:
    """Why a block of this model has no exact split, or None (names the architecture and the
    component that prevents it)."""
    return view.layout.unsupported


for _name, _symbol, _formula, _shape, _attr, _frame in (
    ("head_term", "<z_h W_O^h, u_attn>", "head h's share of block layer's squared-norm change "
     "||x_out||^2 - ||x_in||^2 (a Shapley-style share of the change: cross terms split half and half; not an "
     "ablation effect), mean over the scope's tokens; u_attn = x_out + x_in for pre-LN blocks, pulled back "
     "through the block's frozen norms and multiplier otherwise (definitions §7)", "prompt layer head", "head",
     "to_frame"),
    ("mlp_term", "<mlp_out - b_out, u_mlp>", "the MLP's share (its output bias is in bias_term)",
     "prompt layer", "mlp", "layer_frame"),
    ("bias_term", "<b_O, u_attn> + <b_out, u_mlp>", "the attention and MLP output biases' share (post-LN and "
     "sandwich blocks: and the norms' biases)", "prompt layer", "bias", "layer_frame"),
    ("norm_term", "<T x_in - x_in, x_out + x_in>", "post-LN blocks: the share of the incoming stream's rescaling "
     "by the block's LayerNorms (T: their linear part with the per-token scales frozen); 0 for other layouts",
     "prompt layer", "norm", "layer_frame"),
    ("sae_term", "<sae(x) - x, u_sae>", "the share of the change made by the SAEs spliced into the block's "
     "residual stream (reconstruction minus input, error term included); 0 without SAEs", "prompt layer", "sae",
     "layer_frame"),
    ("norm_sq_change", "||x_out||^2 - ||x_in||^2", "the block's squared-norm change, x_in = x_layer, x_out = "
     "x_{layer+1} (the gain's residual states); = sum_h head_term + mlp_term + bias_term + norm_term + sae_term",
     "prompt layer", "total", "layer_frame"),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape=_shape, result="GainAttribution",
                           section="gain", unit="squared residual norm", attr=_attr, frame=_frame,
                           column=None if _name == "head_term" else _attr,
                           panel=_name == "head_term"))
register_metric(Metric("expert_term", symbol="<w_e E_e(x), u_mlp>", formula="mixture-of-experts MLP: expert e's "
                       "share of the MLP term (router weight times expert output; sums to mlp_term over experts; a "
                       "dense MLP is one expert with weight 1)",
                       shape="prompt layer expert", result="GainAttribution", section="gain",
                       unit="squared residual norm", attr="expert", frame="expert_frame"))


def _unexplained_cause(collected: Collected, layer: int) -> str:
    """What most likely broke block ``layer``'s identity: user hooks, SAEs acting where the layout
    has no term for them, or the architecture."""
    view = collected.view
    causes = []
    if collected.hooks:
        causes.append("a user hook changed an activation the components do not account for (e.g. at "
                      f"blocks.{layer}.hook_attn_out, hook_resid_mid or hook_resid_post; hooks: "
                      + "; ".join(str(h) for h in collected.hooks) + ")")
    sites, other = sae_sites(view)
    here = [s for s in sites if s.layer == layer]
    if here and view.layout.kind in ("post", "sandwich") and any(s.where not in ("z", "end", "start") for s in here):
        causes.append("an SAE at " + ", ".join(s.hook for s in here) + f" sits where the {view.layout.describe()} "
                      "block has no single adjoint for it")
    if other:
        causes.append("an attached SAE acts outside the stream points the attribution splits: " + "; ".join(other))
    if not causes:
        causes.append(f"this {view.layout.describe()} block ({view.model_type or view.name}) adds something the "
                      "layout does not describe")
    return "; or ".join(causes)


def attribution_from_collected(collected: Collected, token_scope: str = "all_but_first") -> GainAttribution:
    """The :class:`GainAttribution` of a :func:`~thermo_lens.passes.collect` pass that ran
    :func:`attribution_terms` (pure; checks that every block closes)."""
    _check_scope(token_scope)
    if "attr_head" not in collected.recorder.names:
        raise ThermoLensInputError("this collection has no attribution terms: run collect(..., [attribution_terms(scope)])")
    head = collected.stack("attr_head").permute(1, 0, 2).contiguous()  # [P, L, H]
    get = {k: collected.stack(f"attr_{k}").T.contiguous()
           for k in ("mlp", "bias", "norm", "sae", "sae_error", "total", "closure", "scale")}
    expert = (collected.stack("attr_expert").permute(1, 0, 2).contiguous()
              if "attr_expert" in collected.recorder.names else None)
    view = collected.view
    rel = get["closure"] / get["scale"].clamp_min(torch.finfo(torch.float32).tiny)
    # The model adds its components in its own dtype: half-precision residual streams round each
    # addition to about 3 significant digits, so the identity closes only to that precision.
    rtol = _CLOSURE_RTOL if view.dtype in (torch.float32, torch.float64) else _CLOSURE_RTOL_HALF
    if bool((rel > rtol).any()):
        p, l = (int(i) for i in (rel > rtol).nonzero()[0])
        raise ThermoLensInputError(
            f"{view.name}: block {l}'s output is not its input plus its heads, MLP, biases"
            f"{', norms' if view.layout.norm_sites else ''} and SAEs (prompt {p}: unexplained "
            f"{float(rel[p, l]):.2e} of ||x_out||^2 + ||x_in||^2): {_unexplained_cause(collected, l)}; "
            "gain_attribution cannot split it. Hooks at hook_resid_pre, attn.hook_z and hook_mlp_out are "
            "attributed as they ran.")
    if expert is not None:
        gap = (expert.sum(-1) - get["mlp"]).abs() / get["scale"].clamp_min(torch.finfo(torch.float32).tiny)
        if bool((gap > rtol).any()):
            p, l = (int(i) for i in (gap > rtol).nonzero()[0])
            raise ThermoLensInputError(
                f"{view.name}: block {l}'s experts do not add up to its MLP output (prompt {p}: "
                f"{float(gap[p, l]):.2e} of the scale): the mixture of experts adds something besides router "
                "weight x expert output (a shared expert, or a hook on the router)")
    return GainAttribution(head=head, mlp=get["mlp"], bias=get["bias"], total=get["total"], closure=get["closure"],
                           scale=get["scale"], token_scope=token_scope, provenance=collected.provenance(),
                           norm=get["norm"], sae=get["sae"], sae_error=get["sae_error"], expert=expert)


def _build(ctx: BuildContext, *, token_scope: str) -> GainAttribution:
    return attribution_from_collected(ctx.collected, token_scope)


register_measurement(Measurement(
    "attribution", title="Gain attribution", result="GainAttribution", section="gain",
    summary="each head's (and the MLP's, biases', norms', SAEs' and experts') exact share of each block's "
            "squared-norm change ||x_out||^2 - ||x_in||^2",
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

    ``head[p, layer, h] = mean_t <z_h W_O^h, u_attn>`` over the scoped real tokens of prompt ``p``,
    with ``mlp``, ``bias``, ``norm``, ``sae`` and ``total = mean_t ||x_out||^2 - ||x_in||^2``
    likewise, so ``head.sum(-1) + mlp + bias + norm + sae == total`` (see the module docstring;
    ``u_attn = x_out + x_in`` in a pre-LN block). Exact on pre-LN, parallel, sandwich (Gemma-2/3,
    OLMo-2), multiplier (Granite), mixture-of-experts (per expert) and post-LN (BERT, OPT-350m)
    blocks, with SAEs spliced in.

    Args:
        model: a TransformerLens model (``TransformerBridge``, ``HookedTransformer``,
            ``HookedSAETransformer``, ``HookedEncoder``).
        prompts: anything :func:`thermo_lens.inputs.as_prompts` takes.
        token_scope: ``"all_but_first"`` (default), ``"all"`` or ``"last"``.
        settings, **run: run options (:class:`thermo_lens.RunSettings`): ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks`` (e.g. a patch or ablation; attributed as it
            ran), ``progress``.

    Returns:
        :class:`GainAttribution`.

    Raises:
        ThermoLensInputError: a block with no exact split (the message names the architecture
            and the component), or a block that does not close (names the hook or SAE).
    """
    _check_scope(token_scope)
    view = as_view(model)
    why = _not_splittable(view)
    if why:
        raise ThermoLensInputError(why)
    view.warn_if_processed("the residual norms differ from the raw model's", stacklevel=2)
    return measure.run(view, prompts, {"attribution": {"token_scope": token_scope}}, settings=settings, **run).attribution
