"""The in-pass reduction of the gain attribution (``thermo_lens.definitions`` §7).

Per block, hooks keep ``x_in``, the heads' ``z``, the MLP output, the norms' scales, the routing
of a mixture of experts and the activations of spliced SAEs until the block's output fires, then
reduce them to the per-token terms of :mod:`thermo_lens.measures.attribution` and drop them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from thermo_lens.core import attached
from thermo_lens.measures.attribution.features import FEATURE_DEFINITIONS, FeatureSite, decoder, feature_sites, split_features
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.layout import BlockLayout, NormSite
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes import Recorder, Reduction
from thermo_lens.core.products import as_float32, scoped_rows, token_norms
from thermo_lens.core.tokens import TERM_SCOPES, TokenBatch, check_token_scope

__all__ = ["attribution_terms", "sae_sites", "ATTRIBUTION_SCOPES", "ATTRIBUTION_DEFINITIONS", "TERM_COLUMNS"]

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
    "splice": "<x_{layer+1} - y, x_out + x_in>, y = blocks.{layer}.hook_resid_post as the block wrote it: the change "
              "hooks made to the stream between this block's output and the next block's input (e.g. a patch at "
              "blocks.{layer+1}.hook_resid_pre, which x_out = x_{layer+1} includes); 0 without such hooks",
    "expert": "<w_e(t) E_e(x_t), u_mlp>: mixture of experts, expert e's share (sums to mlp; a dense MLP is one "
              "expert with weight 1)",
    "total": "||x_out||^2 - ||x_in||^2, x_in = x_layer, x_out = x_{layer+1} (the gain's residual states)",
    "closure": "total - (sum_h head + mlp + bias + norm + sae + splice): float32 rounding (checked)",
    **FEATURE_DEFINITIONS,
}

#: The per-token columns of a block's terms after the heads' (then the experts', if any), each recorded
#: as ``("attr_<column>", l)``.
TERM_COLUMNS = ("mlp", "bias", "norm", "sae", "sae_error", "splice", "scale", "closure", "total")

_CLOSURE_RTOL = 1e-3  # float32 / float64 models: the closure is ~1e-7 of the scale in practice
_CLOSURE_RTOL_HALF = 5e-2  # bfloat16 / float16 models (see attribution_from_collected)
_SAE_SITE = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|"
                       r"hook_mlp_out|attn\.hook_z)$")


def _check_scope(token_scope: object) -> str:
    return check_token_scope(token_scope, ATTRIBUTION_SCOPES, refused={"frobenius": (
        "token_scope='frobenius' is a ratio of whole-sequence norms, not a mean of per-token terms; "
        "for the attribution use token_scope='all' (the squared-norm change summed over tokens is "
        "n_tokens times the 'all' mean)")})


#: ``take(what, raw=False, out=None)``: a block's scoped rows of the activation it kept as ``what`` (:func:`_taker`).
Take = Callable[..., Tensor]
#: ``features(j, v, part, error, rest_of)``: one SAE split per feature (:func:`_split_features`).
Features = Callable[[int, Tensor, Tensor, "Tensor | None", Tensor], None]


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
    ``[n, d]`` (``r`` ``[n, 1]``): ``P (r * g * v)`` (a new tensor; ``v`` is not changed)."""
    w = (v * g).mul_(r)  # no [n, d] r * g temporary
    return w.sub_(w.mean(-1, keepdim=True)) if site.centered else w


def _row_norms(x: Tensor) -> Tensor:
    """``[n]`` per-row ``||x||`` (one fused reduction, no ``x * x`` temporary; squared by :func:`_close`)."""
    return torch.linalg.vector_norm(x, dim=-1)


def _vec_dot(a: Tensor, b: Tensor) -> Tensor:
    return torch.linalg.vecdot(a, b)


def _owned_dot(a: Tensor, b: Tensor) -> Tensor:
    """``_vec_dot(a, b)`` (the same numbers: ``(a * b).sum(-1)``) computed in ``a``'s storage, which
    the caller owns and no longer needs: no ``[n, d]`` temporary."""
    return a.mul_(b).sum(-1)


