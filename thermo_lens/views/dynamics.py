"""Layer dynamics: block gain per layer with confidence bands, anisotropy profile, input robustness.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", section 3 and appendix C;
``thermo_lens.definitions`` §1. Every trace's hover text names the definition behind its numbers (token
scope, BOS mode, float32 norms, model dtype, raw/processed weights, pre/post-LN).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import plotly.graph_objects as go

from thermo_lens.views._common import (
    POST_LN_DASH,
    POST_LN_NOTE,
    POST_LN_SUFFIX,
    POST_LN_SYMBOL,
    ThermoLensViewError,
    base_layout,
    check_type,
    color_of,
    hover,
    log_ticks,
    named,
    note,
    settings_text,
    to_numpy,
    wrap,
)
from thermo_lens.core.result import register_plot
from thermo_lens.measures.gain import SUMMARIES

if TYPE_CHECKING:
    from thermo_lens.measures.anisotropy import AnisotropyResult
    from thermo_lens.measures.gain import GainResult
    from thermo_lens.measures.profile import ThermoProfile
    from thermo_lens.measures.robustness import RobustnessResult
    from thermo_lens.views._common import OneOrMany

__all__ = ["layer_dynamics", "anisotropy_plot", "robustness_plot"]

GAIN_DEFINITION = ("block gain of block layer (0-based) = ||resid_post_layer|| / ||resid_pre_layer|| "
                   "(paper G_l = ||x_l|| / ||x_{l-1}||, l = layer + 1)")


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def gain_settings(g: GainResult) -> str:
    """The definition sentence of a :class:`~thermo_lens.measures.gain.GainResult`'s numbers."""
    return settings_text(token_scope=g.token_scope, prepend_bos=g.prepend_bos, dtype=g.dtype,
                         weights=g.weights, post_ln=g.post_ln)


def _band(fig: go.Figure, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str, name: str,
          group: str, **kw: object) -> None:
    ok = np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return
    xs, los, his = x[ok], lo[ok], hi[ok]
    fig.add_trace(go.Scatter(
        x=np.concatenate([xs, xs[::-1]]), y=np.concatenate([his, los[::-1]]), fill="toself", mode="lines",
        fillcolor=_rgba(color, 0.18), line=dict(width=0), hoverinfo="skip", showlegend=False,
        name=f"{name} 95% CI", legendgroup=group, meta={"role": "ci_band", "model": name}), **kw)


#: ``split_first="auto"`` draws block 0 in a panel of its own when its gain is this many times
#: the largest gain of the other blocks (the first block often multiplies the embedding's norm
#: 10-50x, which would flatten every other block against 1).
SPLIT_FIRST_RATIO = 3.0


def _split_first(pairs: list[tuple[str, Any]], x: str, layers: int | Sequence[int] | None, split_first: bool | str) -> bool:
    if split_first not in (True, False, "auto"):
        raise ThermoLensViewError(f"layer_dynamics: split_first must be True, False or 'auto', got {split_first!r}")
    if x != "layer" or layers is not None or any(g.n_layers < 2 for _, g in pairs):
        return False
    if split_first != "auto":
        return bool(split_first)
    for _, g in pairs:
        m = to_numpy(g.layer_summary.mean)
        rest = m[1:][np.isfinite(m[1:])]
        if rest.size and np.isfinite(m[0]) and m[0] > SPLIT_FIRST_RATIO * float(np.abs(rest).max()):
            return True
    return False


