"""Plotly views of a heritage lab: gain trajectories over training, effect sizes per knob.

Both take the lab's tables (:func:`thermo_lens.experiments.lab.run.runs_frame`,
:func:`thermo_lens.experiments.lab.effects.effects_frame`), so they draw a finished lab from its CSV files too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from thermo_lens.experiments.lab.effects import last_checkpoints
from thermo_lens.views._common import HEIGHT, base_layout, color_of, log_ticks, wrap

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["gain_trajectories", "effect_sizes", "per_seed_effects"]

_GAIN_DEFS = {
    "last_block_gain": "G_L = ||x_L|| / ||x_{L-1}|| (last block; paper metric B)",
    "penultimate_gain": "G_{L-1} (penultimate block; paper metric A)",
    "first_block_gain": "G_1 (first block)",
    "geometric_mean_gain": "(||x_L|| / ||x_0||)^(1/L)",
    "total_amplification": "||x_L|| / ||x_0||",
    "max_block_gain": "max_l G_l",
    "W_V_W_O_ratio": "mean over heads of ||W_V^h||_2 / ||W_O^h||_2",
    "val_loss": "validation cross-entropy (nats/token)",
}


def gain_trajectories(runs: pd.DataFrame, metric: str = "last_block_gain") -> go.Figure:
    """``metric`` against training step, one colour per arm: thin lines per seed, thick the seed mean.

    Step 0 (the initial model) is drawn at step 0.5 on the log axis. A dotted line marks 1 (the
    expander / dampener boundary) for gain metrics.
    """
    import pandas as pd

    df = pd.DataFrame(runs)
    if metric not in df.columns:
        raise ValueError(f"no column {metric!r} in the runs table; have {list(df.columns)}")
    fig = go.Figure()
    arms = list(dict.fromkeys(df["arm"]))
    scope = ", ".join(sorted({str(s) for s in df.get("token_scope", pd.Series(dtype=str)).dropna()}))
    for arm in arms:
        sub = df.loc[df["arm"] == arm]
        col = color_of(arm, arms)
        for seed, g in sub.groupby("seed"):
            g = g.sort_values("step")
            fig.add_trace(go.Scatter(x=np.maximum(g["step"], 0.5), y=g[metric], mode="lines", line=dict(color=col, width=0.8),
                                     opacity=0.35, legendgroup=arm, showlegend=False,
                                     hovertemplate=f"{arm}, seed {seed}<br>step %{{x}}<br>{metric} %{{y:.4f}}<extra></extra>"))
        m = sub.groupby("step")[metric].agg(["mean", "count"]).reset_index()
        fig.add_trace(go.Scatter(x=np.maximum(m["step"], 0.5), y=m["mean"], mode="lines+markers", name=arm,
                                 line=dict(color=col, width=2.5), legendgroup=arm,
                                 customdata=m["count"],
                                 hovertemplate=f"{arm}: mean over %{{customdata}} seeds<br>step %{{x}}<br>"
                                               f"{metric} %{{y:.4f}}<extra></extra>"))
    if metric != "val_loss" and metric != "W_V_W_O_ratio":
        fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1))
    steps = np.maximum(pd.to_numeric(df["step"], errors="coerce").dropna().to_numpy(float), 0.5)
    vals, text = log_ticks(float(steps.min()), float(steps.max())) if steps.size else ([], [])
    fig.update_xaxes(type="log", title="training step (log; step 0 drawn at 0.5)",
                     **(dict(tickvals=vals, ticktext=text) if vals else {}))
    fig.update_yaxes(title=metric)
    base_layout(fig, f"{metric} during training",
                wrap(f"{_GAIN_DEFS.get(metric, metric)}{f'; token scope {scope}' if scope else ''}", 150),
                height=HEIGHT, bottom=70)
    return fig


def effect_sizes(effects: pd.DataFrame, metrics: tuple[str, ...] = ("last_block_gain", "penultimate_gain",
                                                          "W_V_W_O_ratio", "val_loss")) -> go.Figure:
    """Forest plot: per knob level, the seed-paired effect with its 95% CI, one panel per metric."""
    import pandas as pd

    eff = pd.DataFrame(effects)
    have = set(eff.get("metric", []))
    if not have & set(metrics):
        raise ValueError(f"the effects table has none of the metrics {', '.join(metrics)} (it has "
                         f"{', '.join(sorted(map(str, have))) or 'no rows'})")
    metrics = tuple(m for m in metrics if m in have)
    fig = make_subplots(rows=1, cols=len(metrics), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"{m}" for m in metrics])
    for j, m in enumerate(metrics, start=1):
        sub = eff.loc[eff["metric"] == m]
        labels = [f"{k}: {r} → {lv}" for k, r, lv in zip(sub["knob"], sub["reference"], sub["level"])]
        flip = [bool(f) if f is not None and f == f else False for f in sub["flips_regime"]]
        fig.add_trace(go.Scatter(
            x=sub["effect"], y=labels, mode="markers",
            marker=dict(size=9, color=["#d62728" if f else "#1f77b4" for f in flip],
                        symbol=["diamond" if f else "circle" for f in flip]),
            error_x=dict(type="data", symmetric=False, array=sub["ci_high"] - sub["effect"],
                         arrayminus=sub["effect"] - sub["ci_low"]),
            customdata=np.stack([sub["pvalue"], sub["n_seeds"], sub["reference_mean"], sub["level_mean"]], axis=-1),
            hovertemplate="%{y}<br>effect %{x:.4f}<br>p = %{customdata[0]:.3g} (exact sign-flip, "
                          "%{customdata[1]} seeds)<br>means %{customdata[2]:.4f} → %{customdata[3]:.4f}<extra>"
                          + m + "</extra>", showlegend=False), row=1, col=j)
        fig.add_vline(x=0, line=dict(color="black", dash="dot", width=1), row=1, col=j)
    n = sorted({int(v) for v in eff["n_seeds"]}) if len(eff) else []
    for name, color, symbol in (("effect, 95% t-CI", "#1f77b4", "circle"),
                                ("effect that flips the regime", "#d62728", "diamond")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                 marker=dict(size=9, color=color, symbol=symbol)), row=1, col=1)
    seeds = "/".join(map(str, n)) or "?"
    base_layout(fig, "Effect of each knob (level − reference)",
                f"paired by seed, 95% t-CI over {seeds} seeds; toy-scale models",
                height=140 + 32 * max(1, eff[["knob", "level"]].drop_duplicates().shape[0]), bottom=70)
    longest = max((len(f"{k}: {r} → {lv}") for k, r, lv in zip(eff["knob"], eff["reference"], eff["level"])), default=10)
    fig.update_layout(margin=dict(l=max(80, 8 * longest + 30)))  # the level labels stay left of the panels
    return fig


def per_seed_effects(runs: pd.DataFrame, reference_arm: str, arm: str,
                     metrics: tuple[str, ...] = ("last_block_gain", "penultimate_gain")) -> go.Figure:
    """Each seed's paired difference ``metric(arm, s) - metric(reference, s)`` at the last step of
    every training budget: one grey line per seed, the seed mean in colour, 0 dotted."""
    import pandas as pd

    df = pd.DataFrame(runs)
    if "budget" not in df.columns or df["budget"].isna().all():
        df = df.assign(budget=df.groupby("run")["step"].transform("max"))
    final = last_checkpoints(df)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[_GAIN_DEFS.get(m, m) for m in metrics])
    for j, m in enumerate(metrics, start=1):
        a = final.loc[final["arm"] == reference_arm].set_index(["seed", "budget"])[m]
        b = final.loc[final["arm"] == arm].set_index(["seed", "budget"])[m]
        d = (b - a).dropna().reset_index().rename(columns={m: "d"})
        for seed, g in d.groupby("seed"):
            g = g.sort_values("budget")
            fig.add_trace(go.Scatter(x=g["budget"], y=g["d"], mode="lines+markers", line=dict(color="#bbbbbb", width=1),
                                     marker=dict(size=4), name="each seed", legendgroup="seeds",
                                     showlegend=bool(j == 1 and seed == d["seed"].min()),
                                     hovertemplate=f"seed {seed}<br>budget %{{x}} steps<br>difference %{{y:.4f}}<extra></extra>"),
                          row=1, col=j)
        mean = d.groupby("budget")["d"].mean()
        fig.add_trace(go.Scatter(x=mean.index, y=mean.to_numpy(), mode="lines+markers", name="mean over seeds",
                                 line=dict(color=color_of(arm, [arm]), width=3), showlegend=(j == 1),
                                 hovertemplate="budget %{x} steps<br>mean difference %{y:.4f}<extra></extra>"),
                      row=1, col=j)
        fig.add_hline(y=0, line=dict(dash="dot", color="black", width=1), row=1, col=j)
        fig.update_xaxes(title_text="training budget (steps)", type="log", row=1, col=j)
        fig.update_yaxes(title_text=f"{arm} minus {reference_arm}", row=1, col=j)
    base_layout(fig, f"Per-seed paired differences: {arm} vs {reference_arm}",
                "the last step of each training budget; grey: one seed each, colour: the mean over seeds")
    return fig
