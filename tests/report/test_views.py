"""Views: every figure's traces carry the result's numbers (checked against independent
computations), hover text names the definition, post-LN models are flagged, bad input is refused
with a clear error. The circuitsvis panel is offline and its numbers match the model's own
activations."""

import json
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from scipy import stats

from thermo_lens import laws, views
from thermo_lens.paper import reference
from thermo_lens.measures.anisotropy import anisotropy_from_collected
from thermo_lens.measures.depth import l_star_from_traces
from thermo_lens.measures.gain import gain_from_collected
from thermo_lens.core.passes import collect
from thermo_lens.measures.anisotropy import anisotropy
from thermo_lens.measures.sheaf.traces import attention_diagonal
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.model import ModelView
from thermo_lens.measures.robustness import robustness_from_gain
from thermo_lens.measures.sheaf import sheaf_laplacian, traces_from_collected
from thermo_lens.measures.spectral import spectral_signature
from thermo_lens.views import ThermoLensViewError
from thermo_lens.core.tokens import tokenize

PROMPTS = ["The capital of France is Paris", "Water boils at one hundred degrees",
           "the early bird catches the worm", "Colorless green ideas sleep furiously"]
CATEGORIES = ["Factual", "Factual", "Cliche", "Nonsense"]


@pytest.fixture(scope="module")
def measured(bridge):
    """Gain, anisotropy, traces, L*, spectral signature of three fixture models, one pass each."""
    out = {}
    for arch in ("gpt2", "opt_postln", "llama_gqa"):
        c = collect(bridge(arch), PROMPTS, [residual_norms, anisotropy, attention_diagonal], prepend_bos=True)
        t = traces_from_collected(c)
        out[arch] = dict(gain=gain_from_collected(c), anisotropy=anisotropy_from_collected(c), traces=t,
                         l_star=l_star_from_traces(t), spectral=spectral_signature(bridge(arch)))
    return out


def _by_role(fig, role):
    return [t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("role") == role]


def doubled_labels(text: str) -> list[str]:
    """Phrases said twice in a row in a figure's text: "no correlation: correlation: ...", "the the"."""
    plain = re.sub(r"<[^>]+>", " ", text or "")
    return [m.group(0) for m in re.finditer(r"\b([A-Za-z][\w ]*?): (?:[\w ]*? )?\1:", plain)] + \
        [m.group(0) for m in re.finditer(r"\b([A-Za-z]{2,}) \1\b", plain)]


def _figure_texts(fig) -> list[str]:
    """Title (with subtitle), axis titles, annotations and trace names of a figure."""
    lay = fig.layout
    out = [lay.title.text or ""] + [a.text or "" for a in lay.annotations]
    out += [ax.title.text or "" for ax in (lay[k] for k in lay if k.startswith(("xaxis", "yaxis")))]
    return out + [t.name or "" for t in fig.data]


def _t_ci(values):
    """Independent per-column mean and 95% t-CI (scipy), ddof=1."""
    v = np.asarray(values, dtype=np.float64)
    m, se = v.mean(0), v.std(0, ddof=1) / np.sqrt(v.shape[0])
    lo, hi = stats.t.interval(0.95, v.shape[0] - 1, loc=m, scale=se)
    return m, lo, hi


# ---------------------------------------------------------------------------- dynamics
def test_layer_dynamics_traces_equal_per_layer_mean_and_ci(measured):
    gains = {a: measured[a]["gain"] for a in ("gpt2", "opt_postln")}
    fig = views.layer_dynamics(gains, split_first=False)
    assert isinstance(fig, go.Figure)
    means, bands = _by_role(fig, "mean"), _by_role(fig, "ci_band")
    assert [t.meta["model"] for t in means] == ["gpt2", "opt_postln"] and len(bands) == 2
    for tr, band, arch in zip(means, bands, gains):
        g = gains[arch]
        m, lo, hi = _t_ci(g.block_gain.double().numpy())
        np.testing.assert_allclose(tr.x, np.arange(g.n_layers))  # 0-based block index, as every frame
        np.testing.assert_allclose(tr.y, m, rtol=1e-6)
        L = g.n_layers  # band polygon: upper edge forward, lower edge backward
        np.testing.assert_allclose(band.y[:L], hi, rtol=1e-6)
        np.testing.assert_allclose(band.y[L:], lo[::-1], rtol=1e-6)
        for words in ("||resid_post_layer|| / ||resid_pre_layer||", "l = layer + 1", "token scope all_but_first", "BOS prepended",
                      "float32 norms", "raw weights", "ddof=1"):
            assert words in tr.hovertemplate, words
    # the post-LN model is flagged: name, dashed line, open diamonds, and a note on the figure
    post = means[1]
    assert "[post-LN]" in post.name and post.line.dash == "dash" and post.marker.symbol == "diamond-open"
    assert "post-LN" in post.hovertemplate and "LayerNorm" in post.hovertemplate
    assert means[0].line.dash == "solid" and "[post-LN]" not in means[0].name
    assert any("post-LN" in a.text for a in fig.layout.annotations)
    assert not any("post-LN" in (a.text or "") for a in views.layer_dynamics(gains["gpt2"]).layout.annotations)