@register_plot("GainResult")
def layer_dynamics(gains: OneOrMany[GainResult | ThermoProfile], names: Sequence[str] | None = None, *,
                   x: str = "layer", show_ci: bool = True, log_y: bool | str = "auto",
                   layers: int | Sequence[int] | None = None, split_first: bool | str = "auto") -> go.Figure:
    """Block gain ``G_l`` per layer, mean over prompts with its 95% t-CI band, models overlaid.

    Args:
        gains: a :class:`~thermo_lens.measures.gain.GainResult`, a list of them, a ``{name: GainResult}``
            dict, or ThermoProfile(s) (their ``.gain`` is used).
        names: display names (default: the recorded model names).
        x: ``"layer"`` (0-based block index ``layer = 0..L-1``, as ``blocks.{layer}`` and every
            thermo-lens frame) or ``"relative_depth"`` (``(layer + 1) / L``: compares models of
            different depth; the last block is at 1).
        show_ci: draw the CI bands (``GainResult.layer_summary``: mean +- t * SE, SD ddof=1).
        log_y: log-scale gain axis; ``"auto"``: when the drawn per-layer means span more than a
            factor of 5. Log ticks read 1, 2, 5, 10, 20, ...
        layers: draw only these blocks (ints or a list; negative from each model's end, so
            ``layers=[-1]`` is every model's last block).
        split_first: draw block 0 in a narrow panel of its own with its own axis, so the other
            blocks stay legible: ``"auto"`` (the default) when block 0's gain exceeds
            :data:`SPLIT_FIRST_RATIO` times every other block's (``x="layer"``, all layers),
            ``True`` / ``False`` to force.

    Returns:
        ``plotly.graph_objects.Figure``; per model one line trace (``meta["role"] == "mean"``,
        ``y`` = per-layer mean ``G_l`` of the blocks it draws, ``x`` their indices) and one band
        (``meta["role"] == "ci_band"``); with block 0 split off, block 0's point is a trace of its
        own (``meta["role"] == "first_block"``) in the left panel. Post-LN models are drawn dashed
        with open diamonds, ``[post-LN]`` in their name and a note.

    Definition (``thermo_lens.definitions`` §1): the gain of block ``layer`` is ``||resid_post_layer|| / ||resid_pre_layer||``
    (the paper's ``G_{layer+1}``; final norm never included), norms in float32, reduced over
    tokens by the result's token scope.
    """
    if x not in ("layer", "relative_depth"):
        raise ThermoLensViewError(f"layer_dynamics: x must be 'layer' or 'relative_depth', got {x!r}")
    pairs = named(gains, "gain", "GainResult", names)
    for _, g in pairs:
        check_type(g, "GainResult", "layer_dynamics",
                   "Pass thermo_lens.residual_gain(model, prompts) results (or ThermoProfiles).")
    split = _split_first(pairs, x, layers, split_first)
    if split:
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=2, column_widths=[0.16, 0.84], horizontal_spacing=0.09,
                            subplot_titles=("block 0 (own scale)", "blocks 1 and after"))
    else:
        fig = go.Figure()
    main = dict(row=1, col=2) if split else {}
    labels = [n for n, _ in pairs]
    any_post = False
    settings = set()
    all_means, first_means = [], []
    for name, g in pairs:
        s = g.layer_summary
        mean, lo, hi = to_numpy(s.mean), to_numpy(s.ci_low), to_numpy(s.ci_high)
        sd, se = to_numpy(s.sd), to_numpy(s.se)
        L_all = mean.shape[0]
        keep = np.arange(L_all)
        if layers is not None:
            items = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
            bad = [i for i in items if isinstance(i, bool) or not -L_all <= int(i) < L_all]
            if bad or not items:
                raise ThermoLensViewError(f"layer_dynamics: layer(s) {bad or items} out of range 0..{L_all - 1} for {name}")
            keep = np.array([int(i) % L_all for i in items])
        color = color_of(name, labels)
        post = bool(g.post_ln)
        any_post |= post
        defn = gain_settings(g)
        settings.add((g.token_scope, str(g.prepend_bos), g.dtype, g.weights))
        label = name + (POST_LN_SUFFIX if post else "")
        lines = [f"<b>{label}</b>", "block (layer) %{customdata[0]:.0f} (paper G_l, l = layer + 1)",
                 "mean block gain = %{y:.4f}  (95% t-CI [%{customdata[1]:.4f}, %{customdata[2]:.4f}])",
                 "SE %{customdata[3]:.3g}, SD %{customdata[4]:.3g} (ddof=1), n = %{customdata[5]:.0f} prompts",
                 GAIN_DEFINITION, wrap(defn, 90)] + ([wrap(POST_LN_NOTE, 90)] if post else [])
        line = dict(color=color, dash=POST_LN_DASH if post else "solid")
        marker = dict(symbol=POST_LN_SYMBOL if post else "circle", size=8 if post else 7, color=color)
        meta = {"model": name, "post_ln": post, "definition": f"{GAIN_DEFINITION}, {defn}"}

        table = np.stack([np.arange(L_all), lo, hi, se, sd, np.full(L_all, g.n_prompts)], axis=1)

        if split:
            first_means.append(mean[:1])
            fig.add_trace(go.Scatter(
                x=[0], y=mean[:1], mode="markers", name=label, legendgroup=name, showlegend=False,
                marker=marker, customdata=table[:1], hovertemplate=hover(lines),
                error_y=dict(type="data", symmetric=False, array=hi[:1] - mean[:1], arrayminus=mean[:1] - lo[:1],
                             color=color, thickness=1.2, width=4) if show_ci else None,
                meta={"role": "first_block", **meta}), row=1, col=1)
            keep = keep[1:]
        sel = (mean[keep], lo[keep], hi[keep])
        all_means.append(sel[0])
        xs = (keep + 1) / L_all if x == "relative_depth" else keep
        if show_ci:
            _band(fig, xs.astype(float), sel[1], sel[2], color, label, name, **main)
        fig.add_trace(go.Scatter(
            x=xs, y=sel[0], mode="lines+markers", name=label, legendgroup=name, line=line, marker=marker,
            customdata=table[keep], hovertemplate=hover(lines), meta={"role": "mean", **meta}), **main)
    fig.add_hline(y=1.0, line=dict(color="#888", width=1, dash="dot"), **main)
    if show_ci:  # the bands are drawn without a legend entry each: one entry says what they are
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="95% t-CI band (shaded)",
                                 line=dict(color="rgba(120,120,120,0.35)", width=10), hoverinfo="skip",
                                 meta={"role": "legend"}), **main)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="gain = 1 (neither expands nor dampens)",
                             line=dict(color="#888", width=1, dash="dot"), hoverinfo="skip",
                             meta={"role": "legend"}), **main)
    g0 = pairs[0][1]
    common = settings_text(token_scope=g0.token_scope, prepend_bos=g0.prepend_bos, dtype=g0.dtype, weights=g0.weights)
    subtitle = wrap(GAIN_DEFINITION + ("; " + common if len(settings) == 1 else
                                       "; the models' settings differ (each model's hover names its own)"), 150)
    base_layout(fig, "Layer dynamics: block gain per layer (mean over prompts, 95% CI)", subtitle)
    x_title = "layer (0-based block index)" if x == "layer" else "relative depth (layer + 1) / L"
    dtick = 1 if x == "layer" and max(g.n_layers for _, g in pairs) <= 48 else None
    fig.update_xaxes(title=x_title, dtick=dtick, **main)
    y_title = "block gain ||resid_post|| / ||resid_pre||"
    # split: the right panel's y title goes into its panel title (between the panels there is room for
    # tick labels only; a title there sat on the data in a narrow window)
    fig.update_yaxes(title=None if split else y_title, **main)
    v = np.concatenate(all_means) if all_means else np.array([])
    v = v[np.isfinite(v) & (v > 0)]
    if log_y == "auto":
        log_y = bool(v.size) and float(v.max() / v.min()) > 5.0
    if log_y and v.size:
        vals, text = log_ticks(min(float(v.min()), 1.0), max(float(v.max()), 1.0))
        ticks = dict(tickvals=vals, ticktext=text) if vals else {}
        fig.update_yaxes(type="log", title=None if split else y_title + " (log scale)", **ticks, **main)
    if split:
        f = np.concatenate(first_means)
        fig.update_xaxes(tickvals=[0], ticktext=["0"], range=[-0.6, 0.6], title="layer", row=1, col=1)
        fig.update_yaxes(title="block 0 gain", rangemode="tozero" if np.nanmax(f) < 5 else "normal", row=1, col=1)
        fig.update_annotations(font=dict(size=12, color="#444"), text="block 0<br>(own scale)",
                               selector=dict(text="block 0 (own scale)"))
        right = f"blocks 1 and after: {y_title}" + (" (log scale)" if log_y and v.size else "")
        fig.update_annotations(font=dict(size=12, color="#444"), text=right, x=fig.layout.xaxis2.domain[0],
                               xanchor="left", selector=dict(text="blocks 1 and after"))
    if any_post:
        note(fig, "⚠ " + POST_LN_NOTE)
    return fig


