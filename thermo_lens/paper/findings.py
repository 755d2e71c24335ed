"""What the paper's own numbers say, recomputed with :mod:`thermo_lens.laws`.

Every quantitative sentence of the findings page (`docs/findings.md`, "What the paper's own numbers say") is generated
by :func:`readme_section` from :func:`compute` (a test regenerates it and fails when the page and
the computation drift apart). Inputs: :mod:`thermo_lens.paper.reference`, the per-model numbers of
the paper's result files: the 8-model Pythia sweep (metric A, 25 prompts), the 16-model lab survey
(metric A, 5 prompts), the base/instruct twins and the six L* validation models of the paper's
Fig. A2. Each law is read through its declared primary test (``thermo_lens.definitions`` §5), and
each finding carries its caveat.

:func:`law_results` runs the same laws on the paper's tables with extra rows of your own (one row
per model, the columns :mod:`thermo_lens.laws` takes), e.g. a study's ``profiles_frame``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from thermo_lens.paper import reference
from thermo_lens.paper.lstar import l_star_predictor_test, predicted_l_star

if TYPE_CHECKING:
    import pandas as pd

    from thermo_lens.laws.table import Table

__all__ = ["compute", "readme_section", "crowding_scopes", "l_star_validation_table", "law_results",
           "RHO_CRIT_FITTED_ON", "bound_tables", "PUBLIC_DEPTHS", "primary_holm"]

_LSTAR_V2 = "L_star_empirical_v2_argmax (approx)"
_LSTAR_CALIBRATION = "L_star_trace_argmax_grad"

#: The models the paper chose rho_crit on (its Pythia sweep): a crowding accuracy on them is in-sample.
RHO_CRIT_FITTED_ON: tuple[str, ...] = ("pythia-70m", "pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b",
                                       "pythia-2.8b", "pythia-6.9b", "pythia-12b")

#: The paper's gain measurements held to the bound, with how the findings page names them.
_BOUND_METRICS = {"residual_gain_no_final_ln": "metric A (G_(L-1))", "emb_to_block0_gain": "G_1",
                  "last_block_gain_hook": "metric B (G_L)", "residual_gain_with_final_ln": "G_L with the final norm"}


def crowding_scopes() -> dict[str, Any]:
    """The crowding tables side by side: within one family, across families, all models."""
    return {"within-family (8 Pythia)": reference.pythia_family(),
            "across-family (16-model lab survey)": reference.lab_survey(),
            "all 23 models": reference.gains()}


def l_star_validation_table():
    """The paper's six L* validation models (Fig. A2; empirical values read off its plot)."""
    t = reference.table()
    v = t[t["measurement"] == _LSTAR_V2].rename(columns={"value": "empirical"})
    return v[["model", "n_layers", "n_heads", "empirical"]].reset_index(drop=True)


#: Depths the paper's table lacks for some metric-B rows, from each checkpoint's public config.json
#: (``num_hidden_layers``; ``n_layer`` for GPT-2). Used only where asked (``fill_public_depths``).
PUBLIC_DEPTHS: dict[str, int] = {"mistralai/Mistral-7B-Instruct-v0.2": 32, "google/gemma-7b-it": 28,
                                 "meta-llama/Llama-3.1-8B-Instruct": 32, "gpt2-medium": 24, "gpt2-large": 36,
                                 "gpt2-xl": 48}


def bound_tables(fill_public_depths: bool = False):
    """One frame per gain measurement of the paper (:data:`_BOUND_METRICS`), each model held to 10^(1/L).

    Rows without a depth in the paper's table are left out (``bound_table`` skips them), unless
    ``fill_public_depths``: then their depth comes from :data:`PUBLIC_DEPTHS` (the models' configs).
    """
    import pandas as pd

    from thermo_lens import laws

    frames = []
    for meas, label in _BOUND_METRICS.items():
        rows = reference.gains(meas)
        if fill_public_depths:
            rows = rows.copy()
            missing = rows["n_layers"].isna() & rows["hf_id"].isin(list(PUBLIC_DEPTHS))
            rows.loc[missing, "n_layers"] = rows.loc[missing, "hf_id"].map(PUBLIC_DEPTHS)
        b = laws.bound_table(rows, ["gain"])
        b["n_rows"] = len(rows)
        b["metric"], b["measurement"] = label, meas
        frames.append(b)
    return pd.concat(frames, ignore_index=True)