class _Scratch:
    """A batch's buffers for the products every block makes and drops (the same ``n`` scoped rows in
    each block): ``u = v_a W_O^T`` ``[n, head * d_head]`` (and its ``[n, head, d_head]`` view), and the pair
    ``[2, n, d_model]`` of a pre-LN block's MLP output rows and ``x_out - x_in``, whose dot products with
    ``s = x_out + x_in`` (the MLP and total terms) are taken with one product and one sum. Made once per
    batch: one allocation and no view op per block; each block's products are written over the last's
    (the block's terms are taken before the next block's hooks run)."""

    def __init__(self, like: Tensor, n_heads: int, d_head: int) -> None:
        n, d = like.shape
        self.u = like.new_empty(n, n_heads * d_head)
        self.u_heads = self.u.view(n, n_heads, d_head)
        self.pair = like.new_empty(2, n, d)
        self.mlp_rows, self.diff = self.pair.unbind(0)


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
    experts: torch.nn.Module | None = None  # the MoE's experts module
    splice: str | None = None  # where the block's output is read as written (the next block may read another)
    has_b_O: bool = True  # whether b_O / b_out has a non-zero entry
    has_b_out: bool = True
    features: list[FeatureSite] = field(default_factory=list)  # SAEs split per feature (sae_features=True)
    decoders: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # (W, b_dec) of each, float32
    _on: dict = field(default_factory=dict, repr=False)  # device -> this plan's constants there
    W_OT: Tensor = field(init=False, repr=False)  # [d_model, head * d_head]: W_O.mT (a view), once per plan
    b_sum: Tensor = field(init=False, repr=False)  # [d_model]: b_O + b_out, once per plan

    def __post_init__(self) -> None:
        self.W_OT, self.b_sum = self.W_O.mT, self.b_O + self.b_out

    def on(self, dev: torch.device) -> _BlockPlan:
        """This plan with its constants (``W_O``, biases, norm parameters) on ``dev``, the device of
        the block's activations: copied once per pass and device, not in every batch. On a GPU the
        per-batch host-to-device copies of ``W_O`` were 72% of the device time of a warm
        ``profile()`` (1B geometry, H200, torch.profiler)."""
        if self.W_O.device == dev:
            return self
        moved = self._on.get(dev)
        if moved is None:
            W_O = self.W_O.to(dev)
            moved = replace(self, W_O=W_O, b_O=self.b_O.to(dev), b_out=self.b_out.to(dev),
                            norms={m: (g.to(dev), None if beta is None else beta.to(dev))
                                   for m, (g, beta) in self.norms.items()},
                            decoders=[(W.to(dev), b.to(dev)) for W, b in self.decoders], _on={})
            self._on[dev] = moved
        return moved


def _plan(view: ModelView, rec: Recorder | None = None, sae_features: bool = False) -> list[_BlockPlan]:
    """Every block's plan; ``rec``: the recorder of the pass (shares ``W_O`` with other reductions,
    and tells whether hooks other than the reductions' run: without them, no splice is read);
    ``sae_features``: also read the attached SAEs' latents, to split their terms per feature."""
    layout: BlockLayout = view.layout
    L, H, d = view.n_layers, view.n_heads, view.d_model
    W_O = view.W_O_layers() if rec is None else rec.per_pass(("W_O layers", torch.float32), view.W_O_layers)
    W_flat = [w.reshape(H * view.d_head, d) for w in W_O]
    foreign_hooks = rec is None or rec.foreign_hooks
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

    fsites = feature_sites(view, sites, layout.mlp_hook, sae_hook) if sae_features else []
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
        mine_f = [fs for fs in fsites if fs.layer == l]
        for j, fs in enumerate(mine_f):
            reads.append((fs.acts, f"sae_f:{j}"))
            if fs.error is not None:
                reads.append((fs.error, f"tc_err:{j}"))
        # The block's output as it wrote it: x_out = x_{l+1} is read where block l+1 reads it, after any
        # hook between the two (e.g. a patch at blocks.{l+1}.hook_resid_pre); that change is the splice
        # term. Not for the last block (x_L is its output), nor where an SAE sits at x_{l+1}'s point (its
        # sae term, read at the SAE's input and output, covers the change there). Nor in a pass where no
        # hook but the reductions' runs: nothing can change the stream between the two points (the
        # term is then exactly 0, as it is with the copy: x_out and y_out are the same tensor).
        post = names[L].rsplit(".", 1)[-1]
        splice = f"blocks.{l}.{post}" if foreign_hooks and l + 1 < L and names[l + 1] != f"blocks.{l}.{post}" and not any(
            s.hook == names[l + 1] for s in mine) else None
        b_O, b_out = zero if b_O is None else b_O, zero if b_out is None else b_out
        plans.append(_BlockPlan(
            layer=l, reads=reads, W_O=W_flat[l], b_O=b_O, b_out=b_out,
            norms={n.module: n.params(block) for n in layout.norm_sites},
            sites=mine, experts=experts, splice=splice, has_b_O=bool(b_O.any()),
            has_b_out=bool(b_out.any()), features=mine_f,
            decoders=[decoder(attached.sae_wrappers(view.model)[fs.key].sae) for fs in mine_f]))
    return plans


