"""Per-head views: any ``[layer, head]`` metric as a heatmap, and the spectral signature.

The ``[layer, head]`` layout is TransformerLens' (as ``head_detector`` returns): row = layer
(block index, 0-based as in ``blocks.{l}``), column = query head. D'Elia (2026), "Thermodynamic
Constraints in Transformer Architectures", section 4.3 (spectral signature) and section 5 (sheaf
trace); ``thermo_lens.definitions`` §2 and §3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from thermo_lens.core import registry
from thermo_lens.views._common import (
    POST_LN_SUFFIX,
    ThermoLensViewError,
    MIN_HEIGHT,
    base_layout,
    check_type,
    color_of,
    hover,
    log_ticks,
    named,
    settings_text,
    to_numpy,
    wrap,
)
from thermo_lens.core.result import register_plot

if TYPE_CHECKING:
    import torch
    from numpy.typing import ArrayLike

    from thermo_lens.measures.attribution.result import GainAttribution
    from thermo_lens.measures.profile import ThermoProfile
    from thermo_lens.measures.sheaf.traces import SheafTraces
    from thermo_lens.measures.spectral.signature import SpectralSignature
    from thermo_lens.views._common import OneOrMany, Selection

__all__ = ["head_heatmap", "spectral_scatter", "spectral_heatmaps", "sheaf_trace_heatmap", "attribution_heatmap"]

def select_layers_heads(z: np.ndarray, layers: Selection = None, heads: Selection = None, *, func: str = "figure"
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``layers`` and columns ``heads`` of a ``[layer, head]`` matrix (ints or lists;
    negative from the end, as everywhere in thermo-lens) and their true indices."""
    L, H = z.shape

    def pick(sel: Selection, n: int, what: str) -> np.ndarray:
        if sel is None:
            return np.arange(n)
        items = [sel] if isinstance(sel, (int, np.integer)) else list(sel)
        bad = [i for i in items if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= int(i) < n]
        if bad or not items:
            raise ThermoLensViewError(f"{func}: {what}(s) {bad or items} out of range 0..{n - 1} (negative from the end)")
        return np.array([int(i) % n for i in items])

    ls, hs = pick(layers, L, "layer"), pick(heads, H, "head")
    return z[np.ix_(ls, hs)], ls, hs


def head_heatmap(values: torch.Tensor | ArrayLike, *, title: str, definition: str, colorscale: str | None = None,
                 zmid: float | None = None, layer_offset: int = 0, colorbar_title: str | None = None,
                 value_format: str = ".4g", layers: Selection = None, heads: Selection = None) -> go.Figure:
    """Any per-head metric as a layer x head heatmap.

    Args:
        values: ``Float[Tensor, "layer head"]`` (tensor, array or nested list); NaN cells are blank.
        title: figure title (e.g. ``"||W_V||_2 per head, gpt2"``).
        definition: what the numbers are (shown under the title and in every cell's hover text),
            e.g. ``"sigma_max(W_V), raw weights, float32"``.
        colorscale: plotly colour scale (default ``"Viridis"``, or ``"RdBu_r"`` when ``zmid`` is set).
        zmid: value at the middle of a diverging scale (e.g. 1.0 for gains, 0.0 for changes).
        layer_offset: added to the row index in labels (0: ``blocks.{l}`` indexing).
        colorbar_title: colour bar label.
        value_format: d3 format of the value in hover text.
        layers, heads: show only these layers / heads (ints or lists, negative from the end);
            the axes keep their true indices.

    Returns:
        A figure with one ``go.Heatmap`` whose ``z`` is ``values`` (row = layer, column = head).
    """
    z = to_numpy(values)
    if z.ndim != 2:
        raise ThermoLensViewError(
            f"head_heatmap: expected a [layer, head] matrix, got shape {tuple(z.shape)}; for "
            "[prompt, layer, head] tensors reduce over prompts first (e.g. .mean(0))")
    if not isinstance(title, str) or not isinstance(definition, str) or not definition.strip():
        raise ThermoLensViewError("head_heatmap: give a title and a non-empty definition string (what the numbers are)")
    z, ls, hs = select_layers_heads(z, layers, heads, func="head_heatmap")
    L, H = z.shape
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(h) for h in hs], y=[str(l + layer_offset) for l in ls], colorscale=colorscale or ("RdBu_r" if zmid is not None else "Viridis"),
        zmid=zmid, colorbar=dict(title=dict(text=colorbar_title, side="right")) if colorbar_title else None,
        hovertemplate=hover(["layer %{y}, head %{x}", f"value %{{z:{value_format}}}", wrap(definition, 90)]),
        meta={"role": "heatmap", "definition": definition},
    ))
    base_layout(fig, title, wrap(definition, 140), height=max(300, min(900, 120 + 22 * L)), bottom=60)
    fig.update_xaxes(title="head", dtick=1 if H <= 40 else None)
    fig.update_yaxes(title="layer", autorange="reversed", dtick=1 if L <= 40 else None)
    return fig


