"""Cross-model laws (thermo_lens.laws): the paper's numbers, scipy agreement, hand-made answers."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples
from scipy import stats

from thermo_lens import laws
from thermo_lens.paper import reference


# ---------------------------------------------------------------- the paper's own data

def test_kleiber_reproduces_paper_r_on_pythia_family():
    k = laws.kleiber(reference.pythia_family())
    # "Kleiber's law r = -0.81, p = 0.014": gain vs rho over the 8 Pythia models.
    assert round(k.gain_vs_rho.statistic, 4) == -0.8116
    assert round(k.gain_vs_rho.pvalue, 4) == 0.0144
    # Same data, gain vs depth L (what the paper's text says it correlated).
    assert round(k.gain_vs_depth.statistic, 3) == -0.878
    assert round(k.gain_vs_depth.pvalue, 4) == 0.0041
    stats_ = reference.paper_statistics().set_index("measurement")["value"]
    assert k.gain_vs_rho.statistic == pytest.approx(stats_["pearson_r_rho_vs_gain"], abs=1e-5)
    assert k.gain_vs_rho.pvalue == pytest.approx(stats_["pearson_p_rho_vs_gain"], abs=1e-6)
    assert k.gain_vs_depth.statistic == pytest.approx(stats_["pearson_r_L_vs_gain (derived)"], abs=1e-5)
    assert k.n == 8 and k.gain_vs_rho.n == 8
    # The bound G_max = 10**(1/L) is violated by pythia-1b in the paper's own data.
    assert list(k.violations["model"]) == ["pythia-1b"]
    assert k.violations["margin"].iloc[0] == pytest.approx(1.21632 - 10 ** (1 / 16))
    assert k.bound["pythia-70m"] == pytest.approx(10 ** (1 / 6))


def test_heritage_on_lab_survey_disagrees_with_paper_p():
    s = reference.lab_survey()
    h = laws.heritage(s)
    e = h.fisher["EleutherAI"]
    assert e.table == ((4, 1), (2, 9))
    assert e.pvalue == pytest.approx(stats.fisher_exact([[4, 1], [2, 9]]).pvalue)
    assert 0.03 < e.pvalue < 0.04  # the paper says p < 0.001
    labs = h.labs.set_index("lab")
    assert labs.loc["EleutherAI", "frac_dampener"] == pytest.approx(0.8)
    assert labs.loc["Meta", "n_dampener"] == 1  # paper: "Meta/OpenAI 100% expansion"
    # Lab means equal the paper's aggregates; the paper's "std" there is the SD with ddof=0, not an SE.
    agg = reference.paper_statistics()
    agg = agg[agg["measurement"] == "lab_mean_residual_gain_no_final_ln"]
    for _, r in agg.iterrows():
        vals = s.loc[s["lab"] == r["lab"], "gain"].to_numpy()
        assert labs.loc[r["lab"], "mean_gain"] == pytest.approx(r["value"], abs=1e-5)
        assert np.std(vals, ddof=0) == pytest.approx(r["std"], abs=1e-5)


@pytest.mark.slow
def test_crowding_on_lab_survey_matches_h25_accuracy():
    c = laws.crowding(reference.lab_survey())
    acc = c.thresholds.set_index("threshold")["accuracy"]
    assert acc.loc[0.2] == pytest.approx(0.4375)  # the paper's file: h25_accuracy = 0.4375
    assert c.best_accuracy < c.baseline_accuracy == pytest.approx(10 / 16)
    assert c.logistic.slope < 0  # opposite of the paper's direction
    assert not c.logistic.separated


def test_twin_on_paper_pairs():
    t = laws.twin(reference.twins())
    assert t.n_pairs == 3 and t.all_sign_kept
    gemma = t.pairs.set_index("model").loc["Gemma-7B-instruct"]
    assert gemma["ratio"] == pytest.approx(1.15311 / 2.3159)
    assert gemma["relative_change"] == pytest.approx((1.15311 - 2.3159) / 1.3159)


def test_hierarchy_on_benchmark():
    h = laws.hierarchy(reference.benchmark(), by="family")
    assert h.order == ("pythia", "mistral", "llama", "gemma")
    assert h.groups["n"].tolist() == [1, 1, 1, 1]
    assert h.groups["se"].isna().all()


# ---------------------------------------------------------------- correlation vs scipy

@pytest.mark.slow
@settings(max_examples=examples(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(4, 40))
def test_correlation_matches_scipy(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 0.5 * x + rng.normal(size=n)
    c = laws.correlation(x, y)
    p, s = stats.pearsonr(x, y), stats.spearmanr(x, y)
    assert c.statistic == pytest.approx(p.statistic, abs=1e-12)
    assert c.pvalue == pytest.approx(p.pvalue, rel=1e-9, abs=1e-15)
    assert c.spearman_statistic == pytest.approx(s.statistic, abs=1e-12)
    assert c.spearman_pvalue == pytest.approx(s.pvalue, rel=1e-9, abs=1e-15)
    assert c.pearson.statistic == c.statistic and c.spearman.pvalue == c.spearman_pvalue
    assert c.ci_low <= c.statistic <= c.ci_high
    assert c.n == n


def test_kleiber_selectable_gain_and_rho_from_heads():
    df = pd.DataFrame({"model": list("abcd"), "n_layers": [6, 12, 24, 32], "n_heads": [8, 12, 16, 32],
                       "d_head": [64, 64, 64, 80], "G": [1.5, 1.1, 1.0, 0.98]})
    k = laws.kleiber(df, gain="G")
    np.testing.assert_allclose(k.table["rho"], [0.125, 0.1875, 0.25, 0.4])
    assert k.gain_column == "G"
    assert list(k.violations["model"]) == ["a"]  # 1.5 > 10**(1/6) = 1.468
    assert laws.kleiber(df, gain="G", rho=None).gain_vs_rho is None


# ---------------------------------------------------------------- heritage / Fisher

def _hand_table():
    # lab A: 3 dampeners, 1 expander; lab B: 1 dampener, 4 expanders; lab C: 2 expanders, 1 neutral.
    rows = ([("A", "dampener", 0.9)] * 3 + [("A", "expander", 1.1)] +
            [("B", "dampener", 0.95)] + [("B", "expander", 1.2)] * 4 +
            [("C", "expander", 1.3)] * 2 + [("C", "neutral", 1.0)])
    return pd.DataFrame(rows, columns=["lab", "regime", "gain"])


def test_heritage_fisher_matches_scipy():
    h = laws.heritage(_hand_table())
    tables = {"A": [[3, 1], [1, 7]], "B": [[1, 4], [3, 4]], "C": [[0, 3], [4, 5]]}
    for lab, t in tables.items():
        ref = stats.fisher_exact(t)
        f = h.fisher[lab]
        assert f.table == tuple(map(tuple, t))
        assert f.pvalue_minlike == pytest.approx(ref.pvalue)  # scipy's p, beside
        assert f.pvalue >= f.pvalue_minlike - 1e-12 and f.method == "blaker"  # Blaker's p is never smaller
        assert f.odds_ratio == pytest.approx(ref.statistic)
    holm = h.labs.set_index("lab")["pvalue_holm"]
    assert (holm >= h.labs.set_index("lab")["pvalue"]).all() and (holm <= 1).all()
    assert h.contingency.loc["C"].to_dict() == {"expander": 2, "dampener": 0, "neutral": 1}
    assert h.regime_source == "column 'regime'"


def test_heritage_mean_se():
    h = laws.heritage(_hand_table())
    b = h.labs.set_index("lab").loc["B"]
    vals = np.array([0.95, 1.2, 1.2, 1.2, 1.2])
    assert b["mean_gain"] == pytest.approx(vals.mean())
    assert b["se"] == pytest.approx(vals.std(ddof=1) / math.sqrt(5))
    single = laws.heritage(pd.DataFrame({"lab": ["X", "Y", "Y"], "gain": [0.9, 1.1, 1.2]}))
    x = single.labs.set_index("lab").loc["X"]
    assert x["n"] == 1 and math.isnan(x["se"])
    assert single.regime_source == "sign of 'gain' - 1"


def test_regimes_from_measurement():
    assert laws.regime_from_gain(1.2) == "expander"
    assert laws.regime_from_gain(0.8) == "dampener"
    assert laws.regime_from_gain(1.0) == "neutral"
    assert laws.regime_from_gain(1.05, 0.99, 1.1) == "neutral"
    assert list(laws.regime_from_gain([1.05, 0.95, 1.2], [1.01, 0.9, 0.99], [1.1, 0.99, 1.3])) == [
        "expander", "dampener", "neutral"]
    with pytest.raises(ValueError):
        laws.regime_from_gain(float("nan"))
    with pytest.raises(ValueError):
        laws.regime_from_gain(1.0, ci_low=0.9)


def test_gain_ci_and_add_regimes():
    lo, hi = laws.gain_ci(1.0, 0.1, 5, std_ddof=1)
    half = stats.t.ppf(0.975, 4) * 0.1 / math.sqrt(5)
    assert (lo, hi) == pytest.approx((1 - half, 1 + half))
    # ddof=0 SD converted to ddof=1 first.
    lo0, hi0 = laws.gain_ci(1.0, 0.1 * math.sqrt(4 / 5), 5, std_ddof=0)
    assert (lo0, hi0) == pytest.approx((lo, hi))
    df = laws.add_regimes(reference.pythia_family(), std_ddof=0)
    reg = dict(zip(df["model"], df["regime"]))
    assert reg["pythia-1.4b"] == "neutral" and reg["pythia-6.9b"] == "neutral"
    assert reg["pythia-2.8b"] == "dampener" and reg["pythia-70m"] == "expander"


# ---------------------------------------------------------------- crowding

def test_threshold_accuracy_known_answer():
    df = pd.DataFrame({"rho": [0.1, 0.12, 0.17, 0.18, 0.3, 0.4],
                       "regime": ["expander", "expander", "dampener", "neutral", "dampener",
                                  "dampener"]})
    c = laws.crowding(df, thresholds=[0.15, 0.175, 0.2])
    acc = c.thresholds.set_index("threshold")
    assert acc["accuracy"].tolist() == pytest.approx([5 / 6, 4 / 6, 5 / 6])
    assert acc.loc[0.175, ["tp", "fp", "tn", "fn"]].tolist() == [2, 1, 2, 1]
    assert c.best_threshold == 0.15 and c.best_thresholds == (0.15, 0.2)
    assert c.best_accuracy == pytest.approx(5 / 6)
    assert c.baseline_accuracy == pytest.approx(0.5)
    assert c.n_dampener == 3
    # default grid
    assert len(laws.crowding(df).thresholds) == 11


def _newton_logistic(x, y, iters=100):
    X = np.column_stack([np.ones_like(x), x])
    b = np.zeros(2)
    for _ in range(iters):
        p = 1 / (1 + np.exp(-X @ b))
        b = b + np.linalg.solve((X * (p * (1 - p))[:, None]).T @ X, X.T @ (y - p))
    return b


@pytest.mark.parametrize("true_slope", [30.0, -30.0])
def test_logistic_recovers_slope(true_slope):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 0.5, 400)
    p = 1 / (1 + np.exp(-(-true_slope * 0.25 + true_slope * x)))
    y = (rng.uniform(size=x.size) < p).astype(int)
    fit = laws.logistic_fit(x, y)
    assert not fit.separated and fit.converged
    assert np.sign(fit.slope) == np.sign(true_slope)
    b = _newton_logistic(x, y)
    assert (fit.intercept, fit.slope) == pytest.approx(tuple(b), rel=1e-4)
    assert fit.x50 == pytest.approx(0.25, abs=0.05)
    assert fit.slope_pvalue < 1e-6 and fit.lr_pvalue < 1e-6
    assert fit.predict_proba(fit.x50) == pytest.approx(0.5)


def test_logistic_separation_flagged():
    fit = laws.logistic_fit([0.1, 0.12, 0.14, 0.3, 0.4], [0, 0, 0, 1, 1])
    assert fit.separated and fit.slope == math.inf and math.isnan(fit.intercept)
    assert fit.x50 == pytest.approx(0.22) and fit.loglik == 0.0
    assert fit.lr_statistic == pytest.approx(-2 * (2 * math.log(0.4) + 3 * math.log(0.6)))
    assert "SEPARATED" in fit.summary()
    down = laws.logistic_fit([0.1, 0.2, 0.3, 0.4], [1, 1, 0, 0])
    assert down.separated and down.slope == -math.inf
    one = laws.logistic_fit([0.1, 0.2, 0.3], [0, 0, 0])
    assert math.isnan(one.slope) and "one class" in one.note


# ---------------------------------------------------------------- twin

def test_twin_sign_logic():
    df = pd.DataFrame({
        "model": ["b1", "f1", "b2", "f2", "b3", "f3", "b4", "f4"],
        "base": [None, "b1", None, "b2", "", "b3", float("nan"), "b4"],
        "gain": [1.2, 1.1, 0.9, 1.05, 1.5, 0.5, 1.3, 1.0],
    })
    t = laws.twin(df)
    p = t.pairs.set_index("model")
    assert p["sign_kept"].to_dict() == {"f1": True, "f2": False, "f3": False, "f4": False}
    assert t.n_sign_kept == 1 and not t.all_sign_kept
    assert p.loc["f1", "relative_change"] == pytest.approx((1.1 - 1.2) / 0.2)
    assert p.loc["f2", "relative_change"] == pytest.approx((1.05 - 0.9) / 0.1)
    assert p.loc["f3", "ratio"] == pytest.approx(1 / 3)
    assert p.loc["f4", "ft_sign"] == 0
    pairs = laws.twin(pd.DataFrame({"base_gain": [1.2, 0.8], "ft_gain": [1.3, 0.9]}))
    assert pairs.pairs["sign_kept"].tolist() == [True, True]


# ---------------------------------------------------------------- hierarchy

def test_hierarchy_ranks_with_t_ci():
    df = pd.DataFrame({"lab": ["A", "A", "A", "B", "B", "C"], "gain": [1.0, 1.2, 1.1, 0.8, 0.9, 2.0]})
    h = laws.hierarchy(df)
    assert h.order == ("B", "A", "C")
    a = h.groups.set_index("group").loc["A"]
    se = np.std([1.0, 1.2, 1.1], ddof=1) / math.sqrt(3)
    assert a["se"] == pytest.approx(se)
    assert a["ci_high"] == pytest.approx(1.1 + stats.t.ppf(0.975, 2) * se)
    assert laws.hierarchy(df, ascending=False).order == ("C", "A", "B")
    fam = laws.hierarchy(pd.DataFrame({"model": ["EleutherAI/pythia-1b", "pythia-70m", "gpt2-xl"],
                                       "gain": [1.2, 1.0, 1.0]}), by="family")
    assert set(fam.order) == {"pythia", "gpt2"}
    assert laws.family_of("facebook/opt-125m") == "opt"
    assert laws.family_of("gpt-neo-125M") == "gpt-neo"


# ---------------------------------------------------------------- inputs, outputs, errors

class _Row:
    def __init__(self, **kw):
        self.kw = kw

    def to_row(self):
        return dict(self.kw)


@pytest.mark.slow
def test_accepts_list_of_rows_and_serialises():
    rows = [_Row(model=m, n_layers=L, rho=r, gain=g) for m, L, r, g in
            [("a", 6, 0.1, 1.3), ("b", 12, 0.2, 1.1), ("c", 24, 0.3, 0.99)]]
    k = laws.kleiber(rows)
    assert k.n == 3
    k2 = laws.kleiber([r.to_row() for r in rows])
    assert k2.gain_vs_rho.statistic == pytest.approx(k.gain_vs_rho.statistic)
    for res in (k, laws.heritage(_hand_table()), laws.crowding(reference.lab_survey()),
                laws.twin(reference.twins()), laws.hierarchy(reference.lab_survey())):
        d = res.to_dict()
        json.dumps(d)
        assert isinstance(res.summary(), str) and repr(res) == res.summary()
    assert "r=-0.8116" in repr(laws.kleiber(reference.pythia_family()))


def test_bad_input_errors():
    good = pd.DataFrame({"model": list("abc"), "n_layers": [6, 12, 24], "rho": [0.1, 0.2, 0.3],
                         "gain": [1.2, 1.1, 1.0]})
    with pytest.raises(ValueError, match="'n_layers'"):
        laws.kleiber(good.drop(columns="n_layers"))
    with pytest.raises(ValueError, match="'rho'"):
        laws.kleiber(good.drop(columns="rho"))
    with pytest.raises(ValueError, match="at least 3"):
        laws.kleiber(good.iloc[:2])
    nan = good.copy()
    nan.loc[1, "gain"] = np.nan
    with pytest.raises(ValueError, match=r"'gain'.*NaN.*\bb\b"):
        laws.kleiber(nan)
    text = good.copy()
    text["gain"] = ["x", "y", "z"]
    with pytest.raises(ValueError, match="not numeric"):
        laws.kleiber(text)
    with pytest.raises(ValueError, match="constant"):
        laws.correlation([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 3"):
        laws.correlation([1, 2], [1, 2])
    with pytest.raises(ValueError, match="'lab'"):
        laws.heritage(good)
    with pytest.raises(ValueError, match="at least 2 labs"):
        laws.heritage(good.assign(lab="X"))
    with pytest.raises(ValueError, match="'regime'"):
        laws.heritage(good.assign(lab=list("XYX"), regime=["up", "down", "up"]))
    with pytest.raises(ValueError, match="not a 'model'"):
        laws.twin(pd.DataFrame({"model": ["f"], "base": ["missing"], "gain": [1.0]}))
    with pytest.raises(ValueError, match="no base/fine-tuned pairs"):
        laws.twin(pd.DataFrame({"model": ["a"], "base": [None], "gain": [1.0]}))
    with pytest.raises(ValueError, match="'family'|'lab'"):
        laws.hierarchy(pd.DataFrame({"gain": [1.0]}))
    with pytest.raises(TypeError):
        laws.kleiber(42)
    with pytest.raises(ValueError, match="< 2"):
        laws.add_regimes(good.assign(std=0.1, n_prompts=1))


# ---------------------------------------------------------------- tests carried by every law result

def _all_results():
    s = reference.lab_survey()
    return {
        "kleiber": laws.kleiber(reference.pythia_family()),
        "heritage": laws.heritage(s),
        "crowding": laws.crowding(reference.pythia_family()),
        "twin": laws.twin(reference.twins()),
        "hierarchy": laws.hierarchy(s),
        "comparison": laws.crowding_comparison({"pythia": reference.pythia_family(), "survey": s}),
    }


@pytest.mark.slow
def test_law_results_round_trip_through_json():
    from thermo_lens.core.result import Result

    for name, res in _all_results().items():
        assert isinstance(res, Result), name
        back = type(res).from_json(res.to_json())
        assert back.summary() == res.summary(), name
        if hasattr(res, "to_frame"):
            pd.testing.assert_frame_equal(back.to_frame(), res.to_frame(), check_index_type=False)
        pd.testing.assert_frame_equal(back.tests_frame(), res.tests_frame())


def _holm_by_hand(p):
    p = np.asarray(p, float)
    m = len(p)
    run, want = 0.0, np.empty(m)
    for i, j in enumerate(np.argsort(p)):
        run = max(run, min(1.0, (m - i) * p[j]))
        want[j] = run
    return want


@pytest.mark.slow
def test_every_law_carries_its_tests():
    res = _all_results()
    for name in ("kleiber", "heritage", "crowding", "twin", "hierarchy"):
        r = res[name]
        assert r.tests, name
        df = r.tests_frame()
        for col in ("test", "n", "effect", "effect_value", "ci_low", "ci_high", "pvalue", "pvalue_method",
                    "pvalue_holm", "loo_model", "loo_statistic", "loo_pvalue", "loo_change", "role", "hypothesis"):
            assert col in df.columns, (name, col)
        # exactly one declared primary per law, not adjusted
        prim = df[df["role"] == "primary"]
        assert len(prim) == 1 and r.primary is not None and r.primary.role == "primary", name
        assert prim["pvalue_holm"].iloc[0] == prim["pvalue"].iloc[0]
        # Holm over the secondary family only, by hand; its nulls are distinct
        sec = df[df["role"] == "secondary"]
        assert sec["hypothesis"].is_unique, name
        np.testing.assert_allclose(sec["pvalue_holm"], _holm_by_hand(sec["pvalue"]))
        # sensitivity tests restate a null of the others and are in no family
        sens = df[df["role"] == "sensitivity"]
        assert sens["pvalue_holm"].isna().all()
        assert set(sens["hypothesis"]) <= set(prim["hypothesis"]) | set(sec["hypothesis"]), name
        assert "primary test (declared; not adjusted)" in repr(r) and "leave-one-out" in repr(r)


@pytest.mark.slow
def test_holm_family_holds_distinct_nulls_only():
    """Kleiber's family held six tests before, pairs of them of one null (Spearman with 10^(1/L) is
    Spearman with L; Pearson and Spearman on one pair): now the primary is alone, the family is the
    one other null, and the restatements are in no family."""
    k = laws.kleiber(reference.pythia_family())
    t = {x.name: x for x in k.tests}
    assert k.primary.name == "gain vs rho: Pearson"
    assert [x.name for x in k.tests_by_role("secondary")] == ["gain vs depth L: Pearson"]
    assert {x.name for x in k.tests_by_role("sensitivity")} == {
        "gain vs rho: Spearman", "gain vs depth L: Spearman", "gain vs bound 10^(1/L): Pearson"}
    assert "gain vs bound 10^(1/L): Spearman" not in t  # identical to Spearman with L up to sign
    bound = reference.pythia_family()["n_layers"].to_numpy(float)
    g = reference.pythia_family()["gain"].to_numpy()
    assert abs(stats.spearmanr(10 ** (1 / bound), g).statistic) == pytest.approx(abs(stats.spearmanr(bound, g).statistic))
    # the primary is not adjusted; the secondary family of one is its own p
    assert k.primary.pvalue_holm == k.primary.pvalue
    assert t["gain vs depth L: Pearson"].pvalue_holm == t["gain vs depth L: Pearson"].pvalue
    assert math.isnan(t["gain vs rho: Spearman"].pvalue_holm)
    # declaring two secondary tests of one null is refused
    from dataclasses import replace

    from thermo_lens.laws.base import declare

    two = [replace(t["gain vs depth L: Pearson"]), replace(t["gain vs bound 10^(1/L): Pearson"], role="secondary")]
    with pytest.raises(ValueError, match="one null"):
        declare(two)


@pytest.mark.slow
def test_kleiber_tests_small_n_and_leave_one_out():
    k = laws.kleiber(reference.pythia_family())
    assert len(k.tests) == 5
    t = {x.name: x for x in k.tests}
    sp = t["gain vs rho: Spearman"]
    assert "exact permutation" in sp.pvalue_method and round(sp.pvalue, 4) == 0.0036
    assert round(sp.pvalue_other, 4) == 0.0014  # scipy's t approximation, shown beside
    pr = t["gain vs rho: Pearson"]
    g, rho = reference.pythia_family()["gain"].to_numpy(), reference.pythia_family()["rho"].to_numpy()
    # the primary's p is the exact permutation p over all 8! pairings (brute force here), the t test's beside
    import itertools

    rc = rho - rho.mean()
    perms = np.array(list(itertools.permutations(range(8))))
    gp = g[perms] - g.mean()
    r_all = (gp * rc).sum(1) / np.sqrt((gp ** 2).sum(1) * (rc ** 2).sum())
    assert pr.pvalue == pytest.approx(np.mean(np.abs(r_all) >= abs(pr.statistic) - 1e-12))
    assert pr.pvalue_other == pytest.approx(stats.pearsonr(rho, g).pvalue)
    assert pr.loo_worst_model == "pythia-1b"
    # the largest move of r itself is pythia-1.4b (r strengthens to -0.92 without it)
    loo = [stats.pearsonr(np.delete(rho, i), np.delete(g, i)).statistic for i in range(8)]
    i = int(np.argmax(np.abs(np.array(loo) - pr.statistic)))
    assert pr.loo_model == reference.pythia_family()["model"][i] and pr.loo_statistic == pytest.approx(loo[i])
    assert (pr.ci_low, pr.ci_high) == pytest.approx(tuple(stats.pearsonr(rho, g).confidence_interval(0.95)))
    assert "not the permutation test" in pr.ci_method


def test_bound_for_g1_and_every_gain_metric():
    """The paper's own first-block gains G_1 = 12-76 violate 10^(1/L) for all 8 Pythia models."""
    pyt = reference.pythia_family()
    g1 = reference.gains("emb_to_block0_gain", source="pythia_family", unique=False)
    table = pyt.assign(first_block_gain=g1["gain"].to_numpy())
    k = laws.kleiber(table)
    b = k.bounds
    assert set(b["metric"]) == {"gain", "first_block_gain"}
    first = b[b["metric"] == "first_block_gain"]
    L = pyt["n_layers"].to_numpy(float)
    np.testing.assert_allclose(first["bound"], 10 ** (1 / L))
    assert first["violates"].all() and len(first) == 8
    assert (round(first["gain"].min()), round(first["gain"].max())) == (12, 76)
    assert b[b["metric"] == "gain"]["violates"].sum() == 1  # pythia-1b under metric A
    assert "bound under first_block_gain: 8/8 above it" in repr(k)
    # a named column without a CI, and a column that is not there
    only = laws.bound_table(table, ["first_block_gain"])
    assert only["ci_low"].isna().all() and len(only) == 8
    with pytest.raises(ValueError, match="no column"):
        laws.bound_table(table, ["last_block_gain"])