#: What :func:`_block_parts` returns per block after the heads' terms: the components whose sum the
#: closure checks, then the sizes that :func:`_close` turns into the scale and closure columns.
_PARTS = ("mlp", "bias", "norm", "sae", "sae_error", "splice", "total", "norm_out", "norm_in")


def _block_parts(view: ModelView, plan: _BlockPlan, take: Take, x_out: Tensor, y_out: Tensor | None = None,
                 row_norms: Callable[[Tensor], Tensor] | None = None, features: Features | None = None,
                 zero: Tensor | None = None,
                 scratch: _Scratch | None = None) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """The per-token terms of one block from its scoped activations (``take(key)`` -> ``[n, ...]``
    float32): the heads' ``[n, head]``, the parts of :data:`_PARTS` (``[n]`` each: mlp, bias, norm, sae,
    sae_error, splice, total, and the rows' norms ``||x_out||``, ``||x_in||``, which :func:`_close`
    turns into the scale and closure columns, for every block of a batch at once) and the experts'
    ``[n, expert]`` (None without a mixture of experts). ``y_out``: the block's output as it wrote it
    (:attr:`_BlockPlan.splice`), None where ``x_out`` is it. ``row_norms(x)``: per-row ``||x||``
    (the pass shares block ``l``'s ``||x_out||`` with block ``l + 1``, whose ``x_in`` it is).
    ``zero``: the ``[n]`` zeros of the absent components (shared by a batch's blocks; never changed).
    ``features(j, v, part, error, rest_of)``: called once per SAE split per feature (``plan.features[j]``)
    with the adjoint ``v`` ``[n, d]`` where it writes, the per-token term its features, rest and error
    must add up to (``part``: the SAE's ``sae`` share, or the MLP term a transcoder writes), its error
    share (None without an error term) and the vector its rest pairs with ``b_dec - rest_of``
    (the SAE's input; a transcoder: the MLP's output bias)."""
    layout: BlockLayout = view.layout
    H, dh, dev = view.n_heads, view.d_head, x_out.device
    plan = plan.on(dev)
    # A pre-LN block (no norm between a sublayer and the stream, multiplier 1: every adjoint is s): the MLP
    # rows and x_out - x_in are taken into the batch's pair buffer, their two dot products with s taken at once.
    pair = scratch is not None and not layout.stream_norms and layout.attn_norm is None and \
        layout.mlp_norm is None and float(layout.multiplier) == 1.0
    x_in, z = take("x_in"), take("z")
    mlp_out = take("mlp_out", out=scratch.mlp_rows) if pair and scratch is not None else take("mlp_out")
    s = x_out + x_in  # [n, d_model]
    b_out = plan.b_out
    r = {m: 1.0 / take("scale:" + m).clamp_min(torch.finfo(torch.float32).tiny) for m in plan.norms}
    zero = s.new_zeros(s.shape[0]) if zero is None else zero
    bias = zero

    def through(site: NormSite | None, v: Tensor) -> Tensor:
        """``v`` pulled back through ``site``'s frozen linear part (identity for None); the site's
        bias share ``<beta, v>`` joins ``bias``."""
        nonlocal bias
        if site is None:
            return v
        g, beta = plan.norms[site.module]
        if beta is not None:
            bias = bias + v @ beta
        return _norm_T(site, g, r[site.module], v)

    alpha = float(layout.multiplier)
    L1, L2 = layout.stream_norms if layout.stream_norms else (None, None)

    def scaled(v: Tensor) -> Tensor:
        return v if alpha == 1.0 else alpha * v

    u2 = through(L2, s)  # adjoint where the MLP's contribution enters the stream
    v_m = scaled(through(layout.mlp_norm, u2))
    u1 = through(L1, u2)  # adjoint where the attention's contribution enters (and at x_in)
    v_a = scaled(through(layout.attn_norm, u1))
    if layout.mlp_norm is not None and layout.mlp_hook.endswith("hook_normalized"):
        mlp_out = mlp_out / r[layout.mlp_norm.module]  # HookedTransformer: M / scale
    # v_a W_O^T for every head at once: one [n, d_model] x [d_model, head*d_head] matmul. The row dot
    # products below run in place on tensors this function owns (the product, the differences, the
    # scoped rows take() copied): the numbers of torch.linalg.vecdot ((a * b).sum(-1)), without an
    # [n, d_model] temporary each.
    u = v_a @ plan.W_OT if scratch is None else torch.mm(v_a, plan.W_OT, out=scratch.u)
    u_heads = u.view(-1, H, dh) if scratch is None else scratch.u_heads
    # (in u's storage unless an SAE at hook_z reads u below)
    head_dot = _vec_dot if any(site.where == "z" for site in plan.sites) else _owned_dot
    head = head_dot(u_heads, z if z.ndim == 3 else z.view(-1, H, dh))  # [n, head]
    # The output bias is subtracted where there is one (an all-zero bias leaves mlp_out as it is).
    # mlp_out is this function's own copy (take() copies the scoped rows): changed in place.
    if plan.has_b_out:
        mlp_out.sub_(b_out)
    if pair:  # v_m is s: <mlp_out, s> and <x_out - x_in, s> (= ||x_out||^2 - ||x_in||^2) with one product
        assert scratch is not None
        torch.sub(x_out, x_in, out=scratch.diff)
        dots = scratch.pair.mul_(s).sum(-1)  # [2, n]
        # (kept as one [2, n] tensor for both where only _record reads them: it takes its rows with no op)
        mlp, total = (dots, dots) if features is None else dots.unbind(0)
    else:
        mlp = _owned_dot(mlp_out, v_m)
    if v_a is v_m:  # pre-LN, no norm after the sublayers, multiplier 1: one product for both biases
        if plan.has_b_O or plan.has_b_out:
            product = v_a @ plan.b_sum
            bias = product if bias is zero else bias + product  # (0 + p is p)
    else:
        bias = bias + v_a @ plan.b_O + v_m @ b_out
    norm = _owned_dot(u1 - s, x_in) if layout.stream_norms else zero
    adjoint = {"start": u1, "mid": u2, "attn_out": u1, "mlp_out": u2, "end": s, "z": u}
    sae, sae_err = _sae_terms(plan, take, adjoint, zero, v_m, mlp, features)
    # x_out = y_out + (what hooks changed between the blocks): the change is its own component (exactly 0
    # without such hooks: x_out and y_out are then the same tensor, and a pass without foreign hooks
    # does not read y_out at all)
    splice = _owned_dot(x_out - y_out, s) if y_out is not None else zero
    if not pair:
        total = _owned_dot(x_out - x_in, s)  # = ||x_out||^2 - ||x_in||^2 without cancellation
    norms = row_norms or _row_norms
    experts = _expert_terms(take, plan.experts, layout.moe.n_experts, v_m) if layout.moe is not None else None
    return head, [mlp, bias, norm, sae, sae_err, splice, total, norms(x_out), norms(x_in)], experts