# ---------------------------------------------------------------------------- spectral
def spectral_settings(sig: object) -> str:
    """Definition sentence of a SpectralSignature's numbers (weights, dtype, architecture)."""
    model = getattr(sig, "model", None) or {}
    dtype = getattr(sig, "dtype", None) or model.get("dtype")
    weights = getattr(sig, "weights", None) or model.get("weights")
    extra = []
    n_kv, n_h = model.get("n_kv_heads"), model.get("n_heads")
    if n_kv and n_h and n_kv != n_h:
        extra.append(f"GQA: {n_h} query heads read {n_kv} KV heads (W_V repeated per query head)")
    return settings_text(dtype=dtype, weights=weights, norms="float32/64 SVD",
                         post_ln=model.get("post_ln"), extra=extra)


def _definition(sig: object, metric: str) -> str:
    try:
        return registry.get(metric).formula
    except KeyError:
        return metric


def _sig_tensor(sig: object, metric: str) -> np.ndarray:
    if not hasattr(sig, metric):
        raise ThermoLensViewError(
            f"the spectral signature has no metric {metric!r}; available: "
            f"{', '.join(getattr(sig, 'head_metrics', {}))}")
    z = to_numpy(getattr(sig, metric))
    if z.ndim != 2:
        raise ThermoLensViewError(f"spectral metric {metric!r} is not a [layer, head] tensor (shape {z.shape})")
    return z