def test_kleiber_violations_with_cis_over_several_tables():
    v = laws.kleiber_violations(reference.pythia_family(), reference.lab_survey(), names=["pythia", "survey"])
    assert list(v["model"]) == ["pythia-1b", "bloom-560m", "opt-125m", "gpt-j-6B", "opt-2.7b", "opt-6.7b"]
    assert list(v["table"]) == ["pythia"] + ["survey"] * 5
    assert (v["margin"] > 0).all() and np.isfinite(v["ci_low"]).all()
    r = v.set_index("model").loc["pythia-1b"]
    sd1 = 0.027567 * math.sqrt(25 / 24)  # the file's SD is ddof=0
    half = stats.t.ppf(0.975, 24) * sd1 / 5
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((1.21632 - half, 1.21632 + half), abs=1e-6)
    k = laws.kleiber(reference.lab_survey())
    assert set(k.violations["model"]) == set(v.loc[v["table"] == "survey", "model"])
    assert "95% CI" in repr(k)
    with pytest.raises(ValueError, match="names"):
        laws.kleiber_violations(reference.lab_survey(), names=["a", "b"])


def test_heritage_p_and_interval_invert_the_same_test():
    """scipy's two-sided Fisher p (minimum likelihood, 0.036) sat beside the conditional interval
    [0.85, 981], which inverts the doubled test (p = 0.071) and includes 1. Now the primary is
    Blaker's test with the interval inverting it, which excludes 1 exactly when p < 0.05."""
    from scipy.stats import nchypergeom_fisher

    h = laws.heritage(reference.lab_survey())
    e = h.fisher["EleutherAI"]
    assert h.primary.name.startswith("EleutherAI") and h.primary_lab == "EleutherAI"
    table = [[4, 1], [2, 9]]
    assert e.table == ((4, 1), (2, 9))
    orr = stats.contingency.odds_ratio(table)
    assert e.odds_ratio_conditional == pytest.approx(orr.statistic)
    assert e.pvalue_minlike == pytest.approx(stats.fisher_exact(table).pvalue)

    def blaker(psi):  # Blaker's p by its definition, on scipy's noncentral hypergeometric
        d = nchypergeom_fisher(16, 5, 6, psi)
        xs = np.arange(0, 6)
        pmf = d.pmf(xs)
        gamma = np.minimum(d.cdf(xs), d.sf(xs - 1))
        return pmf[gamma <= gamma[4] * (1 + 1e-7)].sum()

    assert e.pvalue == pytest.approx(blaker(1.0))
    assert e.ci_low > 1 and e.pvalue < 0.05  # matched: the interval excludes 1 as the test rejects
    # the ends are where the same test starts to reject (Blaker's p jumps there)
    assert blaker(e.ci_low * 0.999) < 0.05 < blaker(e.ci_low * 1.001)
    assert blaker(e.ci_high * 1.001) < 0.05 < blaker(e.ci_high * 0.999)
    # the doubled test and its central interval: the other matched pair (scipy's interval)
    from thermo_lens.stats.exact import fisher_exact

    c = fisher_exact(table, method="central")
    ci = c.confidence_interval(0.95)
    assert (ci.low, ci.high) == pytest.approx(tuple(orr.confidence_interval(0.95)), rel=1e-4)
    assert round(c.pvalue, 3) == 0.071 and ci.low < 1
    t = h.primary
    assert t.pvalue == e.pvalue and t.ci_low == e.ci_low and "inverts Blaker" in t.ci_method
    assert "not independent" in t.note