def _close(head: Tensor, parts: Sequence[Tensor], absent: frozenset[int] = frozenset()) -> list[Tensor]:
    """The columns of :data:`TERM_COLUMNS` from :func:`_block_parts`' heads ``[..., n, head]`` and parts
    (``[..., n]`` each; a batch's blocks stacked on the leading dimension): the scale
    ``||x_out||^2 + ||x_in||^2`` (the size the closure is compared with) and the per-token
    ``|total - components|`` (its scoped mean: a cancellation across tokens must not hide a block
    that does not close). An absent component is exactly 0, so subtracting it changes nothing."""
    mlp, bias, norm, sae, sae_err, splice, total, norm_out, norm_in = parts
    scale = norm_out.square() + norm_in.square()
    closure = total - head.sum(-1) - mlp
    for k, part in ((1, bias), (2, norm), (3, sae), (5, splice)):
        if k not in absent:  # (``absent``: indices into _PARTS of components exactly 0 in every row)
            closure = closure - part
    return [mlp, bias, norm, sae, sae_err, splice, scale, closure.abs(), total]


def _block_terms(view: ModelView, plan: _BlockPlan, take: Take, x_out: Tensor, y_out: Tensor | None = None,
                 features: Features | None = None) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """One block's heads ``[n, head]``, :data:`TERM_COLUMNS` columns ``[n]`` and experts (see
    :func:`_block_parts`; the pass takes the last columns of a batch's blocks at once)."""
    head, parts, experts = _block_parts(view, plan, take, x_out, y_out, features=features)
    return head, _close(head, parts), experts


