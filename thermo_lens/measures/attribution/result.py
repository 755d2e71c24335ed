"""The gain attribution's result, its metrics and measurement, and the public entry point."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core import measure
from thermo_lens.measures.attribution.features import FEATURE_DEFINITIONS
from thermo_lens.measures.attribution.terms import (_CLOSURE_RTOL, _CLOSURE_RTOL_HALF, TERM_COLUMNS, _check_scope, _not_splittable,
                                           attribution_terms, sae_sites)
from thermo_lens.core.errors import ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.model import as_view
from thermo_lens.stats.paired import PairedMixin
from thermo_lens.core.passes import Collected
from thermo_lens.core.passes.cached import documents_cache
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.registry import (BuildContext, Measurement, Metric, Options, Probe, Readout, option,
                                  register_measurement, register_metric)
from thermo_lens.core.result import Result, label
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import TermScope, TokenScope
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from transformer_lens import ActivationCache

    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.model import ModelView

__all__ = ["GainAttribution", "gain_attribution", "attribution_from_collected"]


# ---------------------------------------------------------------------------- the result
@dataclass(frozen=True, repr=False, eq=False)
class GainAttribution(PairedMixin, ProvenanceFields, Result):
    """Per-head (and MLP, bias, norm, SAE, expert) shares of each block's squared-norm change.

    All terms are means over the scoped real tokens (:data:`ATTRIBUTION_SCOPES`) of per-token
    terms ``<c, u_c>`` of block ``layer`` (0-based, ``blocks.{layer}``; see the module docstring and
    :data:`ATTRIBUTION_DEFINITIONS`), float64 accumulations of float32 per-token terms;
    ``head.sum(-1) + mlp + bias + norm + sae + splice == total`` up to float32 rounding (``closure``).
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
        splice: ``Float[Tensor, "prompt layer"]`` ``<x_{layer+1} - y, x_out + x_in>``: the change hooks
            made to the stream between the block's output ``y`` (``hook_resid_post`` as the block
            wrote it) and the next block's input (e.g. a patch at ``blocks.{layer+1}.hook_resid_pre``),
            which belongs to this block as it does to its gain; 0 without such hooks.
        expert: ``Float[Tensor, "prompt layer expert"]`` mixture of experts: expert ``e``'s share
            ``<w_e E_e(x), u_mlp>`` (router weight times expert output; ``expert.sum(-1) == mlp``);
            a dense MLP is one expert chosen with weight 1 (``[prompt, layer, 1]``, equal to ``mlp``).
        sae_features: ``{SAE hook: Float[Tensor, "prompt feature"]}`` (``gain_attribution(...,
            sae_features=True)``; None otherwise): feature ``i``'s term ``<f_i(x) W_dec[i], u_sae>``
            (float32 means over the scope; ``u_sae`` the adjoint where the SAE writes, ``x_out + x_in``
            at a pre-LN block's ends). Every feature, or with ``sae_features_top_k=k`` the ``k`` with
            the largest mean over prompts of ``|term|``, in that order, their indices in
            ``sae_feature_index``. A transcoder (keyed by its input hook) splits the MLP term.
        sae_feature_rest: ``{SAE hook: Float[Tensor, "prompt"]}`` ``<b_dec - x, u_sae>`` (a
            transcoder: ``<b_dec - b_out, u_mlp>``); ``sae_features.sum(-1) + sae_feature_rest +
            sae_feature_error`` is the SAE's ``sae`` term (a transcoder's: ``mlp``), all features kept.
        sae_feature_error: ``{SAE hook: Float[Tensor, "prompt"]}`` its error term's share
            (``use_error_term``; 0 without), part of ``sae_error`` for an SAE in the stream.
        sae_feature_index: ``{SAE hook: Long[Tensor, "k"]}`` the features kept, or None (all kept).
        sae_feature_layer: ``{SAE hook: block}`` the block whose term the SAE's features split.
        sae_feature_closure: ``{SAE hook: Float[Tensor, "prompt"]}`` the scoped mean of the per-token
            ``|term - features - rest - error|`` (checked against ``scale`` as ``closure`` is).
        sae_features_top_k: the ``k`` of ``sae_features_top_k`` (None: every feature kept).
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
    splice: Tensor | None = None
    sae_features: dict[str, Tensor] | None = None
    sae_feature_rest: dict[str, Tensor] | None = None
    sae_feature_error: dict[str, Tensor] | None = None
    sae_feature_index: dict[str, Tensor] | None = None
    sae_feature_layer: dict[str, int] | None = None
    sae_feature_closure: dict[str, Tensor] | None = None
    sae_features_top_k: int | None = None

    #: 2: the norm, sae, sae_error and expert terms (results stored under 1 read them as 0 / None).
    #: 3: the per-feature split of SAE terms (None: not computed; results stored under 2 read None).
    schema_version = 3

    @classmethod
    def from_collected(cls, collected: Collected, token_scope: str = "all_but_first", *, sae_features: bool = False,
                       sae_features_top_k: int | None = None) -> "GainAttribution":
        """The result of a :func:`thermo_lens.core.passes.collect` pass that ran :func:`attribution_terms`
        (pure: no forward pass; checks every block's closure)."""
        return _attribution_from_collected(collected, token_scope, sae_features=sae_features,
                                           sae_features_top_k=sae_features_top_k)

    def __post_init__(self) -> None:
        for name in ("norm", "sae", "sae_error", "splice"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, torch.zeros_like(self.total))
        if self.expert is None:  # schema 1, or a dense MLP: one expert, router weight 1
            object.__setattr__(self, "expert", self.mlp[..., None].clone())

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
        sheaf frames on ``layer`` and ``head``): the generic frame of the metric registered for it
        (:meth:`Result.tidy_frame`)."""
        return self.tidy_frame()

    def _definition_columns(self, df: pd.DataFrame) -> pd.DataFrame:
        df["token_scope"] = self.token_scope
        df["block_layout"] = self.block_layout
        for k, v in self.provenance.columns().items():
            df[k] = v
        return df

    def layer_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer): ``heads`` (sum over heads), ``mlp``, ``bias``, ``norm``,
        ``sae``, ``sae_error``, ``splice``, ``total``, ``closure`` and the definition columns."""
        P, L = self.total.shape
        assert self.norm is not None and self.sae is not None and self.sae_error is not None
        assert self.splice is not None
        df = pd.DataFrame({"prompt": np.repeat(np.arange(P), L), "layer": np.tile(np.arange(L), P),
                           "heads": self.head.sum(-1).numpy().ravel(), "mlp": self.mlp.numpy().ravel(),
                           "bias": self.bias.numpy().ravel(), "norm": self.norm.numpy().ravel(),
                           "sae": self.sae.numpy().ravel(), "sae_error": self.sae_error.numpy().ravel(),
                           "splice": self.splice.numpy().ravel(),
                           "total": self.total.numpy().ravel(), "closure": self.closure.numpy().ravel()})
        return self._definition_columns(df)

    def expert_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer, expert): ``expert_term`` and the definition columns (a dense
        MLP is expert 0, router weight 1): the generic frame of its registered metric."""
        return self.tidy_frame("expert_frame")

    # ------------------------------------------------------------------ SAE features
    def _require_features(self) -> dict[str, Tensor]:
        if not self.sae_features:
            raise ThermoLensInputError(
                "this attribution has no per-feature SAE terms: run gain_attribution(model, prompts, sae_features=True) "
                "on a model with SAEs attached")
        return self.sae_features

    def feature_ids(self, hook: str) -> Tensor:
        """``[k]`` the SAE feature index of each column of ``sae_features[hook]`` (all, in order, unless
        ``sae_features_top_k`` kept a subset)."""
        terms = self._require_features()
        if hook not in terms:
            raise ThermoLensInputError(f"no SAE features at {hook!r}; this attribution has {', '.join(map(repr, terms))}")
        if self.sae_feature_index is not None and hook in self.sae_feature_index:
            return self.sae_feature_index[hook]
        return torch.arange(terms[hook].shape[1])

    def feature_frame(self) -> pd.DataFrame:
        """One row per (prompt, SAE hook, feature): ``prompt, hook, layer, feature, sae_feature_term`` and
        the definition columns (``feature`` is the SAE's feature index: frames merge on ``(hook,
        feature)``, e.g. with :meth:`feature_summary`, and with a feature sweep's frame on ``(sae_hook,
        feature)``)."""
        frames = []
        for hook, t in self._require_features().items():
            P, K = t.shape
            ids = self.feature_ids(hook).numpy()
            frames.append(pd.DataFrame({"prompt": np.repeat(np.arange(P), K), "hook": hook, "sae_hook": hook,
                                        "layer": self._feature_layer(hook), "feature": np.tile(ids, P),
                                        "sae_feature_term": t.double().numpy().ravel()}))
        df = self._definition_columns(pd.concat(frames, ignore_index=True))
        df["sae_features_kept"] = "all" if self.sae_features_top_k is None else f"top {self.sae_features_top_k} by mean |term|"
        return df

    def feature_rest_frame(self) -> pd.DataFrame:
        """One row per (prompt, SAE hook): ``sae_feature_rest``, ``sae_feature_error``, the features' sum
        (``features``; of the kept ones with ``sae_features_top_k``), the SAE's block and the definition columns."""
        assert self.sae_feature_rest is not None and self.sae_feature_error is not None
        rows = [pd.DataFrame({"prompt": np.arange(self.n_prompts), "hook": hook, "layer": self._feature_layer(hook),
                              "features": t.double().sum(-1).numpy(),
                              "sae_feature_rest": self.sae_feature_rest[hook].numpy(),
                              "sae_feature_error": self.sae_feature_error[hook].numpy()})
                for hook, t in self._require_features().items()]
        return self._definition_columns(pd.concat(rows, ignore_index=True))

    def _feature_layer(self, hook: str) -> int:
        return int((self.sae_feature_layer or {})[hook])

    def feature_summary(self, level: float = 0.95) -> pd.DataFrame:
        """One row per (SAE hook, feature): ``mean`` of its term over prompts, ``sd`` (ddof=1), ``se``,
        the Student-t ``ci_low`` / ``ci_high`` at ``level``, ``mean_abs`` and ``n`` (prompts), with
        ``hook``, ``layer``, ``feature``: which features amplify (``mean > 0``) or damp the block's
        stream, on these prompts."""
        from thermo_lens.stats import t_interval

        frames = []
        for hook, t in self._require_features().items():
            x = t.double().numpy()
            n = x.shape[0]
            mean = x.mean(0)
            sd = x.std(0, ddof=1) if n > 1 else np.full_like(mean, np.nan)
            lo, hi = t_interval(mean, sd, np.full_like(mean, n), level)
            frames.append(pd.DataFrame({"hook": hook, "sae_hook": hook, "layer": self._feature_layer(hook),
                                        "feature": self.feature_ids(hook).numpy(), "mean": mean, "sd": sd,
                                        "se": sd / np.sqrt(n), "ci_low": lo, "ci_high": hi,
                                        "mean_abs": np.abs(x).mean(0), "n": n}))
        df = pd.concat(frames, ignore_index=True)
        df["level"] = level
        df["token_scope"] = self.token_scope
        return df

    def top_features(self, k: int = 10, *, hook: str | None = None, by: str = "abs", level: float = 0.95) -> pd.DataFrame:
        """The ``k`` features (of ``hook``, or of every SAE) with the largest mean term (``by="mean"``: most
        amplifying), the smallest (``by="damp"``: most damping) or the largest ``|mean|`` (``"abs"``),
        as rows of :meth:`feature_summary`."""
        if by not in ("mean", "damp", "abs"):
            raise ThermoLensInputError(f"by must be 'mean', 'damp' or 'abs', got {by!r}")
        df = self.feature_summary(level)
        if hook is not None:
            self.feature_ids(hook)  # names the hooks there are
            df = df[df["hook"] == hook]
        key = {"mean": -df["mean"], "damp": df["mean"], "abs": -df["mean"].abs()}[by]
        return df.assign(_key=key).sort_values("_key", kind="stable").drop(columns="_key").head(k).reset_index(drop=True)

    def plot_features(self, k: int = 8, level: float = 0.95) -> go.Figure:
        """Per SAE, the ``k`` features that amplify and damp their block most, with ``level`` t-CIs
        (a plotly figure: :func:`thermo_lens.views.feature_chart`)."""
        import importlib

        from thermo_lens.core import result as _result

        if "GainAttribution.features" not in _result._PLOTS:
            importlib.import_module(_result._FIGURES_MODULE)  # views register their figures on import
        return _result._PLOTS["GainAttribution.features"](self, k=k, level=level)

    def __repr__(self) -> str:
        m = self.model
        lt = self.total.mean(0).tolist()
        shown = ", ".join(f"{v:.4g}" for v in lt[:12]) + (", ..." if len(lt) > 12 else "")
        top = self.top_heads(3)
        tops = ", ".join(f"{label(layer=r.layer, head=r.head)} {r.head_term:+.4g}" for r in top.itertuples())
        parts = ["sum_h head", "mlp", "bias"]
        assert self.norm is not None and self.sae is not None
        if bool((self.norm != 0).any()):
            parts.append("norm")
        if bool((self.sae != 0).any()) or m.get("saes"):
            parts.append("sae")
        if self.splice is not None and bool((self.splice != 0).any()):
            parts.append("splice")
        saes = m.get("saes") or []
        # A half-precision model rounds each residual addition to ~3 digits: the identity holds to that.
        exact = "exact" if self.dtype in ("float32", "float64") else f"exact up to the model's {self.dtype} rounding"
        lines = [f"GainAttribution({m.get('name')}: {self.n_prompts} prompts x {self.n_layers} layers x "
                 f"{self.n_heads} heads; {self.block_layout}; token_scope={self.token_scope!r}, "
                 f"BOS={self.prepend_bos!r}, weights {self.provenance.weights_text}, {self.dtype})",
                 f"  per block: ||x_out||^2 - ||x_in||^2 = {' + '.join(parts)} ({exact}; max closure "
                 f"{float((self.closure / self.scale).max()):.1e} of the scale)"]
        if self.n_experts > 1:
            lines.append(f"  mlp = sum over {self.n_experts} experts of expert (router weight x expert output)")
        lines += [f"  mean total by layer 0..{self.n_layers - 1}: [{shown}]",
                  f"  most expanding heads: {tops}"]
        if saes:
            lines.append("  SAEs: " + "; ".join(
                f"{r['hook']} (d_sae={r['d_sae']}{', error term' if r['use_error_term'] else ''})" for r in saes))
        for hook, t in (self.sae_features or {}).items():
            mean = t.double().mean(0)
            ids = self.feature_ids(hook)
            hi, lo = int(mean.argmax()), int(mean.argmin())
            kept = "all features" if self.sae_features_top_k is None else f"top {t.shape[1]} by mean |term|"
            clo = float((self.sae_feature_closure or {})[hook].div(self.scale[:, self._feature_layer(hook)]).max())
            lines.append(f"  features of {hook} (block {self._feature_layer(hook)}, {kept}): sum_i <f_i W_dec[i], u> + "
                         f"<b_dec - x, u> + error = its term (max closure {clo:.1e}); most amplifying #{int(ids[hi])} "
                         f"{float(mean[hi]):+.4g}, most damping #{int(ids[lo])} {float(mean[lo]):+.4g}")
        lines.append(f"  hooks: {self.provenance.hooks_text}")
        return "\n".join(lines)


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
    ("splice_term", "<x_{l+1} - y, x_out + x_in>", "the share of the change hooks made to the stream between the "
     "block's output y (hook_resid_post as written) and the next block's input (e.g. a patch at the next "
     "hook_resid_pre); 0 without such hooks", "prompt layer", "splice", "layer_frame"),
    ("norm_sq_change", "||x_out||^2 - ||x_in||^2", "the block's squared-norm change, x_in = x_layer, x_out = "
     "x_{layer+1} (the gain's residual states); = sum_h head_term + mlp_term + bias_term + norm_term + sae_term "
     "+ splice_term", "prompt layer", "total", "layer_frame"),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape=_shape, result="GainAttribution",
                           section="gain", unit="squared residual norm", attr=_attr, frame=_frame,
                           column=None if _name == "head_term" else _attr,
                           panel=_name == "head_term"))