def test_heritage_without_the_declared_lab_tests_the_association():
    df = pd.DataFrame({"lab": ["A"] * 4 + ["B"] * 4, "gain": [0.9, 0.8, 0.95, 1.1, 1.2, 1.1, 1.3, 1.05]})
    h = laws.heritage(df)
    assert h.primary_lab == "" and h.primary.name.startswith("lab x dampener association")
    # 3 of 4 dampeners in A, 0 of 4 in B: chi-square by hand, p over all C(8, 3) labelings
    import itertools

    def chi2(lab):
        a = lab[:4].sum()
        b = lab[4:].sum()
        obs = np.array([[a, 4 - a], [b, 4 - b]], float)
        exp = np.outer(obs.sum(1), obs.sum(0)) / 8
        return ((obs - exp) ** 2 / exp).sum()

    y = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)
    allc = []
    for idx in itertools.combinations(range(8), 3):
        lab = np.zeros(8, bool)
        lab[list(idx)] = True
        allc.append(chi2(lab))
    assert h.primary.statistic == pytest.approx(chi2(y))
    assert h.primary.pvalue == pytest.approx(np.mean(np.array(allc) >= chi2(y) - 1e-9))
    assert {t.role for t in h.tests if t.name.endswith("vs rest (dampener vs not)")} == {"secondary"}
    named = laws.heritage(df, primary_lab="B")
    assert named.primary.name.startswith("B vs rest")


