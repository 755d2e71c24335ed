"""Sheaf views: the factored Laplacian of one head (M, spectrum, restriction maps) and L*.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", section 5 and appendix D;
``thermo_lens.definitions`` §3 and §4. The Laplacian is ``L = M (x) W_V W_V^T`` with restriction maps
``rho_ij = sqrt(c_ij) W_V`` (``c = A`` directed, ``(A + A^T)/2`` symmetrized); nothing here forms
the ``n d_model`` square matrix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

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

if TYPE_CHECKING:
    from thermo_lens.measures.depth import LStarResult
    from thermo_lens.measures.profile import ThermoProfile
    from thermo_lens.measures.sheaf.operator import LayerSheafLaplacian, SheafLaplacian
    from thermo_lens.views._common import OneOrMany

__all__ = ["sheaf_plot", "restriction_norms", "l_star_plot", "eq6_beyond_depth"]

#: Largest number of eigenvalues drawn; larger spectra are shown at evenly spaced ranks.
MAX_EIGENVALUES = 2000


def restriction_norms(laplacian: SheafLaplacian, norm: str = "spectral") -> np.ndarray:
    """``[n, n]`` norms ``||rho_ij||`` of the restriction maps ``rho_ij = sqrt(c_ij) W_V`` (0 on the diagonal).

    ``norm="spectral"``: ``||rho_ij||_2 = sqrt(c_ij) sigma_max(W_V)``; ``"frobenius"``:
    ``sqrt(c_ij) ||W_V||_F``. Computed from the factors (one SVD of ``W_V``), never per map.
    """
    if norm not in ("spectral", "frobenius"):
        raise ThermoLensViewError(f"restriction_norms: norm must be 'spectral' or 'frobenius', got {norm!r}")
    W = laplacian.W_V.double()
    scale = torch.linalg.matrix_norm(W, ord=2 if norm == "spectral" else "fro")
    coef = torch.sqrt(laplacian.edge_coefficients.double())
    return to_numpy(coef * scale)


def _tokens(L: SheafLaplacian) -> list[str]:
    toks = list(L.tokens) if L.tokens else [str(i) for i in range(L.n)]
    # Byte-level BPE / SentencePiece markers for a leading space or newline, for display only.
    toks = [t.replace("\u0120", " ").replace("\u2581", " ").replace("\u010a", "\\n") for t in toks]
    # Unique tick labels (plotly merges equal category labels): prefix the position.
    return [f"{i}:{t}" for i, t in enumerate(toks)]


@register_plot("SheafLaplacian")
def sheaf_plot(laplacian: SheafLaplacian | LayerSheafLaplacian, *, head: int | None = None, norm: str = "spectral",
               max_eigenvalues: int = MAX_EIGENVALUES) -> go.Figure:
    """One head's sheaf Laplacian: ``M`` heatmap, nonzero spectrum, restriction-map norms.

    Args:
        laplacian: a :class:`~thermo_lens.measures.sheaf.SheafLaplacian` (one head), or a
            :class:`~thermo_lens.measures.sheaf.LayerSheafLaplacian` with ``head`` given.
        head: which head of a layer-level Laplacian.
        norm: restriction-map norm, ``"spectral"`` (``sqrt(c_ij) sigma_max(W_V)``) or ``"frobenius"``.
        max_eigenvalues: cap on plotted eigenvalues (evenly spaced ranks beyond it; stated in the title).

    Panels: top left the token factor ``M`` (``M_ii = sum_{j != i} c_ij``, ``M_ij = -sqrt(c_ij c_ji)``);
    top right ``||rho_ij||`` per token pair ``(i, j)``; below, across the width, the nonzero
    eigenvalues of ``L = M (x) W_V W_V^T`` by rank, log scale, with the kernel dimension and
    spectral-gap reason in the hover.
    """
    from thermo_lens.measures.sheaf.operator import LayerSheafLaplacian

    if isinstance(laplacian, LayerSheafLaplacian):
        if head is None:
            raise ThermoLensViewError(
                f"sheaf_plot: this is a layer-level Laplacian over {laplacian.n_heads} heads; pass "
                "head=h (or index it: layer_laplacian[h])")
        laplacian = laplacian[head]
    elif head is not None and getattr(laplacian, "head", None) not in (None, head):
        raise ThermoLensViewError(f"sheaf_plot: head={head} but this Laplacian is head {laplacian.head}")
    check_type(laplacian, "SheafLaplacian", "sheaf_plot",
               "Pass thermo_lens.measures.sheaf.sheaf_laplacian(model, prompt, layer, head).")
    L = laplacian
    M = to_numpy(L.M)
    ticks = _tokens(L)
    ev = to_numpy(L.nonzero_eigenvalues())[::-1]  # descending
    total = ev.size
    ranks = np.arange(1, total + 1)
    if total > max_eigenvalues:
        keep = np.unique(np.linspace(0, total - 1, max_eigenvalues).round().astype(int))
        ev, ranks = ev[keep], ranks[keep]
    gap = L.spectral_gap()
    rn = restriction_norms(L, norm)
    where = ", ".join(x for x in (f"layer {L.layer}" if L.layer is not None else "",
                                  f"head {L.head}" if L.head is not None else "") if x)
    model = L.model or {}
    settings = settings_text(prepend_bos=L.prepend_bos, dtype=model.get("dtype"), weights=model.get("weights"),
                             post_ln=model.get("post_ln"), norms="float64 factors")
    conv = L.convention
    cdef = "c_ij = A_ij (directed)" if conv == "directed" else "c_ij = (A_ij + A_ji)/2 (symmetrized)"
    # the two token x token maps side by side, the spectrum below across the width: three panels in
    # a row left each too narrow for its token labels and colour bar in a narrow window
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], horizontal_spacing=0.18,
                        vertical_spacing=0.2, row_heights=[0.58, 0.42], subplot_titles=(
        "token factor M", f"restriction-map norms ||rho_ij||_{'2' if norm == 'spectral' else 'F'}",
        f"nonzero spectrum of L ({total} of {L.size})" + (f", {ev.size} shown" if ev.size < total else "")))
    top = fig.layout.yaxis.domain
    bar = dict(len=top[1] - top[0], y=(top[0] + top[1]) / 2, yanchor="middle", thickness=10, xanchor="left")
    fig.add_trace(go.Heatmap(
        z=M, x=ticks, y=ticks, colorscale="RdBu_r", zmid=0.0, colorbar=dict(x=fig.layout.xaxis.domain[1] + 0.01, **bar),
        hovertemplate=hover(["M[%{y}, %{x}] = %{z:.4g}",
                             "M_ii = sum_{j != i} c_ij, M_ij = -sqrt(c_ij c_ji)", cdef]),
        meta={"role": "M"}), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=ranks, y=ev, mode="markers+lines", marker=dict(size=4), line=dict(width=1),
        hovertemplate=hover(["rank %{x}: lambda = %{y:.4g}",
                             "eig(M (x) W_V W_V^T) = mu_a(M) * sigma_k(W_V)^2 (from the factors)",
                             f"dim ker L = {gap.kernel_dim}; lambda_2 = {gap.value:.3g}",
                             wrap(gap.reason, 90)]),
        meta={"role": "spectrum", "kernel_dim": gap.kernel_dim}, showlegend=False), row=2, col=1)
    fig.add_trace(go.Heatmap(
        z=rn, x=ticks, y=ticks, colorscale="Viridis", colorbar=dict(x=1.01, **bar),
        hovertemplate=hover(["||rho_{%{y} -> %{x}}|| = %{z:.4g}",
                             f"rho_ij = sqrt(c_ij) W_V, {cdef}; map token i's stalk R^d_model -> edge {{i,j}} R^d_head",
                             "||rho_ij||_2 = sqrt(c_ij) sigma_max(W_V)" if norm == "spectral"
                             else "||rho_ij||_F = sqrt(c_ij) ||W_V||_F"]),
        meta={"role": "restriction_norms", "norm": norm}), row=1, col=2)
    for c in (1, 2):
        fig.update_yaxes(autorange="reversed", row=1, col=c, title="token i" if c == 1 else None,
                         tickfont=dict(size=9))
        fig.update_xaxes(row=1, col=c, title="token j", tickfont=dict(size=9), tickangle=-90)
    pos = ev[np.isfinite(ev) & (ev > 0)]
    vals, labels = log_ticks(float(pos.min()), float(pos.max())) if pos.size else ([], [])
    fig.update_yaxes(type="log", row=2, col=1, title="eigenvalue",
                     **(dict(tickvals=vals, ticktext=labels) if vals else {}))
    fig.update_xaxes(row=2, col=1, title="rank (descending)")
    prompt = (L.prompt or "")[:60]
    base_layout(fig, f"Sheaf Laplacian L = M (x) W_V W_V^T{', ' + where if where else ''}" +
                (f" — {model.get('name')}" if model.get("name") else ""),
                wrap(f"{conv} convention; prompt {prompt!r}; {settings}; trace {L.trace():.5g} = "
                     f"(n - sum_i A_ii) ||W_V||_F^2", 150), height=860, bottom=90)
    gap_note = wrap(f"spectral gap lambda_2 = {gap.value:.3g}: {gap.reason}", 150)
    n_lines = gap_note.count("<br>") + 1
    # below the spectrum's axis title, in pixels: the margin grows with the note
    note(fig, gap_note, y=0.0, size=10)
    fig.layout.annotations[-1].update(yshift=-60)
    fig.update_layout(margin=dict(b=80 + 14 * n_lines), height=fig.layout.height + 14 * n_lines)
    return fig


# ---------------------------------------------------------------------------- L*
def _lstar_arrays(r: LStarResult) -> dict[str, Any]:
    src = r.source or {}
    model = src.get("model") or {}
    trace_def = src.get("trace_definition") or "layer trace as given"
    bos = src.get("prepend_bos")
    settings = settings_text(prepend_bos=bos if bos is not None else None, dtype=model.get("dtype"),
                             weights=model.get("weights"), post_ln=model.get("post_ln"), norms=None)
    err = ""
    if np.isfinite(r.empirical):
        err = (f"error: APE |pred - emp| / emp = {r.ape:.3g}; paper |pred - emp| / L = {r.paper_error:.3g}")
    paper = not getattr(r, "paper_rule", True)  # the paper's rule beside a non-paper default
    paper_value = float(getattr(r, "paper_rule_empirical", float("nan"))) if paper else float("nan")
    return {
        "trace": to_numpy(r.layer_trace),
        "empirical": float(r.empirical),
        "paper_rule": paper_value,
        "paper_rule_definition": ("argmax_abs_gradient (the paper's rule, appendix E): argmax_l |dT/dl| with "
                                  "np.gradient (one-sided differences at the ends)"
                                  + (f"; note: {r.paper_rule_note}" if getattr(r, "paper_rule_note", "") else "")),
        "predicted": float(r.predicted),
        "post_ln": bool(model.get("post_ln")),
        "trace_definition": f"T_l = sum over heads, mean over {src.get('n_prompts', '?')} prompts, of {trace_def}"
                            + (f"; {settings}" if settings else ""),
        "empirical_definition": f"{r.variant}: {r.definition}; {r.layer_indexing}"
                                + (f"; note: {r.note}" if r.note else ""),
        "predicted_definition": f"{r.predicted_definition}, L = {r.n_layers}, H = {r.n_heads}",
        "error_text": err,
    }


def eq6_beyond_depth(r: LStarResult) -> bool:
    """Whether eq. 6 predicts an L* past the model's last block (``predicted > n_layers``): then there
    is no prediction to test, and neither the figure nor the report's text compares it."""
    return bool(np.isfinite(r.predicted) and r.predicted > r.n_layers)