register_metric(Metric("sae_feature_term", symbol="<f_i(x) W_dec[i], u_sae>", formula=FEATURE_DEFINITIONS["sae_features"],
                       shape="prompt feature", result="GainAttribution", section="gain", unit="squared residual norm",
                       attr="sae_features", frame="feature_frame"))
register_metric(Metric("sae_feature_rest", symbol="<b_dec - x, u_sae>", formula=FEATURE_DEFINITIONS["sae_feature_rest"],
                       shape="prompt", result="GainAttribution", section="gain", unit="squared residual norm",
                       attr="sae_feature_rest", frame="feature_rest_frame"))
register_metric(Metric("sae_feature_error", symbol="<error, u_sae>", formula=FEATURE_DEFINITIONS["sae_feature_error"],
                       shape="prompt", result="GainAttribution", section="gain", unit="squared residual norm",
                       attr="sae_feature_error", frame="feature_rest_frame"))
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
                      f"blocks.{layer}.hook_attn_out, hook_resid_mid or hook_resid_post, which the block's output is "
                      "read after; hooks: "
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


# where each term of block l is read (named when a term is NaN/inf)
_TERM_SOURCES = {"head": "blocks.{l}.attn.hook_z and W_O", "mlp": "blocks.{l}.<MLP output hook>",
                 "bias": "b_O / b_out (and the norms' biases)", "norm": "the block's norm scales",
                 "sae": "the SAE at block {l}", "sae_error": "the SAE error at block {l}",
                 "splice": "the residual between blocks {l} and {l1}", "total": "blocks.{l}'s input and output",
                 "scale": "blocks.{l}'s input and output", "closure": "the sum of the terms",
                 "expert": "the experts' outputs and routing weights at block {l}"}


