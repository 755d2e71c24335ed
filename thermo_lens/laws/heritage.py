"""Training heritage: lab x regime, one Fisher exact test per lab (D'Elia 2026, section 4.2, Fig. 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from thermo_lens.laws.base import LawResult, StatTest, _fmt_p, leave_one_out, with_holm
from thermo_lens.laws.table import REGIMES, _as_frame, _group_stats, _labels, _numeric, _regimes, _require
from thermo_lens.stats import holm, odds_ratio_ci

__all__ = ["FisherResult", "HeritageResult", "heritage"]


@dataclass(frozen=True, repr=False)
class FisherResult(LawResult):
    """Fisher exact test of one lab vs the rest, dampener vs not (``scipy.stats.fisher_exact``).

    ``table`` is ``((lab & dampener, lab & not), (rest & dampener, rest & not))``; ``statistic`` the
    sample odds ratio (``inf``/``0`` when a cell is empty); ``pvalue`` as scipy gives it for
    ``alternative``; ``pvalue_holm`` Holm-adjusted over all labs tested together;
    ``odds_ratio_conditional`` with ``ci_low``/``ci_high`` the conditional MLE odds ratio and its
    exact 95% CI (``scipy.stats.contingency.odds_ratio``), the interval that goes with the test.
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

    @property
    def odds_ratio(self) -> float:
        return self.statistic

    def summary(self) -> str:
        return (f"FisherResult({self.lab} vs rest: table={self.table}, odds ratio={self.statistic:.3g} "
                f"(conditional {self.odds_ratio_conditional:.3g}, 95% CI [{self.ci_low:.3g}, {self.ci_high:.3g}]), "
                f"p={_fmt_p(self.pvalue)}, Holm p={_fmt_p(self.pvalue_holm)}, {self.alternative})")


@dataclass(frozen=True, repr=False, eq=False)
class HeritageResult(LawResult):
    """Training-heritage test (D'Elia 2026 section 4.2, Fig. 2).

    Attributes
    ----------
    contingency:
        Lab x regime counts (columns ``expander, dampener, neutral``).
    labs:
        Per lab: ``n, n_dampener, frac_dampener``, Fisher ``odds_ratio, pvalue, pvalue_holm``,
        ``or_ci_low, or_ci_high`` (exact CI of the conditional odds ratio), and mean gain with
        ``sd`` (ddof=1), ``se = sd / sqrt(n)`` and t 95% CI (NaN for n = 1).
    fisher:
        Lab -> :class:`FisherResult`.
    regime_source:
        Where the regimes came from (a column, a CI, or the sign of G - 1).
    stat_tests:
        One :class:`StatTest` per lab: exact p, Holm over the labs, leave-one-out.

    The paper reports "EleutherAI 80% dampening, all other labs 100% expansion, Fisher p < 0.001".
    On its 16-model survey the EleutherAI test gives p = 0.036 with the paper's sign labels (Holm
    over the 5 labs: 0.18) and 0.0027 with CI labels (Holm 0.014).
    """

    contingency: pd.DataFrame
    labs: pd.DataFrame
    fisher: dict
    regime_source: str
    stat_tests: tuple = ()

    def to_frame(self) -> pd.DataFrame:
        return self.labs.copy()

    def summary(self) -> str:
        lines = [f"HeritageResult({len(self.labs)} labs, {int(self.labs['n'].sum())} models; "
                 f"regimes from {self.regime_source})"]
        for _, r in self.labs.iterrows():
            se = "" if not np.isfinite(r["se"]) else f" +- {r['se']:.4f} (SE)"
            mean = "" if not np.isfinite(r["mean_gain"]) else f", mean gain {r['mean_gain']:.4f}{se}"
            lines.append(f"  {r['lab']}: {int(r['n_dampener'])}/{int(r['n'])} dampeners{mean}; "
                         f"Fisher OR={r['odds_ratio']:.3g}, p={_fmt_p(r['pvalue'])} "
                         f"(Holm {_fmt_p(r['pvalue_holm'])})")
        lines.append(f"  tests ({len(self.tests)}; Holm over the labs):")
        lines += [f"    {t.summary()}" for t in self.tests]
        return "\n".join(lines)


