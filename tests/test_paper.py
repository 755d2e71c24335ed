"""The paper namespace: README numbers vs their computation, each checked against scipy directly."""

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import thermo_lens as tl
from thermo_lens import paper
from thermo_lens.paper import findings, reference

ROOT = Path(__file__).resolve().parents[1]


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- findings:start -->\n(.*?)\n<!-- findings:end -->", text, flags=re.S)
    assert m, "README lost its findings markers"
    return m.group(1)


def test_readme_numbers_are_the_computed_ones():
    """Every number in the README's findings section comes from paper.findings (regenerate with
    ``python -c "from thermo_lens.paper import findings; print(findings.readme_section())"``)."""
    block, generated = _readme_block(), findings.readme_section()
    nums = lambda s: re.findall(r"-?\d+(?:\.\d+)?", s)  # noqa: E731
    assert nums(block) == nums(generated), "README numbers drifted from thermo_lens.paper.findings"
    assert block == generated


def _holm(p):
    p = np.asarray(p, float)
    order = np.argsort(p)
    adj, run = np.empty_like(p), 0.0
    for i, j in enumerate(order):
        run = max(run, min(1.0, (len(p) - i) * p[j]))
        adj[j] = run
    return adj


def test_kleiber_numbers_against_scipy():
    f = findings.compute()
    pyt = reference.pythia_family()
    g, rho, L = pyt["gain"].to_numpy(), pyt["rho"].to_numpy(), pyt["n_layers"].to_numpy(float)
    full = stats.pearsonr(rho, g)
    assert (round(full.statistic, 4), round(full.pvalue, 4)) == (-0.8116, 0.0144)
    keep = pyt["model"] != "pythia-1b"
    loo = stats.pearsonr(rho[keep], g[keep])
    assert (round(loo.statistic, 3), round(loo.pvalue, 3)) == (-0.715, 0.071)
    assert f["kleiber_loo_worst_model"] == "pythia-1b"
    assert f["kleiber_loo_worst_r"] == pytest.approx(loo.statistic) and f["kleiber_loo_worst_p"] == pytest.approx(loo.pvalue)
    # exact Spearman p by brute force over all 8! pairings (independent of scipy.permutation_test)
    perms = np.array(list(itertools.permutations(range(8))))

    def brute_spearman_p(x):
        rx, rg = stats.rankdata(x), stats.rankdata(g)
        rx, rg = rx - rx.mean(), rg - rg.mean()
        rs = (rg[perms] * rx).sum(axis=1) / np.sqrt((rx ** 2).sum() * (rg ** 2).sum())
        obs = (rg * rx).sum() / np.sqrt((rx ** 2).sum() * (rg ** 2).sum())
        return np.mean(np.abs(rs) >= abs(obs) - 1e-12)

    exact = brute_spearman_p(rho)
    assert round(exact, 4) == 0.0036 and f["kleiber_spearman_p_exact"] == pytest.approx(exact)
    assert round(stats.spearmanr(rho, g).pvalue, 4) == 0.0014 == round(f["kleiber_spearman_p_t"], 4)
    # Holm over the six tests (Pearson t p, Spearman exact p; depth, rho, bound)
    bound = 10 ** (1 / L)
    ps = []
    for x in (L, rho, bound):
        ps.append(stats.pearsonr(x, g).pvalue)
        ps.append(brute_spearman_p(x))
    assert f["kleiber_holm_rho"] == pytest.approx(_holm(ps)[2])
    # Fisher-z CI of r
    z, se = np.arctanh(full.statistic), 1 / np.sqrt(8 - 3)
    assert f["kleiber_ci_rho"] == pytest.approx(np.tanh([z - 1.959964 * se, z + 1.959964 * se]), abs=1e-5)


def test_kleiber_bound_violations_over_both_tables():
    f = findings.compute()
    viol = {(t, m): (lo, hi, sig) for t, m, g, b, lo, hi, sig in f["violations"]}
    assert set(m for _, m in viol) == {"pythia-1b", "opt-125m", "opt-2.7b", "opt-6.7b", "bloom-560m", "gpt-j-6B"}
    s = reference.lab_survey().set_index("model")
    # bloom-560m: 5 prompts, SD stored with ddof=0 (converted), t_4 interval
    r = s.loc["bloom-560m"]
    sd1 = r["std"] * np.sqrt(5 / 4)
    half = stats.t.ppf(0.975, 4) * sd1 / np.sqrt(5)
    lo, hi, sig = viol[("lab survey", "bloom-560m")]
    assert (lo, hi) == pytest.approx((r["gain"] - half, r["gain"] + half))
    assert sig == (r["gain"] - half > 10 ** (1 / 24))
    assert viol[("lab survey", "opt-6.7b")][2] is False  # 1.0773 vs 1.0746: the CI includes the bound


