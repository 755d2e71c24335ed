"""Training heritage: lab x regime, one Fisher exact test per lab (D'Elia 2026, section 4.2, Fig. 2).

Declared tests (``thermo_lens.definitions`` §5): the primary is the paper's claim, the declared lab
(``primary_lab``, default EleutherAI) vs the rest, dampener vs not, by Blaker's exact test, whose
p-value and odds-ratio interval invert the same test (scipy's two-sided Fisher p, the
minimum-likelihood one, is shown beside it; the conditional interval scipy gives inverts yet
another test, the doubled one). The other labs vs the rest are the secondary family (Holm). When
the declared lab is not in the table the primary is the association of lab and dampening over all
labs (a permutation test of the chi-square statistic). Every test treats models as independent:
they are not (one lab's models share a recipe and data, and each lab is one or two families, so
lab is confounded with family).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from thermo_lens.laws.base import LawResult, StatTest, _fmt_p, declare, leave_one_out
from thermo_lens.laws.table import REGIMES, Table, _as_frame, _group_stats, _labels, _numeric, _regimes, _require
from thermo_lens.stats import holm
from thermo_lens.stats.exact import fisher_exact

__all__ = ["FisherResult", "HeritageResult", "heritage", "PAPER_HERITAGE_LAB", "NON_INDEPENDENCE"]

#: The lab of the paper's heritage claim ("EleutherAI 80% dampening").
PAPER_HERITAGE_LAB = "EleutherAI"
#: The caveat every heritage test carries.
NON_INDEPENDENCE = ("models are not independent: a lab's models share recipe and data (GPT-Neo, OPT, Pythia "
                    "each one recipe) and lab is confounded with family")


@dataclass(frozen=True, repr=False)
class FisherResult(LawResult):
    """Exact test of one lab vs the rest, dampener vs not.

    ``table`` is ``((lab & dampener, lab & not), (rest & dampener, rest & not))``; ``statistic`` the
    sample odds ratio (``inf``/``0`` when a cell is empty); ``pvalue`` Blaker's exact two-sided p
    (``method``; :func:`thermo_lens.stats.exact.fisher_exact`) and ``ci_low``/``ci_high`` the 95%
    interval of the conditional MLE odds ratio ``odds_ratio_conditional`` that inverts the same
    test; ``pvalue_minlike`` scipy's ``fisher_exact`` two-sided p; ``pvalue_holm`` Holm-adjusted
    over all labs tested together (a reference; the heritage law's family is its secondary tests).
    """

    lab: str
    table: tuple[tuple[int, int], tuple[int, int]]
    statistic: float
    pvalue: float
    pvalue_holm: float
    alternative: str = "two-sided"
    odds_ratio_conditional: float = float("nan")
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    method: str = "blaker"
    pvalue_minlike: float = float("nan")

    @property
    def odds_ratio(self) -> float:
        return self.statistic

    def summary(self) -> str:
        return (f"FisherResult({self.lab} vs rest: table={self.table}, odds ratio={self.statistic:.3g} "
                f"(conditional {self.odds_ratio_conditional:.3g}, 95% CI [{self.ci_low:.3g}, {self.ci_high:.3g}]), "
                f"{self.method} p={_fmt_p(self.pvalue)} (scipy's minimum-likelihood p {_fmt_p(self.pvalue_minlike)}), "
                f"Holm p={_fmt_p(self.pvalue_holm)}, {self.alternative})")


@dataclass(frozen=True, repr=False, eq=False)
class HeritageResult(LawResult):
    """Training-heritage test (D'Elia 2026 section 4.2, Fig. 2).

    Attributes
    ----------
    contingency:
        Lab x regime counts (columns ``expander, dampener, neutral``).
    labs:
        Per lab: ``n, n_dampener, frac_dampener``, ``odds_ratio`` (sample), Blaker ``pvalue``,
        ``pvalue_holm`` (over all labs), ``or_conditional`` with ``or_ci_low, or_ci_high`` (the
        interval inverting Blaker's test), ``pvalue_minlike``, and mean gain with ``sd``
        (ddof=1), ``se = sd / sqrt(n)`` and t 95% CI (NaN for n = 1).
    fisher:
        Lab -> :class:`FisherResult`.
    regime_source:
        Where the regimes came from (a column, a CI, or the sign of G - 1).
    stat_tests:
        Primary: ``primary_lab`` vs the rest (or the all-labs association when that lab is
        absent); secondary: every other lab vs the rest (Holm); each with leave-one-out.
    primary_lab:
        The declared lab ("" when it is not in the table).

    The paper reports "EleutherAI 80% dampening, all other labs 100% expansion, Fisher p < 0.001".
    On its 16-model survey the EleutherAI test gives Blaker p = 0.036, odds ratio 14 (95% CI
    [1.13, 481]) with the paper's sign labels, and p = 0.0027 with CI labels.
    """

    contingency: pd.DataFrame
    labs: pd.DataFrame
    fisher: dict
    regime_source: str
    stat_tests: tuple = ()
    primary_lab: str = ""

    def to_frame(self) -> pd.DataFrame:
        return self.labs.copy()

    def summary(self) -> str:
        lines = [f"HeritageResult({len(self.labs)} labs, {int(self.labs['n'].sum())} models; "
                 f"regimes from {self.regime_source})"]
        for _, r in self.labs.iterrows():
            se = "" if not np.isfinite(r["se"]) else f" +- {r['se']:.4f} (SE)"
            mean = "" if not np.isfinite(r["mean_gain"]) else f", mean gain {r['mean_gain']:.4f}{se}"
            lines.append(f"  {r['lab']}: {int(r['n_dampener'])}/{int(r['n'])} dampeners{mean}; "
                         f"odds ratio {r['or_conditional']:.3g} [{r['or_ci_low']:.3g}, {r['or_ci_high']:.3g}], "
                         f"Blaker p={_fmt_p(r['pvalue'])}")
        lines += self.tests_summary()
        lines.append(f"  caveat: {NON_INDEPENDENCE}")
        return "\n".join(lines)


def _two_by_two(labs_col: np.ndarray, damp: np.ndarray, name: str) -> tuple:
    inlab = labs_col == name
    return ((int(np.sum(inlab & damp)), int(np.sum(inlab & ~damp))),
            (int(np.sum(~inlab & damp)), int(np.sum(~inlab & ~damp))))


def _association(labs_col: np.ndarray, damp: np.ndarray, seed: int = 0) -> tuple[float, float, str]:
    """Chi-square of the lab x dampener table and its permutation p (labels exchangeable)."""
    keys = list(dict.fromkeys(labs_col))
    g = np.array([keys.index(k) for k in labs_col])
    n, k = damp.size, int(damp.sum())
    sizes = np.bincount(g, minlength=len(keys)).astype(float)

    def chi2(lab: np.ndarray) -> np.ndarray:  # lab [m, n] bool
        obs = np.stack([lab[:, g == j].sum(axis=1) for j in range(len(keys))], axis=1).astype(float)  # [m, labs]
        e1 = sizes * k / n
        e0 = sizes * (n - k) / n
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.nansum((obs - e1) ** 2 / e1 + ((sizes - obs) - e0) ** 2 / e0, axis=1)

    if k in (0, n):
        return 0.0, 1.0, "one class: no test"
    total = math.comb(n, k)
    if total <= 100_000:
        labs = np.zeros((total, n), dtype=bool)
        for i, idx in enumerate(combinations(range(n), k)):
            labs[i, list(idx)] = True
        how = f"exact permutation (all {total} labelings)"
    else:
        labs = np.random.default_rng(seed).permuted(np.tile(damp, (20_000, 1)), axis=1)
        how = f"Monte Carlo permutation (20000 labelings, seed {seed})"
    obs = float(chi2(damp[None, :])[0])
    return obs, float(np.mean(chi2(labs) >= obs - 1e-9)), how


def heritage(table: Table, lab: str = "lab", regime: str = "regime", gain: str = "gain",
             primary_lab: str = PAPER_HERITAGE_LAB) -> HeritageResult:
    """Lab x regime contingency, per-lab exact tests (Blaker) and per-lab mean gain +- SE.

    Regimes are taken from column ``regime`` if present (values expander/dampener/neutral, e.g.
    from :func:`add_regimes`); else from columns ``ci_low``/``ci_high`` if present; else from the
    sign of ``gain - 1`` (the paper's rule). For each lab a 2x2 exact test compares that lab
    with all other labs on dampener vs non-dampener (expander or neutral). ``primary_lab`` is the
    declared primary (the paper's EleutherAI); when the table has no such lab the primary is the
    all-labs association test, and the result says so. Per-lab mean gain uses ``gain`` (skipped,
    NaN, if that column is absent); SE from the SD with ddof=1, only for n > 1. Needs at least 2 labs.
    """
    func = "heritage"
    df = _as_frame(table, func)
    _require(df, [lab], func)
    if df[lab].isna().any():
        raise ValueError(f"{func}: column {lab!r} has missing values")
    labs_col = df[lab].astype(str).to_numpy()
    reg, source = _regimes(df, regime, gain, func)
    g = _numeric(df, gain, func) if gain in df.columns else None
    order = list(dict.fromkeys(labs_col))
    if len(order) < 2:
        raise ValueError(f"{func}: need at least 2 labs in column {lab!r}, got {order}")
    cont = (pd.crosstab(pd.Categorical(labs_col, categories=order),
                        pd.Categorical(reg, categories=list(REGIMES)), dropna=False)
            .rename_axis(index=lab, columns="regime"))
    damp = reg == "dampener"
    labels = _labels(df)
    has_primary = primary_lab in order
    rows, tests = [], []
    for name in order:
        t = _two_by_two(labs_col, damp, name)
        res = fisher_exact(t)
        ci = res.confidence_interval(0.95)
        inlab = labs_col == name
        st = _group_stats(g[inlab]) if g is not None else dict.fromkeys(
            ("mean", "sd", "se", "ci_low", "ci_high"), float("nan"))
        rows.append({"lab": name, "n": int(inlab.sum()), "n_dampener": t[0][0],
                     "frac_dampener": t[0][0] / int(inlab.sum()),
                     "odds_ratio": float(res.sample_odds_ratio), "pvalue": float(res.pvalue),
                     "or_conditional": float(res.statistic), "or_ci_low": ci.low, "or_ci_high": ci.high,
                     "pvalue_minlike": float(res.pvalue_minlike),
                     "mean_gain": st["mean"], "sd": st["sd"], "se": st["se"],
                     "ci_low": st["ci_low"], "ci_high": st["ci_high"], "_t": t})

        def loo(keep, name=name):
            r = fisher_exact(_two_by_two(labs_col[keep], damp[keep], name))
            return float(r.statistic), float(r.pvalue)

        tests.append(StatTest(
            family="heritage", name=f"{name} vs rest (dampener vs not)",
            test="Blaker's exact test of the 2x2 table (two-sided)", n=len(df), statistic=float(res.statistic),
            effect="odds ratio (conditional MLE)", effect_value=float(res.statistic), ci_low=ci.low, ci_high=ci.high,
            pvalue=float(res.pvalue), pvalue_method="exact (Blaker)", pvalue_other=float(res.pvalue_minlike),
            pvalue_other_method="scipy fisher_exact, minimum likelihood (no matching interval)",
            role="primary" if has_primary and name == primary_lab else "secondary",
            hypothesis=f"{name}'s models dampen as often as the rest", ci_method="inverts Blaker's test",
            note=f"{t[0][0]}/{int(inlab.sum())} dampeners in {name}, {t[1][0]}/{len(df) - int(inlab.sum())} in the "
                 f"rest; {NON_INDEPENDENCE}",
            **leave_one_out(labels, loo, float(res.statistic))))
    if not has_primary:
        chi, p, how = _association(labs_col, damp)

        def loo_assoc(keep):
            c, pp, _ = _association(labs_col[keep], damp[keep])
            return c, pp

        tests.insert(0, StatTest(
            family="heritage", name="lab x dampener association (all labs)",
            test="chi-square statistic of the lab x dampener table, permutation test", n=len(df), statistic=chi,
            effect="chi-square", effect_value=chi, ci_low=float("nan"), ci_high=float("nan"), pvalue=p,
            pvalue_method=how, role="primary", hypothesis="dampening independent of lab",
            note=f"declared lab {primary_lab!r} is not in the table; {NON_INDEPENDENCE}",
            **leave_one_out(labels, loo_assoc, chi)))
    adj = holm(np.array([r["pvalue"] for r in rows]))
    fisher = {}
    for r, ph in zip(rows, adj):
        r["pvalue_holm"] = float(ph)
        fisher[r["lab"]] = FisherResult(r["lab"], r.pop("_t"), r["odds_ratio"], r["pvalue"], float(ph),
                                        "two-sided", r["or_conditional"], r["or_ci_low"], r["or_ci_high"],
                                        "blaker", r["pvalue_minlike"])
    labs = pd.DataFrame(rows)[["lab", "n", "n_dampener", "frac_dampener", "odds_ratio", "pvalue",
                              "pvalue_holm", "or_conditional", "or_ci_low", "or_ci_high", "pvalue_minlike",
                              "mean_gain", "sd", "se", "ci_low", "ci_high"]]
    return HeritageResult(contingency=cont, labs=labs, fisher=fisher, regime_source=source,
                          stat_tests=declare(tests), primary_lab=primary_lab if has_primary else "")
