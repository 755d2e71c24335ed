"""Any registered metric as a figure, drawn from its shape in :mod:`thermo_lens.core.registry`.

``metric_plot(result, "qk_norm")`` draws a ``[layer, head]`` metric as a heatmap, a per-layer
metric as a line, a per-prompt metric as a strip of points, and so on; every hover names the
metric's formula, so a newly registered metric is viewable without writing a view for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from thermo_lens.core import registry
from thermo_lens.views._common import ThermoLensViewError, base_layout, hover, to_numpy, wrap
from thermo_lens.views.heads import head_heatmap
from thermo_lens.core.result import register_plot

if TYPE_CHECKING:
    from thermo_lens.core.result import Result

__all__ = ["metric_plot"]


@register_plot("__metric__")
def metric_plot(result: Result, name: str, *, title: str | None = None) -> go.Figure:
    """The registered metric ``name`` of ``result`` (its result object, or a ThermoProfile).

    Shapes: ``[layer, head]`` / ``[layer, kv_head]`` heatmap; ``[prompt, layer, head]`` (and ``[prompt, layer, expert]``) heatmap of
    the mean over prompts; ``[prompt, layer]`` / ``[prompt, state]`` per-prompt lines and their
    mean; ``[layer]`` line; ``[prompt]`` and ``[head]`` points; a scalar as one bar.
    """
    try:
        m = registry.get(name)
    except KeyError as e:
        raise ThermoLensViewError(str(e.args[0])) from None
    try:
        values = m.values(result)
    except (TypeError, AttributeError, KeyError) as e:
        raise ThermoLensViewError(f"metric_plot: {type(result).__name__} has no {name!r} ({e})") from None
    if values is None:
        raise ThermoLensViewError(f"metric_plot: {name!r} was not computed for this result")
    definition = f"{m.symbol} = {m.formula} [{m.reference}]"
    label = title or f"{name} ({m.symbol})"
    dims = m.dims
    z = to_numpy(values) if dims else np.asarray([float(values)])
    if dims in (("layer", "head"), ("layer", "kv_head"), ("prompt", "layer", "head"), ("prompt", "layer", "expert")):
        if len(dims) == 3:
            z, definition = np.nanmean(z, axis=0), "mean over prompts of " + definition
        fig = head_heatmap(z, title=label, definition=definition, colorbar_title=m.symbol)
        fig.update_xaxes(title=dims[-1])
        fig.data[0].meta = {**fig.data[0].meta, "metric": name}
        return fig
    fig = go.Figure()
    text = wrap(definition, 90)
    if len(dims) == 2:  # [prompt, layer] or [prompt, state]
        x = np.arange(z.shape[1])
        for p, row in enumerate(z):
            fig.add_trace(go.Scatter(x=x, y=row, mode="lines", line=dict(width=1, color="#bbb"), showlegend=False,
                                     hovertemplate=hover([f"prompt {p}", f"{dims[1]} %{{x}}", "value %{y:.4g}", text]),
                                     meta={"role": "prompt", "metric": name}))
        fig.add_trace(go.Scatter(x=x, y=np.nanmean(z, axis=0), mode="lines+markers", name="mean over prompts",
                                 hovertemplate=hover([f"{dims[1]} %{{x}}", "mean %{y:.4g}", text]),
                                 meta={"role": "mean", "metric": name, "definition": m.formula}))
        fig.update_xaxes(title=dims[1])
    elif dims in (("layer",), ("prompt",), ("head",)):
        fig.add_trace(go.Scatter(x=np.arange(z.size), y=z, mode="lines+markers" if dims == ("layer",) else "markers",
                                 name=name, hovertemplate=hover([f"{dims[0]} %{{x}}", "value %{y:.4g}", text]),
                                 meta={"role": "values", "metric": name, "definition": m.formula}))
        fig.update_xaxes(title=dims[0])
    elif not dims:
        fig.add_trace(go.Bar(x=[name], y=z, hovertemplate=hover(["value %{y:.4g}", text]),
                             meta={"role": "value", "metric": name, "definition": m.formula}))
    else:  # pragma: no cover - registry.SHAPES lists only the shapes above
        raise ThermoLensViewError(f"metric_plot: no figure for shape {m.shape!r}")
    fig.update_yaxes(title=m.symbol)
    base_layout(fig, label, wrap(definition, 140))
    return fig