def law_results(extra: Table | None = None) -> dict[str, Any]:
    """The laws on the paper's tables, with ``extra`` rows (your models) added to each.

    ``extra``: ``None`` or a table with one row per model (``model``, ``gain``, ``n_layers``,
    ``rho`` or ``n_heads``/``d_head``, ``lab`` for heritage). Returns ``{"kleiber": ...,
    "heritage": ..., "crowding": ..., "twin": ..., "hierarchy": ...}``: Kleiber on the Pythia sweep
    (+ extra), heritage and hierarchy on the lab survey (+ extra rows that have a lab), crowding
    within Pythia, across the survey and on all models (+ extra, out of sample unless a model is
    one of :data:`RHO_CRIT_FITTED_ON`), the twins as published. Gains are the paper's metric A;
    an extra row measured under another definition is not like for like (see
    ``views.reference_overlay``).
    """
    import pandas as pd

    from thermo_lens import laws
    from thermo_lens.laws.table import _as_frame

    def plus(t: pd.DataFrame, need: tuple[str, ...] = ()) -> pd.DataFrame:
        if extra is None:
            return t
        e = _as_frame(extra, "law_results")
        if need and not set(need) <= set(e.columns):
            return t
        if need:
            e = e[e[list(need)].notna().all(axis=1)]
        return pd.concat([t, e], ignore_index=True)

    scopes = crowding_scopes()
    if extra is not None:
        scopes["with your models"] = plus(reference.gains())
    return {
        "kleiber": laws.kleiber(plus(reference.pythia_family())),
        "heritage": laws.heritage(plus(reference.lab_survey(), ("lab",))),
        "crowding": laws.crowding_comparison(scopes, fitted_on=RHO_CRIT_FITTED_ON),
        "twin": laws.twin(reference.twins()),
        "hierarchy": laws.hierarchy(plus(reference.lab_survey(), ("lab",)), by="lab"),
    }


def _test(result, name: str):
    return next(t for t in result.tests if t.name == name)


def _primary(result):
    p = result.primary
    if p is None:  # pragma: no cover - the paper's tables always carry one
        raise RuntimeError(f"{type(result).__name__} declared no primary test on the paper's table")
    return p