def spectral_scatter(signatures: OneOrMany[SpectralSignature | ThermoProfile],
                     labs: Sequence[str] | Mapping[str, str] | None = None, names: Sequence[str] | None = None, *,
                     per: str = "head") -> go.Figure:
    """``||W_V||_2`` vs ``||W_O||_2`` on log-log axes, one point per head (or per model), one colour per
    model, one marker symbol per lab (the legend is grouped by lab).

    Args:
        signatures: a :class:`~thermo_lens.measures.spectral.SpectralSignature`, a list / dict of them, or
            ThermoProfile(s) (``.spectral``; their ``meta["lab"]`` picks the marker symbol).
        labs: lab per model (a list aligned with ``signatures`` or a ``{name: lab}`` dict); default
            the profiles' ``meta["lab"]``, else the model name. Models of one lab share a marker
            symbol and a legend group, never a colour.
        names: display names.
        per: ``"head"`` (every head of every layer, hover names layer/head) or ``"model"`` (the mean
            over heads and layers per model).

    The diagonal ``||W_V|| = ||W_O||`` (ratio 1) is drawn dotted. Post-LN models get the open
    variant of their lab's symbol.
    """
    if per not in ("head", "model"):
        raise ThermoLensViewError(f"spectral_scatter: per must be 'head' or 'model', got {per!r}")
    raw = signatures
    pairs = named(signatures, "spectral", "SpectralSignature", names)
    lab_of = _labs(raw, pairs, labs)
    lab_keys = [lab_of[n] for n, _ in pairs]
    model_keys = [n for n, _ in pairs]
    fig = go.Figure()
    shown_labs: set[str] = set()
    lo, hi = np.inf, -np.inf
    for name, sig in pairs:
        check_type(sig, "SpectralSignature", "spectral_scatter",
                   "Pass thermo_lens.measures.spectral.spectral_signature(model) results (or ThermoProfiles).")
        v, o, r = _sig_tensor(sig, "W_V_norm"), _sig_tensor(sig, "W_O_norm"), _sig_tensor(sig, "ratio")
        L, H = v.shape
        lab = lab_of[name]
        color = color_of(name, model_keys)  # models are compared: one colour each; the lab is the symbol
        symbol = _LAB_SYMBOLS[list(dict.fromkeys(lab_keys)).index(lab) % len(_LAB_SYMBOLS)]
        post = bool((getattr(sig, "model", None) or {}).get("post_ln"))
        defs = spectral_settings(sig)
        if per == "head":
            ll, hh = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
            x, y = v.ravel(), o.ravel()
            custom = np.stack([ll.ravel(), hh.ravel(), r.ravel()], axis=1)
            where = "layer %{customdata[0]:.0f}, head %{customdata[1]:.0f}"
        else:
            x, y = np.array([np.nanmean(v)]), np.array([np.nanmean(o)])
            custom = np.array([[L, H, np.nanmean(r)]])
            where = "mean over %{customdata[0]:.0f} layers x %{customdata[1]:.0f} heads"
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        if ok.any():
            lo, hi = min(lo, x[ok].min(), y[ok].min()), max(hi, x[ok].max(), y[ok].max())
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="markers", name=name + (POST_LN_SUFFIX if post else ""),
            legendgroup=lab, legendgrouptitle=dict(text=f"lab: {lab}"),
            marker=dict(color=color, size=7 if per == "head" else 12, opacity=0.75,
                        symbol=symbol + "-open" if post else symbol),
            customdata=custom,
            hovertemplate=hover([f"<b>{name}</b> ({lab})", where,
                                 "||W_V||_2 = %{x:.4g}, ||W_O||_2 = %{y:.4g}, ratio %{customdata[2]:.4g}",
                                 wrap("||W_V||_2 = " + _definition(sig, "W_V_norm"), 90),
                                 wrap("||W_O||_2 = " + _definition(sig, "W_O_norm"), 90), wrap(defs, 90)]),
            meta={"role": "heads" if per == "head" else "model_mean", "model": name, "lab": lab},
        ))
        shown_labs.add(lab)
    if np.isfinite(lo):
        d = np.array([lo / 1.5, hi * 1.5])
        fig.add_trace(go.Scatter(x=d, y=d, mode="lines", line=dict(color="#999", dash="dot", width=1),
                                 name="||W_V|| = ||W_O||", hoverinfo="skip", meta={"role": "diagonal"}))
    base_layout(fig, "Spectral signature: ||W_V||_2 vs ||W_O||_2 " + ("per head" if per == "head" else "per model"),
                "sigma_max of each head's value (W_V [d_model, d_head]) and output (W_O [d_head, d_model]) "
                "matrices; log-log; colour = model, symbol = lab")
    fig.update_xaxes(type="log", title="||W_V||_2 (sigma_max)")
    fig.update_yaxes(type="log", title="||W_O||_2 (sigma_max)")
    if np.isfinite(lo):  # 0.5, 1, 2 rather than plotly's bare minor digits (a "3" that means 0.3)
        vals, text = log_ticks(lo / 1.5, hi * 1.5)  # the diagonal's span
        if vals:
            fig.update_xaxes(tickvals=vals, ticktext=text)
            fig.update_yaxes(tickvals=vals, ticktext=text)
    return fig


#: Marker symbol per lab in the spectral scatter (the colour is the model's).
_LAB_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "star", "hexagon", "triangle-down",
                "pentagon", "star-square")