def test_threshold_rule_pvalue_by_enumeration():
    import itertools

    rho = np.array([0.05, 0.1, 0.12, 0.17, 0.18, 0.22, 0.3, 0.4])
    y = np.array([0, 0, 1, 0, 1, 1, 1, 0], dtype=bool)
    ths = np.linspace(0.15, 0.2, 11)
    p, how = laws.threshold_rule_pvalue(rho, y, ths)

    def best(lab):
        return max(np.mean((rho > t) == lab) for t in ths)

    obs = best(y)
    allb = []
    for idx in itertools.combinations(range(8), int(y.sum())):
        lab = np.zeros(8, dtype=bool)
        lab[list(idx)] = True
        allb.append(best(lab))
    assert p == pytest.approx(np.mean(np.array(allb) >= obs - 1e-12)) and "exact" in how


@pytest.mark.slow
def test_crowding_within_vs_across_family_side_by_side():
    comp = laws.crowding_comparison({"within Pythia": reference.pythia_family(),
                                     "across labs": reference.lab_survey(), "all": reference.gains()})
    f = comp.to_frame().set_index("scope")
    assert f.loc["within Pythia", "best_accuracy"] == 1.0 and f.loc["within Pythia", "baseline_accuracy"] == 0.5
    assert (f.loc["within Pythia", "rho_crit_low"], f.loc["within Pythia", "rho_crit_high"]) == pytest.approx((0.19, 0.2))
    assert f.loc["across labs", "best_accuracy"] == 0.4375 and not f.loc["across labs", "beats_baseline"]
    assert f.loc["all", "best_accuracy"] == pytest.approx(f.loc["all", "baseline_accuracy"])
    assert round(f.loc["within Pythia", "r_rho_depth"], 2) == 0.72
    assert round(f.loc["within Pythia", "partial_r"], 2) == -0.54 and round(f.loc["within Pythia", "partial_pvalue"], 2) == 0.21
    text = repr(comp)
    assert "8/8" in text and "rho and depth L correlate" in text and "below the majority baseline" in text
    c = comp.results["within Pythia"]
    assert c.partial.control == "n_layers" and "confound" in c.confound
    # without depth there is no confound to name, and no partial correlation
    nod = laws.crowding(reference.lab_survey().drop(columns="n_layers"))
    assert nod.partial is None and nod.confound == ""