@lru_cache(maxsize=1)
def _compute() -> dict[str, Any]:
    from scipy import stats

    from thermo_lens import laws
    from thermo_lens.laws.crowding import threshold_rule_pvalue
    from thermo_lens.laws.hierarchy import KRUSKAL_EXACT_LIMIT
    from thermo_lens.stats.exact import fisher_exact, logistic_exact_test

    f: dict[str, Any] = {}
    pyt, survey = reference.pythia_family(), reference.lab_survey()
    # ---- Kleiber: primary gain vs rho (Pearson, exact permutation p)
    k = laws.kleiber(pyt)
    pr, sp, dep = _primary(k), _test(k, "gain vs rho: Spearman"), _test(k, "gain vs depth L: Pearson")
    keep = pyt["model"] != pr.loo_worst_model
    f.update(kleiber_n=k.n, kleiber_primary=pr.name, kleiber_r_rho=pr.statistic, kleiber_p_rho=pr.pvalue,
             kleiber_p_rho_t=pr.pvalue_other, kleiber_ci_rho=(pr.ci_low, pr.ci_high),
             kleiber_r_depth=dep.statistic, kleiber_p_depth=dep.pvalue,
             kleiber_n_secondary=len(k.tests_by_role("secondary")),
             kleiber_loo_worst_model=pr.loo_worst_model, kleiber_loo_worst_p=pr.loo_worst_pvalue,
             kleiber_loo_worst_r=float(stats.pearsonr(pyt.loc[keep, "rho"], pyt.loc[keep, "gain"]).statistic),
             kleiber_spearman=sp.statistic, kleiber_spearman_p_exact=sp.pvalue, kleiber_spearman_p_t=sp.pvalue_other,
             kleiber_r_rho_depth=float(stats.pearsonr(pyt["rho"], pyt["n_layers"].astype(float)).statistic))
    # ---- the bound, per gain metric
    viol = laws.kleiber_violations(pyt, survey, names=["Pythia sweep", "lab survey"])
    f["violations"] = [(r.table, r.model, r.gain, r.bound, r.ci_low, r.ci_high, bool(r.violates_ci))
                       for r in viol.itertuples()]
    bt = bound_tables()
    filled = bound_tables(fill_public_depths=True).groupby("metric", sort=False)
    f["bound_by_metric"] = [(label, int(len(b)), int(b["violates"].sum()), int(b["violates_ci"].sum()),
                             float(b["gain"].min()), float(b["gain"].max()), int(b["n_rows"].iloc[0]),
                             int(filled.get_group(label)["violates"].sum()),
                             int(filled.get_group(label)["violates_ci"].sum()), int(len(filled.get_group(label))))
                            for label, b in bt.groupby("metric", sort=False)]
    g1 = bt[(bt["measurement"] == "emb_to_block0_gain")]
    f["bound_g1"] = (int(g1["violates"].sum()), len(g1), float(g1["gain"].min()), float(g1["gain"].max()),
                     float(g1["bound"].min()), float(g1["bound"].max()))
    # ---- heritage: primary EleutherAI vs rest (Blaker)
    h_sign = laws.heritage(survey)
    h_ci = laws.heritage(laws.add_regimes(survey, std_ddof=0))
    e_sign, e_ci = _primary(h_sign), _primary(h_ci)
    central = fisher_exact(h_sign.fisher["EleutherAI"].table, method="central")
    cci = central.confidence_interval(0.95)
    f.update(heritage_lab=h_sign.primary_lab, heritage_p_sign=e_sign.pvalue, heritage_p_ci=e_ci.pvalue,
             heritage_or=e_sign.effect_value, heritage_or_ci=(e_sign.ci_low, e_sign.ci_high),
             heritage_or_ci_labels=(e_ci.ci_low, e_ci.ci_high), heritage_minlike=e_sign.pvalue_other,
             heritage_central_p=central.pvalue, heritage_central_ci=(cci.low, cci.high),
             heritage_n_labs=len(h_sign.labs), heritage_n_secondary=len(h_sign.tests_by_role("secondary")),
             heritage_min_secondary_holm=min(t.pvalue_holm for t in h_sign.tests_by_role("secondary")),
             heritage_t4=float(stats.t.ppf(0.975, 4)))
    damp = survey[(survey["gain"] < 1) & (survey["lab"] != "EleutherAI")]
    f["heritage_other_dampeners"] = list(damp["model"])
    # ---- crowding: the rule (primary), in- and out-of-sample
    comp = laws.crowding_comparison(crowding_scopes(), fitted_on=RHO_CRIT_FITTED_ON)
    for key, (scope, c) in zip(("within", "across", "all"), comp.results.items()):
        logi = _test(c, "logistic P(dampener) on rho")
        f[f"crowding_{key}"] = {
            "scope": scope, "n": c.n, "hits": int(round(c.best_accuracy * c.n)), "accuracy": c.best_accuracy,
            "rho_crit": (min(c.best_thresholds), max(c.best_thresholds)), "baseline": c.baseline_accuracy,
            "rule_p": c.rule_pvalue, "sample": c.sample, "r_depth": c.depth_correlation.statistic,
            "partial_r": c.partial.statistic, "partial_p": c.partial.pvalue, "separated": c.logistic.separated,
            "logistic_exact_p": logi.pvalue, "lr_statistic": c.logistic.lr_statistic,
            "logistic_exact_p_two_sided": logistic_exact_test(c.table["rho"].to_numpy(float),
                                                              c.table["dampener"].to_numpy(int)).pvalue,
            "rule_p_exact": threshold_rule_pvalue(c.table["rho"].to_numpy(float), c.table["dampener"].to_numpy(bool),
                                                  c.thresholds["threshold"].to_numpy(float), exact_max=1_000_000),
            "lr_p_invalid": float(stats.chi2.sf(c.logistic.lr_statistic, 1)),
            "n_out": int(sum(m not in RHO_CRIT_FITTED_ON for m in c.table["model"]))}
    # ---- twins and hierarchy
    tw = laws.twin(reference.twins())
    f.update(twin_kept=tw.n_sign_kept, twin_n=tw.n_pairs, twin_p=_primary(tw).pvalue, twin_ci_low=_primary(tw).ci_low)
    hi = laws.hierarchy(survey, by="lab", exact_max=KRUSKAL_EXACT_LIMIT)  # 60,540,480 labelings: seconds
    f.update(hier_groups=len(hi.groups), hier_n=int(hi.groups["n"].sum()), hier_p=_primary(hi).pvalue,
             hier_p_method=_primary(hi).pvalue_method, hier_bench_n=int(len(reference.benchmark())))
    # ---- L*: eq. 6 vs L/2, paired
    v = l_star_validation_table()
    t = reference.table()
    calib = set(t.loc[t["measurement"] == _LSTAR_CALIBRATION, "model"])
    bloom = [m for m in v["model"] if laws.family_of(m) == "bloom"]
    tp, ta = l_star_predictor_test(v, "paper"), l_star_predictor_test(v, "ape")
    nb = v[~v["model"].isin(bloom)]
    ta_nb = l_star_predictor_test(nb, "ape")
    f.update(lstar_n=len(v), lstar_pairs=len(set(zip(v["n_layers"], v["n_heads"]))),
             lstar_calibration=int(v["model"].isin(calib).sum()), lstar_bloom=", ".join(bloom),
             lstar_eq6_paper=tp.mean_eq6, lstar_half_paper=tp.mean_half, lstar_p_paper=tp.pvalue,
             lstar_eq6_ape=ta.mean_eq6, lstar_half_ape=ta.mean_half, lstar_p_ape=ta.pvalue,
             lstar_nobloom_eq6_ape=ta_nb.mean_eq6, lstar_nobloom_half_ape=ta_nb.mean_half,
             lstar_deep=predicted_l_star(80, 64, warn=False))
    # ---- the six declared primary tests, each unadjusted; what Holm across them would give
    f["primary_holm"] = primary_holm(f)
    return f


