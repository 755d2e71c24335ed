"""The paper's L* prediction (eq. 6) against the fit-free baselines, on the paper's own models.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", section 5.3, eq. 6:
``L* = L (0.11 + 0.012 L + 4.9 / H)`` with ``L`` blocks and ``H`` query heads per layer,
calibrated on 0-based argmax values; ALiBi models are out of its scope. The formula itself lives
with the measure (:mod:`thermo_lens.measures.depth.predicted`); this module re-exports it.

A prediction is only as good as its baselines. :data:`L_STAR_BASELINES` names the trivial
predictors reported beside eq. 6 everywhere (``half_depth = L/2`` needs no fit at all).
:func:`l_star_comparison` scores them model by model; :func:`l_star_predictor_test` compares eq. 6
with ``L/2`` by a paired exact test. On the paper's six validation models (its Fig. A2, values
read off the plot; only two distinct ``(L, H)`` pairs; four of them are eq. 6's calibration
models) the two are indistinguishable under either error, and which one is ahead flips when BLOOM
(ALiBi, outside eq. 6's stated scope) is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from thermo_lens._lazy import pandas as pd
from thermo_lens.measures.depth.predicted import (L_STAR_BASELINES, PREDICTED_DEFINITION, LStarBeyondDepthWarning,
                                         l_star_baselines, predicted_l_star)
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.result import Result
from thermo_lens.stats.exact import ConfidenceInterval, SignedRankTest, signed_rank_test

if TYPE_CHECKING:
    from thermo_lens.laws.table import Table

__all__ = ["PREDICTED_DEFINITION", "L_STAR_BASELINES", "predicted_l_star", "l_star_baselines",
           "l_star_comparison", "LStarBeyondDepthWarning", "LStarPredictorTest", "l_star_predictor_test"]


def l_star_comparison(table: Table, empirical: str = "empirical", n_layers: str = "n_layers",
                      n_heads: str = "n_heads") -> pd.DataFrame:
    """Eq. 6 against the trivial baselines on a table of models with an empirical L*.

    ``table`` has one row per model with columns ``n_layers``, ``n_heads`` and ``empirical``
    (``model`` names rows if present). Returns one row per (model, predictor) with ``predicted``,
    ``paper_error = |pred - emp| / L`` and ``ape = |pred - emp| / emp`` (fractions), for the
    predictors ``eq6``, ``half_depth`` and ``constant_fraction_loo`` (:data:`L_STAR_BASELINES`);
    ``.groupby("predictor")[["paper_error", "ape"]].mean()`` gives the headline numbers.
    """
    df = pd.DataFrame(table).reset_index(drop=True)
    for c in (empirical, n_layers, n_heads):
        if c not in df.columns:
            raise ThermoLensInputError(f"l_star_comparison: missing column {c!r}")
    L = df[n_layers].astype(float).to_numpy()
    H = df[n_heads].astype(int).to_numpy()
    emp = df[empirical].astype(float).to_numpy()
    if len(df) < 2 or not np.all(np.isfinite(emp)):
        raise ThermoLensInputError("l_star_comparison: need >= 2 models with a finite empirical L*")
    frac = emp / L
    preds = {
        "eq6": np.array([predicted_l_star(int(a), int(b), warn=False) for a, b in zip(L, H)]),
        "half_depth": L / 2.0,
        "constant_fraction_loo": np.array([np.mean(np.delete(frac, i)) for i in range(len(L))]) * L,
    }
    names = df["model"].astype(str).tolist() if "model" in df.columns else [str(i) for i in range(len(df))]
    rows = []
    for pname, p in preds.items():
        for i in range(len(L)):
            rows.append({"model": names[i], "predictor": pname, "n_layers": int(L[i]), "n_heads": int(H[i]),
                         "empirical": emp[i], "predicted": float(p[i]),
                         "paper_error": abs(p[i] - emp[i]) / L[i],
                         "ape": abs(p[i] - emp[i]) / emp[i] if emp[i] != 0 else math.nan})
    return pd.DataFrame(rows)


@dataclass(frozen=True, repr=False, eq=False)
class LStarPredictorTest(Result):
    """Eq. 6 against ``L / 2`` on the same models: a paired exact test of their errors.

    Attributes:
        metric: ``"paper"`` (``|pred - emp| / L``) or ``"ape"`` (``|pred - emp| / emp``).
        models: ``[model]`` names.
        eq6_error, half_error: ``[model]`` each predictor's error (fractions).
        mean_eq6, mean_half: their means (the headline numbers).
        test: :class:`thermo_lens.stats.exact.SignedRankTest` of ``eq6_error - half_error``
            (exact Wilcoxon p, Hodges-Lehmann estimate, ``.confidence_interval()`` inverting it).
        leave_one_out: per model left out: ``model, mean_eq6, mean_half, ahead, pvalue``.
        verdict: one sentence (``"indistinguishable"`` when the test does not reject at 5%).
        caveat: what the comparison rests on.
    """

    metric: str
    models: tuple
    eq6_error: np.ndarray
    half_error: np.ndarray
    mean_eq6: float
    mean_half: float
    test: SignedRankTest
    leave_one_out: pd.DataFrame
    verdict: str
    caveat: str = ""

    @property
    def statistic(self) -> float:
        return self.test.statistic

    @property
    def pvalue(self) -> float:
        return self.test.pvalue

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """Interval of the median paired difference eq. 6 minus ``L / 2`` (inverting the same test)."""
        return self.test.confidence_interval(level)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"model": list(self.models), "eq6_error": self.eq6_error, "half_error": self.half_error,
                             "difference": self.eq6_error - self.half_error})

    def __repr__(self) -> str:
        ci = self.confidence_interval()
        return (f"LStarPredictorTest({self.metric} error over {len(self.models)} models: eq. 6 {self.mean_eq6:.4f}, "
                f"L/2 {self.mean_half:.4f}; paired exact Wilcoxon p = {self.pvalue:.3g}, Hodges-Lehmann difference "
                f"{self.test.estimate:.3g} (95% CI [{ci.low:.3g}, {ci.high:.3g}]): {self.verdict})"
                + (f"\n  caveat: {self.caveat}" if self.caveat else ""))


def l_star_predictor_test(table: Table, metric: str = "paper", level: float = 0.95, caveat: str = "") -> LStarPredictorTest:
    """Is eq. 6 better than ``L / 2``? A paired exact signed-rank test of their per-model errors.

    ``table`` as :func:`l_star_comparison` takes. The verdict says ``"indistinguishable"`` unless
    the exact two-sided p is below ``1 - level``; the leave-one-out table shows whether the ranking
    of the two mean errors depends on one model.
    """
    if metric not in ("paper", "ape"):
        raise ThermoLensInputError(f"l_star_predictor_test: metric must be 'paper' or 'ape', got {metric!r}")
    col = "paper_error" if metric == "paper" else "ape"
    comp = l_star_comparison(table)
    eq6 = comp[comp["predictor"] == "eq6"].reset_index(drop=True)
    half = comp[comp["predictor"] == "half_depth"].reset_index(drop=True)
    a, b = eq6[col].to_numpy(float), half[col].to_numpy(float)
    test = signed_rank_test(a, b)
    rows = []
    for i, m in enumerate(eq6["model"]):
        keep = np.arange(a.size) != i
        ma, mb = float(a[keep].mean()), float(b[keep].mean())
        rows.append({"model": m, "mean_eq6": ma, "mean_half": mb,
                     "ahead": "eq6" if ma < mb else ("half_depth" if mb < ma else "tie"),
                     "pvalue": signed_rank_test(a[keep], b[keep]).pvalue})
    loo = pd.DataFrame(rows)
    ahead = "eq. 6" if a.mean() < b.mean() else "L/2"
    flips = loo.loc[loo["ahead"] != ("eq6" if ahead == "eq. 6" else "half_depth"), "model"].tolist()
    alpha = 1 - level
    word = (f"eq. 6 and L/2 are indistinguishable (p = {test.pvalue:.2g} >= {alpha:g})" if test.pvalue >= alpha
            else f"{ahead} is better (p = {test.pvalue:.2g})")
    if flips:
        word += f"; without {', '.join(flips)} the other one is ahead"
    return LStarPredictorTest(metric=metric, models=tuple(eq6["model"]), eq6_error=a, half_error=b,
                              mean_eq6=float(a.mean()), mean_half=float(b.mean()), test=test, leave_one_out=loo,
                              verdict=word, caveat=caveat)