def test_layer_dynamics_block_zero_in_its_own_panel(measured):
    """Block 0 (often 10-50x) gets its own panel and axis; the other blocks keep theirs, with
    readable log ticks when they need a log axis; every mark has a legend entry."""
    g = measured["gpt2"]["gain"]
    m, lo, hi = _t_ci(g.block_gain.double().numpy())
    fig = views.layer_dynamics({"gpt2": g}, split_first=True)
    (first,), (rest,) = _by_role(fig, "first_block"), _by_role(fig, "mean")
    np.testing.assert_allclose(first.y, m[:1], rtol=1e-6)
    np.testing.assert_allclose(rest.x, np.arange(1, g.n_layers))
    np.testing.assert_allclose(rest.y, m[1:], rtol=1e-6)
    assert first.xaxis == "x" and rest.xaxis == "x2"  # two panels, two y axes
    np.testing.assert_allclose(np.array(first.error_y.array) + first.y, hi[:1], rtol=1e-6)
    legend = {t.name for t in fig.data if t.showlegend is not False}
    assert {"gpt2", "95% t-CI band (shaded)", "gain = 1 (neither expands nor dampens)"} <= legend
    # no unexplained marks: bands are shaded areas (no vertex dots), every marker's group has an entry
    assert all(t.mode == "lines" for t in _by_role(fig, "ci_band"))
    shown = {t.legendgroup for t in fig.data if t.showlegend is not False}
    assert all(t.legendgroup in shown for t in fig.data if "markers" in (t.mode or ""))
    # the right panel's y title is in its panel title, not in the narrow gap beside block 0's panel
    assert fig.layout.yaxis2.title.text is None
    assert any((a.text or "").startswith("blocks 1 and after: block gain ||resid_post|| / ||resid_pre||")
               and a.xanchor == "left" and a.x == fig.layout.xaxis2.domain[0] for a in fig.layout.annotations)
    # auto: split only when block 0 dominates
    m0 = float(np.asarray(m)[0])
    split = m0 > views.dynamics.SPLIT_FIRST_RATIO * float(np.abs(m[1:]).max())
    assert bool(_by_role(views.layer_dynamics(g), "first_block")) == split


def test_log_ticks_read_1_2_5():
    from thermo_lens.views._common import log_ticks

    assert log_ticks(0.9, 20)[1] == ["1", "2", "5", "10", "20"]
    assert log_ticks(0.3, 3)[1] == ["0.5", "1", "2"]
    assert log_ticks(1.0, 1.5) == ([], [])  # narrow: plotly's own ticks


def test_layer_dynamics_relative_depth_and_profile_input(measured):
    g = measured["llama_gqa"]["gain"]
    fig = views.layer_dynamics([g], names=["mine"], x="relative_depth", show_ci=False, log_y=False)
    (tr,) = _by_role(fig, "mean")
    np.testing.assert_allclose(tr.x, np.arange(1, 4) / 3)
    assert tr.name == "mine" and not _by_role(fig, "ci_band") and fig.layout.yaxis.type != "log"

    class Prof:  # anything with .meta and .gain is unwrapped like a ThermoProfile
        meta = {"name": "prof"}
        gain = g
    (tr2,) = _by_role(views.layer_dynamics(Prof()), "mean")
    assert tr2.meta["model"] == "prof"
    np.testing.assert_allclose(tr2.y, tr.y)


def test_anisotropy_plot_equals_nanmean_over_prompts(measured):
    a = measured["gpt2"]["anisotropy"]
    fig = views.anisotropy_plot({"gpt2": a, "post": measured["opt_postln"]["anisotropy"]})
    tr, post = _by_role(fig, "mean")
    np.testing.assert_allclose(tr.y, np.nanmean(a.values.double().numpy(), axis=0), rtol=1e-6)
    np.testing.assert_array_equal(tr.x, np.arange(4))  # x_0 .. x_L
    assert "position 0" in tr.hovertemplate and "cosine" in tr.hovertemplate
    assert "[post-LN]" in post.name


