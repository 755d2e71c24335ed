"""Dimensional crowding: does head density ``rho = n_heads / d_head`` predict dampening?

D'Elia (2026), section 5.4 and conclusion: above a critical ``rho_crit ~ 0.15-0.20`` a model
dampens. Read within one family (the 8 Pythia models) the rule is perfect; read across families it
does not beat always guessing the majority class; and within Pythia rho rises with depth, so the
rule can be reading depth. :func:`crowding` reports each table with the partial correlation
``r(gain, rho | L)`` and names that confound; :func:`crowding_comparison` puts several tables
(within-family, across-family, all models) side by side.

Declared tests (``thermo_lens.definitions`` §5): the primary is the paper's rule, its best accuracy
over the rho_crit grid with an exact permutation p (the search over the grid is paid for). The
logistic slope tests the same null (dampening exchangeable across rho), so it is a sensitivity
test, with the exact conditional p: when the classes are separated by rho there is no finite
maximum-likelihood slope and the asymptotic likelihood-ratio p is not valid (it is shown only when
they are not). The partial correlation ``r(gain, rho | L)`` is the one secondary hypothesis.
The paper chose rho_crit on the 8 Pythia models: an accuracy there is in-sample (``fitted_on``
says which models were used, and the result's ``sample`` which of the table's are among them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations, islice
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from thermo_lens.laws.base import (CorrelationResult, LawResult, StatTest, _fmt_p, correlation, declare,
                                   leave_one_out)
from thermo_lens.laws.logistic import LogisticFit, logistic_fit
from thermo_lens.laws.table import Table, _as_frame, _labels, _numeric, _regimes, _rho
from thermo_lens.stats import PartialCorrelation, partial_correlation
from thermo_lens.stats.exact import LogisticExact, logistic_exact_test

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["CrowdingResult", "CrowdingComparison", "crowding", "crowding_comparison",
           "threshold_rule_pvalue"]

#: Up to this many distinct labelings the rule's permutation p enumerates them all (exact).
_EXACT_LABELINGS = 100_000


def _rule_accuracy(r: np.ndarray, y: np.ndarray, ths: np.ndarray) -> np.ndarray:
    """Accuracy ``[labeling, threshold]`` of ``rho > th => dampener`` for labelings ``y [m, n]``."""
    pred = (r[None, :] > ths[:, None]).astype(float)           # [T, n]
    yf = np.atleast_2d(y).astype(float)                        # [m, n]
    return (yf @ pred.T + (1 - yf) @ (1 - pred).T) / r.size    # [m, T]


def _labelings(n: int, k: int, chunk: int = 50_000):
    """Every labeling of ``n`` models with ``k`` dampeners, ``[m, n]`` bool, in chunks of ``chunk``."""
    it = combinations(range(n), k)
    while True:
        block = list(islice(it, chunk))
        if not block:
            return
        labs = np.zeros((len(block), n), dtype=bool)
        np.put_along_axis(labs, np.array(block, dtype=np.int64).reshape(len(block), k), True, axis=1)
        yield labs


def threshold_rule_pvalue(rho: ArrayLike, dampener: ArrayLike, thresholds: ArrayLike, seed: int = 0,
                          n_resamples: int = 20_000, exact_max: int = _EXACT_LABELINGS) -> tuple[float, str]:
    """Permutation p of the best accuracy of ``rho > t => dampener`` over the threshold grid.

    Null: the dampener labels are exchangeable across models (their number fixed). The statistic
    is the *maximum* accuracy over ``thresholds``, so the search over the grid is paid for. All
    ``C(n, k)`` labelings are enumerated when there are at most ``exact_max`` (100,000 by default;
    up to a few million take seconds), else ``n_resamples`` random permutations with ``seed``, and
    the description gives the Monte Carlo standard error. Returns ``(pvalue, description)``.
    """
    r = np.asarray(rho, dtype=float)
    y = np.asarray(dampener, dtype=bool)
    ths = np.atleast_1d(np.asarray(thresholds, dtype=float))
    n, k = y.size, int(y.sum())
    observed = _rule_accuracy(r, y, ths).max()
    total = math.comb(n, k)
    if total <= exact_max:
        hits = sum(int(np.count_nonzero(_rule_accuracy(r, labs, ths).max(axis=1) >= observed - 1e-12))
                   for labs in _labelings(n, k))
        return hits / total, f"exact permutation (all {total:,} labelings)"
    rng = np.random.default_rng(seed)
    labs = rng.permuted(np.tile(y, (n_resamples, 1)), axis=1)
    p = float(np.mean(_rule_accuracy(r, labs, ths).max(axis=1) >= observed - 1e-12))
    return p, (f"Monte Carlo permutation ({n_resamples} resamples, seed {seed}; Monte Carlo SE "
               f"{math.sqrt(p * (1 - p) / n_resamples):.4f})")


@dataclass(frozen=True, repr=False, eq=False)
class CrowdingResult(LawResult):
    """Dimensional-crowding test on one table (D'Elia 2026 section 5.4 and conclusion).

    Attributes
    ----------
    thresholds:
        Per threshold: ``threshold, accuracy, tp, fp, tn, fn`` of the rule
        ``rho > threshold => dampener`` (dampener = positive class).
    best_threshold, best_accuracy:
        The smallest threshold reaching the maximum accuracy (``best_thresholds`` lists all ties).
    baseline_accuracy:
        Accuracy of always predicting the majority class: the rule must beat this to mean anything.
    logistic:
        :class:`LogisticFit` of P(dampener) on rho (slope > 0 is the paper's direction).
    rule_pvalue, rule_pvalue_method:
        Permutation p of ``best_accuracy`` (:func:`threshold_rule_pvalue`).
    depth_correlation:
        ``r(rho, L)`` (:class:`CorrelationResult`), the confound, when ``n_layers`` is given.
    partial:
        ``r(gain, rho | L)`` (:class:`thermo_lens.stats.PartialCorrelation`), when ``n_layers``
        and ``gain`` are given.
    confound:
        The confound in words ("" without depth).
    exact_logistic:
        :class:`thermo_lens.stats.exact.LogisticExact`: the exact conditional test of the slope
        (one-sided, the paper's direction), valid under separation.
    sample:
        ``"in-sample"`` (every model was used to choose rho_crit), ``"out-of-sample"`` (none),
        ``"partly in-sample (k of n: ...)"`` or ``"unknown"`` (``fitted_on`` not given).
    stat_tests:
        Primary: the rule; sensitivity: the logistic slope (same null); secondary: the partial
        correlation (:class:`StatTest`).
    """

    table: pd.DataFrame
    thresholds: pd.DataFrame
    best_threshold: float
    best_accuracy: float
    best_thresholds: tuple
    baseline_accuracy: float
    logistic: LogisticFit
    n: int
    n_dampener: int
    regime_source: str
    rule_pvalue: float = float("nan")
    rule_pvalue_method: str = ""
    depth_correlation: CorrelationResult | None = None
    partial: PartialCorrelation | None = None
    confound: str = ""
    stat_tests: tuple = ()
    exact_logistic: LogisticExact | None = None
    sample: str = "unknown"

    @property
    def beats_baseline(self) -> bool:
        return self.best_accuracy > self.baseline_accuracy + 1e-12

    def verdict(self) -> str:
        """One sentence: accuracy vs the majority baseline, at which rho_crit, and the confound."""
        lo, hi = min(self.best_thresholds), max(self.best_thresholds)
        at = f"rho_crit {lo:.3g}" if lo == hi else f"rho_crit {lo:.3g}-{hi:.3g}"
        hits = int(round(self.best_accuracy * self.n))
        cmp = ("above" if self.beats_baseline else
               "equal to" if abs(self.best_accuracy - self.baseline_accuracy) < 1e-12 else "below")
        out = (f"{hits}/{self.n} correct ({self.best_accuracy:.3f}, {self.sample}) at {at}, {cmp} the majority "
               f"baseline {self.baseline_accuracy:.3f} (permutation p={_fmt_p(self.rule_pvalue)})")
        return out + (f"; {self.confound}" if self.confound else "")

    def to_frame(self) -> pd.DataFrame:
        return self.thresholds.copy()

    def summary(self) -> str:
        t = self.thresholds["threshold"]
        lines = [
            f"CrowdingResult(n={self.n}, {self.n_dampener} dampeners; regimes from {self.regime_source})",
            f"  rule rho > rho_crit => dampener, rho_crit in [{t.min():.4g}, {t.max():.4g}]: "
            f"best accuracy {self.best_accuracy:.4f} ({self.sample}) at {self.best_threshold:.4g} "
            f"(majority-class baseline {self.baseline_accuracy:.4f}; permutation p={_fmt_p(self.rule_pvalue)})",
            f"  {self.logistic.summary()}",
        ]
        if self.exact_logistic is not None:
            lines.append(f"  {self.exact_logistic!r}")
        if self.partial is not None:
            lines.append(f"  {self.confound}")
        lines += self.tests_summary()
        return "\n".join(lines)


def _sample(labels: list[str], fitted_on: Iterable[object] | None) -> str:
    if fitted_on is None:
        return "unknown"
    fit = {str(m) for m in fitted_on}
    inside = [m for m in labels if m in fit]
    if not inside:
        return "out-of-sample"
    if len(inside) == len(labels):
        return "in-sample"
    return f"partly in-sample ({len(inside)} of {len(labels)}: {', '.join(inside)})"


def crowding(table: Table, thresholds: ArrayLike | None = None, rho: str = "rho", regime: str = "regime",
             gain: str = "gain", n_layers: str = "n_layers", fitted_on: Iterable[object] | None = None) -> CrowdingResult:
    """Accuracy of ``rho > rho_crit => dampener`` over a threshold grid, a logistic fit, and the
    depth confound.

    ``rho`` from column ``rho`` or ``n_heads / d_head``. The outcome "dampener" comes from column
    ``regime`` if present, else from ``ci_low``/``ci_high``, else ``gain < 1`` (the paper's H25
    used ``G < 1``); neutral models count as non-dampeners. ``thresholds`` defaults to
    ``np.linspace(0.15, 0.20, 11)`` (the paper's rho_crit range). The rule is strict (``>``); note
    the paper's own hypothesis file used ``rho >= 0.2``. With an ``n_layers`` column the result
    also carries ``r(rho, L)`` and the partial correlation ``r(gain, rho | L)``. ``fitted_on``:
    the models (``model`` names) rho_crit was chosen on; the result's ``sample`` says whether the
    accuracy is in-sample (the paper's own: the 8 Pythia models, ``thermo_lens.paper.findings.RHO_CRIT_FITTED_ON``).
    """
    func = "crowding"
    df = _as_frame(table, func)
    r = _rho(df, rho, func)
    reg, source = _regimes(df, regime, gain, func)
    if len(df) < 3:
        raise ValueError(f"{func}: need at least 3 models, got {len(df)}")
    ths = np.linspace(0.15, 0.20, 11) if thresholds is None else np.atleast_1d(
        np.asarray(thresholds, dtype=float))
    if ths.size == 0 or not np.all(np.isfinite(ths)):
        raise ValueError(f"{func}: thresholds must be a non-empty list of finite numbers")
    y = reg == "dampener"
    rows = []
    for th in ths:
        pred = r > th
        tp, fp = int(np.sum(pred & y)), int(np.sum(pred & ~y))
        tn, fn = int(np.sum(~pred & ~y)), int(np.sum(~pred & y))
        rows.append({"threshold": float(th), "accuracy": (tp + tn) / len(y),
                     "tp": tp, "fp": fp, "tn": tn, "fn": fn})
    acc = pd.DataFrame(rows)
    best = float(acc["accuracy"].max())
    ties = tuple(float(t) for t in acc.loc[np.isclose(acc["accuracy"], best), "threshold"])
    labels = _labels(df)
    per_model = pd.DataFrame({"model": labels, "rho": r, "regime": reg, "dampener": y})
    baseline = float(max(y.mean(), 1 - y.mean()))
    logit = logistic_fit(r, y.astype(int))
    rule_p, rule_how = threshold_rule_pvalue(r, y, ths)
    sample = _sample(labels, fitted_on)
    exact = logistic_exact_test(r, y.astype(int), alternative="greater") if 0 < y.sum() < y.size else None
    tests = [_rule_test(r, y, ths, labels, best, baseline, rule_p, rule_how, sample)]
    if exact is not None:
        tests.append(_logistic_test(r, y, labels, logit, exact))
    depth = part = None
    confound = ""
    if n_layers in df.columns:
        L = _numeric(df, n_layers, func)
        per_model["n_layers"] = L
        if len(df) >= 4 and np.ptp(L) > 0 and np.ptp(r) > 0:
            depth = correlation(L, r, n_layers, "rho")
            if gain in df.columns:
                g = _numeric(df, gain, func)
                part = partial_correlation(r, g, L, (rho, gain, n_layers))
                tests.append(_partial_test(r, g, L, labels, part, rho, gain, n_layers))
                confound = (f"confound: rho and depth L correlate (r = {depth.statistic:.2f}, p={_fmt_p(depth.pvalue)}); "
                            f"controlling for L, r({gain}, rho | L) = {part.statistic:.2f} (p={_fmt_p(part.pvalue)})")
            else:
                confound = f"confound: rho and depth L correlate (r = {depth.statistic:.2f}, p={_fmt_p(depth.pvalue)})"
    return CrowdingResult(
        table=per_model, thresholds=acc, best_threshold=min(ties), best_accuracy=best,
        best_thresholds=ties, baseline_accuracy=baseline, logistic=logit, n=len(y),
        n_dampener=int(y.sum()), regime_source=source, rule_pvalue=rule_p, rule_pvalue_method=rule_how,
        depth_correlation=depth, partial=part, confound=confound, stat_tests=declare(tests),
        exact_logistic=exact, sample=sample,
    )


def _rule_test(r, y, ths, labels, best, baseline, p, how, sample) -> StatTest:
    from scipy import stats

    hits = int(round(best * y.size))
    ci = stats.binomtest(hits, y.size).proportion_ci(0.95, method="exact")

    def loo(keep):
        if y[keep].all() or not y[keep].any():
            raise ValueError("one class")
        b = float(_rule_accuracy(r[keep], y[keep], ths).max())
        return b, threshold_rule_pvalue(r[keep], y[keep], ths)[0]

    return StatTest(
        family="crowding", name="rule rho > rho_crit => dampener (best over the grid)",
        test="best accuracy over the threshold grid vs exchangeable dampener labels", n=int(y.size),
        statistic=best, effect="accuracy", effect_value=best, ci_low=float(ci.low), ci_high=float(ci.high),
        pvalue=p, pvalue_method=how, role="primary", alternative="greater",
        hypothesis="dampening exchangeable across rho (no relation)",
        ci_method="Clopper-Pearson interval of the accuracy: it ignores the search over thresholds and "
                  "does not invert the permutation test",
        note=f"{sample}; majority baseline {baseline:.3f}",
        **leave_one_out(labels, loo, best))


def _logistic_test(r, y, labels, fit: LogisticFit, exact: LogisticExact) -> StatTest:
    ci = exact.confidence_interval(0.95)

    def loo(keep):
        if y[keep].all() or not y[keep].any():
            raise ValueError("one class")
        e = logistic_exact_test(r[keep], y[keep].astype(int), alternative="greater")
        f = logistic_fit(r[keep], y[keep].astype(int))
        return f.slope, e.pvalue

    valid_lr = not fit.separated and np.isfinite(fit.lr_pvalue)
    return StatTest(
        family="crowding", name="logistic P(dampener) on rho",
        test="exact conditional test of the logistic slope (sufficient statistic sum rho * dampener)",
        n=int(y.size), statistic=fit.slope, effect="slope (per unit rho; MLE)", effect_value=fit.slope,
        ci_low=ci.low, ci_high=ci.high, pvalue=exact.pvalue, pvalue_method=exact.method, alternative="greater",
        pvalue_other=fit.lr_pvalue if valid_lr else float("nan"),
        pvalue_other_method="likelihood ratio, chi2 1 df (asymptotic)" if valid_lr else "",
        role="sensitivity", hypothesis="dampening exchangeable across rho (no relation)",
        ci_method="inverts the exact conditional test (one-sided)",
        note=("the same null as the rule; " + (f"{fit.note}: the asymptotic LR and Wald tests are not valid"
                                                if fit.separated else "not separated")),
        **leave_one_out(labels, loo, fit.slope))


def _partial_test(r, g, L, labels, part: PartialCorrelation, rho, gain, n_layers) -> StatTest:
    def loo(keep):
        p = partial_correlation(r[keep], g[keep], L[keep])
        return p.statistic, p.pvalue

    return StatTest(
        family="crowding", name=f"partial r({gain}, {rho} | {n_layers})",
        test=f"partial Pearson r controlling for {n_layers}, t test with n - 3 df", n=part.n,
        statistic=part.statistic, effect="partial r", effect_value=part.statistic,
        ci_low=part.ci_low, ci_high=part.ci_high, pvalue=part.pvalue,
        pvalue_method="t test (exact under normality)", role="secondary",
        hypothesis=f"{gain} and {rho} unrelated once {n_layers} is controlled for",
        ci_method="Fisher z, approximate", note=f"r({rho}, {n_layers}) = {part.r_xz:.3f}",
        **leave_one_out(labels, loo, part.statistic))


@dataclass(frozen=True, repr=False, eq=False)
class CrowdingComparison(LawResult):
    """Crowding verdicts on several tables side by side (e.g. within-family vs across-family).

    ``results``: scope name -> :class:`CrowdingResult`. ``to_frame()`` gives one row per scope:
    ``scope, n, sample, n_dampener, best_accuracy, rho_crit_low, rho_crit_high, baseline_accuracy,
    beats_baseline, rule_pvalue, r_rho_depth, partial_r, partial_pvalue``.
    """

    results: dict

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for name, c in self.results.items():
            rows.append({
                "scope": name, "n": c.n, "sample": c.sample, "n_dampener": c.n_dampener,
                "best_accuracy": c.best_accuracy,
                "rho_crit_low": min(c.best_thresholds), "rho_crit_high": max(c.best_thresholds),
                "baseline_accuracy": c.baseline_accuracy, "beats_baseline": c.beats_baseline,
                "rule_pvalue": c.rule_pvalue,
                "r_rho_depth": c.depth_correlation.statistic if c.depth_correlation else float("nan"),
                "partial_r": c.partial.statistic if c.partial else float("nan"),
                "partial_pvalue": c.partial.pvalue if c.partial else float("nan"),
            })
        return pd.DataFrame(rows)

    def summary(self) -> str:
        lines = ["CrowdingComparison (rule rho > rho_crit => dampener, side by side):"]
        lines += [f"  {name}: {c.verdict()}" for name, c in self.results.items()]
        return "\n".join(lines)


def crowding_comparison(scopes: Mapping[str, Table], **kwargs: Any) -> CrowdingComparison:
    """:func:`crowding` on each named table (``{"within Pythia": t1, "across labs": t2}``)."""
    if not isinstance(scopes, Mapping) or not scopes:
        raise ValueError("crowding_comparison: pass a non-empty mapping of scope name -> table")
    return CrowdingComparison(results={str(k): crowding(v, **kwargs) for k, v in scopes.items()})