def _sae_terms(plan: _BlockPlan, take: Take, adjoint: dict[str, Tensor], zero: Tensor, v_m: Tensor, mlp: Tensor,
               features: Features | None) -> tuple[Tensor, Tensor]:
    """``(sae, sae_error)`` ``[n]`` of the block's stream SAEs, and ``features(...)`` (see
    :func:`_block_terms`) for each SAE split per feature, transcoders (which wrote the MLP output) last."""
    sae, sae_err = zero, zero
    split = {fs.site: j for j, fs in enumerate(plan.features) if fs.site is not None} if features else {}
    for i, site in enumerate(plan.sites):
        v = adjoint[site.where]
        x = take(f"sae_in:{i}")
        part = _owned_dot(take(f"sae_out:{i}") - x, v)
        sae = sae + part
        err = _vec_dot(take(f"sae_err:{i}"), v) if site.error_term else None
        if err is not None:
            sae_err = sae_err + err
        if i in split and features is not None:
            features(split[i], v, part, err, x)
    if features:
        for j, fs in enumerate(plan.features):
            if fs.site is None:  # a transcoder: it wrote the MLP output (its bias replaced b_out)
                features(j, v_m, mlp, _vec_dot(take(f"tc_err:{j}"), v_m) if fs.error else None, plan.b_out)
    return sae, sae_err


@functools.lru_cache(maxsize=None)
def attribution_terms(token_scope: str = "all_but_first", sae_features: bool = False) -> Reduction:
    """Reduction (for :func:`thermo_lens.core.passes.collect`) recording the scoped means, per block
    ``l``: ``("attr_head", l)`` ``[batch, head]``, ``("attr_mlp", l)``, ``("attr_bias", l)``,
    ``("attr_norm", l)``, ``("attr_sae", l)``, ``("attr_sae_error", l)``, ``("attr_splice", l)``,
    ``("attr_total", l)``,
    ``("attr_closure", l)`` and ``("attr_scale", l)`` (the scoped mean of
    ``||x_out||^2 + ||x_in||^2``, the size the closure is compared with), each ``[batch]``
    float64, and for a mixture of experts ``("attr_expert", l)`` ``[batch, expert]``
    (:data:`TERM_COLUMNS`: the order of the per-token columns after the heads).

    With ``sae_features``, per SAE split per feature (:mod:`thermo_lens.measures.attribution.features`, key
    ``k`` its hook, ``l`` its block): ``("attr_sae_feature:k", l)`` ``[batch, d_sae]`` float32 means
    of ``<f_i W_dec[i], u>``, ``("attr_sae_rest:k", l)``, ``("attr_sae_ferror:k", l)`` and
    ``("attr_sae_fclosure:k", l)`` (the scoped mean of the per-token ``|part - features - rest -
    error|``) ``[batch]`` float64."""
    _check_scope(token_scope)

    def reduction(view: ModelView, rec: Recorder) -> None:
        why = _not_splittable(view)
        if why:
            raise ThermoLensInputError(why)
        names = view.resid_hook_names
        last = [-1]  # the last block whose hooks are registered (a sweep registers one block's)
        for plan in _plan(view, rec, sae_features):
            state: dict[str, Tensor] = {}
            z_key = next(hook for hook, key in plan.reads if key == "z")

            def keep(x: Tensor, batch: TokenBatch, _key: str, _state: dict = state, _name: str = names[plan.layer]) -> None:
                _state[_key] = x  # transient: dropped when this block's x_out fires
                if _key == "x_in" and x.dtype != torch.float64:
                    # ||x_in|| per token: the residual norms the gain takes at this hook point (shared)
                    _state["x_in_norm"] = token_norms(rec, _name, x)

            def keep_z(x: Tensor, batch: TokenBatch, _hook: str = z_key, _state: dict = state) -> None:
                # the heads' scoped float32 rows [n, head, d_head], taken now and shared with the head
                # write norms at the same hook point (a product of the batch; never changed in place)
                _state["z"] = scoped_rows(rec, _hook, x, token_scope)

            def finish(x_out: Tensor, batch: TokenBatch, _plan: _BlockPlan = plan, _state: dict = state) -> None:
                _check_read(view, _plan, _state)
                dev = x_out.device
                B, T, _ = x_out.shape
                # Only the scoped real tokens enter the means, so only they are reduced: padding,
                # position 0 (all_but_first) or all but the last token ("last") never reach the
                # u W_O^T matmul, the one d_model^2-per-token step here. index_select, not x[rows]:
                # the same rows, a fraction of advanced indexing's overhead. The rows are found once
                # per batch and shared by every layer and reduction (the Recorder drops them when the
                # batch ends).
                rows, prompt_of, n = rec.scope_rows(token_scope, dev)
                # Block l's x_out is block l + 1's x_in, read at the same hook point (after every other hook
                # there): its scoped rows and their norms are found once and shared (dropped with the
                # batch); so are the zeros of the absent components.
                shared: dict[Any, Any] = rec.per_batch(("attr_shared", str(dev)), lambda batch: {})

                take = _taker(_state, shared, names[_plan.layer], x_out.shape, rows)

                x_rows = as_float32(x_out.reshape(B * T, -1).index_select(0, rows))
                shared[names[_plan.layer + 1]] = x_rows
                zero, scratch = _batch_buffers(shared, x_rows, view)
                y_out = _state.pop("y_out", None)  # already the scoped rows (a copy, see keep_output)
                split = functools.partial(_split_features, rec, _plan.on(dev), take, prompt_of, n) if _plan.features else None
                # ||x_out||, ||x_in|| of the scoped rows: the per-token norms the gain takes at the same hook
                # points (shared products; the same float32 numbers as the rows' own norms), their scoped
                # rows taken for every block at once (_record); a float64 model's rows are normed themselves
                # (its per-token norms reduce in float64)
                row_norms = _norms_of(rec, shared, _state.pop("x_in_norm", None), names[_plan.layer + 1], x_out, x_rows)
                terms = _block_parts(view, _plan, take, x_rows, None if y_out is None else as_float32(y_out),
                                     row_norms, split, zero, scratch)
                _state.clear()
                # The per-prompt means of every block's terms (and their scale and closure columns) are
                # taken and recorded once per batch, by the last block of the pass (the total too: the
                # hook returns None).
                pending = shared.setdefault("terms", [])
                pending.append((_plan.layer, *terms))
                if _plan.layer == last[0]:
                    _record(rec, pending, prompt_of, n, zero, rows)
                    pending.clear()

            def keep_output(x: Tensor, batch: TokenBatch, _state: dict = state) -> None:
                # A copy of the scoped rows, now: a hook between the blocks may edit this very tensor in
                # place (e.g. a patch at the next block's hook_resid_pre) before x_out is read.
                B, T, _ = x.shape
                rows = rec.scope_rows(token_scope, x.device)[0]
                _state["y_out"] = x.reshape(B * T, -1).index_select(0, rows)

            if plan.splice is not None:
                rec.add(plan.splice, ("_attr_y_out", plan.layer), keep_output)

            for hook, key in plan.reads:
                fn = keep_z if key == "z" else functools.partial(keep, _key=key)
                rec.add(hook, ("_attr_" + key, plan.layer), fn)
            rec.add(names[plan.layer + 1], ("attr_total", plan.layer), finish)
        last[0] = max((key[1] for key in rec.registered() if key[0] == "attr_total"), default=-1)

    return reduction


