"""Views of the per-feature split of SAE terms (``gain_attribution(..., sae_features=True)``).

:func:`feature_chart` (``GainAttribution.plot_features()``): per SAE (one panel each, titled with
its block), the features whose term ``<f_i W_dec[i], u_sae>`` amplifies the block's stream most
(largest mean over prompts) and damps it most (smallest), with Student-t CIs across prompts.

:func:`feature_panel`: one feature: its term across prompts, its latent per token on given prompts
(circuitsvis token colouring), its decoder norm, and the cosine of its decoder row with each head
of the block: for an SAE in the stream, ``||P_h w|| / ||w||`` with ``P_h`` the projection onto head
``h``'s output space (the row space of ``W_O^h``); for an SAE at ``attn.hook_z``, the cosine of head
``h``'s part of the write (``W_dec[i, h] W_O^h``) with the whole write ``sum_h W_dec[i, h] W_O^h``.
"""

from __future__ import annotations

import html as _html
from dataclasses import dataclass
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from thermo_lens.core import attached
from thermo_lens.core.model import as_view
from thermo_lens.core.result import register_plot
from thermo_lens.views._common import ThermoLensViewError, base_layout, hover, wrap
from thermo_lens.views.panels import circuitsvis_html

if TYPE_CHECKING:
    from thermo_lens.measures.attribution.result import GainAttribution
    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.model import ModelView


@runtime_checkable
class _SAEDecoder(Protocol):
    """What the panel reads of an SAE: its decoder ``W_dec``, ``[d_sae, d_in]``."""

    W_dec: Tensor

__all__ = ["feature_chart", "feature_panel", "FeaturePanel"]

_AMP, _DAMP = "#d62728", "#1f77b4"


@register_plot("GainAttribution.features")
def feature_chart(attribution: GainAttribution, k: int = 8, level: float = 0.95) -> go.Figure:
    """Per SAE, the ``k`` features that amplify the block's stream most and the ``k`` that damp it
    most: mean term over prompts with its ``level`` t-CI (horizontal bars, one panel per SAE)."""
    terms = getattr(attribution, "sae_features", None)
    if not terms:
        raise ThermoLensViewError("plot_features needs gain_attribution(model, prompts, sae_features=True) on a model "
                                  "with SAEs attached")
    if not isinstance(k, int) or k < 1:
        raise ThermoLensViewError(f"k must be a positive int, got {k!r}")
    summary = attribution.feature_summary(level)
    hooks = list(terms)
    titles = [f"{h} (block {(attribution.sae_feature_layer or {})[h]})" for h in hooks]
    fig = make_subplots(rows=len(hooks), cols=1, subplot_titles=titles, vertical_spacing=0.12 / max(len(hooks), 1))
    definition = ("<f_i W_dec[i], u_sae>: feature i's share of its block's ||x_out||^2 - ||x_in||^2, mean over "
                  f"{attribution.n_prompts} prompts ({attribution.token_scope} tokens), {100 * level:g}% t-CI")
    for row, hook in enumerate(hooks, start=1):
        df = summary[summary["hook"] == hook].sort_values("mean", kind="stable")
        picked = [df.tail(k)[::-1], df.head(k)]  # amplifying (largest first), damping (most negative first)
        for part, color, role in zip(picked, (_AMP, _DAMP), ("amplify", "damp")):
            part = part[(part["mean"] > 0) if role == "amplify" else (part["mean"] < 0)]
            if part.empty:
                continue
            fig.add_trace(go.Bar(
                x=part["mean"], y=[f"#{int(f)}" for f in part["feature"]], orientation="h", marker_color=color,
                error_x=dict(type="data", symmetric=False, array=part["ci_high"] - part["mean"],
                             arrayminus=part["mean"] - part["ci_low"]),
                name=f"{role}s", showlegend=row == 1,
                customdata=np.stack([part["ci_low"], part["ci_high"], part["feature"]], axis=-1),
                hovertemplate=hover([f"{hook} feature %{{customdata[2]}}", "mean %{x:.4g}",
                                     "CI [%{customdata[0]:.4g}, %{customdata[1]:.4g}]", wrap(definition, 80)]),
                meta={"role": role, "hook": hook, "features": [int(f) for f in part["feature"]],
                      "definition": definition}), row=row, col=1)
        fig.add_vline(x=0, line=dict(color="#888", width=1), row=row, col=1)
    kept = "" if attribution.sae_features_top_k is None else f" (of the top {attribution.sae_features_top_k} kept)"
    base_layout(fig, f"SAE features that amplify / damp their block{kept}", definition,
                height=max(320, 260 * len(hooks)))
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text="feature term (squared residual norm)", row=len(hooks), col=1)
    return fig


@dataclass(frozen=True)
class FeaturePanel:
    """One SAE feature: ``terms`` ``[prompt]`` (its attribution term per prompt), ``activations`` (per
    given prompt, its latent per token), ``tokens``, ``decoder_norm`` ``||W_dec[i]||``, ``head_cosine``
    ``[head]`` (module docstring), ``figure`` (terms and head cosines, plotly) and ``html`` (the
    definition and the circuitsvis token colouring, offline)."""

    hook: str
    feature: int
    layer: int
    terms: Tensor
    tokens: list[list[str]]
    activations: list[Tensor]
    decoder_norm: float
    head_cosine: Tensor
    figure: go.Figure
    html: str
    definition: str

    def _repr_html_(self) -> str:
        return self.html