def test_robustness_plot_per_prompt_and_category_means(measured):
    g = measured["gpt2"]["gain"]
    r = robustness_from_gain(g, CATEGORIES, prompt_set="mine")
    other = robustness_from_gain(measured["llama_gqa"]["gain"], CATEGORIES, prompt_set="mine")
    fig = views.robustness_plot({"a": r, "b": other, "c": r})
    boxes, means = _by_role(fig, "per_prompt"), _by_role(fig, "category_mean")
    box, mean_a = boxes[0], means[0]
    per = g.summaries[g.regime_by].values
    np.testing.assert_allclose(box.y, per)
    assert list(box.customdata) == CATEGORIES
    df = pd.DataFrame({"c": CATEGORIES, "v": per}).groupby("c", sort=False)["v"].mean()
    assert list(mean_a.meta["categories"]) == list(df.index)
    np.testing.assert_allclose(mean_a.y, df.to_numpy())
    assert "last_block_gain" in mean_a.hovertemplate and "token scope all_but_first" in mean_a.hovertemplate
    # each model's mean +- CI marker sits on its own box: same x as that model's box for the category,
    # and a different x from every other model's box there
    ticks = dict(zip(fig.layout.xaxis.ticktext, fig.layout.xaxis.tickvals))
    slots = {}
    for b, m in zip(boxes, means):
        assert b.meta["model"] == m.meta["model"] and b.legendgroup == m.legendgroup
        box_x = {}
        for c, x in zip(b.customdata, b.x):
            box_x.setdefault(c, set()).add(float(x))
        for c, x in zip(m.meta["categories"], m.x):
            assert box_x[c] == {float(x)}, (m.meta["model"], c)
            assert abs(float(x) - ticks[c]) < 0.5  # inside its category's slot
            slots.setdefault(c, []).append(float(x))
    for c, xs in slots.items():
        assert len(set(xs)) == 3, f"two models share a box in {c}"
    assert fig.layout.boxmode == "overlay"


# ---------------------------------------------------------------------------- heads
def test_head_heatmap_carries_values_and_definition():
    z = torch.arange(12.0).reshape(3, 4)
    fig = views.head_heatmap(z, title="t", definition="my metric, raw weights")
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), z.numpy())
    assert "my metric, raw weights" in fig.data[0].hovertemplate
    assert fig.layout.yaxis.title.text == "layer" and fig.layout.xaxis.title.text == "head"
    with pytest.raises(ThermoLensViewError, match=r"\[layer, head\].*reduce over prompts"):
        views.head_heatmap(torch.zeros(2, 3, 4), title="t", definition="d")
    with pytest.raises(ThermoLensViewError, match="definition"):
        views.head_heatmap(z, title="t", definition="")


def test_spectral_scatter_equals_numpy_svd_one_colour_per_model_symbol_per_lab(bridge, measured):
    view = ModelView(bridge("llama_gqa"))  # GQA: 4 query heads read 2 KV heads
    W_V, W_O = view.W_V().double().numpy(), view.W_O().double().numpy()
    sig = measured["llama_gqa"]["spectral"]
    fig = views.spectral_scatter({"a": measured["gpt2"]["spectral"], "b": sig, "c": sig},
                                 labs=["lab1", "lab2", "lab2"])
    heads = _by_role(fig, "heads")
    tr = heads[1]
    for i, (l, h) in enumerate(np.ndindex(view.n_layers, view.n_heads)):
        kv = int(view.kv_head_of[h])
        assert tr.x[i] == pytest.approx(np.linalg.norm(W_V[l, kv], 2), rel=1e-5)
        assert tr.y[i] == pytest.approx(np.linalg.norm(W_O[l, h], 2), rel=1e-5)
        assert tuple(tr.customdata[i][:2]) == (l, h)
    # models are compared: three models, three colours, although b and c share a lab (and weights)
    assert len({t.marker.color for t in heads}) == 3
    # the lab is still shown: one symbol and one legend group per lab
    assert heads[1].marker.symbol == heads[2].marker.symbol != heads[0].marker.symbol
    assert heads[1].legendgroup == heads[2].legendgroup == "lab2" != heads[0].legendgroup
    assert heads[1].legendgrouptitle.text == "lab: lab2" and [t.name for t in heads] == ["a", "b", "c"]
    assert "colour = model, symbol = lab" in fig.layout.title.text
    means = _by_role(views.spectral_scatter({"a": measured["gpt2"]["spectral"], "b": sig, "c": sig},
                                            labs=["lab1", "lab2", "lab2"], per="model"), "model_mean")
    assert len({t.marker.color for t in means}) == 3
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "sigma_max" in tr.hovertemplate and "raw weights" in tr.hovertemplate and "GQA" in tr.hovertemplate
    (m,) = _by_role(views.spectral_scatter(sig, per="model"), "model_mean")
    assert m.x[0] == pytest.approx(float(sig.W_V_norm.double().mean()))