def _check_finite(view: ModelView, head: Tensor, get: dict[str, Tensor], expert: Tensor | None) -> None:
    """Refuses NaN/inf terms (``[prompt, layer, ...]``), naming the block, prompt and where the term is
    read: a NaN is never a number of the result, nor a closure that passes (``NaN > rtol`` is False)."""
    terms = {"head": head, **get, **({"expert": expert} if expert is not None else {})}
    # A NaN flows downstream, so the shallowest block with a non-finite term is where it arose.
    first: tuple[int, int, str, Tensor] | None = None
    for name, t in terms.items():
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            idx = bad.nonzero()
            k = int(idx[:, 1].argmin())
            p, l = int(idx[k, 0]), int(idx[k, 1])
            if first is None or l < first[0]:
                first = (l, p, name, bad)
    if first is None:
        return
    l, p, name, bad = first
    where = _TERM_SOURCES.get(name, name).format(l=l, l1=l + 1)
    hint = (f" in {str(view.dtype).replace('torch.', '')} this is often overflow: try float32"
            if view.dtype in (torch.float16, torch.bfloat16) else
            " check the cache or hooks that supplied it, and the weights (a NaN/inf parameter)")
    raise ThermoLensNumericsError(
        f"{view.name}: the attribution's {name} term of block {l} is NaN/inf for prompt {p} "
        f"({int(bad.sum())} value(s) of that term in all): it is read from {where};{hint}")