def _head_cosine(model: TransformerLensModel | ModelView, sae: _SAEDecoder, hook: str, layer: int, feature: int) -> Tensor:
    view = as_view(model)
    W_O = view.W_O_layers()[layer].double()  # [head, d_head, d_model]
    w = sae.W_dec.detach()[feature].double()
    if hook.endswith("attn.hook_z"):
        parts = torch.einsum("hd,hdm->hm", w.view(W_O.shape[0], W_O.shape[1]), W_O)  # head h's write
        whole = parts.sum(0)
        return torch.nn.functional.cosine_similarity(parts, whole[None], dim=-1).float()
    if w.shape[0] != W_O.shape[-1]:
        return torch.full((W_O.shape[0],), float("nan"))
    out = []
    for h in range(W_O.shape[0]):
        q, _ = torch.linalg.qr(W_O[h].T)  # [d_model, d_head]: an orthonormal basis of head h's output space
        out.append(float((q.T @ w).norm() / w.norm().clamp_min(1e-30)))
    return torch.tensor(out)


def feature_panel(model: TransformerLensModel, attribution: GainAttribution, hook: str, feature: int, prompts: str | Sequence[str],
                  include_js: bool = True) -> FeaturePanel:
    """The panel of SAE feature ``feature`` at ``hook`` (module docstring): ``attribution`` a
    ``gain_attribution(..., sae_features=True)`` of ``model`` (with that SAE attached); ``prompts`` the
    texts whose tokens are coloured by the latent (BOS as in the attribution)."""
    terms_all = getattr(attribution, "sae_features", None) or {}
    if hook not in terms_all:
        raise ThermoLensViewError(f"no SAE features at {hook!r} in this attribution; it has {list(terms_all)}")
    ids = attribution.feature_ids(hook).tolist()
    if feature not in ids:
        raise ThermoLensViewError(f"feature {feature} of {hook} is not among the kept features (top "
                                  f"{attribution.sae_features_top_k}); rerun without sae_features_top_k, or pick one of "
                                  f"{ids[:10]}...")
    wrappers = attached.sae_wrappers(model)
    key = hook if hook in wrappers else None
    if key is None:
        raise ThermoLensViewError(f"no SAE is attached at {hook} of this model")
    sae = getattr(wrappers[key], "sae", wrappers[key])
    rec = next(r for r in attached.sae_records(model) if r["hook"] == key)
    acts_hook = f"{rec['hook_out']}.hook_sae_acts_post"
    layer = int((attribution.sae_feature_layer or {})[hook])
    terms = terms_all[hook][:, ids.index(feature)].double()
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    bos = attribution.prepend_bos if isinstance(attribution.prepend_bos, bool) else True
    tokens, acts = [], []
    with torch.no_grad():
        for t in texts:
            _, cache = model.run_with_cache(t, prepend_bos=bos, names_filter=lambda n: n == acts_hook)
            acts.append(cache[acts_hook][0, :, feature].detach().float().cpu())
            tokens.append([str(s) for s in model.to_str_tokens(t, prepend_bos=bos)])
    norm = float(sae.W_dec.detach()[feature].norm())
    cos = _head_cosine(model, sae, hook, layer, feature)
    definition = (f"feature {feature} of the SAE at {hook} (block {layer}): term <f_i W_dec[i], u_sae> per prompt "
                  f"({attribution.token_scope} tokens); latent f_i per token (hook_sae_acts_post); ||W_dec[i]|| = "
                  f"{norm:.4g}; cosine of W_dec[i] with each head's output space of block {layer}")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("term per prompt", f"cosine with block {layer}'s heads"))
    fig.add_trace(go.Bar(x=list(range(len(terms))), y=terms.numpy(), marker_color=_AMP, name="term",
                         hovertemplate=hover(["prompt %{x}", "term %{y:.4g}"]), meta={"role": "terms"}), row=1, col=1)
    fig.add_trace(go.Bar(x=list(range(len(cos))), y=cos.numpy(), marker_color=_DAMP, name="cosine",
                         hovertemplate=hover(["head %{x}", "cosine %{y:.3f}"]), meta={"role": "head_cosine"}),
                  row=1, col=2)
    base_layout(fig, f"{hook} feature {feature}", definition, height=360)
    fig.update_layout(showlegend=False)
    colored = "".join(circuitsvis_html("ColoredTokens", include_js=include_js and i == 0, tokens=tok,
                                       values=a.tolist()) for i, (tok, a) in enumerate(zip(tokens, acts)))
    page = f"<div><p>{_html.escape(definition)}</p>{colored}</div>"  # offline: the figure is .figure
    return FeaturePanel(hook=hook, feature=int(feature), layer=layer, terms=terms, tokens=tokens, activations=acts,
                        decoder_norm=norm, head_cosine=cos, figure=fig, html=page, definition=definition)
