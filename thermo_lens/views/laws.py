"""Cross-model views: Kleiber plot, heritage bars, hierarchy, and the overlay on the paper's models.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", sections 4.1-4.2, 5.1 and
Fig. 1-2; ``thermo_lens.definitions`` §5. The statistics come from :mod:`thermo_lens.laws` (computed, with
p-values, never asserted); the paper's published numbers from :mod:`thermo_lens.paper.reference`.

Inputs are per-model tables: a DataFrame with one row per model, or a list of ThermoProfiles
(``.to_row()``), or of :class:`~thermo_lens.measures.gain.GainResult` (turned into rows by
:func:`gain_row`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, Union, cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from thermo_lens.stats import format_p as _fmt_p  # the one p-value format
from thermo_lens.views._common import (
    POST_LN_NOTE,
    POST_LN_SYMBOL,
    ThermoLensViewError,
    base_layout,
    bos_text,
    color_of,
    hover,
    is_true,
    note,
    wrap,
)

if TYPE_CHECKING:
    from thermo_lens.measures.gain import GainResult
    from thermo_lens.laws.table import Table
    from thermo_lens.measures.profile import ThermoProfile

    #: What the per-model views take: a table (one row per model), or models' profiles or gain
    #: results, one row each (:func:`rows_frame`).
    ModelTable: TypeAlias = Union[Table, ThermoProfile, GainResult]

__all__ = ["gain_row", "rows_frame", "kleiber_plot", "heritage_plot", "hierarchy_plot",
           "reference_overlay", "PAPER_DEFINITION_NOTE"]

#: What the paper's reference numbers are (stated on every overlay; filled per metric).
PAPER_DEFINITION_NOTE = (
    "Paper numbers (thermo_lens.paper.reference) use the paper's own definition, not thermo-lens': "
    "{measurement} = {definition}; token scope {scope}; model and norms in {dtypes}; BOS as the HF "
    "tokenizer adds it; mean over prompts"
)


# ---------------------------------------------------------------------------- rows
def gain_row(g: GainResult, *, lab: str | None = None, family: str | None = None, name: str | None = None) -> dict[str, Any]:
    """One per-model summary row from a :class:`~thermo_lens.measures.gain.GainResult` (profile-row columns).

    ``gain`` is the mean of the summary that decided the regime (``g.regime_by``), with its 95%
    CI in ``gain_ci_low``/``gain_ci_high``; every named summary is a column too.
    """
    m = g.model or {}
    head = g.summaries[g.regime_by]
    row = {
        "model": name or m.get("name"), "lab": lab, "family": family,
        "n_layers": m.get("n_layers", g.n_layers), "n_heads": m.get("n_heads"), "d_head": m.get("d_head"),
        "d_model": m.get("d_model"), "rho": m.get("rho"),
        "gain": float(head.mean), "gain_ci_low": float(head.ci_low), "gain_ci_high": float(head.ci_high),
        "gain_by": g.regime_by, "regime": g.regime, "n_prompts": g.n_prompts,
    }
    for k, s in g.summaries.items():
        row[k] = float(s.mean)
    row.update(post_ln=bool(g.post_ln), weights=g.weights, dtype=g.dtype, prepend_bos=g.prepend_bos,
               token_scope=g.token_scope)
    return row


def rows_frame(table: ModelTable, func: str = "view") -> pd.DataFrame:
    """A per-model DataFrame from a DataFrame, a dict of columns, or a list / dict of rows,
    ThermoProfiles (``.to_row()``) or GainResults (:func:`gain_row`)."""
    if isinstance(table, pd.DataFrame):
        df = table.copy()
    elif isinstance(table, Mapping) and all(isinstance(v, (list, tuple, np.ndarray, pd.Series)) for v in table.values()):
        df = pd.DataFrame(dict(table))
    else:
        items = list(table.items()) if isinstance(table, Mapping) else [(None, t) for t in (
            table if isinstance(table, (list, tuple)) else [table])]
        rows = []
        for key, obj in items:
            if isinstance(obj, Mapping):
                row = dict(obj)
            elif hasattr(obj, "to_row"):
                row = dict(obj.to_row())
            elif {c.__name__ for c in type(obj).__mro__} & {"GainResult"}:  # by name: no import of gain
                row = gain_row(cast("GainResult", obj))
            else:
                raise ThermoLensViewError(
                    f"{func}: cannot make a per-model row from a {type(obj).__name__}; pass a DataFrame "
                    "(one row per model), ThermoProfiles or GainResults")
            if key is not None and not row.get("model"):
                row["model"] = str(key)
            rows.append(row)
        df = pd.DataFrame(rows)
    if df.empty:
        raise ThermoLensViewError(f"{func}: no models (empty table)")
    if "model" not in df.columns:
        df["model"] = [f"model {i + 1}" for i in range(len(df))]
    return df.reset_index(drop=True)


def _definition_of(row: pd.Series) -> str:
    """The definition sentence recorded in a row (thermo-lens settings, or the paper's text)."""
    parts = []
    for key in ("gain_by", "gain_summary"):
        if isinstance(row.get(key), str):
            parts.append(f"gain = {row[key]}")
            break
    if isinstance(row.get("token_scope"), str):
        parts.append(f"token scope {row['token_scope']}")
    if "prepend_bos" in row and not pd.isna(row["prepend_bos"]):
        parts.append(bos_text(row["prepend_bos"]))
    if isinstance(row.get("dtype"), str):
        parts.append(f"model {row['dtype']}")
    if isinstance(row.get("weights"), str):
        parts.append(f"{row['weights']} weights")
    if isinstance(row.get("definition"), str):
        parts.append(row["definition"])
    return ", ".join(parts) if parts else "definition not recorded in the table"


def _labs(df: pd.DataFrame) -> list[str]:
    if "lab" in df.columns:
        return [str(x) if isinstance(x, str) and x else "unknown lab" for x in df["lab"]]
    return ["unknown lab"] * len(df)


def _post(df: pd.DataFrame) -> np.ndarray:
    if "post_ln" not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return np.array([is_true(v) for v in df["post_ln"]], dtype=bool)


# ---------------------------------------------------------------------------- Kleiber
def kleiber_plot(table: ModelTable, gain: str = "gain", *, n_layers: str = "n_layers") -> go.Figure:
    """Gain vs depth L with the bound curve ``G_max = 10^(1/L)`` (paper eq. 3, Fig. 1).

    Args:
        table: one row per model (see module docstring); columns ``gain`` (or the one named),
            ``n_layers``; optional ``lab``, ``gain_ci_low``/``gain_ci_high`` (error bars),
            ``post_ln`` (post-LN models drawn as open diamonds and named in a note), definition
            columns (``token_scope``, ``prepend_bos``, ``dtype``, ``weights``, ``definition``).
        gain: which gain column (its definition matters: ``penultimate_gain`` is the paper's Fig. 1
            metric, ``last_block_gain`` its abstract's).
        n_layers: depth column.

    With >= 3 models of at least two depths the subtitle gives Pearson/Spearman r and p of gain vs L
    (:func:`thermo_lens.laws.kleiber`); models of one depth are drawn, and the subtitle says there
    is no correlation to test. Models above their bound are outlined in red.
    """
    from thermo_lens import laws

    df = rows_frame(table, "kleiber_plot")
    for c in (gain, n_layers):
        if c not in df.columns:
            raise ThermoLensViewError(f"kleiber_plot: no column {c!r}; the table has {list(df.columns)}")
    g = pd.to_numeric(df[gain], errors="coerce").to_numpy(float)
    L = pd.to_numeric(df[n_layers], errors="coerce").to_numpy(float)
    ok = np.isfinite(g) & np.isfinite(L) & (L > 0)
    if not ok.any():
        raise ThermoLensViewError(f"kleiber_plot: no model has a finite {gain!r} and positive {n_layers!r}")
    bound = np.where(ok, 10.0 ** (1.0 / np.where(L > 0, L, 1)), np.nan)
    labs = _labs(df)
    post = _post(df)
    has_ci = {"gain_ci_low", "gain_ci_high"} <= set(df.columns) and gain == "gain"
    fig = go.Figure()
    Ls = np.linspace(max(1.0, np.nanmin(L[ok]) * 0.8), np.nanmax(L[ok]) * 1.15, 200)
    fig.add_trace(go.Scatter(x=Ls, y=10.0 ** (1.0 / Ls), mode="lines", name="bound G_max = 10^(1/L)",
                             line=dict(color="#444", dash="dash"),
                             hovertemplate=hover(["L = %{x:.1f}: G_max = 10^(1/L) = %{y:.4f}",
                                                  "the paper's Kleiber bound (eq. 3): G_max^L = 10"]),
                             meta={"role": "bound"}))
    for lab in dict.fromkeys(labs):
        idx = np.array([i for i, lb in enumerate(labs) if lb == lab and ok[i]])
        if idx.size == 0:
            continue
        sub = df.iloc[idx]
        viol = g[idx] > bound[idx]
        err = None
        if has_ci:
            lo = pd.to_numeric(sub["gain_ci_low"], errors="coerce").to_numpy(float)
            hi = pd.to_numeric(sub["gain_ci_high"], errors="coerce").to_numpy(float)
            err = dict(type="data", symmetric=False, array=np.nan_to_num(hi - g[idx]),
                       arrayminus=np.nan_to_num(g[idx] - lo), thickness=1)
        texts = [
            "<br>".join([f"<b>{m}</b> ({lab})" + (" [post-LN]" if p else ""),
                         f"L = {int(l)}, {gain} = {v:.4f}, bound 10^(1/L) = {b:.4f}"
                         + (" — ABOVE the bound" if v > b else ""),
                         wrap(_definition_of(r), 90)] + ([wrap(POST_LN_NOTE, 90)] if p else []))
            for m, l, v, b, p, (_, r) in zip(sub["model"], L[idx], g[idx], bound[idx], post[idx], sub.iterrows())
        ]
        fig.add_trace(go.Scatter(
            x=L[idx], y=g[idx], mode="markers", name=lab, error_y=err, text=texts,
            hovertemplate="%{text}<extra></extra>",
            marker=dict(size=11, color=color_of(lab, labs),
                        symbol=[POST_LN_SYMBOL if p else "circle" for p in post[idx]],
                        line=dict(width=[2.5 if v else 0.5 for v in viol],
                                  color=["red" if v else "white" for v in viol])),
            meta={"role": "models", "lab": lab, "models": list(map(str, sub["model"])),
                  "post_ln": [bool(p) for p in post[idx]]},
        ))
    stats = ""
    depths = sorted({int(v) for v in L[ok]})
    if ok.sum() >= 3 and len(depths) == 1:  # nothing to correlate: say so once, in words
        stats = (f"gain vs L not tested: all {int(ok.sum())} models have depth L = {depths[0]} "
                 "(a correlation needs models of different depths)")
    elif ok.sum() >= 3:
        try:
            k = laws.kleiber(df[ok].reset_index(drop=True), gain=gain, n_layers=n_layers,
                             rho="rho" if ("rho" in df.columns or {"n_heads", "d_head"} <= set(df.columns)) else None)
            d = k.gain_vs_depth
            t = {x.name: x for x in k.tests}["gain vs depth L: Pearson"]
            stats = (f"gain vs L over {k.n} models: Pearson r = {d.statistic:.3f} (permutation p = {_fmt_p(t.pvalue)}"
                     f", {t.role} test), Spearman {d.spearman_statistic:.3f} (permutation p = "
                     f"{_fmt_p(d.spearman_pvalue_exact)}); {len(k.violations)} above the bound")
        except ValueError as e:  # the message names its function ("correlation: ..."): not repeated
            stats = "gain vs L not tested: " + re.sub(r"^\w+: ", "", str(e))
    else:
        stats = f"only {int(ok.sum())} model(s): correlations need at least 3"
    fig.add_hline(y=1.0, line=dict(color="#bbb", width=1, dash="dot"))
    base_layout(fig, f"Kleiber plot: {gain} vs depth L with the bound 10^(1/L)", stats)
    fig.update_xaxes(title="depth L (blocks)")
    if np.nanmax(L[ok]) / max(np.nanmin(L[ok]), 1) > 8:
        ticks = [v for v in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
                 if np.nanmin(L[ok]) / 1.5 <= v <= np.nanmax(L[ok]) * 1.5]
        fig.update_xaxes(type="log", tickvals=ticks, ticktext=[str(v) for v in ticks])
    fig.update_yaxes(title=gain)
    if post[ok].any():
        names = ", ".join(map(str, df["model"][post & ok]))
        note(fig, "⚠ post-LN: " + names + " — " + POST_LN_NOTE)
    return fig


# ---------------------------------------------------------------------------- heritage
def heritage_plot(table: ModelTable, gain: str = "gain", *, lab: str = "lab") -> go.Figure:
    """Per-lab mean gain +- SE (bars) with every model as a point (paper section 4.2, Fig. 2).

    Regimes and the per-lab exact test (lab vs rest, dampener vs not; Blaker's p with the odds-ratio
    interval that inverts it, and the p Holm-adjusted over all labs) come
    from :func:`thermo_lens.laws.heritage` on the table's ``regime`` column (else the CI columns,
    else the sign of ``gain - 1``). SE = SD (ddof=1) / sqrt(n); labs with one model have no bar.
    Needs at least 2 labs.
    """
    from thermo_lens import laws

    df = rows_frame(table, "heritage_plot")
    if lab not in df.columns:
        raise ThermoLensViewError(f"heritage_plot: no {lab!r} column: give each model a lab")
    if gain not in df.columns:
        raise ThermoLensViewError(f"heritage_plot: no column {gain!r}")
    work = df.copy()
    if gain != "gain" and "regime" in work.columns:
        work = work.drop(columns=["regime"])  # the recorded regime belongs to another gain column
    if gain != "gain":
        work = work.drop(columns=[c for c in ("ci_low", "ci_high") if c in work.columns])
    try:
        h = laws.heritage(work, lab=lab, gain=gain)
    except ValueError as e:
        raise ThermoLensViewError(f"heritage_plot: {e}") from None
    labs_df = h.labs
    labs = list(labs_df["lab"])
    fig = go.Figure()
    mean = labs_df["mean_gain"].to_numpy(float)
    # Bars grow from G = 1 (up: expanding labs, down: dampening labs); y + base is the lab mean.
    fig.add_trace(go.Bar(
        x=labs, y=mean - 1.0, base=1.0, name="lab mean ± SE",
        error_y=dict(type="data", array=np.nan_to_num(labs_df["se"].to_numpy(float)), visible=True),
        marker_color=[color_of(lb, labs) for lb in labs], opacity=0.55,
        customdata=np.stack([labs_df["n"], labs_df["n_dampener"], labs_df["se"], labs_df["sd"],
                             labs_df["pvalue"], labs_df["pvalue_holm"], mean, labs_df["or_conditional"],
                             labs_df["or_ci_low"], labs_df["or_ci_high"]], axis=1),
        hovertemplate=hover(["<b>%{x}</b>: mean %{customdata[6]:.4f} ± %{customdata[2]:.3g} (SE; SD %{customdata[3]:.3g}, ddof=1)",
                             "%{customdata[1]:.0f} of %{customdata[0]:.0f} models dampeners",
                             "Fisher exact test, Blaker two-sided p (lab vs rest, dampener vs not): p = %{customdata[4]:.3g}, "
                             "Holm over labs %{customdata[5]:.3g}; odds ratio %{customdata[7]:.3g} "
                             "[%{customdata[8]:.3g}, %{customdata[9]:.3g}] (inverts the same test)",
                             f"gain column {gain!r}; regimes from {h.regime_source}"]),
        meta={"role": "lab_mean", "gain": gain},
    ))
    regimes = laws._regimes(work, "regime", gain, "heritage_plot")[0]
    post = _post(df)
    sym = {"expander": "triangle-up", "dampener": "triangle-down", "neutral": "circle"}
    fig.add_trace(go.Scatter(
        x=df[lab].astype(str), y=pd.to_numeric(df[gain], errors="coerce"), mode="markers", name="models",
        marker=dict(color="black", size=9, symbol=[POST_LN_SYMBOL if p else sym.get(r, "circle")
                                                   for r, p in zip(regimes, post)]),
        text=["<br>".join([f"<b>{m}</b>: {gain} = {v:.4f}, regime {r}" + (" [post-LN]" if p else ""),
                           wrap(_definition_of(row), 90)])
              for m, v, r, p, (_, row) in zip(df["model"], pd.to_numeric(df[gain], errors="coerce"), regimes, post,
                                              df.iterrows())],
        hovertemplate="%{text}<extra></extra>", meta={"role": "models"},
    ))
    fig.add_hline(y=1.0, line=dict(color="#888", width=1, dash="dot"))
    base_layout(fig, f"Training heritage: {gain} by lab (mean ± SE)",
                "▲ expander, ▼ dampener, ● neutral (from the 95% CI of each model, never from the lab name)")
    fig.update_yaxes(title=gain)
    return fig


def hierarchy_plot(table: ModelTable, gain: str = "gain", *, by: str = "lab") -> go.Figure:
    """Groups (labs, families) ranked by mean gain with 95% t-CI (paper abstract's hierarchy).

    From :func:`thermo_lens.laws.hierarchy`; CI NaN (not drawn) for groups of one model.
    """
    from thermo_lens import laws

    df = rows_frame(table, "hierarchy_plot")
    try:
        h = laws.hierarchy(df, by=by, gain=gain)
    except ValueError as e:
        raise ThermoLensViewError(f"hierarchy_plot: {e}") from None
    gdf = h.groups
    mean = gdf["mean"].to_numpy(float)
    lo, hi = gdf["ci_low"].to_numpy(float), gdf["ci_high"].to_numpy(float)
    fig = go.Figure(go.Scatter(
        x=mean, y=gdf["group"].astype(str), mode="markers", marker=dict(size=12, color="#1f77b4"),
        error_x=dict(type="data", symmetric=False, array=np.nan_to_num(hi - mean),
                     arrayminus=np.nan_to_num(mean - lo)),
        customdata=np.stack([gdf["rank"], gdf["n"], lo, hi, gdf["se"]], axis=1),
        hovertemplate=hover(["<b>%{y}</b> (rank %{customdata[0]:.0f}, n = %{customdata[1]:.0f})",
                             "mean %{x:.4f}, SE %{customdata[4]:.3g}",
                             "95% t-CI [%{customdata[2]:.4f}, %{customdata[3]:.4f}] (NaN for n = 1)",
                             f"gain column {gain!r}"]),
        meta={"role": "groups", "by": by},
    ))
    fig.add_vline(x=1.0, line=dict(color="#888", width=1, dash="dot"))
    base_layout(fig, f"Hierarchy: groups ({by}) ranked by mean {gain}", h.summary().splitlines()[0][:160],
                height=max(300, 120 + 40 * len(gdf)), bottom=60)
    fig.update_xaxes(title=f"mean {gain} (95% CI)")
    fig.update_yaxes(autorange="reversed")
    return fig


# ---------------------------------------------------------------------------- reference overlay
def reference_overlay(table: ModelTable, metric: str = "A", *, x: str = "n_layers") -> go.Figure:
    """Your models on top of the paper's published models (``thermo_lens.paper.reference``).

    Args:
        table: your models (DataFrame / ThermoProfiles / GainResults, one row per model) with the
            thermo-lens summary matching ``metric`` (``penultimate_gain`` for A, ``last_block_gain``
            for B) and the definition columns ``token_scope``, ``prepend_bos``, ``dtype``.
        metric: the paper's gain definition (``thermo_lens.paper.PAPER_METRICS``): ``"A"`` (its
            NO_FINAL_LN penultimate-block gain, 23 models incl. the Pythia sweep and lab survey),
            ``"B"`` (true last block, hook-based, the abstract's values), ``"alltokens"``,
            ``"emb_to_block0"``.
        x: x axis column, ``"n_layers"`` or ``"rho"``.

    The figure states the paper's definition, yours, and whether they are like for like: the same
    summary, the same token scope and the same BOS mode (``"tokenizer"``, the paper's HF
    protocol). Norms are float32 in thermo-lens and fp16/bf16 in the paper (a precision
    difference, also stated). When they differ, your points are drawn hollow and the title says
    "NOT like for like".
    """
    from thermo_lens.paper import reference
    from thermo_lens.paper.metrics import PAPER_METRICS

    if metric not in PAPER_METRICS:
        raise ThermoLensViewError(f"reference_overlay: unknown paper metric {metric!r}; choose one of "
                                  f"{', '.join(map(repr, PAPER_METRICS))}")
    if x not in ("n_layers", "rho"):
        raise ThermoLensViewError(f"reference_overlay: x must be 'n_layers' or 'rho', got {x!r}")
    spec = PAPER_METRICS[metric]
    ref = reference.gains(spec.reference_measurement)
    df = rows_frame(table, "reference_overlay")
    col = spec.summary
    if col not in df.columns:
        raise ThermoLensViewError(
            f"reference_overlay: your table has no {col!r} column (the thermo-lens summary equal to the "
            f"paper's metric {metric}); pass ThermoProfiles, GainResults or a profiles frame")
    if x == "rho" and "rho" not in df.columns and {"n_heads", "d_head"} <= set(df.columns):
        df["rho"] = pd.to_numeric(df["n_heads"]) / pd.to_numeric(df["d_head"])
    fig = go.Figure()
    rlabs = [str(v) for v in ref["lab"].fillna("unknown lab")]
    ref_def = f"paper metric {metric} ({spec.reference_measurement}): {spec.paper_definition}"
    for lab in dict.fromkeys(rlabs):
        sub = ref[[lb == lab for lb in rlabs]]
        fig.add_trace(go.Scatter(
            x=pd.to_numeric(sub[x], errors="coerce"), y=sub["gain"], mode="markers", name=f"paper: {lab}",
            legendgroup="paper", marker=dict(size=8, color="#b0b0b0", line=dict(color=color_of(lab, rlabs), width=2)),
            text=["<br>".join([f"<b>{m}</b> ({lab}), paper", f"gain {v:.4f} (SD {s:.3g}, {sd_note}), n = {n}",
                               f"{dt}, {ts}", wrap(ref_def, 90)])
                  for m, v, s, n, dt, ts, sd_note in zip(
                      sub["model"], sub["gain"], sub["std"].fillna(np.nan), sub["n_prompts"].astype("object"),
                      sub["dtype"].astype("object"), sub["token_scope"].astype("object"),
                      ["ddof=0" if d == 0 else "ddof unknown" for d in sub["std_ddof"].fillna(-1)])],
            hovertemplate="%{text}<extra></extra>", meta={"role": "paper", "lab": lab},
        ))
    # Like-for-like check, model by model.
    same = []
    for _, r in df.iterrows():
        scope_ok = str(r.get("token_scope")) == spec.token_scope
        bos_ok = str(r.get("prepend_bos")) == str(spec.prepend_bos)
        same.append((scope_ok and bos_ok, scope_ok, bos_ok))
    all_same = all(s[0] for s in same)
    post = _post(df)
    xv = pd.to_numeric(df[x], errors="coerce") if x in df.columns else pd.Series(np.nan, index=df.index)
    yv = pd.to_numeric(df[col], errors="coerce")
    text = []
    for (_, r), (ok, scope_ok, bos_ok), p in zip(df.iterrows(), same, post):
        why = []
        if not scope_ok:
            why.append(f"token scope {r.get('token_scope')} (paper: {spec.token_scope})")
        if not bos_ok:
            why.append(f"{bos_text(r.get('prepend_bos'))} (paper: {bos_text(spec.prepend_bos)})")
        text.append("<br>".join([f"<b>{r['model']}</b> (yours)" + (" [post-LN]" if p else ""),
                                 f"{col} = {float(yv[_]):.4f}",
                                 wrap(_definition_of(r), 90),
                                 "like for like with the paper" if ok else "NOT like for like: " + "; ".join(why),
                                 "norms float32 here vs fp16/bf16 in the paper"]))
    # One trace (and legend entry) per model of yours: names in the legend and the hover, never as
    # text on the plot, where models of one depth and similar gain would print on top of each other.
    # Models sharing an x value are spread a little sideways (the hover gives the true value).
    names = [str(m) for m in df["model"]]
    shift = np.ones(len(df))
    xs_arr = xv.to_numpy(float)
    for val in {v for v in xs_arr if np.isfinite(v)}:
        idx = [i for i, v in enumerate(xs_arr) if v == val]
        if len(idx) > 1:
            for k, i in enumerate(idx):
                shift[i] = 1 + 0.04 * (k - (len(idx) - 1) / 2)
    for i, (name, (ok, _, _)) in enumerate(zip(names, same)):
        xi = xs_arr[i] * shift[i] if x == "n_layers" else xs_arr[i] + (shift[i] - 1) * 0.05
        fig.add_trace(go.Scatter(
            x=[xi], y=[yv.iloc[i]], mode="markers", name=f"{name} (yours{'' if ok else ', not like for like'})",
            legendgroup="yours", hovertext=[text[i]], hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(size=15, symbol="star" if ok else "star-open", color=color_of(name, names),
                        line=dict(color=color_of(name, names) if not ok else "black", width=2 if not ok else 1)),
            meta={"role": "user", "model": name, "summary": col, "like_for_like": [bool(ok)],
                  "x": float(xs_arr[i]) if np.isfinite(xs_arr[i]) else None},
        ))
    fig.add_hline(y=1.0, line=dict(color="#888", width=1, dash="dot"))
    verdict = ("LIKE FOR LIKE (same summary, token scope and BOS mode; norms float32 vs paper fp16)" if all_same else
               "NOT like for like: some of your models used another token scope / BOS mode (hollow stars)")
    base_layout(fig, f"Your models among the paper's ({len(ref)} models, metric {metric} = {col}): {verdict.split(' (')[0].split(':')[0]}",
                wrap(f"{verdict}. Paper: {spec.paper_definition}", 150), height=520, bottom=150)
    fig.update_xaxes(title="depth L" if x == "n_layers" else "rho = n_heads / d_head")
    if x == "n_layers":
        allx = np.concatenate([pd.to_numeric(ref["n_layers"], errors="coerce").to_numpy(float), xv.to_numpy(float)])
        allx = allx[np.isfinite(allx) & (allx > 0)]
        ticks = [v for v in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
                 if allx.size and allx.min() / 1.5 <= v <= allx.max() * 1.5]
        fig.update_xaxes(type="log", tickvals=ticks, ticktext=[str(v) for v in ticks])
    fig.update_yaxes(title=f"gain ({col})")
    dtypes = "/".join(dict.fromkeys(str(d) for d in ref["dtype"].dropna())) or "unknown dtype"
    scopes = "/".join(dict.fromkeys(str(d) for d in ref["token_scope"].dropna())) or spec.token_scope
    paper_note = PAPER_DEFINITION_NOTE.format(measurement=spec.reference_measurement,
                                              definition=spec.paper_definition, scope=scopes, dtypes=dtypes)
    note(fig, wrap(f"{paper_note}. Your {col} matches it only with token_scope={spec.token_scope!r} and "
                   f"prepend_bos={spec.prepend_bos!r}.", 170), y=-0.16, size=10)
    return fig