def _attribution_from_collected(collected: Collected, token_scope: str = "all_but_first", *,
                               sae_features: bool = False, sae_features_top_k: int | None = None) -> GainAttribution:
    """The :class:`GainAttribution` of a :func:`~thermo_lens.core.passes.collect` pass that ran
    :func:`attribution_terms` (pure; checks that every block closes, and with ``sae_features`` that
    every SAE's features close to its term)."""
    _check_scope(token_scope)
    sae_features_top_k = _check_top_k(sae_features_top_k)
    if "attr_head" not in collected.recorder.names:
        raise ThermoLensInputError("this collection has no attribution terms: run collect(..., [attribution_terms(scope)])")
    head = collected.stack("attr_head").permute(1, 0, 2).contiguous()  # [P, L, H]
    get = {k: collected.stack(f"attr_{k}").T.contiguous() for k in TERM_COLUMNS}
    expert = (collected.stack("attr_expert").permute(1, 0, 2).contiguous()
              if "attr_expert" in collected.recorder.names else None)
    view = collected.view
    _check_finite(view, head, get, expert)
    rel = get["closure"] / get["scale"].clamp_min(torch.finfo(torch.float32).tiny)
    # The model adds its components in its own dtype: half-precision residual streams round each
    # addition to about 3 significant digits, so the identity closes only to that precision.
    rtol = _CLOSURE_RTOL if view.dtype in (torch.float32, torch.float64) else _CLOSURE_RTOL_HALF
    # ~(rel <= rtol), not rel > rtol: a NaN closure is not a closed block
    if bool((~(rel <= rtol)).any()):
        p, l = (int(i) for i in (~(rel <= rtol)).nonzero()[0])
        raise ThermoLensInputError(
            f"{view.name}: block {l}'s output is not its input plus its heads, MLP, biases"
            f"{', norms' if view.layout.norm_sites else ''} and SAEs (prompt {p}: unexplained "
            f"{float(rel[p, l]):.2e} of ||x_out||^2 + ||x_in||^2): {_unexplained_cause(collected, l)}; "
            "gain_attribution cannot split it. Hooks at hook_resid_pre (the splice term), attn.hook_z and "
            "hook_mlp_out are attributed as they ran.")
    if expert is not None:
        gap = (expert.sum(-1) - get["mlp"]).abs() / get["scale"].clamp_min(torch.finfo(torch.float32).tiny)
        if bool((~(gap <= rtol)).any()):
            p, l = (int(i) for i in (~(gap <= rtol)).nonzero()[0])
            raise ThermoLensInputError(
                f"{view.name}: block {l}'s experts do not add up to its MLP output (prompt {p}: "
                f"{float(gap[p, l]):.2e} of the scale): the mixture of experts adds something besides router "
                "weight x expert output (a shared expert, or a hook on the router)")
    feats = _feature_fields(collected, get["scale"], rtol, sae_features_top_k) if sae_features else {}
    return GainAttribution(head=head, mlp=get["mlp"], bias=get["bias"], total=get["total"], closure=get["closure"],
                           scale=get["scale"], token_scope=token_scope, provenance=collected.provenance(),
                           norm=get["norm"], sae=get["sae"], sae_error=get["sae_error"], expert=expert,
                           splice=get["splice"], **feats)