def _fisher(labs_col: np.ndarray, damp: np.ndarray, name: str, alternative: str):
    from scipy import stats

    inlab = labs_col == name
    t = ((int(np.sum(inlab & damp)), int(np.sum(inlab & ~damp))),
         (int(np.sum(~inlab & damp)), int(np.sum(~inlab & ~damp))))
    return t, stats.fisher_exact(t, alternative=alternative)


def heritage(table: Any, lab: str = "lab", regime: str = "regime", gain: str = "gain",
             alternative: str = "two-sided") -> HeritageResult:
    """Lab x regime contingency, per-lab Fisher exact tests and per-lab mean gain +- SE.

    Regimes are taken from column ``regime`` if present (values expander/dampener/neutral, e.g.
    from :func:`add_regimes`); else from columns ``ci_low``/``ci_high`` if present; else from the
    sign of ``gain - 1`` (the paper's rule). For each lab a 2x2 Fisher exact test compares that lab
    with all other labs on dampener vs non-dampener (expander or neutral). Per-lab mean gain uses
    ``gain`` (skipped, NaN, if that column is absent); SE from the SD with ddof=1, only for n > 1.
    Needs at least 2 labs.
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
    rows, pvals, tests = [], [], []
    for name in order:
        t, res = _fisher(labs_col, damp, name, alternative)
        orc, olo, ohi = odds_ratio_ci(t)
        pvals.append(float(res.pvalue))
        inlab = labs_col == name
        st = _group_stats(g[inlab]) if g is not None else dict.fromkeys(
            ("mean", "sd", "se", "ci_low", "ci_high"), float("nan"))
        rows.append({"lab": name, "n": int(inlab.sum()), "n_dampener": t[0][0],
                     "frac_dampener": t[0][0] / int(inlab.sum()),
                     "odds_ratio": float(res.statistic), "pvalue": float(res.pvalue),
                     "or_conditional": orc, "or_ci_low": olo, "or_ci_high": ohi,
                     "mean_gain": st["mean"], "sd": st["sd"], "se": st["se"],
                     "ci_low": st["ci_low"], "ci_high": st["ci_high"], "_t": t})

        def loo(keep, name=name):
            _, r = _fisher(labs_col[keep], damp[keep], name, alternative)
            return float(r.statistic), float(r.pvalue)

        tests.append(StatTest(
            family="heritage", name=f"{name} vs rest (dampener vs not)",
            test=f"Fisher exact test, {alternative}", n=len(df), statistic=float(res.statistic),
            effect="odds ratio (conditional MLE)", effect_value=orc, ci_low=olo, ci_high=ohi,
            pvalue=float(res.pvalue), pvalue_method="exact (Fisher)",
            note=f"{t[0][0]}/{int(inlab.sum())} dampeners in {name}, {t[1][0]}/{len(df) - int(inlab.sum())} in the rest",
            **leave_one_out(labels, loo, float(res.statistic))))
    adj = holm(np.array(pvals))
    fisher = {}
    for r, ph in zip(rows, adj):
        r["pvalue_holm"] = float(ph)
        fisher[r["lab"]] = FisherResult(r["lab"], r.pop("_t"), r["odds_ratio"], r["pvalue"], float(ph),
                                        alternative, r["or_conditional"], r["or_ci_low"], r["or_ci_high"])
    labs = pd.DataFrame(rows)[["lab", "n", "n_dampener", "frac_dampener", "odds_ratio", "pvalue",
                              "pvalue_holm", "or_conditional", "or_ci_low", "or_ci_high", "mean_gain",
                              "sd", "se", "ci_low", "ci_high"]]
    return HeritageResult(contingency=cont, labs=labs, fisher=fisher, regime_source=source,
                          stat_tests=with_holm(tests))