def _labs(raw: object, pairs: list[tuple[str, Any]], labs: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    names = [n for n, _ in pairs]
    if labs is None:
        objs = list(raw.values()) if isinstance(raw, dict) else (list(raw) if isinstance(raw, (list, tuple)) else [raw])
        out = {}
        for n, obj in zip(names, objs):
            meta = getattr(obj, "meta", None)
            lab = meta.get("lab") if isinstance(meta, dict) else None
            out[n] = str(lab) if lab else n
        return out
    if isinstance(labs, dict):
        missing = [n for n in names if n not in labs]
        if missing:
            raise ThermoLensViewError(f"spectral_scatter: labs has no entry for {missing}")
        return {n: str(labs[n]) for n in names}
    labs = list(labs)
    if len(labs) != len(names):
        raise ThermoLensViewError(f"spectral_scatter: {len(labs)} labs for {len(names)} models")
    return {n: str(lab) for n, lab in zip(names, labs)}


@register_plot("SpectralSignature")
def spectral_heatmaps(signature: SpectralSignature | ThermoProfile, metrics: Sequence[str] = ("W_V_norm", "W_O_norm", "ratio", "ov_norm"),
                      *, name: str | None = None, layers: Selection = None, heads: Selection = None,
                      attribution: GainAttribution | ThermoProfile | None = None) -> go.Figure:
    """Several per-head spectral metrics of one model as side-by-side ``[layer, head]`` heatmaps.

    Args:
        signature: a :class:`~thermo_lens.measures.spectral.SpectralSignature` (or a ThermoProfile).
        metrics: names of registered ``[layer, head]`` metrics (:mod:`thermo_lens.core.registry`).
        name: display name (default: the recorded model name).
        layers, heads: show only these layers / heads (negative from the end).
        attribution: a :class:`~thermo_lens.measures.attribution.GainAttribution` of the same model (or a
            ThermoProfile, whose ``.attribution`` is used when ``signature`` is one): adds its
            mean head term as a last, diverging heatmap beside the spectral ones.
    """
    if attribution is None and getattr(signature, "attribution", None) is not None and hasattr(signature, "meta"):
        attribution = signature.attribution
    ((label, sig),) = named(signature, "spectral", "SpectralSignature", [name] if name else None)
    check_type(sig, "SpectralSignature", "spectral_heatmaps",
               "Pass thermo_lens.measures.spectral.spectral_signature(model) (or a ThermoProfile).")
    metrics = list(metrics)
    if not metrics:
        raise ThermoLensViewError("spectral_heatmaps: give at least one metric")
    zs = [_sig_tensor(sig, m) for m in metrics]
    defs_of = {m: _definition(sig, m) for m in metrics}
    if attribution is not None:
        check_type(attribution, "GainAttribution", "spectral_heatmaps",
                   "Pass thermo_lens.gain_attribution(model, prompts) of the same model.")
        if tuple(attribution.head.shape[1:]) != zs[0].shape:
            raise ThermoLensViewError(
                f"spectral_heatmaps: the attribution is [layer, head] = {tuple(attribution.head.shape[1:])}, "
                f"the signature {zs[0].shape}: not the same model")
        metrics.append("head_term")
        zs.append(to_numpy(attribution.mean_head))
        defs_of["head_term"] = (f"<z_h W_O^h, x_out + x_in>: the head's share of its block's ||x_out||^2 - "
                                f"||x_in||^2, mean over {attribution.n_prompts} prompts (token scope "
                                f"{attribution.token_scope}); a share of the growth, not an ablation effect")
    picked = [select_layers_heads(z, layers, heads, func="spectral_heatmaps") for z in zs]
    zs = [p[0] for p in picked]
    ls, hs = picked[0][1], picked[0][2]
    L, H = zs[0].shape
    defs = spectral_settings(sig)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics, horizontal_spacing=0.1)
    for k, (m, z) in enumerate(zip(metrics, zs)):
        definition = defs_of[m]
        axis = fig.layout["xaxis" if k == 0 else f"xaxis{k + 1}"]
        diverging = m == "head_term"
        fig.add_trace(go.Heatmap(
            z=z, x=[str(h) for h in hs], y=[str(l) for l in ls],
            colorscale="RdBu_r" if diverging else "Viridis", zmid=0.0 if diverging else None,
            showscale=True, colorbar=dict(len=0.9, x=axis.domain[1] + 0.005, xanchor="left", thickness=10,
                                          tickfont=dict(size=9)),
            hovertemplate=hover([f"<b>{m}</b>", "layer %{y}, head %{x}", "value %{z:.4g}",
                                 wrap(definition, 80), wrap(defs, 80)]),
            meta={"role": "heatmap", "metric": m, "definition": definition},
        ), row=1, col=k + 1)
        fig.update_yaxes(autorange="reversed", row=1, col=k + 1, title="layer" if k == 0 else None)
        fig.update_xaxes(title="head", row=1, col=k + 1)
    base_layout(fig, f"Per-head spectral signature, {label}", wrap(defs, 140),
                height=max(320, min(900, 140 + 22 * L)), bottom=60)
    return fig