def attribution_from_collected(collected: Collected, token_scope: str = "all_but_first", *, sae_features: bool = False,
                               sae_features_top_k: int | None = None) -> GainAttribution:
    """The same as :meth:`GainAttribution.from_collected` (deprecated name, kept for one release; silent:
    callers that treat every warning as an error keep working)."""
    return GainAttribution.from_collected(collected, token_scope, sae_features=sae_features,
                                          sae_features_top_k=sae_features_top_k)


def _check_top_k(k: object) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
        raise ThermoLensInputError(f"sae_features_top_k must be a positive int (or None: keep every feature), got {k!r}")
    return int(k)


def _feature_fields(collected: Collected, scale: Tensor, rtol: float, top_k: int | None) -> dict[str, Any]:
    """The ``sae_feature*`` fields of a pass that split SAE terms per feature (each SAE's closure checked;
    with ``top_k`` only the ``k`` features with the largest mean ``|term|`` over prompts kept)."""
    names = collected.recorder.names
    keys = sorted({n.split(":", 1)[1] for n in names if n.startswith("attr_sae_feature:")})
    view = collected.view
    if not keys:
        raise ThermoLensInputError(
            f"sae_features=True, but no SAE is attached to {view.name} whose term can be split (attach one with "
            "model.add_sae(sae) on a HookedSAETransformer / SAETransformerBridge), or run without sae_features")
    out: dict[str, dict[str, Any]] = {k: {} for k in ("sae_features", "sae_feature_rest", "sae_feature_error",
                                                      "sae_feature_index", "sae_feature_layer", "sae_feature_closure")}
    for key in keys:
        layer = int(next(k[1] for k in collected.recorder._parts if k[0] == f"attr_sae_feature:{key}"))
        terms = collected.stack(f"attr_sae_feature:{key}")[0]  # [P, d_sae] float32
        rest, err, clo = (collected.stack(f"attr_sae_{w}:{key}")[0] for w in ("rest", "ferror", "fclosure"))
        rel = clo / scale[:, layer].clamp_min(torch.finfo(torch.float32).tiny)
        if bool((~(rel <= rtol)).any()):
            p = int((~(rel <= rtol)).nonzero()[0, 0])
            raise ThermoLensInputError(
                f"{view.name}: the features of the SAE at {key} do not add up to its term in block {layer} (prompt "
                f"{p}: unexplained {float(rel[p]):.2e} of ||x_out||^2 + ||x_in||^2): its output is not f(x) W_dec + "
                "b_dec (+ its error term); e.g. a hook edited hook_sae_recons or hook_sae_output, exclude_special_tokens "
                "bypassed it on some tokens, or its decoder is not linear. Remove such hooks, or run without "
                "sae_features")
        if top_k is not None:
            idx = torch.argsort(terms.double().abs().mean(0), descending=True, stable=True)[:top_k]
            out["sae_feature_index"][key] = idx
            terms = terms[:, idx].contiguous()
        out["sae_features"][key] = terms
        out["sae_feature_rest"][key], out["sae_feature_error"][key] = rest, err
        out["sae_feature_closure"][key], out["sae_feature_layer"][key] = clo, layer
    return {**out, "sae_feature_index": out["sae_feature_index"] if top_k is not None else None,
            "sae_features_top_k": top_k}