def test_spectral_heatmaps_and_sheaf_trace_heatmap(bridge, measured):
    sig = measured["gpt2"]["spectral"]
    fig = views.spectral_heatmaps(sig, metrics=("W_V_norm", "ov_norm"))
    for tr, m in zip(fig.data, ("W_V_norm", "ov_norm")):
        np.testing.assert_allclose(np.asarray(tr.z), getattr(sig, m).numpy())
        assert tr.meta["metric"] == m
    # sheaf trace per head vs the full cached pattern of one prompt: (n - sum_i A_ii) ||W_V||_F^2
    model, view = bridge("gpt2"), ModelView(bridge("gpt2"))
    c = collect(model, PROMPTS[:1], [attention_diagonal], prepend_bos=True)
    fig = views.sheaf_trace_heatmap(traces_from_collected(c))
    tokens = tokenize(view, PROMPTS[:1], prepend_bos=True).tokens
    _, cache = model.run_with_cache(tokens)
    W_V = view.W_V().double()
    expected = np.zeros((view.n_layers, view.n_heads))
    for l in range(view.n_layers):
        A = cache[f"blocks.{l}.attn.hook_pattern"][0].double()
        n = A.shape[-1]
        for h in range(view.n_heads):
            expected[l, h] = (n - torch.diagonal(A[h]).sum()) * W_V[l, h].pow(2).sum()
    np.testing.assert_allclose(np.asarray(fig.data[0].z), expected, rtol=1e-4)
    assert "(n - sum_i A_ii)" in fig.data[0].hovertemplate and "BOS prepended" in fig.data[0].hovertemplate


# ---------------------------------------------------------------------------- sheaf
def test_sheaf_plot_against_dense_laplacian_and_restriction_maps(bridge):
    short = "the cat"  # few tokens: the dense n*d_model check stays small
    L = sheaf_laplacian(bridge("gpt2"), short, layer=1, head=2)
    assert 3 <= L.n <= 8
    fig = views.sheaf_plot(L)
    (M,), (spec,), (rn,) = _by_role(fig, "M"), _by_role(fig, "spectrum"), _by_role(fig, "restriction_norms")
    A = L.pattern.numpy()
    off = A.sum(1) - np.diag(A)  # M_ii = sum_{j != i} A_ij; M_ij = -sqrt(A_ij A_ji) = 0 (causal)
    np.testing.assert_allclose(np.asarray(M.z), np.diag(off), atol=1e-12)
    np.testing.assert_allclose(np.diag(np.asarray(M.z)), 1 - np.diag(A), atol=1e-6)
    dense = np.linalg.eigvalsh(L.dense().numpy())  # independent: the assembled n*d_model matrix
    nonzero = np.sort(dense[dense > 1e-9 * dense.max()])[::-1]
    np.testing.assert_allclose(spec.y, nonzero, rtol=1e-6)
    for i in range(L.n):
        for j in range(L.n):
            want = 0.0 if i == j else np.linalg.norm(L.restriction_map(i, j).numpy(), 2)
            assert np.asarray(rn.z)[i, j] == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert "rho_ij = sqrt(c_ij) W_V" in rn.hovertemplate and "dim ker L" in spec.hovertemplate
    assert "directed" in fig.layout.title.text
    sym = views.sheaf_plot(sheaf_laplacian(bridge("gpt2"), short, layer=1, head=2, convention="symmetrized"))
    (Ms,) = _by_role(sym, "M")
    w = (A + A.T) / 2
    np.fill_diagonal(w, 0)
    np.testing.assert_allclose(np.asarray(Ms.z), np.diag(w.sum(1)) - w, atol=1e-12)  # graph Laplacian
    with pytest.raises(ThermoLensViewError, match="head=h"):
        views.sheaf_plot(sheaf_laplacian(bridge("gpt2"), short, layer=1))