@register_plot("SheafTraces")
def sheaf_trace_heatmap(traces: SheafTraces | ThermoProfile, *, name: str | None = None, log: bool = False,
                        layers: Selection = None, heads: Selection = None) -> go.Figure:
    """Mean sheaf Laplacian trace per head over prompts, ``[layer, head]``.

    Args:
        traces: a :class:`~thermo_lens.measures.sheaf.SheafTraces` (or a ThermoProfile, ``.sheaf``).
        name: display name.
        log: colour by ``log10`` of the trace (wide dynamic range across layers).
        layers, heads: show only these layers / heads (negative from the end).

    Definition (``thermo_lens.definitions`` §3): ``Tr L^{(l,h)} = (n - sum_i A_ii) ||W_V^{(l,h)}||_F^2`` per
    prompt (or the traces' recorded formula), then the mean over prompts.
    """
    ((label, tr),) = named(traces, "sheaf", "SheafTraces", [name] if name else None)
    check_type(tr, "SheafTraces", "sheaf_trace_heatmap",
               "Pass thermo_lens.measures.sheaf.sheaf_traces(model, prompts) (or a ThermoProfile).")
    z = to_numpy(tr.trace).mean(axis=0)
    m = tr.model or {}
    definition = (f"{tr.definition}; mean over {tr.n_prompts} prompts; "
                  + settings_text(prepend_bos=tr.prepend_bos, dtype=m.get("dtype"), weights=m.get("weights"),
                                  post_ln=m.get("post_ln"), norms=None))
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.log10(z)
        definition = "log10 of " + definition
    return head_heatmap(z, title=f"Sheaf Laplacian trace per head, {label}", definition=definition,
                        colorbar_title="log10 Tr L" if log else "Tr L", layers=layers, heads=heads)


#: Heatmaps print their values in the cells up to this many cells (beyond, hover only).
MAX_CELL_TEXT = 400