def _check_flag(v: object) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise ThermoLensInputError(f"sae_features must be True or False, got {v!r}")
    return bool(v)


@dataclass(frozen=True)
class AttributionOptions(Options):
    """The options of the gain attribution (checked when made)."""

    token_scope: TermScope = option("all_but_first", "the tokens the per-token terms are averaged over", _check_scope)
    sae_features: bool = option(False, "also split each attached SAE's term per feature", _check_flag)
    sae_features_top_k: int | None = option(None, "with sae_features: keep only the k features with the largest mean "
                                            "|term| over prompts (None: all)", _check_top_k)


@dataclass(frozen=True)
class AttributionReadout(Readout):
    """One block's terms per prompt (its squared-norm change, or its heads' share), with the
    block's closure checked as :func:`gain_attribution` checks it."""

    def parse(self, text: str, n_layers: int, n_heads: int | None = None) -> Probe:
        where, dot, head = text.partition(":")[2].strip().partition(".")
        if dot and self.name == "attribution_total":
            raise ThermoLensInputError(f"measure {text!r}: the total term is a block's, not a head's; use "
                                       f"'attribution_total:{where}' or 'attribution_head:{where}.{head}'")
        return super().parse(text, n_layers, n_heads)

    def values(self, collected: Collected, probe: Probe, m: Measurement, row_name: Callable[[int], str]) -> Tensor:
        closure, scale = collected.stack("attr_closure")[0], collected.stack("attr_scale")[0]
        rel = closure / scale.clamp_min(torch.finfo(torch.float32).tiny)
        rtol = _CLOSURE_RTOL if collected.view.dtype in (torch.float32, torch.float64) else _CLOSURE_RTOL_HALF
        if bool((~(rel <= rtol)).any()):  # (NaN-aware: a NaN closure is not a closed block)
            r = int((~(rel <= rtol)).nonzero()[0])
            raise ThermoLensInputError(
                f"measure {probe.label}: block {probe.layer}'s output is not its input plus its heads, MLP and biases "
                f"under {row_name(r)} (unexplained {float(rel[r]):.2e} of ||x_out||^2 + ||x_in||^2): a condition edits "
                f"an activation between the block's components and its output (e.g. blocks.{probe.layer}."
                "hook_resid_post or hook_attn_out), which the attribution cannot split; sweep attn.hook_z, hook_pattern "
                "or hook_resid_pre, or choose a measure of another block")
        if self.name == "attribution_total":
            return collected.stack("attr_total")[0].double()
        head = collected.stack("attr_head")[0].double()  # [row, head]
        return head[:, probe.index[0]] if probe.index else head.sum(-1)


