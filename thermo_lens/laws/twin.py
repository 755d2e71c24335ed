"""Base vs fine-tuned pairs: is the sign of ``G - 1`` kept? (D'Elia 2026, section 5.5).

Declared tests (``thermo_lens.definitions`` §5): the primary is the paper's claim, the sign kept,
an exact one-sided binomial test against a coin flip with the one-sided exact interval that
inverts it; the secondary is the magnitude change, an exact Wilcoxon signed-rank test of
``log(ft / base)`` with the Hodges-Lehmann ratio and the interval inverting the same test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from thermo_lens.laws.base import LawResult, StatTest, declare, leave_one_out
from thermo_lens.laws.table import Table, _as_frame, _numeric, _require
from thermo_lens.stats.exact import signed_rank_test

__all__ = ["TwinResult", "twin"]


@dataclass(frozen=True, repr=False, eq=False)
class TwinResult(LawResult):
    """Base vs fine-tuned test (D'Elia 2026, section 5.5).

    ``pairs`` per pair: ``base, model, base_gain, ft_gain``, ``base_sign``/``ft_sign`` (sign of
    ``G - 1``: +1 expander, -1 dampener, 0 exactly neutral), ``sign_kept``, ``delta = ft - base``,
    ``relative_change = (ft - base) / |base - 1|`` (change relative to the base's distance from
    neutrality: -1 means the fine-tune moved exactly to G = 1; < -1 with an expander base means the
    sign flipped) and ``ratio = ft / base``.
    The paper: "RLHF modulates magnitude (up to 50%) but cannot invert sign. Gemma: 2.32 -> 1.15".
    """

    pairs: pd.DataFrame
    stat_tests: tuple = ()

    @property
    def n_pairs(self) -> int:
        return len(self.pairs)

    @property
    def n_sign_kept(self) -> int:
        return int(self.pairs["sign_kept"].sum())

    @property
    def all_sign_kept(self) -> bool:
        return self.n_sign_kept == self.n_pairs

    def to_frame(self) -> pd.DataFrame:
        return self.pairs.copy()

    def summary(self) -> str:
        lines = [f"TwinResult(sign of G-1 kept in {self.n_sign_kept}/{self.n_pairs} pairs)"]
        for _, r in self.pairs.iterrows():
            lines.append(f"  {r['base']} -> {r['model']}: {r['base_gain']:.4f} -> {r['ft_gain']:.4f} "
                         f"(sign {'kept' if r['sign_kept'] else 'FLIPPED'}, ratio {r['ratio']:.3f}, "
                         f"relative change {r['relative_change']:+.3f})")
        lines += self.tests_summary()
        return "\n".join(lines)


def twin(table: Table, model: str = "model", base: str = "base", gain: str = "gain") -> TwinResult:
    """Compare fine-tuned models with their bases.

    Two input shapes:

    - one row per model with columns ``model``, ``base`` and ``gain``: a row whose ``base`` names
      another row's ``model`` is a fine-tune of it (``base`` empty/NaN, or equal to ``model``, for
      base rows). ``reference.twins()`` has this shape.
    - one row per pair with columns ``base_gain`` and ``ft_gain`` (optionally ``base`` and
      ``model`` as names).
    """
    func = "twin"
    df = _as_frame(table, func)
    if "base_gain" in df.columns and "ft_gain" in df.columns:
        bg, fg = _numeric(df, "base_gain", func), _numeric(df, "ft_gain", func)
        bnames = (df[base].astype(str).tolist() if base in df.columns
                  else [f"base{i}" for i in range(len(df))])
        fnames = df[model].astype(str).tolist() if model in df.columns else [f"ft{i}" for i in range(len(df))]
    else:
        _require(df, [model, base, gain], func)
        g = _numeric(df, gain, func)
        names = df[model].astype(str).to_numpy()
        dup = sorted({m for m in names if (names == m).sum() > 1})
        if dup:
            raise ValueError(f"{func}: duplicate {model!r} names: {dup}")
        lookup = dict(zip(names, g))
        bcol = df[base]
        bnames, fnames, bg_l, fg_l = [], [], [], []
        for m, b, gv in zip(names, bcol, g):
            if b is None or (isinstance(b, float) and math.isnan(b)) or b is pd.NA or str(b) in ("", m):
                continue
            b = str(b)
            if b not in lookup:
                raise ValueError(f"{func}: base {b!r} of {m!r} is not a {model!r} in the table")
            bnames.append(b); fnames.append(m); bg_l.append(lookup[b]); fg_l.append(gv)
        bg, fg = np.array(bg_l, dtype=float), np.array(fg_l, dtype=float)
    if len(bg) == 0:
        raise ValueError(f"{func}: no base/fine-tuned pairs found (fill the {base!r} column of the "
                         "fine-tuned rows with their base model's name)")
    bs, fs = np.sign(bg - 1.0).astype(int), np.sign(fg - 1.0).astype(int)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = (fg - bg) / np.abs(bg - 1.0)
        ratio = fg / bg
    pairs = pd.DataFrame({"base": bnames, "model": fnames, "base_gain": bg, "ft_gain": fg,
                          "base_sign": bs, "ft_sign": fs, "sign_kept": bs == fs,
                          "delta": fg - bg, "relative_change": rel, "ratio": ratio})
    return TwinResult(pairs=pairs, stat_tests=_twin_tests(pairs))


def _twin_tests(pairs: pd.DataFrame) -> tuple:
    """Sign kept (exact one-sided binomial vs a coin flip) and the magnitude change (exact Wilcoxon)."""
    from scipy import stats

    n = len(pairs)
    kept = pairs["sign_kept"].to_numpy(bool)
    labels = [f"{b}->{m}" for b, m in zip(pairs["base"], pairs["model"])]
    k = int(kept.sum())
    bt = stats.binomtest(k, n, 0.5, alternative="greater")
    ci = bt.proportion_ci(0.95, method="exact")

    def loo_sign(keep):
        kk = int(kept[keep].sum())
        return kk / int(keep.sum()), float(stats.binomtest(kk, int(keep.sum()), 0.5, alternative="greater").pvalue)

    tests = [StatTest(
        family="twin", name="sign of G - 1 kept by the fine-tune", test="exact binomial test vs p = 0.5 (one-sided)",
        n=n, statistic=k / n, effect="fraction kept", effect_value=k / n, ci_low=float(ci.low),
        ci_high=float(ci.high), pvalue=float(bt.pvalue), pvalue_method="exact (binomial)", role="primary",
        alternative="greater", hypothesis="a fine-tune keeps the sign of G - 1 no more often than a coin flip",
        ci_method="one-sided exact (Clopper-Pearson) bound, inverting the same one-sided test",
        note=f"a coin-flip null is a weak one; with {n} pairs even {n}/{n} gives p = {0.5 ** n:.3g}",
        **leave_one_out(labels, loo_sign, k / n))]
    logr = np.log(pairs["ratio"].to_numpy(float))
    if n >= 2 and np.all(np.isfinite(logr)) and np.any(logr != 0):
        sr = signed_rank_test(logr)
        lo, hi = sr.confidence_interval(0.95)

        def loo_mag(keep):
            r = signed_rank_test(logr[keep])
            return float(np.exp(r.estimate)), float(r.pvalue)

        tests.append(StatTest(
            family="twin", name="magnitude change ft/base", test="Wilcoxon signed-rank of log(ft/base), exact",
            n=n, statistic=float(np.exp(sr.estimate)), effect="Hodges-Lehmann ratio ft/base",
            effect_value=float(np.exp(sr.estimate)), ci_low=float(np.exp(lo)), ci_high=float(np.exp(hi)),
            pvalue=float(sr.pvalue), pvalue_method="exact (Wilcoxon, all sign flips)", role="secondary",
            hypothesis="log(ft/base) symmetric about 0 (no magnitude change)",
            ci_method="inverts the same signed-rank test (infinite ends: too few pairs to reject any ratio)",
            **leave_one_out(labels, loo_mag, float(np.exp(sr.estimate)))))
    return declare(tests)