def _anisotropy_arrays(a: AnisotropyResult) -> dict[str, Any]:
    s = a.stats
    n = to_numpy(s.n)
    return {
        "mean": to_numpy(s.mean), "ci_low": to_numpy(s.ci_low), "ci_high": to_numpy(s.ci_high),
        "n": n, "post_ln": bool(a.post_ln), "definition": str(a.definition),
        "settings": settings_text(prepend_bos=a.prepend_bos, dtype=a.dtype, weights=a.weights,
                                  post_ln=a.post_ln, norms="float32 reduction"),
    }


@register_plot("AnisotropyResult")
def anisotropy_plot(results: OneOrMany[AnisotropyResult | ThermoProfile], names: Sequence[str] | None = None, *, show_ci: bool = True) -> go.Figure:
    """Anisotropy per residual state ``x_0..x_L``: mean pairwise cosine of token states.

    Args:
        results: an :class:`~thermo_lens.measures.anisotropy.AnisotropyResult`, a list / dict of them, or
            ThermoProfile(s) (their ``.anisotropy``).
        names: display names.
        show_ci: 95% t-CI band across prompts.

    Definition (paper appendix C; ``thermo_lens.definitions`` §1): per prompt and state ``x_l``, the mean over
    token pairs ``i != j`` of ``cos(x_l[i], x_l[j])``, position 0 excluded; then mean over prompts.
    """
    pairs = named(results, "anisotropy", "AnisotropyResult", names)
    fig = go.Figure()
    labels = [n for n, _ in pairs]
    any_post = False
    for name, a in pairs:
        check_type(a, "AnisotropyResult", "anisotropy_plot",
                   "Pass thermo_lens.measures.anisotropy.anisotropy_profile(model, prompts) results (or ThermoProfiles).")
        d = _anisotropy_arrays(a)
        color = color_of(name, labels)
        post = d["post_ln"]
        any_post |= post
        label = name + (POST_LN_SUFFIX if post else "")
        states = np.arange(d["mean"].shape[0])
        if show_ci:
            _band(fig, states.astype(float), d["ci_low"], d["ci_high"], color, label, name)
        custom = np.stack([d["ci_low"], d["ci_high"], np.broadcast_to(d["n"], states.shape)], axis=1)
        fig.add_trace(go.Scatter(
            x=states, y=d["mean"], mode="lines+markers", name=label, legendgroup=name,
            line=dict(color=color, dash=POST_LN_DASH if post else "solid"),
            marker=dict(symbol=POST_LN_SYMBOL if post else "circle"), customdata=custom,
            hovertemplate=hover([f"<b>{label}</b>", "state x_%{x}", "mean anisotropy %{y:.4f} "
                                 "(95% CI [%{customdata[0]:.4f}, %{customdata[1]:.4f}], n = %{customdata[2]:.0f})",
                                 wrap(d["definition"], 90), wrap(d["settings"], 90)]),
            meta={"role": "mean", "model": name, "post_ln": post, "definition": d["definition"]},
        ))
    base_layout(fig, "Anisotropy profile (mean pairwise cosine similarity of token states)",
                "state x_0 = block-0 input, x_l = block l output; position 0 excluded")
    fig.update_xaxes(title="residual state x_l", dtick=1)
    fig.update_yaxes(title="mean cos(x_l[i], x_l[j]), i != j")
    if any_post:
        note(fig, "⚠ " + POST_LN_NOTE)
    return fig