@register_measurement
class Attribution(Measurement[AttributionOptions]):
    """The exact attribution of each block's squared-norm change (:class:`GainAttribution`)."""

    name = "attribution"
    title = "Gain attribution"
    summary = ("each head's (and the MLP's, biases', norms', SAEs' and experts') exact share of each block's "
               "squared-norm change ||x_out||^2 - ||x_in||^2")
    result = GainAttribution
    section = "gain"
    Options = AttributionOptions
    optional = True
    readouts = (
        AttributionReadout("attribution_total:<layer>", "gain_attribution's total[:, layer]: the mean over the "
                           "token_scope's tokens of ||x_out||^2 - ||x_in||^2 of block <layer> (its squared-norm "
                           "change)", reads_next_state=True, starts_at_block=True),
        AttributionReadout("attribution_head:<layer>", "gain_attribution's head[:, layer].sum(-1): the attention's "
                           "share of block <layer>'s squared-norm change, sum over heads of <z_h W_O^h, u_attn>, mean "
                           "over the token_scope's tokens (a Shapley-style share, not an ablation effect)",
                           reads_next_state=True, starts_at_block=True),
        AttributionReadout("attribution_head:<layer>.<head>", "gain_attribution's head[:, layer, head]: head <head>'s "
                           "share <z_h W_O^h, u_attn> of block <layer>'s squared-norm change, mean over the "
                           "token_scope's tokens", reads_next_state=True, starts_at_block=True),
    )

    @classmethod
    def applies(cls, view: ModelView) -> str | None:
        return _not_splittable(view)

    def reductions(self) -> list[Any]:
        o = self.options
        return [attribution_terms(o.token_scope, o.sae_features)]

    def build(self, ctx: BuildContext) -> GainAttribution:
        o = self.options
        return GainAttribution.from_collected(ctx.collected, o.token_scope, sae_features=o.sae_features,
                                          sae_features_top_k=o.sae_features_top_k)