def test_l_star_plot_marks_empirical_and_predicted(measured):
    r = measured["gpt2"]["l_star"]
    t = measured["gpt2"]["traces"]
    fig = views.l_star_plot({"gpt2": r, "post": measured["opt_postln"]["l_star"]})
    tr = _by_role(fig, "layer_trace")[0]
    T = t.trace.sum(-1).mean(0).numpy()  # independent: sum over heads, mean over prompts
    np.testing.assert_allclose(tr.y, T, rtol=1e-10)
    (emp,) = [d for d in _by_role(fig, "l_star_empirical") if d.meta["model"] == "gpt2"]
    (paper,) = [d for d in _by_role(fig, "l_star_paper_rule") if d.meta["model"] == "gpt2"]
    assert emp.x[0] == int(np.argmax(np.abs(np.diff(T)))) + 1          # the default, steepest_step
    assert paper.x[0] == int(np.argmax(np.abs(np.gradient(T))))        # the paper's rule beside it
    assert "steepest_step" in emp.hovertemplate and "argmax_abs_gradient" in paper.hovertemplate
    # eq. 6 gives 3 (0.11 + 0.036 + 4.9 / 4) = 4.11 for L = 3, H = 4: past the last block, so not drawn
    # (the report's text says that comparison is left out); the subtitle says which and why
    assert 3 * (0.11 + 0.012 * 3 + 4.9 / 4) > 3 and r.predicted > r.n_layers
    assert _by_role(fig, "l_star_predicted") == []
    assert "✕ predicted" not in fig.layout.title.text
    title = fig.layout.title.text.replace("<br>", " ")
    assert "Eq. 6 not drawn where it predicts past the last block: gpt2" in title and "(L = 3, H = 4: 4.11)" in title
    # a 12-block, 12-head model: eq. 6 gives 7.948, inside the model, drawn at that depth
    trace = np.array([1.0, 2, 4, 7, 11, 16, 22, 29, 31, 32, 32.5, 33])
    deep = l_star_from_traces(trace, n_heads=12)
    dfig = views.l_star_plot({"deep": deep})
    (pred,) = _by_role(dfig, "l_star_predicted")
    assert pred.x[0] == pytest.approx(12 * (0.11 + 0.012 * 12 + 4.9 / 12))
    assert pred.y[0] == pytest.approx(np.interp(pred.x[0], np.arange(12), trace))
    assert "0.11 + 0.012 L + 4.9 / H" in pred.hovertemplate and "✕ predicted" in dfig.layout.title.text
    assert "not drawn" not in dfig.layout.title.text
    assert "[post-LN]" in _by_role(fig, "layer_trace")[1].name
    with pytest.raises(ThermoLensViewError, match="relative_depth"):
        views.l_star_plot(r, x="depth")


# ---------------------------------------------------------------------------- laws
@pytest.fixture(scope="module")
def survey():
    df = laws.add_regimes(reference.lab_survey(), std_ddof=0)
    df["post_ln"] = df["model"].str.contains("350m")  # OPT-350m is post-LN
    return df


@pytest.mark.slow
def test_kleiber_plot_bound_points_stats_and_post_ln(survey):
    fig = views.kleiber_plot(survey)
    (bound,) = _by_role(fig, "bound")
    np.testing.assert_allclose(bound.y, 10.0 ** (1.0 / np.asarray(bound.x)))
    pts = _by_role(fig, "models")
    got = {m: (x, y) for t in pts for m, x, y in zip(t.meta["models"], t.x, t.y)}
    for _, r in survey.iterrows():
        assert got[r["model"]] == (r["n_layers"], pytest.approx(r["gain"]))
    r = stats.pearsonr(survey["n_layers"].astype(float), survey["gain"])
    assert f"Pearson r = {r.statistic:.3f}" in fig.layout.title.text
    opt = [t for t in pts if t.meta["lab"] == "Meta"][0]
    symbols = dict(zip(opt.meta["models"], opt.marker.symbol))
    assert symbols["opt-350m"] == "diamond-open" and symbols["opt-125m"] == "circle"
    assert any("post-LN" in a.text and "opt-350m" in a.text for a in fig.layout.annotations)
    assert "below the" not in fig.layout.title.text
    # models of one depth: drawn, and the subtitle says once, in words, why there is no correlation
    one = views.kleiber_plot(survey.assign(n_layers=12))
    assert np.all(np.concatenate([t.x for t in _by_role(one, "models")]) == 12)
    assert f"gain vs L not tested: all {len(survey)} models have depth L = 12" in one.layout.title.text
    assert "Pearson" not in one.layout.title.text
    for f in (fig, one):
        assert [d for t in _figure_texts(f) for d in doubled_labels(t)] == []
    assert doubled_labels("no correlation: correlation: 'n_layers' is constant") != []  # the checker bites
    two = views.kleiber_plot(survey.head(2))
    assert "need at least 3" in two.layout.title.text
    with pytest.raises(ThermoLensViewError, match="no column 'nope'"):
        views.kleiber_plot(survey, gain="nope")


@pytest.mark.slow
def test_heritage_and_hierarchy_equal_groupby(survey):
    fig = views.heritage_plot(survey)
    (bars,) = _by_role(fig, "lab_mean")
    g = survey.groupby("lab", sort=False)["gain"]
    np.testing.assert_allclose(np.asarray(bars.y) + bars.base, g.mean().to_numpy())
    se = (g.std(ddof=1) / np.sqrt(g.count())).fillna(0).to_numpy()
    np.testing.assert_allclose(bars.error_y.array, se)
    assert list(bars.x) == list(g.mean().index) and "Fisher" in bars.hovertemplate
    h = views.hierarchy_plot(survey)
    order = g.mean().sort_values()
    assert list(h.data[0].y) == list(order.index)
    np.testing.assert_allclose(h.data[0].x, order.to_numpy())
    with pytest.raises(ThermoLensViewError, match="at least 2 labs"):
        views.heritage_plot(survey[survey["lab"] == "Meta"])


