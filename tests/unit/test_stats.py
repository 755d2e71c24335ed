"""Across-prompt summaries vs numpy / scipy.stats on the same values."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples
from scipy import stats

from thermo_lens.stats import SummaryStats, partial_correlation, summarize

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


def _scipy(x, level=0.95):
    x = np.asarray(x, dtype=float)
    se = stats.sem(x)
    with np.errstate(invalid="ignore"):  # scipy warns for a zero-width interval
        lo, hi = stats.t.interval(level, x.size - 1, loc=x.mean(), scale=se)
    return x.mean(), np.std(x, ddof=1), se, lo, hi


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(finite, min_size=2, max_size=40), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_summary_equals_scipy(values, level):
    s = summarize(values, level=level)
    mean, sd, se, lo, hi = _scipy(values, level)
    assert s.n == len(values) and s.ddof == 1 and s.level == level
    tol = dict(rel=1e-9, abs=1e-9)
    assert s.mean == pytest.approx(mean, **tol)
    assert s.sd == pytest.approx(sd, **tol)
    assert s.se == pytest.approx(se, **tol)
    if sd > 0:
        assert s.ci_low == pytest.approx(lo, **tol) and s.ci_high == pytest.approx(hi, **tol)
    else:  # scipy gives NaN for a zero-width interval; the interval is the point itself
        assert s.ci_low == pytest.approx(mean, **tol) and s.ci_high == pytest.approx(mean, **tol)
    assert s.sd_ddof0 == pytest.approx(np.std(values), **tol)
    np.testing.assert_array_equal(s.values, np.asarray(values, dtype=float))


def test_axis_summary_per_layer_equals_columnwise():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 0.1, size=(7, 5))  # [prompt, layer]
    s = summarize(torch.tensor(x, dtype=torch.float32))
    assert s.mean.shape == (5,) and list(s.n) == [7] * 5
    for l in range(5):
        col = summarize(x[:, l].astype(np.float32))
        assert s.mean[l] == pytest.approx(col.mean, rel=1e-12)
        assert s.ci_high[l] == pytest.approx(col.ci_high, rel=1e-12)
    # axis=1 summarises over the other axis
    s1 = summarize(x, axis=1)
    np.testing.assert_allclose(s1.sd, np.std(x, axis=1, ddof=1), rtol=1e-12)


def test_nan_policies():
    x = np.array([1.0, np.nan, 3.0, 2.0])
    assert np.isnan(summarize(x).mean)  # propagate, as scipy
    s = summarize(x, nan_policy="omit")
    ref = stats.sem(x, nan_policy="omit")
    assert s.n == 3 and s.mean == pytest.approx(2.0) and s.se == pytest.approx(float(ref))
    with pytest.raises(ValueError, match="NaN"):
        summarize(x, nan_policy="raise")
    m = np.array([[1.0, np.nan], [2.0, np.nan], [4.0, 5.0]])
    sm = summarize(m, nan_policy="omit")
    assert list(sm.n) == [3, 1] and np.isnan(sm.sd[1]) and sm.mean[1] == 5.0


def test_one_value_has_no_spread():
    s = summarize([1.3])
    assert s.n == 1 and s.mean == 1.3
    assert all(np.isnan(v) for v in (s.sd, s.se, s.ci_low, s.ci_high))
    assert s.sd_ddof0 == 0.0 and s.excludes(1.0) is False


def test_excludes_and_format():
    s = summarize([1.2, 1.3, 1.25])
    assert s.excludes(1.0) and not s.excludes(1.25)
    text = repr(s)
    assert "ddof=1" in text and "95% CI" in text and "n=3" in text
    assert set(s.to_dict()) == {"n", "mean", "sd", "se", "ci_low", "ci_high", "level", "sd_ddof"}


def test_json_round_trip():
    s = summarize(np.array([[1.0, 2.0], [1.5, 2.5], [0.5, 3.0]]))
    back = SummaryStats.from_json(s.to_json())
    np.testing.assert_array_equal(back.mean, s.mean)
    np.testing.assert_array_equal(back.values, s.values)
    scalar = summarize([1.0, 2.0])
    assert SummaryStats.from_json(scalar.to_json()).ci_low == scalar.ci_low


def test_bad_input():
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="scalar"):
        summarize(1.0)
    with pytest.raises(ValueError, match="level"):
        summarize([1.0, 2.0], level=95)
    with pytest.raises(ValueError, match="nan_policy"):
        summarize([1.0, 2.0], nan_policy="drop")


# ---------------------------------------------------------------- shared inference helpers

def test_t_interval_is_the_one_behind_summarize_gain_ci_and_groups():
    from thermo_lens import laws
    from thermo_lens.stats import t_interval

    x = np.array([1.0, 1.3, 0.9, 1.2, 1.05])
    lo, hi = stats.t.interval(0.95, 4, loc=x.mean(), scale=stats.sem(x))
    assert t_interval(x.mean(), x.std(ddof=1), 5) == pytest.approx((lo, hi))
    s = summarize(x)
    assert (s.ci_low, s.ci_high) == pytest.approx((lo, hi))
    assert laws.gain_ci(x.mean(), x.std(ddof=1), 5) == pytest.approx((lo, hi))
    h = laws.hierarchy({"lab": ["a"] * 5 + ["b"], "gain": [*x, 1.0]}).groups.set_index("group")
    assert (h.loc["a", "ci_low"], h.loc["a", "ci_high"]) == pytest.approx((lo, hi))
    assert np.isnan(t_interval(1.0, np.nan, 1)[0])


def test_regime_rule_is_shared():
    from thermo_lens import laws
    from thermo_lens.stats import regime_from_ci

    assert regime_from_ci(1.01, 1.2) == "expander" and regime_from_ci(0.8, 0.99) == "dampener"
    assert regime_from_ci(0.9, 1.1) == "neutral" and regime_from_ci(np.nan, 1.0) == "undetermined"
    assert list(regime_from_ci([1.1, 0.5], [1.2, 0.6])) == ["expander", "dampener"]
    assert laws.regime_from_gain(1.05, 1.01, 1.1) == regime_from_ci(1.01, 1.1)


def test_format_p_and_holm():
    from thermo_lens.stats import format_p, holm

    assert format_p(0.01443) == "0.0144" and format_p(0.0004) == "4.00e-04" and format_p(np.nan) == "nan"
    p = np.array([0.01, 0.04, 0.03, 0.2])
    # by hand: sorted 0.01*4=0.04, 0.03*3=0.09, 0.04*2=0.08 -> 0.09 (monotone), 0.2*1 -> 0.2
    np.testing.assert_allclose(holm(p), [0.04, 0.09, 0.09, 0.2])
    np.testing.assert_allclose(holm([0.5, np.nan, 0.01]), [0.5, np.nan, 0.02])


@pytest.mark.slow
@pytest.mark.parametrize("n", [5, 8])
def test_permutation_p_is_exact_at_small_n(n):
    import itertools

    from thermo_lens.stats import permutation_correlation_pvalue

    rng = np.random.default_rng(n)
    x, y = rng.normal(size=n), rng.normal(size=n)
    y[0] = y[1]  # a tie
    p, how = permutation_correlation_pvalue(x, y, "spearman")
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    obs = stats.pearsonr(rx, ry).statistic
    allr = [np.corrcoef(rx, ry[list(pp)])[0, 1] for pp in itertools.permutations(range(n))]
    assert p == pytest.approx(np.mean(np.abs(allr) >= abs(obs) - 1e-12)) and "exact" in how
    pp, _ = permutation_correlation_pvalue(x, y, "pearson")
    allp = [np.corrcoef(x, y[list(q)])[0, 1] for q in itertools.permutations(range(n))]
    assert pp == pytest.approx(np.mean(np.abs(allp) >= abs(np.corrcoef(x, y)[0, 1]) - 1e-12))
    p_big, how_big = permutation_correlation_pvalue(rng.normal(size=30), rng.normal(size=30))
    assert "Monte Carlo" in how_big and 0 < p_big <= 1


def test_fisher_z_partial_and_odds_ratio():
    from thermo_lens.stats import fisher_z_ci, odds_ratio_ci, partial_correlation

    rng = np.random.default_rng(0)
    x, z = rng.normal(size=12), rng.normal(size=12)
    y = x + z + rng.normal(size=12)
    ci = stats.pearsonr(x, y).confidence_interval(0.95)
    assert fisher_z_ci(stats.pearsonr(x, y).statistic, 12) == pytest.approx((ci.low, ci.high))
    pc = partial_correlation(x, y, z)
    P = np.linalg.inv(np.corrcoef(np.vstack([x, y, z])))
    assert pc.statistic == pytest.approx(-P[0, 1] / np.sqrt(P[0, 0] * P[1, 1]))
    assert pc.r_xz == pytest.approx(stats.pearsonr(x, z).statistic)
    orr = stats.contingency.odds_ratio([[4, 1], [2, 9]])
    c = orr.confidence_interval(0.95)
    assert odds_ratio_ci([[4, 1], [2, 9]]) == pytest.approx((orr.statistic, c.low, c.high))


def test_kruskal_effect_sizes():
    from thermo_lens.stats import kruskal_detectable_effect, kruskal_effect_size

    groups = [[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.5, 4.5, 6.0, 7.0], [5.0, 6.5, 7.5, 8.0, 9.0]]
    h = stats.kruskal(*groups).statistic
    e = kruskal_effect_size(h, 15, 3)
    assert e["epsilon_squared"] == pytest.approx(h * 16 / (15 ** 2 - 1))  # H (n+1)/(n^2-1)
    assert e["eta_squared_h"] == pytest.approx((h - 2) / 12)
    d = kruskal_detectable_effect(25, 5)
    lam = (3 / np.pi) * 25 * d / (1 - d)
    assert stats.ncx2.sf(stats.chi2.ppf(0.95, 4), 4, lam) == pytest.approx(0.8)
    assert kruskal_detectable_effect(250, 5) < d  # more prompts, smaller detectable effects


def test_paired_detectable_shift_has_the_stated_power():
    from thermo_lens.stats import paired_detectable_shift

    # an independent check: simulate paired t-tests at the returned shift, count rejections
    rng = np.random.default_rng(3)
    for n, alpha in ((12, 0.05), (12, 0.05 / 6), (6, 0.05)):
        shift = paired_detectable_shift(1.0, n, alpha)
        x = rng.normal(shift, 1.0, size=(40_000, n))
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        power = np.mean(np.abs(t) > stats.t.ppf(1 - alpha / 2, n - 1))
        assert power == pytest.approx(0.8, abs=0.01)   # MC SE 0.002
    assert paired_detectable_shift(0.02, 12) == pytest.approx(0.02 * paired_detectable_shift(1.0, 12))
    # large n: the normal approximation (z_{0.975} + z_{0.8}) sd / sqrt(n)
    assert paired_detectable_shift(1.0, 10_000) == pytest.approx(2.8016 / 100, rel=1e-3)
    assert np.isnan(paired_detectable_shift(1.0, 1))


def test_sign_flip_ties_are_judged_on_the_data_scale():
    import itertools
    from fractions import Fraction

    from thermo_lens.stats.exact import sign_flip_pvalue

    def exact_p(k):  # integer data: |sum(s k)| >= |sum(k)| decided exactly, ties and all
        obs = abs(sum(k))
        return Fraction(sum(abs(sum(s * v for s, v in zip(signs, k))) >= obs
                            for signs in itertools.product((1, -1), repeat=len(k))), 2 ** len(k))

    rng = np.random.default_rng(11)
    for k in ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [3, 3, 3, 3, -3, -3, 1, 2, 3, 6], list(rng.integers(-9, 10, size=12)),
              [1] * 12):
        want = float(exact_p(k))
        for c in (1e-300, 1e-20, 1e-13, 0.1, 1.0, 3.7e4, 1e20, 1e290):
            assert sign_flip_pvalue(np.asarray(k, float) * c) == want, (k, c)
    # the absolute tolerance this replaces counted every pattern as a tie on data of scale 1e-13
    assert sign_flip_pvalue(np.full(12, 1e-13)) == 2 / 4096
    assert sign_flip_pvalue(np.zeros(5)) == 1.0 and np.isnan(sign_flip_pvalue([]))


# ---------------------------------------------------------------- exact tests whose interval inverts them

def test_signed_rank_equals_scipy_without_ties_and_brute_force_with_them():
    import itertools

    from thermo_lens.stats.exact import signed_rank_test

    rng = np.random.default_rng(1)
    for _ in range(50):
        d = rng.normal(size=int(rng.integers(3, 12)))
        assert signed_rank_test(d).pvalue == pytest.approx(stats.wilcoxon(d, method="exact").pvalue, abs=1e-12)
    # ties (the L* paired errors have a value three times): every sign flip by hand, midranks
    d = np.array([0.16, 0.04, -0.16, -0.1, 0.2, -0.16])
    r = stats.rankdata(np.abs(d))
    w = r[d > 0].sum()
    flips = np.array(list(itertools.product([0, 1], repeat=6)), bool)
    ws = (flips * r).sum(1)
    e = ws.mean()
    want = np.mean(np.abs(ws - e) >= abs(w - e) - 1e-12)
    res = signed_rank_test(d)
    assert res.statistic == w and res.pvalue == pytest.approx(want)
    walsh = [(d[i] + d[j]) / 2 for i in range(6) for j in range(i, 6)]
    assert res.estimate == pytest.approx(np.median(walsh))
    lo, hi = res.confidence_interval(0.95)
    assert signed_rank_test(d - lo).pvalue > 0.05 and signed_rank_test(d - (lo - 1e-6)).pvalue <= 0.05
    assert signed_rank_test(d - hi).pvalue > 0.05 and signed_rank_test(d - (hi + 1e-6)).pvalue <= 0.05
    # without ties the ends are Walsh averages (the textbook Hodges-Lehmann interval)
    x = rng.normal(size=9)
    lo, hi = signed_rank_test(x).confidence_interval(0.9)
    wa = np.sort([(x[i] + x[j]) / 2 for i in range(9) for j in range(i, 9)])
    assert min(abs(wa - lo)) < 1e-9 and min(abs(wa - hi)) < 1e-9


def test_fisher_central_is_scipys_interval_and_blaker_lies_inside():
    from scipy.stats.contingency import odds_ratio

    from thermo_lens.stats.exact import fisher_exact

    for t in ([[4, 1], [2, 9]], [[3, 1], [1, 7]], [[7, 2], [3, 9]], [[10, 5], [4, 12]]):
        c = fisher_exact(t, method="central")
        ref = odds_ratio(np.array(t)).confidence_interval(0.95)
        assert tuple(c.confidence_interval(0.95)) == pytest.approx((ref.low, ref.high), rel=1e-4)
        b = fisher_exact(t)
        blo, bhi = b.confidence_interval(0.95)
        assert ref.low - 1e-9 <= blo and bhi <= ref.high + 1e-6
        assert b.pvalue <= c.pvalue + 1e-12
        assert (blo > 1) == (b.pvalue < 0.05) and (c.confidence_interval().low > 1) == (c.pvalue < 0.05)
        assert b.pvalue_minlike == pytest.approx(stats.fisher_exact(t).pvalue)
    with pytest.raises(ValueError, match="2x2"):
        fisher_exact([[1, 2, 3]])


def test_logistic_exact_and_mean_difference_by_enumeration():
    import itertools

    from thermo_lens.stats.exact import logistic_exact_test, permutation_mean_difference

    x = np.array([0.1, 0.3, 0.2, 0.5, 0.4, 0.6, 0.35])
    y = np.array([0, 0, 1, 0, 1, 1, 1])
    ts = np.array([x[list(i)].sum() for i in itertools.combinations(range(7), 4)])
    t = x[y == 1].sum()
    for alt, want in (("greater", np.mean(ts >= t - 1e-12)), ("less", np.mean(ts <= t + 1e-12))):
        assert logistic_exact_test(x, y, alt).pvalue == pytest.approx(want)
    two = logistic_exact_test(x, y)
    assert two.pvalue == pytest.approx(min(1, 2 * min(np.mean(ts >= t - 1e-12), np.mean(ts <= t + 1e-12))))
    assert not two.separated and logistic_exact_test(x, (x > 0.32).astype(int)).separated
    u, v = np.array([1.0, 2.5, 3.0]), np.array([4.0, 5.0, 4.5, 7.0])
    md = permutation_mean_difference(u, v)
    z = np.r_[u, v]
    ds = [abs(z[list(i)].mean() - np.delete(z, list(i)).mean()) for i in itertools.combinations(range(7), 3)]
    assert md.pvalue == pytest.approx(np.mean(np.array(ds) >= abs(u.mean() - v.mean()) - 1e-12))
    lo, hi = md.confidence_interval(0.9)
    assert lo < md.statistic < hi and md.pvalue_at(lo - 1e-3) <= 0.1 < md.pvalue_at(lo + 1e-3)


def test_confidence_interval_at_any_level_and_df():
    """SummaryStats and PartialCorrelation: confidence_interval(level) as scipy's, df."""
    x = np.array([[1.0, 2.0], [1.4, 2.5], [0.7, 1.1], [1.2, 3.0]])
    s = summarize(x)
    for level in (0.95, 0.9, 0.5):
        lo, hi = s.confidence_interval(level)
        ref = stats.t.interval(level, 3, loc=x.mean(0), scale=stats.sem(x, axis=0))
        np.testing.assert_allclose(lo, ref[0], rtol=1e-12)
        np.testing.assert_allclose(hi, ref[1], rtol=1e-12)
    np.testing.assert_array_equal(s.confidence_interval().low, s.ci_low)
    assert list(s.df) == [3, 3] and summarize([1.0, 2.0, 4.0]).df == 2
    with pytest.raises(ValueError, match="level"):
        s.confidence_interval(0.0)
    rng = np.random.default_rng(0)
    z = rng.normal(size=12)
    pc = partial_correlation(z + rng.normal(size=12), z + rng.normal(size=12), z)
    assert pc.df == 9 and pc.confidence_interval() == pytest.approx((pc.ci_low, pc.ci_high), rel=1e-12)
    se, q = 1 / np.sqrt(12 - 4), stats.norm.ppf(0.95)
    expect = np.tanh(np.arctanh(pc.statistic) + np.array([-q, q]) * se)
    assert pc.confidence_interval(0.9) == pytest.approx(tuple(expect), rel=1e-12)