def _taker(state: dict[str, Tensor], shared: dict[Any, Any], x_in_hook: str, shape: torch.Size,
           rows: Tensor) -> Take:
    """``take(what, raw=False, out=None)``: the scoped rows ``[n, ...]`` of the activation a block kept as
    ``what`` (dropped from ``state``), float32 unless ``raw`` (into ``out``, float32, when given); ``z`` as
    kept (already its scoped float32 rows); ``x_in`` the previous block's ``x_out`` rows where shared."""
    B, T = shape[0], shape[1]

    def take(what: str, raw: bool = False, out: Tensor | None = None) -> Tensor:
        x = state.pop(what)
        if what == "z":
            return x
        if what == "x_in" and x_in_hook in shared:
            return shared[x_in_hook]
        t = x.reshape(B * T, -1)
        if out is not None:
            if x.dtype == out.dtype:
                return torch.index_select(t, 0, rows, out=out)
            return out.copy_(t.index_select(0, rows))
        t = t.index_select(0, rows)
        return t if raw else as_float32(t)
    return take


def _batch_buffers(shared: dict[Any, Any], x_rows: Tensor, view: ModelView) -> tuple[Tensor, _Scratch]:
    """The batch's ``[n]`` zeros of the absent components and its :class:`_Scratch`, made by its first block."""
    n = x_rows.shape[0]
    got = shared.get(("buffers", n))
    if got is None:
        got = shared[("buffers", n)] = (x_rows.new_zeros(n), _Scratch(x_rows, view.n_heads, view.d_head))
    return got