def test_reference_overlay_states_definitions_and_like_for_like(measured):
    g = measured["gpt2"]["gain"]
    row = views.gain_row(g, lab="mine")
    fig = views.reference_overlay([row], metric="A")
    ref = reference.gains("residual_gain_no_final_ln")
    paper = _by_role(fig, "paper")
    assert sum(len(t.y) for t in paper) == len(ref)
    np.testing.assert_allclose(sorted(y for t in paper for y in t.y), np.sort(ref["gain"].to_numpy()))
    (user,) = _by_role(fig, "user")
    assert user.y[0] == pytest.approx(float(g.penultimate_gain.mean))
    # all_but_first + BOS True is not the paper's definition: said in the title and the hover
    assert user.meta["like_for_like"] == [False] and "NOT like for like" in fig.layout.title.text
    assert "token scope all_but_first (paper: last)" in user.hovertext[0]
    text = " ".join(a.text for a in fig.layout.annotations)
    for words in ("penultimate", "last token", "float16", "HF", "own definition"):
        assert words in text, words
    same = dict(row, token_scope="last", prepend_bos="tokenizer")
    fig2 = views.reference_overlay(pd.DataFrame([same]), metric="B")
    (u2,) = _by_role(fig2, "user")
    assert u2.meta["like_for_like"] == [True] and "NOT" not in fig2.layout.title.text
    assert u2.y[0] == pytest.approx(float(g.last_block_gain.mean))
    with pytest.raises(ThermoLensViewError, match="unknown paper metric"):
        views.reference_overlay([row], metric="Z")


def test_bad_inputs_are_refused_clearly(measured):
    with pytest.raises(ThermoLensViewError, match="expected a GainResult"):
        views.layer_dynamics(measured["gpt2"]["spectral"])
    with pytest.raises(ThermoLensViewError, match="empty"):
        views.layer_dynamics([])
    with pytest.raises(ThermoLensViewError, match="2 names for 1"):
        views.layer_dynamics(measured["gpt2"]["gain"], names=["a", "b"])
    with pytest.raises(ThermoLensViewError, match="expected a SpectralSignature"):
        views.spectral_scatter(measured["gpt2"]["gain"])
    with pytest.raises(ThermoLensViewError, match="cannot make a per-model row"):
        views.kleiber_plot([object()])


# ---------------------------------------------------------------------------- panels
def _props(html_text, element):
    m = re.search(r"CircuitsVis\." + element + r",\s*(\{.*?\})\s*\)", html_text, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_attention_panel_offline_and_equal_to_model_activations(bridge):
    model = bridge("gpt2")
    view = ModelView(model)
    layer, prompt = 1, "The capital of France </script> is"
    panel = views.attention_panel(model, prompt, layer)
    # offline: the bundle is inlined, no src/href to anywhere, nothing from a CDN
    assert "var CircuitsVis" in panel.html and "unpkg" not in panel.html
    assert not re.search(r"<script[^>]*\bsrc=", panel.html) and "sourceMappingURL" not in panel.html
    assert panel.html.count("</script>") == 1  # a token "</script>" cannot end the script early
    assert panel._repr_html_() == panel.html
    # the same props circuitsvis.attention.attention_patterns(tokens=..., attention=...) renders
    import circuitsvis.attention

    ref = circuitsvis.attention.attention_patterns(tokens=list(panel.tokens), attention=panel.pattern)
    # plus headLabels (AttentionPatterns' prop): each pattern named by its head's index
    expected = {**_props(ref.local_src, "AttentionPatterns"), "headLabels": [f"Head {h}" for h in range(view.n_heads)]}
    assert _props(panel.html, "AttentionPatterns") == expected
    # pattern and metrics against the model's own cached activations
    tokens = tokenize(view, [prompt], prepend_bos=True).tokens
    _, cache = model.run_with_cache(tokens)
    A = cache[f"blocks.{layer}.attn.hook_pattern"][0].double()
    torch.testing.assert_close(panel.pattern.double(), A, rtol=1e-5, atol=1e-6)
    assert len(panel.tokens) == tokens.shape[1]
    W_V, W_O = view.W_V().double(), view.W_O().double()
    mt = panel.metrics
    for h in range(view.n_heads):
        n = A.shape[-1]
        assert mt.loc[h, "sheaf_trace"] == pytest.approx(float((n - torch.diagonal(A[h]).sum()) * W_V[layer, h].pow(2).sum()), rel=1e-4)
        assert mt.loc[h, "W_V_norm"] == pytest.approx(np.linalg.norm(W_V[layer, h].numpy(), 2), rel=1e-5)
        assert mt.loc[h, "W_O_norm"] == pytest.approx(np.linalg.norm(W_O[layer, h].numpy(), 2), rel=1e-5)
        assert mt.loc[h, "ov_norm"] == pytest.approx(np.linalg.norm((W_V[layer, h] @ W_O[layer, h]).numpy(), 2), rel=1e-4)
    # zero-ablation gain change, recomputed by hand: mean over tokens 1..n-1 of ||x_{l+1}|| / ||x_l||
    def block_gain(h=None):
        def zero(z, hook):
            z[:, :, h] = 0.0
            return z
        c = cache
        if h is not None:
            with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]):
                _, c = model.run_with_cache(tokens)
        x_in = c[f"blocks.{layer}.hook_resid_pre"][0].double().norm(dim=-1)
        x_out = c[f"blocks.{layer}.hook_resid_post"][0].double().norm(dim=-1)
        return float((x_out / x_in)[1:].mean())
    base = block_gain()
    assert mt["delta_block_gain"].abs().max() > 1e-4  # the ablation really changed the block
    for h in range(view.n_heads):
        assert mt.loc[h, "delta_block_gain"] == pytest.approx(block_gain(h) - base, abs=1e-5)
    for name in ("delta_block_gain", "sheaf_trace", "W_V_norm"):
        assert views.panels.panel_definitions()[name] in panel.html.replace("&#x27;", "'")
    assert "BOS prepended" in panel.html