def test_hierarchy_adjacent_groups_exact_permutation():
    import itertools

    t = pd.DataFrame({"lab": ["a"] * 3 + ["b"] * 4, "gain": [0.9, 0.95, 1.0, 1.1, 1.2, 1.15, 1.3]})
    h = laws.hierarchy(t)
    (test,) = h.tests_by_role("secondary")
    xa, xb = np.array([0.9, 0.95, 1.0]), np.array([1.1, 1.2, 1.15, 1.3])
    allx = np.concatenate([xa, xb])
    obs = abs(xb.mean() - xa.mean())

    def perm_p(u, v):
        z = np.concatenate([u, v])
        o = abs(v.mean() - u.mean())
        diffs = []
        for idx in itertools.combinations(range(7), 4):
            m = np.zeros(7, dtype=bool)
            m[list(idx)] = True
            diffs.append(abs(z[m].mean() - z[~m].mean()))
        return np.mean(np.array(diffs) >= o - 1e-9)

    assert test.pvalue == pytest.approx(perm_p(xa, xb)) and "exact" in test.pvalue_method
    assert test.pvalue_other == pytest.approx(stats.ttest_ind(xb, xa, equal_var=False).pvalue)
    assert test.effect_value == pytest.approx(xb.mean() - xa.mean())
    assert obs == pytest.approx(test.effect_value)
    # the interval inverts the same test: at its ends the shifted samples are just rejected
    for end, inside in ((test.ci_low, +1), (test.ci_high, -1)):
        assert perm_p(xa, xb - end) <= 0.05 + 1e-9
        assert perm_p(xa, xb - (end + inside * 1e-3)) > 0.05
    # the primary: Kruskal-Wallis H, exact permutation p over all C(7, 3) labelings
    hk = stats.kruskal(xa, xb).statistic
    hs = []
    for idx in itertools.combinations(range(7), 3):
        m = np.zeros(7, dtype=bool)
        m[list(idx)] = True
        hs.append(stats.kruskal(allx[m], allx[~m]).statistic)
    assert h.primary.statistic == pytest.approx(hk)
    assert h.primary.pvalue == pytest.approx(np.mean(np.array(hs) >= hk - 1e-9))