def _norms_of(rec: Recorder, shared: dict[Any, Any], tok_in: Tensor | None, out_hook: str, x_out: Tensor,
              x_rows: Tensor) -> Callable[[Tensor], Tensor]:
    """``norms(x)`` for :func:`_block_parts`: ``||x_out||`` and ``||x_in||`` as the per-token norms the gain
    takes at the same hook points (shared products, ``[batch, pos, 1]``: the same float32 numbers as the
    scoped rows' own norms, whose rows :func:`_record` takes for every block at once), or, for a float64
    model (whose per-token norms reduce in float64) or without ``tok_in``, the rows' own norms."""
    if tok_in is None or x_out.dtype == torch.float64:
        return functools.partial(_shared_row_norms, shared)
    tok_out = token_norms(rec, out_hook, x_out)
    return lambda x: tok_out if x is x_rows else tok_in


def _shared_row_norms(shared: dict[Any, Any], x: Tensor) -> Tensor:
    """:func:`_row_norms` of ``x``, once per batch (``shared``: the batch's dict; the same tensor, not a
    later one at its address)."""
    got = shared.get(("norm", id(x)))
    if got is not None and got[0] is x:
        return got[1]
    out = _row_norms(x)
    shared[("norm", id(x))] = (x, out)
    return out


def _split_features(rec: Recorder, plan: _BlockPlan, take: Take, prompt_of: Tensor, n: Tensor, j: int, v: Tensor,
                    part: Tensor, error: Tensor | None, rest_of: Tensor) -> None:
    """Record the per-prompt means of SAE ``plan.features[j]``'s feature terms, rest and error share,
    and of the per-token gap by which they miss ``part`` (the closure, checked when the result is built)."""
    fs = plan.features[j]
    W, b_dec = plan.decoders[j]
    f = take(f"sae_f:{j}")
    if f.shape[-1] != W.shape[0] or v.shape[-1] != W.shape[1]:
        raise ThermoLensInputError(
            f"the SAE at {fs.key}: its latents have width {f.shape[-1]} and it writes width {v.shape[-1]}, but its "
            f"W_dec is {tuple(W.shape)}; sae_features splits SAEs whose decoder maps the latents to the activation "
            "they replace")
    sums, per_token = split_features(f, W, v, prompt_of, n.shape[0])
    rest = _vec_dot(b_dec - rest_of, v)
    gap = part - per_token - rest
    if error is not None:
        gap = gap - error
    B = n.shape[0]

    def mean(t: Tensor) -> Tensor:
        return torch.zeros(B, dtype=torch.float64, device=t.device).index_add_(0, prompt_of, t.double()).div_(n[:, 0])

    rec.put((f"attr_sae_feature:{fs.key}", plan.layer), sums.div_(n).float())
    rec.put_rows([(f"attr_sae_rest:{fs.key}", plan.layer), (f"attr_sae_ferror:{fs.key}", plan.layer),
                  (f"attr_sae_fclosure:{fs.key}", plan.layer)],
                 torch.stack([mean(rest), mean(error) if error is not None else rest.new_zeros(B, dtype=torch.float64),
                              mean(gap.abs())]))


def _check_read(view: ModelView, plan: _BlockPlan, state: dict[str, Tensor]) -> None:
    """Every activation block ``plan.layer``'s terms read was kept (its hook points ran)."""
    missing = {k for _, k in plan.reads} - set(state)
    if missing:
        silent = sorted({h for h, k in plan.reads if k in missing})
        lost = view.adapter.lost_hook_hint(view.model)
        hint = f"; {lost}" if lost else f"; this block ({view.layout.describe()}) is not laid out as TransformerLens hooks it"
        raise ThermoLensInputError(
            f"{view.name} block {plan.layer}: the host never ran the hook point(s) {', '.join(silent)} "
            f"before {view.resid_hook_names[plan.layer + 1]}, so the block cannot be attributed{hint}")