def test_heritage_holm_numbers():
    f = findings.compute()
    s = reference.lab_survey()
    labs = list(dict.fromkeys(s["lab"]))
    sign = []
    for lab in labs:
        inlab, damp = s["lab"] == lab, s["gain"] < 1
        t = [[(inlab & damp).sum(), (inlab & ~damp).sum()], [(~inlab & damp).sum(), (~inlab & ~damp).sum()]]
        sign.append(stats.fisher_exact(t).pvalue)
    e = labs.index("EleutherAI")
    assert round(sign[e], 3) == 0.036 and round(_holm(sign)[e], 2) == 0.18
    assert f["heritage_holm_sign"] == pytest.approx(_holm(sign)[e])
    assert round(f["heritage_holm_ci"], 3) == 0.014 and round(f["heritage_p_ci"], 4) == 0.0027
    orr = stats.contingency.odds_ratio([[4, 1], [2, 9]])
    assert f["heritage_or"] == pytest.approx(orr.statistic)


def test_crowding_within_and_across_family():
    f = findings.compute()
    w, a, al = f["crowding_within"], f["crowding_across"], f["crowding_all"]
    assert (w["hits"], w["n"], w["baseline"]) == (8, 8, 0.5) and w["rho_crit"] == pytest.approx((0.19, 0.20))
    pyt = reference.pythia_family()
    g, rho, L = pyt["gain"].to_numpy(), pyt["rho"].to_numpy(), pyt["n_layers"].to_numpy(float)
    assert round(stats.pearsonr(rho, L).statistic, 2) == 0.72 == round(w["r_depth"], 2)
    # partial correlation from the inverse correlation matrix (independent of the residual method)
    P = np.linalg.inv(np.corrcoef(np.vstack([g, rho, L])))
    pr = -P[0, 1] / np.sqrt(P[0, 0] * P[1, 1])
    assert w["partial_r"] == pytest.approx(pr) and round(pr, 2) == -0.54
    t = pr * np.sqrt((8 - 3) / (1 - pr ** 2))
    assert w["partial_p"] == pytest.approx(2 * stats.t.sf(abs(t), 5)) and round(w["partial_p"], 2) == 0.21
    assert w["rule_p"] == pytest.approx(1 / 70)  # only the top-4-by-rho labelling of C(8,4) = 70 scores 8/8
    assert (round(a["accuracy"], 4), a["baseline"]) == (0.4375, 10 / 16)
    assert al["n"] == 23 and al["accuracy"] == pytest.approx(al["baseline"]) and round(al["baseline"], 2) == 0.61


def test_l_star_baselines_on_the_papers_validation_models():
    f = findings.compute()
    v = findings.l_star_validation_table()
    L, H, e = v["n_layers"].to_numpy(float), v["n_heads"].to_numpy(float), v["empirical"].to_numpy()
    pred = L * (0.11 + 0.012 * L + 4.9 / H)
    assert len(v) == 6
    assert round(100 * np.mean(abs(pred - e) / L), 2) == 15.70 == round(100 * f["lstar_eq6_paper"], 2)
    assert round(100 * np.mean(abs(L / 2 - e) / L), 2) == 15.97 == round(100 * f["lstar_half_paper"], 2)
    assert round(100 * np.mean(abs(L / 2 - e) / e), 1) == 23.1 == round(100 * f["lstar_half_ape"], 1)
    assert round(100 * np.mean(abs(pred - e) / e), 1) == 28.8 == round(100 * f["lstar_eq6_ape"], 1)



def test_paper_metric_defaults_to_the_papers_prompts(bridge):
    model = bridge("neox")
    a = paper.paper_metric(model, metric="A", truncate=True)
    assert a.prompt_set == "pythia_family_sweep_25" and a.experiment == "pythia_family"
    assert list(a.gain.prompts) == list(tl.prompts.get("pythia25").prompts)
    assert "pythia_family experiment" in repr(a)
    s = paper.paper_metric(model, metric="A", experiment="lab_survey")
    assert s.prompt_set == "high_rho_hunt_5" and s.gain.n_prompts == 5
    b = paper.paper_metric(model, metric="B", truncate=True)
    assert b.prompt_set == "grand_unified_twin_gpt2_gptj_25" and b.experiment == "benchmark"
    own = paper.paper_metric(model, ["The capital of France is", "Water boils at"], "A")
    assert own.prompt_set == "custom" and own.experiment == ""
    assert a.to_frame()["prompt_set"].iloc[0] == "pythia_family_sweep_25"
    with pytest.raises(tl.ThermoLensInputError, match="no metric 'B' experiment 'lab_survey'"):
        paper.paper_metric(model, metric="B", experiment="lab_survey")