def test_twin_primary_and_matched_intervals():
    tw = laws.twin(reference.twins())
    p = tw.primary
    assert p.pvalue == pytest.approx(0.125) and p.alternative == "greater"
    # one-sided exact bound: the smallest fraction the one-sided test does not reject, 0.05 ** (1/3)
    assert p.ci_low == pytest.approx(0.05 ** (1 / 3)) and p.ci_high == 1.0
    (mag,) = tw.tests_by_role("secondary")
    logr = np.log(tw.pairs["ratio"].to_numpy())
    walsh = [(logr[i] + logr[j]) / 2 for i in range(3) for j in range(i, 3)]
    assert mag.effect_value == pytest.approx(np.exp(np.median(walsh)))
    assert mag.pvalue == pytest.approx(stats.wilcoxon(logr, method="exact").pvalue)
    assert (mag.ci_low, mag.ci_high) == (0.0, math.inf)  # 3 pairs: no ratio is rejected at 5% (min p = 0.25)


@pytest.mark.slow
def test_crowding_separation_gets_an_exact_p_and_says_in_sample():
    """Within Pythia rho separates the classes: no finite MLE, so the asymptotic LR p (8.7e-4) is
    not valid; the exact conditional p is 1/70, and it is not counted beside the rule (same null)."""
    import itertools

    from thermo_lens.paper.findings import RHO_CRIT_FITTED_ON

    pyt = reference.pythia_family()
    c = laws.crowding(pyt, fitted_on=RHO_CRIT_FITTED_ON)
    assert c.logistic.separated and math.isnan(c.logistic.lr_pvalue)
    assert round(stats.chi2.sf(c.logistic.lr_statistic, 1), 5) == 0.00087  # what the asymptotic test would say
    t = {x.name: x for x in c.tests}
    logi = t["logistic P(dampener) on rho"]
    rho, y = pyt["rho"].to_numpy(), (pyt["gain"] < 1).to_numpy()
    obs = rho[y].sum()
    ts = [rho[list(i)].sum() for i in itertools.combinations(range(8), int(y.sum()))]
    assert logi.pvalue == pytest.approx(np.mean(np.array(ts) >= obs - 1e-12)) == pytest.approx(1 / 70)
    assert logi.role == "sensitivity" and math.isnan(logi.pvalue_holm) and math.isnan(logi.pvalue_other)
    assert all(x.pvalue > 1e-3 for x in c.tests)  # no asymptotic 8.7e-4 anywhere
    assert c.primary.name.startswith("rule") and c.primary.pvalue == pytest.approx(1 / 70)
    assert c.sample == "in-sample" and "in-sample" in c.primary.note and "in-sample" in repr(c)
    # the slope's interval inverts the exact one-sided test: [low, inf), P_low(T >= t_obs) = 0.05
    lo = logi.ci_low
    w = np.exp(lo * (np.array(ts) - max(ts)))
    assert w[np.array(ts) >= obs - 1e-12].sum() / w.sum() == pytest.approx(0.05, abs=1e-6) and logi.ci_high == math.inf
    # out of sample: the survey (15 of 16 not used to fit rho_crit)
    s = laws.crowding(reference.lab_survey(), fitted_on=RHO_CRIT_FITTED_ON)
    assert s.sample.startswith("partly in-sample (1 of 16") and round(s.rule_pvalue, 2) == 0.89
    assert laws.crowding(reference.lab_survey().iloc[:8]).sample == "unknown"