@register_plot("GainAttribution")
def attribution_heatmap(attribution: GainAttribution | ThermoProfile, *, name: str | None = None,
                        relative: bool = False, layers: Selection = None, heads: Selection = None) -> go.Figure:
    """Per-head gain attribution, mean over prompts, beside the block's other terms and its total.

    Args:
        attribution: a :class:`~thermo_lens.measures.attribution.GainAttribution` (or a ThermoProfile,
            ``.attribution``).
        name: display name.
        relative: colour by the term divided by the block input's squared norm
            (:attr:`GainAttribution.relative_head`, comparable across layers).
        layers, heads: show only these layers / heads (negative from the end).

    Left panel: the ``[layer, head]`` head terms (trace ``meta["role"] == "heatmap"``, ``z`` =
    :attr:`~GainAttribution.mean_head`). Right panel, on its own colour scale (trace
    ``meta["role"] == "components"``): the MLP term, the output biases' term, the norm / SAE /
    splice terms where a block has them, and the total ``||x_out||^2 - ||x_in||^2`` of the block;
    the heads of a layer plus its components add up to its total. Values are printed in the cells
    (up to :data:`MAX_CELL_TEXT` cells) and in every cell's hover text. Red expands the residual
    stream, blue dampens it. ``layer`` is the 0-based block index, as in the spectral and sheaf
    heatmaps.
    """
    if hasattr(attribution, "meta") and hasattr(attribution, "attribution"):
        label = name or str(attribution.meta.get("name"))
        attribution = attribution.attribution
        if attribution is None:
            raise ThermoLensViewError("attribution_heatmap: this profile has no attribution (post-LN model)")
    else:
        label = name or str((getattr(attribution, "model", None) or {}).get("name", "model"))
    check_type(attribution, "GainAttribution", "attribution_heatmap",
               "Pass thermo_lens.gain_attribution(model, prompts) (or a ThermoProfile).")
    a = attribution
    norm_in_sq = to_numpy(((a.scale - a.total) / 2).mean(0))
    z = to_numpy(a.relative_head.mean(0) if relative else a.mean_head)
    z, ls, hs = select_layers_heads(z, layers, heads, func="attribution_heatmap")
    comps = [("MLP", a.mlp), ("bias", a.bias), ("norm", a.norm), ("SAE", a.sae), ("splice", a.splice)]
    cols = [(n, to_numpy(t.mean(0))) for n, t in comps if t is not None and (n in ("MLP", "bias")
                                                                             or bool(t.abs().max() > 0))]
    cols.append(("total", to_numpy(a.total.mean(0))))
    cz = np.stack([v for _, v in cols], axis=1)
    if relative:
        cz = cz / norm_in_sq[:, None]
    cz = cz[ls]
    what = ("<z_h W_O^h, x_out + x_in> / ||x_in||^2" if relative else "<z_h W_O^h, x_out + x_in>")
    definition = (f"{what}: head h's exact share of its block's squared-norm change ||x_out||^2 - ||x_in||^2 "
                  f"(x_in = resid_pre, x_out = resid_post of block layer), mean over {a.n_prompts} prompts; "
                  + settings_text(token_scope=a.token_scope, prepend_bos=a.prepend_bos, dtype=a.dtype,
                                  weights=a.weights, post_ln=a.post_ln)
                  + f"; hooks: {a.provenance.hooks_text}")
    L, H, C = len(ls), len(hs), len(cols)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        column_widths=[max(H, 2) / (max(H, 2) + C + 1), (C + 1) / (max(H, 2) + C + 1)])
    text = dict(texttemplate="%{z:.3g}", textfont=dict(size=11)) if (H + C) * L <= MAX_CELL_TEXT else {}
    ys = [str(int(v)) for v in ls]
    unit = "share" if relative else "head term"
    fig.add_trace(go.Heatmap(
        z=z, x=[str(int(h)) for h in hs], y=ys, coloraxis="coloraxis", **text,
        hovertemplate=hover(["layer %{y}, head %{x}", f"{unit} %{{z:.4g}}", wrap(definition, 90)]),
        meta={"role": "heatmap", "definition": definition}), row=1, col=1)
    fig.add_trace(go.Heatmap(
        z=cz, x=[n for n, _ in cols], y=ys, coloraxis="coloraxis2", **text,
        hovertemplate=hover(["layer %{y}: %{x} term", "value %{z:.4g}" + (" (of ||x_in||^2)" if relative else ""),
                             "total = sum of the heads and the other columns (exact; see Definitions)"]),
        meta={"role": "components", "columns": [n for n, _ in cols]}), row=1, col=2)
    base_layout(fig, f"Gain attribution per head, {label}", wrap(definition, 150),
                height=max(MIN_HEIGHT, min(900, 160 + 34 * L)) + 60, bottom=150)
    # One horizontal colour bar under each panel, as wide as the panel, its top 56 px above the figure's
    # foot, titled by an annotation just above it (plotly draws a horizontal bar's own title over the
    # bar): side by side on the right, their titles and ticks collided in a narrow window.
    h = float(fig.layout.height)
    for axis, bar_title, dom, scale in (("coloraxis", unit, fig.layout.xaxis.domain, "RdBu_r"),
                                        ("coloraxis2", "block term", fig.layout.xaxis2.domain, "PuOr_r")):
        mid = (dom[0] + dom[1]) / 2
        fig.update_layout({axis: dict(colorscale=scale, cmid=0.0, colorbar=dict(
            orientation="h", thickness=12, yref="container", y=56 / h, ypad=0, yanchor="top", x=mid,
            xanchor="center", lenmode="fraction", len=dom[1] - dom[0]))})
        fig.add_annotation(text=f"colour: {bar_title}", xref="paper", x=mid, xanchor="center", yref="paper",
                           y=-(float(fig.layout.margin.b) - 60) / (h - float(fig.layout.margin.t) - float(fig.layout.margin.b)),
                           yanchor="bottom", showarrow=False, font=dict(size=12, color="#444"))
    fig.update_xaxes(title="head", dtick=1 if H <= 40 else None, row=1, col=1)
    fig.update_xaxes(title="block terms", row=1, col=2)
    fig.update_yaxes(title="layer", autorange="reversed", dtick=1 if L <= 40 else None, row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    return fig