# ---------------------------------------------------------------------------- robustness
def robustness_definition(r: RobustnessResult, *, with_norm_placement: bool = True) -> str:
    g = r.gain
    settings = settings_text(token_scope=g.token_scope, prepend_bos=g.prepend_bos, dtype=g.dtype,
                             weights=g.weights, post_ln=g.post_ln if with_norm_placement else None)
    return f"{r.metric}: {SUMMARIES.get(r.metric, '')}; {settings}; prompt set {r.prompt_set}"


def _robustness_arrays(r: RobustnessResult) -> dict[str, Any]:
    cats = list(r.by_category)
    per = [r.by_category[c][r.metric] for c in cats]
    return {
        "categories": cats,
        "mean": np.array([float(s.mean) for s in per]),
        "ci_low": np.array([float(s.ci_low) for s in per]),
        "ci_high": np.array([float(s.ci_high) for s in per]),
        "sd": np.array([float(s.sd) for s in per]),
        "n": np.array([float(s.n) for s in per]),
        "per_prompt_value": r.per_prompt(),
        "per_prompt_category": list(r.categories),
        "per_prompt_text": [p if len(p) <= 60 else p[:57] + "..." for p in r.gain.prompts],
        "definition": robustness_definition(r),
    }


@register_plot("RobustnessResult")
def robustness_plot(results: OneOrMany[RobustnessResult], names: Sequence[str] | None = None) -> go.Figure:
    """Gain distribution per prompt category (box of per-prompt values, mean +- 95% CI marker).

    Args:
        results: a :class:`~thermo_lens.measures.robustness.RobustnessResult`, a list / dict of them.
        names: display names.

    Definition: the result's gain summary (its recorded name, token scope and BOS mode) per prompt,
    grouped by the prompt set's categories (the paper's Factual / Syntactic / Cliche / Novel /
    Nonsense, D'Elia 2026 section 5); CI = Student-t 95% over the category's prompts (SD ddof=1).
    """
    pairs = named(results, None, "RobustnessResult", names)
    fig = go.Figure()
    labels = [n for n, _ in pairs]
    defs = set()
    data = []
    for name, r in pairs:
        check_type(r, "RobustnessResult", "robustness_plot",
                   "Pass thermo_lens.measures.robustness.input_robustness(model, 'paper25') results.")
        data.append((name, r, _robustness_arrays(r)))
    # One numeric slot per (category, model): category i at x = i, model m offset inside it, so each
    # model's mean +- CI marker is drawn at exactly its own box's x (plotly groups boxes, not scatters).
    categories = list(dict.fromkeys(c for _, _, d in data for c in d["categories"]))
    slot = 0.8 / len(data)
    for m, (name, r, d) in enumerate(data):
        color = color_of(name, labels)
        defs.add(robustness_definition(r, with_norm_placement=False))
        offset = (m - (len(data) - 1) / 2) * slot
        box_x = np.array([categories.index(c) + offset for c in d["per_prompt_category"]])
        if r.gain.post_ln:
            name = name + POST_LN_SUFFIX
        fig.add_trace(go.Box(
            x=box_x, y=d["per_prompt_value"], name=name, legendgroup=name, marker_color=color,
            boxpoints="all", jitter=0.3, pointpos=0, width=slot * 0.8, text=d["per_prompt_text"],
            customdata=list(d["per_prompt_category"]),
            hovertemplate=hover([f"<b>{name}</b>", "category %{customdata}", "gain %{y:.4f}", "prompt: %{text}",
                                 wrap(d["definition"], 90)]),
            meta={"role": "per_prompt", "model": name, "definition": d["definition"],
                  "categories": list(d["per_prompt_category"])},
        ))
        c = d["categories"]
        fig.add_trace(go.Scatter(
            x=np.array([categories.index(k) + offset for k in c]), y=d["mean"], mode="markers",
            name=f"{name} mean ± 95% CI", legendgroup=name,
            marker=dict(color=color, symbol="line-ew-open", size=18, line=dict(width=3)),
            error_y=dict(type="data", symmetric=False, array=d["ci_high"] - d["mean"],
                         arrayminus=d["mean"] - d["ci_low"], color=color),
            customdata=np.stack([d["ci_low"], d["ci_high"], d["n"], d["sd"]], axis=1), text=c,
            hovertemplate=hover([f"<b>{name}</b>", "category %{text}", "mean %{y:.4f}",
                                 "95% t-CI [%{customdata[0]:.4f}, %{customdata[1]:.4f}]",
                                 "SD %{customdata[3]:.3g} (ddof=1), n = %{customdata[2]:.0f}",
                                 wrap(d["definition"], 90)]),
            meta={"role": "category_mean", "model": name, "definition": d["definition"], "categories": list(c)},
        ))
    fig.add_hline(y=1.0, line=dict(color="#888", width=1, dash="dot"))
    base_layout(fig, "Input robustness: gain by prompt category",
                wrap(next(iter(defs)), 140) if len(defs) == 1 else "models measured under different definitions (see hover)")
    fig.update_layout(boxmode="overlay")
    fig.update_xaxes(title="prompt category", tickvals=list(range(len(categories))), ticktext=categories,
                     range=[-0.5, len(categories) - 0.5], zeroline=False)
    fig.update_yaxes(title="gain")
    return fig