def test_kruskal_exact_enumeration_equals_brute_force_and_monte_carlo_says_its_se():
    """The chunked exact enumeration (largest group by combinations, the rest by arrangements)
    counts the same labelings as the plain list of every arrangement, ties included."""
    import importlib

    H = importlib.import_module("thermo_lens.laws.hierarchy")
    rng = np.random.default_rng(2)
    g = np.round(rng.normal(size=10), 1)                       # rounded: ties among the ranks
    keys = np.array(list("aaaabbbccd"))                         # sizes 4, 3, 2, 1: 12,600 labelings
    ranks = stats.rankdata(g)
    code = np.array([list(dict.fromkeys(keys)).index(k) for k in keys])
    sizes = np.bincount(code).astype(float)
    every = H._arrangements(sizes.astype(int), 10)
    t_all = np.stack([(ranks * (every == j)).sum(1) ** 2 / sizes[j] for j in range(4)], 1).sum(1)
    t_obs = sum(ranks[code == j].sum() ** 2 / sizes[j] for j in range(4))
    hits, total = H._exact_rank_sum_stat(ranks, code, sizes, t_obs, 1e-9 * t_obs)
    assert total == len(every) == 12_600 and hits == int(np.sum(t_all >= t_obs - 1e-9 * t_obs))
    h_small, p_small, how_small = H._kruskal_perm(keys, g)                      # <= 20,000: the plain list
    assert how_small == "exact permutation (all 12600 labelings)" and p_small == pytest.approx(hits / total)
    assert h_small == pytest.approx(stats.kruskal(*[g[keys == k] for k in dict.fromkeys(keys)]).statistic)
    # the paper's survey: Monte Carlo by default (with its standard error), exact when asked
    s = reference.lab_survey()
    mc = laws.hierarchy(s, by="lab").primary
    assert mc.pvalue_method.startswith("Monte Carlo permutation (20000 labelings, seed 0; Monte Carlo SE 0.00")
    with pytest.raises(ValueError, match="exact_max"):
        laws.hierarchy(s, by="lab", exact_max=10 ** 9)