def _record(rec: Recorder, pending: list[tuple[Any, ...]], prompt_of: Tensor, n: Tensor,
            zero: Tensor | None = None, rows: Tensor | None = None) -> None:
    """Record the batch's per-prompt means of every block's terms (``pending``: ``(layer, head,
    columns, experts)`` of :func:`_block_terms`, in pass order) under their keys: one float64 sum
    over the scoped rows per term, every block at once (the same sums, element by element, as one
    block at a time), and one copy into the recorder per kind of term."""
    dev = prompt_of.device
    B = n.shape[0]
    layers = [p[0] for p in pending]

    def means(terms: Tensor) -> Tensor:  # [row, n, k] -> [row, batch, k]
        out = torch.zeros(terms.shape[0], B, terms.shape[2], dtype=torch.float64, device=dev)
        return out.index_add_(1, prompt_of, terms.to(dev, torch.float64)).div_(n)

    def on(t: Tensor) -> Tensor:  # (a model split over devices: blocks' terms on several; a no-op op otherwise)
        return t if t.device == dev else t.to(dev)

    heads = torch.stack([on(p[1]) for p in pending])  # [block, n, head]
    rec.put_rows([("attr_head", l) for l in layers], means(heads))
    # The parts as [block, part, n]; the scale and closure columns of every block at once; the columns
    # as rows, [block * column, n, 1]: their means come out as [block * column, batch], one contiguous
    # row per key.
    n_cols = len(_PARTS) - 2  # the components and the total; the two norms after them
    if all(p[2][0] is p[2][6] for p in pending):
        # every block's MLP and total terms as one [2, n] tensor (a pre-LN block's pair, _Scratch): the
        # columns as rows of one cat, the absent components the batch's zeros as a row (no op each)
        zero_row = zero[None] if zero is not None else None
        pieces: list[Tensor] = []
        for p in pending:
            pieces.append(on(p[2][0]))
            pieces += [zero_row if zero_row is not None and c is zero else on(c)[None] for c in p[2][1:6]]
        mlp, total, *rest = torch.cat(pieces).view(len(pending), n_cols, -1).unbind(1)
        cols = [mlp, *rest, total]
    else:
        def own(c: Tensor, k: int) -> Tensor:  # (a [2, n] pair's row k: the MLP's 0, the total's 1)
            return on(c)[0 if k == 0 else 1] if c.ndim == 2 else on(c)
        cols = list(torch.stack([own(c, k) for p in pending for k, c in enumerate(p[2][:n_cols])]).view(
            len(pending), n_cols, -1).unbind(1))
    if rows is not None and all(p[2][-1].ndim == 3 for p in pending):
        # ||x_out||, ||x_in|| as per-token norms [batch, pos, 1] (a block's x_in norms are the previous block's
        # x_out norms, the same tensor): their scoped rows, every distinct one at once
        distinct: dict[int, int] = {}
        for p in pending:
            for t in (p[2][-1], p[2][-2]):  # x_in, then x_out: a chain of blocks reads 0, 1, ..., L
                distinct.setdefault(id(t), len(distinct))
        tensors = {id(t): t for p in pending for t in p[2][-2:]}
        norm_rows = torch.stack([on(tensors[i]) for i in distinct]).view(len(distinct), -1).index_select(1, rows)
        outs, ins = [distinct[id(p[2][-2])] for p in pending], [distinct[id(p[2][-1])] for p in pending]
        chain = outs == list(range(1, len(pending) + 1)) and ins == list(range(len(pending)))
        norm_out = norm_rows[1:] if chain else norm_rows[torch.tensor(outs, device=dev)]
        norm_in = norm_rows[:-1] if chain else norm_rows[torch.tensor(ins, device=dev)]
    else:
        norm_out, norm_in = torch.stack([on(c) for p in pending for c in p[2][-2:]]).view(len(pending), 2, -1).unbind(1)
    parts = [*cols, norm_out, norm_in]
    # components that are the batch's shared zeros in every block: subtracting them changes nothing
    absent = frozenset(k for k in range(len(_PARTS)) if zero is not None and all(p[2][k] is zero for p in pending))
    columns = torch.stack(_close(heads, parts, absent), dim=1).view(len(pending) * len(TERM_COLUMNS), -1, 1)
    rec.put_rows([(f"attr_{column}", l) for l in layers for column in TERM_COLUMNS], means(columns)[:, :, 0])
    if pending[0][3] is not None:
        rec.put_rows([("attr_expert", l) for l in layers], means(torch.stack([on(p[3]) for p in pending])))


def _expert_terms(take: Take, experts: torch.nn.Module | None, E: int, v_m: Tensor) -> Tensor:
    """``[n, expert]``: ``<w_e(t) E_e(x_t), v_m>`` per scoped token, each chosen expert's output
    recomputed from the experts' input with the model's own experts module (one call per routing
    slot: the cost of the MoE's own forward)."""
    assert experts is not None, "a mixture of experts without its experts module"
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


def _not_splittable(view: ModelView) -> str | None:
    """Why a block of this model has no exact split, or None (names the architecture and the
    component that prevents it)."""
    return view.layout.unsupported
