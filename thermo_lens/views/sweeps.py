"""Sweep and paired-difference views: the ``[layer, head]`` (or ``[layer, pos]``) map of a sweep's
effect with non-significant cells marked, and a per-layer plot of a :class:`PairedDifference`.

The effect of a cell is the measure under the condition (patched or ablated) minus the measure
without it, mean over prompts (:mod:`thermo_lens.experiments.sweeps.result`); a cell is significant when its
Holm-adjusted paired t-test p is below ``1 - level``. ``layer`` is the 0-based block index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from thermo_lens.core.result import register_plot
from thermo_lens.views._common import ThermoLensViewError, base_layout, check_type, hover, to_numpy, wrap

if TYPE_CHECKING:
    from thermo_lens.stats.paired import PairedDifference
    from thermo_lens.experiments.sweeps.result import SweepResult

__all__ = ["sweep_heatmap", "paired_difference_plot"]


def _definition(s: SweepResult) -> str:
    what = (f"patching {s.hook} from the clean prompt" if s.kind == "patch" else f"{s.method}-ablating {s.hook}")
    return (f"effect = {s.measure} under the condition ({what}) - {s.measure} without it, mean over {s.n_prompts} "
            f"prompts; {100 * s.level:g}% paired t-CI; p {_holm(s)}; "
            f"token_scope={s.token_scope}, prepend_bos={s.prepend_bos}; model {s.model.get('name')}")


def _holm(s: SweepResult) -> str:
    n = int(np.isfinite(to_numpy(s.pvalue)).sum())
    total = int(s.effect.numel())
    return (f"Holm-adjusted over the {total} cells" if n == total else
            f"Holm-adjusted over the {n} cells with a p-value ({total - n} NaN cells left out)")


def _pos_index(sweep: SweepResult, pos: int) -> int:
    """The index in ``sweep.positions`` of the swept position ``pos`` (a position as given to the
    sweep: ``-1`` is the last token; a non-negative one also matches the same token given from the
    end when every prompt has one length)."""
    swept = [int(q) for q in sweep.positions]
    if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)):
        raise ThermoLensViewError(f"sweep_heatmap: pos must be a swept position (an int in {swept}), got {pos!r}")
    if int(pos) in swept:
        return swept.index(int(pos))
    lengths = {int(n) for n in to_numpy(sweep.provenance.lengths).tolist()}
    if len(lengths) == 1:  # one length: -1 and n - 1 are the same token of every prompt
        n = lengths.pop()
        same = [k for k, q in enumerate(swept) if (q % n if -n <= q < n else None) == int(pos) % n]
        if same and -n <= int(pos) < n:
            return same[0]
    raise ThermoLensViewError(f"sweep_heatmap: position {pos} was not swept (positions {swept}; negative from each "
                              "prompt's end)")


@register_plot("SweepResult")
def sweep_heatmap(sweep: SweepResult, *, pos: int | None = None, head: int | None = None, mark: str = "x") -> go.Figure:
    """A sweep's mean effect as a diverging ``[layer, head]`` (or ``[layer, pos]``) heatmap.

    Args:
        sweep: a :class:`thermo_lens.experiments.sweeps.SweepResult`.
        pos: for a ``("head", "pos")`` sweep, the swept position whose ``[layer, head]`` map is drawn,
            as the sweep was given it (``-1``: each prompt's last token; on prompts of one length
            ``n - 1`` names the same token); default ``None``: the last position in ``sweep.positions``.
        head: for a ``("head", "pos")`` sweep, draw the ``[layer, pos]`` map of this head instead
            (default ``None``).
        mark: the marker symbol over non-significant cells (Holm-adjusted p >= ``1 - level``);
            default ``"x"``.

    Hover text of every cell: the effect, its CI, the raw and adjusted p (and for patching the
    fraction of the clean-corrupted difference restored, with its CI).
    """
    check_type(sweep, "SweepResult", "sweep_heatmap", "Pass thermo_lens.patch_sweep(...) or ablation_sweep(...).")
    arrays = {k: to_numpy(getattr(sweep, k)) for k in ("effect", "ci_low", "ci_high", "pvalue", "pvalue_holm")}
    patch = sweep.kind == "patch"
    if patch:
        arrays.update(fraction=to_numpy(sweep.fraction), fraction_low=to_numpy(sweep.fraction_low),
                      fraction_high=to_numpy(sweep.fraction_high))
    head_name = getattr(sweep, "head_kind", "head")
    cols, col_name, sel = list(sweep.heads or sweep.positions), head_name if sweep.heads else "pos", ""
    if tuple(sweep.over) == ("head", "pos"):
        if head is not None:
            if head not in sweep.heads:
                raise ThermoLensViewError(f"sweep_heatmap: head {head} was not swept (heads {list(sweep.heads)})")
            j = list(sweep.heads).index(head)
            arrays = {k: v[:, j, :] for k, v in arrays.items()}
            cols, col_name, sel = list(sweep.positions), "pos", f", head {head}"
        else:
            k = len(sweep.positions) - 1 if pos is None else _pos_index(sweep, pos)
            arrays = {name: v[:, :, k] for name, v in arrays.items()}
            sel = f", position {sweep.positions[k]}"
    z = arrays["effect"]
    fields = ["ci_low", "ci_high", "pvalue", "pvalue_holm"] + (["fraction", "fraction_low", "fraction_high"]
                                                                   if patch else [])
    custom = np.stack([arrays[f] for f in fields], axis=-1)
    lines = [f"layer %{{y}}, {col_name} %{{x}}", "effect %{z:+.4g}",
             f"{100 * sweep.level:g}% CI [%{{customdata[0]:+.4g}}, %{{customdata[1]:+.4g}}]",
             "p %{customdata[2]:.3g}, Holm-adjusted p %{customdata[3]:.3g}"]
    if patch:
        lines.append("fraction restored %{customdata[4]:+.3g} [%{customdata[5]:+.3g}, %{customdata[6]:+.3g}]")
    definition = _definition(sweep)
    x = [str(c) for c in cols]
    y = [str(layer) for layer in sweep.layers]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, customdata=custom, colorscale="RdBu_r", zmid=0.0,
                               colorbar=dict(title="effect"), hovertemplate=hover(lines + [wrap(definition, 90)]),
                               meta={"role": "heatmap", "definition": definition}))
    ns = ~(arrays["pvalue_holm"] < 1 - sweep.level)
    li, ci = np.nonzero(ns)
    threshold = f"Holm-adjusted p >= {1 - sweep.level:.2g}"
    fig.add_trace(go.Scatter(x=[x[c] for c in ci], y=[y[r] for r in li], mode="markers", hoverinfo="skip",
                             marker=dict(symbol=mark, color="rgba(60,60,60,0.7)", size=9),
                             showlegend=bool(li.size),  # in the legend even beside the heatmap alone
                             name=f"not significant ({threshold})", meta={"role": "not_significant"}))
    key = (f"marker {mark}: not significant ({threshold}), {li.size} of {ns.size} cells" if li.size
           else f"no cell marked: every cell is significant (Holm-adjusted p < {1 - sweep.level:.2g})")
    what = "patching" if patch else f"{sweep.method} ablation"
    base_layout(fig, f"{what.capitalize()} sweep of {sweep.hook}{sel}, {sweep.model.get('name')}",
                wrap(f"{key}; {definition}", 140), height=max(320, min(900, 140 + 22 * len(y))),
                bottom=90)
    fig.update_layout(showlegend=bool(li.size), legend=dict(orientation="h", x=0, xanchor="left", y=0,
                                                             yanchor="bottom", yref="container"))
    fig.update_xaxes(title=col_name, type="category")
    fig.update_yaxes(title="layer", type="category", autorange="reversed")
    return fig


@register_plot("PairedDifference")
def paired_difference_plot(diff: PairedDifference, *, head: int | None = None) -> go.Figure:
    """A :class:`~thermo_lens.stats.paired.PairedDifference` along its first dimension (``layer`` or
    ``state``): mean difference ``b - a`` with its paired t-CI as error bars, p in the hover.

    Args:
        diff: the paired difference.
        head: for ``[layer, head]`` quantities, the head drawn (default ``None``: one line per head).
    """
    check_type(diff, "PairedDifference", "paired_difference_plot", "Pass thermo_lens.paired_difference(b, a).")
    s = diff.summary
    mean, lo, hi = (np.atleast_1d(to_numpy(np.asarray(v, dtype=np.float64))) for v in (s.mean, s.ci_low, s.ci_high))
    p = np.atleast_1d(np.asarray(diff.pvalue, dtype=np.float64))
    if not diff.dims:
        raise ThermoLensViewError("paired_difference_plot: this difference has no layer dimension (a scalar)")
    if len(diff.dims) == 1:
        series = [("", mean, lo, hi, p)]
    else:
        H = mean.shape[1]
        if head is not None and not -H <= head < H:
            raise ThermoLensViewError(f"paired_difference_plot: head {head} out of range 0..{H - 1}")
        hs = range(H) if head is None else [head % H]
        series = [(f"head {h}", mean[:, h], lo[:, h], hi[:, h], p[:, h]) for h in hs]
    dim = diff.dims[0]
    fig = go.Figure()
    for name, m, a, b, pv in series:
        xs = np.arange(m.shape[0])
        fig.add_trace(go.Scatter(
            x=xs, y=m, mode="lines+markers", name=name or diff.quantity,
            error_y=dict(type="data", symmetric=False, array=b - m, arrayminus=m - a),
            customdata=np.stack([a, b, pv], axis=-1),
            hovertemplate=hover([f"{dim} %{{x}}{', ' + name if name else ''}", "b - a %{y:+.4g}",
                                 f"{100 * diff.level:g}% paired t-CI [%{{customdata[0]:+.4g}}, %{{customdata[1]:+.4g}}]",
                                 "paired t-test p %{customdata[2]:.3g}"])))
    fig.add_hline(y=0.0, line=dict(color="#888", dash="dot"))
    definition = (f"{diff.result_type}.{diff.quantity}: b - a per prompt, mean over {diff.n_prompts} paired prompts; "
                  f"a: {diff.provenance_a.hooks_text}; b: {diff.provenance_b.hooks_text}")
    base_layout(fig, f"Paired difference of {diff.quantity} per {dim}", wrap(definition, 140), bottom=60)
    fig.update_xaxes(title=dim, dtick=1)
    fig.update_yaxes(title=f"{diff.quantity} (b - a)")
    return fig