@register_plot("LStarResult")
def l_star_plot(results: OneOrMany[LStarResult | ThermoProfile], names: Sequence[str] | None = None, *, x: str = "layer") -> go.Figure:
    """Layer trace ``T_l`` per layer with the empirical and predicted L* marked, models overlaid.

    Args:
        results: an :class:`~thermo_lens.measures.depth.LStarResult`, a list / dict of them, or
            ThermoProfile(s) (their ``.l_star``).
        names: display names.
        x: ``"layer"`` (0-based block index) or ``"relative_depth"`` (``l / L``).

    Definition (``thermo_lens.definitions`` §4): ``T_l`` = sum over heads of the sheaf trace, mean over
    prompts; empirical L* by the result's named variant (default ``steepest_step``: the deeper layer of
    the largest ``|T_{k+1} - T_k|``), with the paper's rule (``argmax_l |dT/dl|``, ``np.gradient``) marked
    beside it when the variant is another; predicted (paper eq. 6) ``L* = L (0.11 + 0.012 L + 4.9 / H)``,
    drawn only where it falls inside the model (:func:`eq6_beyond_depth`; a note names the models left out).
    """
    if x not in ("layer", "relative_depth"):
        raise ThermoLensViewError(f"l_star_plot: x must be 'layer' or 'relative_depth', got {x!r}")
    pairs = named(results, "l_star", "LStarResult", names)
    labels = [n for n, _ in pairs]
    fig = go.Figure()
    any_post = False
    beyond: dict[tuple[int, int, float], list[str]] = {}
    for name, r in pairs:
        check_type(r, "LStarResult", "l_star_plot",
                   "Pass thermo_lens.measures.depth.l_star_from_traces(...) results (or ThermoProfiles).")
        d = _lstar_arrays(r)
        L = d["trace"].shape[0]
        layers = np.arange(L)
        scale = ((lambda v, L=L: np.asarray(v, dtype=float) / L) if x == "relative_depth"
                 else (lambda v: np.asarray(v, dtype=float)))
        color = color_of(name, labels)
        post = d["post_ln"]
        any_post |= post
        label = name + (POST_LN_SUFFIX if post else "")
        fig.add_trace(go.Scatter(
            x=scale(layers), y=d["trace"], mode="lines+markers", name=label, legendgroup=name,
            line=dict(color=color, dash=POST_LN_DASH if post else "solid"),
            marker=dict(symbol=POST_LN_SYMBOL if post else "circle"), customdata=layers,
            hovertemplate=hover([f"<b>{label}</b>", "layer %{customdata}", "T_l = %{y:.5g}",
                                 wrap(d["trace_definition"], 90)]),
            meta={"role": "layer_trace", "model": name, "post_ln": post},
        ))
        for kind, value, symbol, text in (("empirical", d["empirical"], "star", d["empirical_definition"]),
                                          ("paper's rule", d["paper_rule"], "diamond-open",
                                           d["paper_rule_definition"]),
                                          ("predicted", d["predicted"], "x", d["predicted_definition"])):
            if value is None or not np.isfinite(value):
                continue
            if kind == "predicted" and eq6_beyond_depth(r):
                beyond.setdefault((r.n_layers, r.n_heads, float(value)), []).append(name)
                continue
            y = float(np.interp(value, layers, d["trace"]))
            fig.add_trace(go.Scatter(
                x=scale([value]), y=[y], mode="markers", name=f"{name} L* {kind} = {value:.3g}",
                legendgroup=name, marker=dict(color=color, symbol=symbol, size=15,
                                              line=dict(width=1, color="black")),
                hovertemplate=hover([f"<b>{name}</b>: {kind} L* = {value:.4g}", wrap(text, 90)] +
                                    ([wrap(d["error_text"], 90)] if d["error_text"] else [])),
                meta={"role": "l_star_paper_rule" if kind == "paper's rule" else f"l_star_{kind}", "model": name,
                      "value": float(value)},
            ))
    drawn = any((t.meta or {}).get("role") == "l_star_predicted" for t in fig.data)
    paper = any((t.meta or {}).get("role") == "l_star_paper_rule" for t in fig.data)
    sub = "T_l = sum over heads of Tr L^(l,h), mean over prompts; ★ empirical L* (its rule in the hover; default steepest_step)"
    if paper:
        sub += ", ◇ the paper's rule argmax_abs_gradient beside it"
    if drawn:
        sub += ", ✕ predicted L* = L (0.11 + 0.012 L + 4.9 / H) (paper eq. 6)"
    if beyond:
        where = "; ".join(f"{', '.join(ks)} (L = {L}, H = {H}: {pred:.3g})" for (L, H, pred), ks in beyond.items())
        sub = wrap(f"{sub}. Eq. 6 not drawn where it predicts past the last block: {where}; no prediction to test",
                   140)
    base_layout(fig, f"L*: layer trace T_l with {'empirical and predicted' if drawn else 'the empirical'} depth of "
                "maximal trace change", sub)
    fig.update_xaxes(title="layer l (block index, 0-based)" if x == "layer" else "relative depth l / L")
    fig.update_yaxes(title="T_l")
    if any_post:
        note(fig, "⚠ " + POST_LN_NOTE)
    return fig