def primary_holm(f: dict[str, Any]) -> list[tuple[str, float, float]]:
    """``(law, p, Holm-adjusted p)`` over the six declared primary tests of :func:`compute`'s numbers.

    The crowding law's primary is its rule on the models it was not fitted on (the survey); the L*
    comparison's is the paired test under the paper's own error ``|pred - emp| / L``.
    """
    from thermo_lens.stats import holm

    ps = [("Kleiber", f["kleiber_p_rho"]), ("heritage", f["heritage_p_sign"]),
          ("crowding", f["crowding_across"]["rule_p"]), ("twins", f["twin_p"]), ("hierarchy", f["hier_p"]),
          ("L*", f["lstar_p_paper"])]
    adj = holm([p for _, p in ps])
    return [(name, float(p), float(a)) for (name, p), a in zip(ps, adj)]


def compute() -> dict[str, Any]:
    """The numbers behind the findings page (a fresh dict; computed once per process)."""
    return dict(_compute())


def _r2(x: float) -> str:
    """Two decimals, halves rounded up (0.625 -> 0.63, as a reader rounds 10/16)."""
    from decimal import ROUND_HALF_UP, Decimal

    return str(Decimal(repr(float(x))).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def _p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def readme_section(f: dict[str, Any] | None = None) -> str:
    """The findings page's "What the paper's own numbers say" bullets, generated from :func:`compute`."""
    f = f or compute()
    w, a, al = f["crowding_within"], f["crowding_across"], f["crowding_all"]
    viol = f["violations"]
    vtext = "; ".join(
        f"{m} {g:.3f} > {b:.3f} (95% CI [{lo:.3f}, {hi:.3f}]{'' if sig else ', CI includes the bound'})"
        for _, m, g, b, lo, hi, sig in viol)
    n_sig = sum(v[-1] for v in viol)
    g1 = f["bound_g1"]
    def per_metric(label, n, nv, nci, n_rows, fv, fci, fn):
        if n == n_rows:
            return f"{label}: {nv} of {n} above it ({nci} with the whole CI above)"
        return (f"{label}: {nv} of the {n} rows with a depth in the paper's table above it ({nci} with the whole CI "
                f"above; {n_rows - n} of its {n_rows} rows have no depth there and are left out; with their depths "
                f"from the models' public configs, {fv} of {fn} above it, {fci} with the whole CI above)")

    others = "; ".join(per_metric(label, n, nv, nci, n_rows, fv, fci, fn)
                       for label, n, nv, nci, _, _, n_rows, fv, fci, fn in f["bound_by_metric"]
                       if label not in ("G_1",))
    holm_rows = f["primary_holm"]
    smallest = min(holm_rows, key=lambda r: r[2])
    lo_or, hi_or = f["heritage_or_ci"]
    lines = [
        f"- **Kleiber.** Declared primary test, the paper's quoted correlation: over the {f['kleiber_n']} Pythia "
        f"models gain vs rho gives r = {f['kleiber_r_rho']:.4f} (95% CI [{f['kleiber_ci_rho'][0]:.3f}, "
        f"{f['kleiber_ci_rho'][1]:.3f}], Fisher z), exact permutation p = {f['kleiber_p_rho']:.4f} (t test "
        f"{f['kleiber_p_rho_t']:.4f}). It is against rho, not depth; gain vs L, the one secondary hypothesis, gives "
        f"r = {f['kleiber_r_depth']:.3f} (p = {f['kleiber_p_depth']:.4f}). Spearman's rho = {f['kleiber_spearman']:.3f} "
        f"(exact p = {f['kleiber_spearman_p_exact']:.4f}) and gain vs the bound 10^(1/L) restate these nulls and are "
        f"not counted again. Caveats: without {f['kleiber_loo_worst_model']} r = {f['kleiber_loo_worst_r']:.3f}, "
        f"p = {f['kleiber_loo_worst_p']:.3f}; the 8 models are one family and one recipe, and rho rises with depth "
        f"there (r = {f['kleiber_r_rho_depth']:.2f}), so rho and L cannot be told apart.",
        f"- **Kleiber's bound** 10^(1/L) is a bound on every block's gain. Under metric A it is exceeded by "
        f"{len(viol)} models, {n_sig} of them with the whole 95% CI above it: {vtext}. The paper's own first-block "
        f"gains G_1 = {g1[2]:.0f}-{g1[3]:.0f} exceed it for {g1[0]} of its {g1[1]} Pythia models (bounds "
        f"{g1[4]:.2f}-{g1[5]:.2f}). Per metric: {others}. Caveat: the paper tests a bound on a maximum with a "
        f"correlation of means.",
        f"- **Heritage.** Declared primary test, {f['heritage_lab']} vs the rest of the 16-model survey (dampener "
        f"vs not), Blaker's exact test: p = {f['heritage_p_sign']:.3f} with the paper's sign-of-(G-1) labels, "
        f"conditional odds ratio {f['heritage_or']:.0f} with the 95% CI that inverts the same test "
        f"[{lo_or:.2f}, {hi_or:.0f}]; p = {f['heritage_p_ci']:.4f} with CI-based regimes (CI "
        f"[{f['heritage_or_ci_labels'][0]:.2f}, inf]). Not p < 0.001. (The central interval "
        f"[{f['heritage_central_ci'][0]:.2f}, {f['heritage_central_ci'][1]:.0f}] inverts the doubled test, "
        f"p = {f['heritage_central_p']:.3f}: it does not go with the minimum-likelihood p = "
        f"{f['heritage_minlike']:.3f} scipy gives.) The other {f['heritage_n_secondary']} labs vs the rest are the "
        f"secondary family (smallest Holm p {f['heritage_min_secondary_holm']:.2f}). Caveats: "
        f"{len(f['heritage_other_dampeners'])} non-EleutherAI models dampen by the paper's own rule "
        f"({', '.join(f['heritage_other_dampeners'])}); each CI rests on 5 prompts (t_4 = {f['heritage_t4']:.2f}); "
        f"the models are not independent (each lab's models share a recipe and data, and lab is confounded with "
        f"family).",
        f"- **Crowding.** Declared primary test, the rule rho > rho_crit => dampener (best accuracy over "
        f"rho_crit in [0.15, 0.20], exact permutation p). Out of sample it fails: on the survey ({a['n_out']} of "
        f"its {a['n']} models not used to choose rho_crit) the best accuracy is {_r2(a['accuracy'])} against a "
        f"{_r2(a['baseline'])} majority baseline (p = {a['rule_p']:.2f}); over all {al['n']} models it is "
        f"{_r2(al['accuracy'])}, equal to the baseline {_r2(al['baseline'])} (exact p = {al['rule_p_exact'][0]:.3f} over "
        f"{al['rule_p_exact'][1].split('all ')[1].rstrip(')')}). Within one family "
        f"({w['scope'].split('(')[1][:-1]}) it scores {w['hits']}/{w['n']} at rho_crit "
        f"{w['rho_crit'][0]:.2f}-{w['rho_crit'][1]:.2f} (majority baseline {_r2(w['baseline'])}, p = "
        f"{w['rule_p']:.3f} = 1/{round(1 / w['rule_p'])}). Caveats: that accuracy is {w['sample']} (the paper chose "
        f"rho_crit on these models); rho separates the classes there, so the logistic fit has no finite MLE and "
        f"its asymptotic likelihood-ratio p ({_p(w['lr_p_invalid'])}) is not valid: the exact conditional test of "
        f"the slope gives one-sided p = {w['logistic_exact_p']:.3f} (the paper's direction; two-sided "
        f"{w['logistic_exact_p_two_sided']:.3f}), the rule's own null, not counted twice; and rho and "
        f"depth correlate there (r = {w['r_depth']:.2f}): controlling for depth r(gain, rho | L) = "
        f"{w['partial_r']:.2f} (p = {w['partial_p']:.2f}), so the rule may be reading depth.",
        f"- **Twins.** Declared primary test, the sign of G - 1 kept: {f['twin_kept']}/{f['twin_n']} pairs, exact "
        f"one-sided binomial p = {f['twin_p']:.3f} against a coin flip (one-sided 95% bound {f['twin_ci_low']:.2f}). "
        f"Caveat: {f['twin_n']} pairs cannot show that fine-tuning \"cannot invert sign\", and the Mistral "
        f"\"instruct\" twin (v0.2) is not a fine-tune of the base it is compared with (v0.1).",
        f"- **Hierarchy.** Declared primary test, do the groups differ at all (Kruskal-Wallis, permutation p): on "
        f"the survey's {f['hier_groups']} labs ({f['hier_n']} models) p = {f['hier_p']:.2f} ("
        f"{f['hier_p_method'].replace('exact permutation (all ', 'exact, over all ').rstrip(')')}). "
        f"Caveat: the "
        f"abstract's ranking is {f['hier_bench_n']} single models, one per lab, measured with metric B: no test "
        f"can separate them.",
        f"- **L\\*.** The paper's errors are `|pred - emp| / L`, not a percentage error of L\\*. On its "
        f"{f['lstar_n']} validation models eq. 6 scores {100 * f['lstar_eq6_paper']:.2f}% by that measure and the "
        f"fit-free L/2 {100 * f['lstar_half_paper']:.2f}%; by the absolute percentage error "
        f"{100 * f['lstar_eq6_ape']:.1f}% and {100 * f['lstar_half_ape']:.1f}%. A paired exact Wilcoxon test of the "
        f"two predictors' errors gives p = {f['lstar_p_paper']:.2f} and {f['lstar_p_ape']:.2f}: they are "
        f"indistinguishable. Without {f['lstar_bloom']} (ALiBi, outside eq. 6's stated scope) the APE ranking flips "
        f"({100 * f['lstar_nobloom_eq6_ape']:.1f}% vs {100 * f['lstar_nobloom_half_ape']:.1f}%). Caveats: the six "
        f"have only {f['lstar_pairs']} distinct (L, H) pairs, {f['lstar_calibration']} of them are eq. 6's "
        f"calibration models, and their empirical L\\* are read off a plot (the paper's own values, by its appendix-E "
        f"rule; thermo-lens's default rule needs the layer traces, which the paper does not give). Eq. 6 is quadratic in L and predicts "
        f"L\\* beyond the last layer for deep models (L = 80, H = 64 gives {f['lstar_deep']:.1f}); thermo-lens warns.",
        f"- **Across the laws.** Each of the {len(holm_rows)} declared primary tests above is reported unadjusted. "
        f"Holm's adjustment across them (" + ", ".join(f"{n.replace('*', chr(92) + '*')} {_p(p)}" for n, p, _ in holm_rows) + ") gives a "
        f"smallest adjusted p of {smallest[2]:.3f} ({smallest[0]}): no primary test survives at 0.05 once the six "
        f"are read together.",
    ]
    return "\n".join(lines)