@pytest.mark.slow
def test_kruskal_exact_on_the_survey():
    s = reference.lab_survey()
    ex = laws.hierarchy(s, by="lab", exact_max=100_000_000).primary
    assert ex.pvalue_method == "exact permutation (all 60,540,480 labelings)" and round(ex.pvalue, 4) == 0.2959


def test_crowding_rule_p_exact_in_chunks_equals_one_block():
    from itertools import combinations

    from thermo_lens.laws.crowding import _labelings, threshold_rule_pvalue

    blocks = np.concatenate(list(_labelings(9, 4, chunk=7)))
    every = np.zeros((126, 9), bool)
    for i, c in enumerate(combinations(range(9), 4)):
        every[i, list(c)] = True
    assert np.array_equal(blocks, every)
    rng = np.random.default_rng(4)
    rho, y = rng.uniform(0.1, 0.3, size=14), rng.random(14) < 0.4
    ths = np.linspace(0.15, 0.2, 11)
    p_exact, how = threshold_rule_pvalue(rho, y, ths)
    # brute force: best accuracy over the grid for every labeling with the same number of dampeners
    best = lambda lab: max(np.mean((rho > t) == lab) for t in ths)  # noqa: E731
    labs = [np.isin(np.arange(14), c) for c in combinations(range(14), int(y.sum()))]
    assert p_exact == pytest.approx(np.mean([best(lab) >= best(y) - 1e-12 for lab in labs]))
    assert how.startswith("exact permutation (all ")
    p_mc, how_mc = threshold_rule_pvalue(rho, y, ths, exact_max=10)
    assert "Monte Carlo SE" in how_mc and abs(p_mc - p_exact) < 5 * np.sqrt(p_exact * (1 - p_exact) / 20_000) + 1e-9