def test_attention_panel_gqa_and_bad_input(bridge, tmp_path):
    model = bridge("llama_gqa")
    panel = views.attention_panel(model, "Birds of a feather flock together", 0, ablation=False,
                                  include_js=False)
    assert "var CircuitsVis" not in panel.html and "delta_block_gain" not in panel.metrics
    view = ModelView(model)
    W_V = view.W_V().double()
    for h in range(view.n_heads):  # GQA: query head h reads KV head h // 2
        assert panel.metrics.loc[h, "W_V_norm"] == pytest.approx(
            np.linalg.norm(W_V[0, int(view.kv_head_of[h])].numpy(), 2), rel=1e-5)
    # in a narrow window the metrics table scrolls inside its own box (the page never scrolls sideways)
    assert re.search(r'<div style="overflow-x:auto;max-width:100%"><table class="thermo-lens-metrics"', panel.html)
    out = panel.save(tmp_path / "p.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(ThermoLensViewError, match=r"layer must be an int in 0\.\.2"):
        views.attention_panel(model, "hello there", 7)
    with pytest.raises(ThermoLensViewError, match="non-empty string"):
        views.attention_panel(model, "", 0)
    with pytest.raises(ThermoLensViewError, match=r"pattern must be \[head, n, n\]"):
        views.panel_from_results(["a", "b"], torch.zeros(2, 3, 3), pd.DataFrame({"head": [0, 1]}),
                                 layer=0, prompt="a b")


def test_every_result_plots_itself_through_the_views_it_registered(measured, bridge):
    # Results never import views (tests/package/test_architecture.py); .plot() finds the figure views
    # registered for the class, or draws the first registered metric from its shape.
    import plotly.graph_objects as go

    import thermo_lens as tl

    m = measured["gpt2"]
    for key, role in (("gain", "mean"), ("anisotropy", None), ("traces", None), ("l_star", None), ("spectral", None)):
        fig = m[key].plot()
        assert isinstance(fig, go.Figure) and len(fig.data) > 0, key
        assert [d for t in _figure_texts(fig) for d in doubled_labels(t)] == [], key
        if role:
            assert _by_role(fig, role), key
    wn = tl.run(bridge("gpt2"), PROMPTS[:2], ["write_norm"]).write_norm  # no view of its own
    fig = wn.plot()
    assert fig.data[0].meta["metric"] == "write_norm"


# ---------------------------------------------------------------------------- sweeps
def test_sweep_heatmap_says_what_its_marker_means(bridge):
    from thermo_lens.experiments.sweeps import patch_sweep

    g = torch.Generator().manual_seed(0)
    clean, corr = torch.randint(1, 250, (3, 6), generator=g), torch.randint(1, 250, (3, 6), generator=g)
    s = patch_sweep(bridge("gpt2"), clean, corr, "attn.hook_z", measure="total_amplification", layers=[0, 1])
    fig = views.sweep_heatmap(s)
    (marked,) = _by_role(fig, "not_significant")
    ns = ~(s.pvalue_adjusted.numpy() < 1 - s.level)  # independent: the cells to mark
    rows, cols = np.nonzero(ns)
    assert sorted(zip(marked.y, marked.x)) == sorted((str(s.layers[r]), str(c)) for r, c in zip(rows, cols))
    assert ns.any(), "the fixture should leave some cell not significant"
    # the marker is explained: in the legend (shown although it is the only legend entry) and the subtitle
    assert marked.showlegend is True and fig.layout.showlegend is True
    assert "not significant" in marked.name and "Holm-adjusted p >= 0.05" in marked.name
    assert f"marker x: not significant (Holm-adjusted p >= 0.05), {int(ns.sum())} of {ns.size} cells" \
        in fig.layout.title.text.replace("<br>", " ")
    everything = views.sweep_heatmap(s, mark="circle-open")
    assert "marker circle-open" in everything.layout.title.text


# ---------------------------------------------------------------------------- layout in narrow windows
def test_attribution_colour_bars_sit_under_their_own_panels(bridge):
    import thermo_lens as tl

    a = tl.run(bridge("gpt2"), PROMPTS[:2], ["attribution"]).attribution
    fig = views.attribution_heatmap(a)
    lay = fig.layout
    titles = [x.text for x in lay.annotations if (x.text or "").startswith("colour: ")]
    assert titles == ["colour: head term", "colour: block term"]
    for axis, xaxis, title in (("coloraxis", "xaxis", titles[0]), ("coloraxis2", "xaxis2", titles[1])):
        bar, dom = lay[axis].colorbar, lay[xaxis].domain
        # horizontal, centred under its panel and no wider: two bars can never meet, at any width
        assert bar.orientation == "h" and bar.x == pytest.approx((dom[0] + dom[1]) / 2)
        assert bar.len == pytest.approx(dom[1] - dom[0]) and bar.lenmode == "fraction"
        (ann,) = [x for x in lay.annotations if x.text == title]
        assert ann.x == pytest.approx(bar.x) and ann.y < 0  # its title above it, under the panel
        assert bar.title.text is None  # plotly draws a horizontal bar's own title over the bar
    assert lay.xaxis.domain[1] < lay.xaxis2.domain[0]


def test_sheaf_plot_maps_side_by_side_over_the_spectrum(bridge):
    fig = views.sheaf_plot(sheaf_laplacian(bridge("gpt2"), "the cat", layer=1, head=2))
    (M,), (spec,), (rn,) = _by_role(fig, "M"), _by_role(fig, "spectrum"), _by_role(fig, "restriction_norms")
    lay = fig.layout
    ax = {t.meta["role"]: (lay["xaxis" + t.xaxis[1:]], lay["yaxis" + t.yaxis[1:]]) for t in (M, spec, rn)}
    assert ax["M"][1].domain == ax["restriction_norms"][1].domain  # one row of two maps
    assert ax["M"][0].domain[1] < ax["restriction_norms"][0].domain[0]
    assert ax["spectrum"][1].domain[1] < ax["M"][1].domain[0]  # the spectrum below them
    assert ax["spectrum"][0].domain[1] - ax["spectrum"][0].domain[0] > 0.9  # across the width
    for t in (M, rn):  # each colour bar beside its own map, in the gap or the right margin
        x0, x1 = ax[t.meta["role"]][0].domain
        assert x1 < t.colorbar.x and (t is rn or t.colorbar.x < ax["restriction_norms"][0].domain[0])


def test_figure_html_lifts_title_subtitle_and_notes_into_wrapping_html(measured):
    from thermo_lens.views.page import figure_html, lift_texts

    fig = views.l_star_plot({"gpt2": measured["gpt2"]["l_star"], "post": measured["opt_postln"]["l_star"]})
    bare, title, subtitle, notes = lift_texts(fig)
    assert title == "L*: layer trace T_l with the empirical depth of maximal trace change"
    assert subtitle.startswith("T_l = sum over heads") and "<span" not in subtitle
    assert len(notes) == 1 and "post-LN" in notes[0]
    assert bare.layout.title.text == "" and not [a for a in bare.layout.annotations if a.name]
    assert bare.layout.margin.t < fig.layout.margin.t and bare.layout.height < fig.layout.height
    assert fig.layout.title.text.startswith(title)  # the figure itself is not changed
    page = figure_html(fig, "fig-x", caption="a <caption>")
    assert '<div class="fig-title">L*: layer trace T_l with the empirical depth' in page
    assert "<br>" not in page.split('<div class="fig-sub">')[1].split("</div>")[0]  # HTML wraps it
    assert '<div class="fig-note">' in page and "a &lt;caption&gt;" in page
    plotly_json = json.loads(re.search(r'Plotly.newPlot\(\s*"fig-x",\s*(\[.*?\]),\s*(\{.*?\})\s*,\s*\{',
                                       page, flags=re.S).group(2))
    assert plotly_json.get("title", {}).get("text", "") == ""
    # plotly label markup that is literal text in a label stays literal text on the page
    attr_like = go.Figure()
    views._common.base_layout(attr_like, "t", "<z_h W_O^h, x_out + x_in>: <b>bold</b>")
    sub = figure_html(attr_like, "fig-y").split('<div class="fig-sub">')[1].split("</div>")[0]
    assert sub == "&lt;z_h W_O^h, x_out + x_in&gt;: <b>bold</b>"