@documents_cache
@validates_own_inputs
def gain_attribution(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    *,
    token_scope: TokenScope = "all_but_first",
    sae_features: bool = False,
    sae_features_top_k: int | None = None,
    settings: RunSettings | None = None,
    cache: ActivationCache | Mapping[str, Tensor] | None = None,
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
        prompts: anything :func:`thermo_lens.core.inputs.as_prompts` takes.
        token_scope: ``"all_but_first"`` (default), ``"all"`` or ``"last"``.
        sae_features: also split each attached SAE's term per feature (``sae_features``,
            ``sae_feature_rest``, ``sae_feature_error``: SAELens standard, top-k, JumpReLU and gated
            SAEs in the stream, at ``attn.hook_z`` or ``hook_mlp_out``, and transcoders replacing
            an MLP), checked to close in the pass; ``4 d_sae`` bytes per prompt and SAE (default ``False``).
        sae_features_top_k: with ``sae_features``, keep only the ``k`` features with the largest
            mean ``|term|`` over prompts (their indices in ``sae_feature_index``; default ``None``: all).
        settings, **run: run options (:class:`thermo_lens.RunSettings`): ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks`` (e.g. a patch or ablation; attributed as it
            ran), ``progress``.
        cache: <CACHE_DOC>

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
    options: dict[str, Any] = {"token_scope": token_scope}
    if sae_features:
        options.update(sae_features=True, sae_features_top_k=sae_features_top_k)
    elif sae_features_top_k is not None:
        raise ThermoLensInputError("sae_features_top_k needs sae_features=True")
    return measure.run(view, prompts, {"attribution": options}, settings=settings, cache=cache, **run).attribution
