"""Plotly view of :class:`thermo_lens.measures.sae.SAEGainChange`: what attached SAEs do to the residual gain.

Top panel: mean block gain ``G_l`` per block ``l`` (0-based) with and without the SAEs, with 95%
t-CI bands. Bottom panel: the paired difference ``delta_l = G_l(with) - G_l(without)`` across
prompts, mean with its t-CI as error bars, and a zero line. Dotted vertical lines mark where each
SAE sits (``l - 0.5``: before block ``l``; ``l + 0.5``: after it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from thermo_lens.views._common import (
    ThermoLensViewError,
    base_layout,
    hover,
    settings_text,
    to_numpy,
    wrap,
)
from thermo_lens.views.dynamics import _rgba
from thermo_lens.core.result import register_plot
from thermo_lens.measures.sae import sae_position

if TYPE_CHECKING:
    from thermo_lens.measures.sae import SAEGainChange

__all__ = ["sae_gain_change_plot"]

_WITH, _WITHOUT, _DELTA = "#d62728", "#1f77b4", "#2ca02c"


@register_plot("SAEGainChange")
def sae_gain_change_plot(result: SAEGainChange) -> go.Figure:
    """Gain per block with and without the SAEs (top) and the paired change with CIs (bottom).

    Args:
        result: a :class:`~thermo_lens.measures.sae.SAEGainChange` (``thermo_lens.sae_gain_change(...)``).

    Returns:
        ``plotly.graph_objects.Figure``: traces with ``meta["role"]`` ``"with_saes"``,
        ``"without_saes"`` (mean ``G_l``), ``"delta"`` (mean paired difference, CI error bars).
    """
    if type(result).__name__ != "SAEGainChange":
        raise ThermoLensViewError(
            f"sae_gain_change_plot needs a SAEGainChange (thermo_lens.sae_gain_change(model, prompts)), "
            f"got {type(result).__name__}")
    g, g0 = result.with_saes, result.without_saes
    if g is None or g0 is None:
        raise ThermoLensViewError("sae_gain_change_plot: this SAEGainChange holds no gain results with and without "
                                  "the SAEs; make it with thermo_lens.sae_gain_change(model, prompts)")
    defn = settings_text(token_scope=g.token_scope, prepend_bos=g.prepend_bos, dtype=g.dtype,
                         weights=g.weights, post_ln=g.post_ln)
    L = result.n_layers
    layers = np.arange(L)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("G_l with and without the SAEs (mean, 95% CI)",
                                        "paired change delta_l = G_l(with) - G_l(without)"))
    for res, name, color, role in ((g0, "without SAEs", _WITHOUT, "without_saes"),
                                   (g, "with SAEs", _WITH, "with_saes")):
        s = res.layer_summary
        mean, lo, hi = to_numpy(s.mean), to_numpy(s.ci_low), to_numpy(s.ci_high)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            xs = layers[ok].astype(float)
            fig.add_trace(go.Scatter(
                x=np.concatenate([xs, xs[::-1]]), y=np.concatenate([hi[ok], lo[ok][::-1]]), fill="toself", mode="lines",
                fillcolor=_rgba(color, 0.18), line=dict(width=0), hoverinfo="skip", showlegend=False,
                meta={"role": "ci_band"}), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=layers, y=mean, mode="lines+markers", name=name, line=dict(color=color),
            customdata=np.stack([lo, hi], axis=1),
            hovertemplate=hover([f"<b>{name}</b>", "block %{x}", "mean G_l = %{y:.5f}",
                                 "95% t-CI [%{customdata[0]:.5f}, %{customdata[1]:.5f}]", wrap(defn, 90)]),
            meta={"role": role}), row=1, col=1)
    d = result.delta_summary
    mean, lo, hi, se = (to_numpy(v) for v in (d.mean, d.ci_low, d.ci_high, d.se))
    fig.add_trace(go.Scatter(
        x=layers, y=mean, mode="markers+lines", name="paired delta", line=dict(color=_DELTA),
        error_y=dict(type="data", symmetric=False, array=hi - mean, arrayminus=mean - lo),
        customdata=np.stack([lo, hi, se, np.asarray(d.n) * np.ones(L)], axis=1),
        hovertemplate=hover(["<b>G_l(with) - G_l(without)</b>", "block %{x}", "mean delta = %{y:.3g}",
                             "95% t-CI [%{customdata[0]:.3g}, %{customdata[1]:.3g}], SE %{customdata[2]:.3g}",
                             "paired over %{customdata[3]:.0f} prompts", wrap(defn, 90)]),
        meta={"role": "delta", "definition": result.definition}), row=2, col=1)
    fig.add_hline(y=0.0, line=dict(color="#888", width=1, dash="dot"), row=2, col=1)
    for r in result.saes:
        pos = sae_position(r["hook"])
        if pos is None:
            continue
        for row in (1, 2):
            fig.add_vline(x=pos, line=dict(color="#555", width=1, dash="dot"), row=row, col=1)
        fig.add_annotation(x=pos, y=1.0, yref="y domain", showarrow=False, yanchor="bottom",
                           text=f"SAE {r['hook'].split('.', 2)[-1]} (d_sae={r['d_sae']}"
                                f"{', error term' if r['use_error_term'] else ''})",
                           font=dict(size=10, color="#555"), row=1, col=1)
    saes = ", ".join(r["hook"] for r in result.saes)
    base_layout(fig, f"SAE effect on the residual gain: {g.model.get('name', 'model')} ({saes})",
                wrap(result.definition, 120), height=600)
    fig.update_xaxes(title="block l (0-based)", dtick=1, row=2, col=1)
    fig.update_yaxes(title="G_l", row=1, col=1)
    fig.update_yaxes(title="delta G_l", row=2, col=1)
    return fig
