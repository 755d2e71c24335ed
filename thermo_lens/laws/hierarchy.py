"""Hierarchy: groups (labs, families) ranked by mean gain with uncertainty (D'Elia 2026, abstract).

The abstract's Pythia (0.80) < Mistral (1.11) < LLaMA (1.48) < Gemma (2.31) ranks one model per
group: with n = 1 per group there is no within-group spread, so no test separates the groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from thermo_lens.laws.base import LawResult, StatTest, leave_one_out, with_holm
from thermo_lens.laws.table import _as_frame, _group_stats, _labels, _numeric, _require

__all__ = ["HierarchyResult", "hierarchy", "family_of"]

_FAMILIES = (
    ("pythia", r"pythia"), ("gpt-neox", r"gpt-?neox"), ("gpt-neo", r"gpt-?neo"),
    ("gpt-j", r"gpt-?j"), ("gpt2", r"gpt-?2"), ("opt", r"(^|/)opt"), ("bloom", r"bloom"),
    ("llama", r"llama"), ("mistral", r"mistral"), ("gemma", r"gemma"), ("falcon", r"falcon"),
    ("stablelm", r"stablelm"), ("apertus", r"apertus"), ("qwen", r"qwen"), ("phi", r"(^|/)phi"),
)


def family_of(model: str) -> str:
    """Model family from a model name or HF id (``"EleutherAI/pythia-1b"`` -> ``"pythia"``).

    Known families by pattern; otherwise the name's first ``-``-separated token, lower-cased.
    """
    s = str(model).lower()
    for fam, pat in _FAMILIES:
        if re.search(pat, s):
            return fam
    return s.split("/")[-1].split("-")[0]


@dataclass(frozen=True, repr=False, eq=False)
class HierarchyResult(LawResult):
    """Groups ranked by mean gain (D'Elia 2026, abstract).

    ``groups`` per group: ``rank, group, n, mean, sd`` (ddof=1), ``se``, ``ci_low, ci_high``
    (t distribution, n - 1 df, NaN for n = 1), ``min, max``. ``separated_from_next``: whether the
    group's CI and the next group's CI are disjoint (a crude check; NaN CIs count as not separated).
    """

    groups: pd.DataFrame
    by: str
    level: float
    stat_tests: tuple = ()

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(self.groups["group"])

    def to_frame(self) -> pd.DataFrame:
        return self.groups.copy()

    def summary(self) -> str:
        lines = [f"HierarchyResult(by {self.by!r}, {len(self.groups)} groups, {self.level:.0%} t CI): "
                 + " < ".join(f"{g} ({m:.3f})" for g, m in zip(self.groups["group"], self.groups["mean"]))]
        for _, r in self.groups.iterrows():
            ci = (f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]" if np.isfinite(r["ci_low"])
                  else "(n=1, no CI)")
            lines.append(f"  {int(r['rank'])}. {r['group']}: n={int(r['n'])}, mean={r['mean']:.4f}, "
                         f"SE={r['se']:.4f}, CI {ci}")
        if self.tests:
            lines.append(f"  tests ({len(self.tests)} adjacent pairs with n >= 2 each; Holm over them):")
            lines += [f"    {t.summary()}" for t in self.tests]
        else:
            lines.append("  no test: no two adjacent groups both have n >= 2")
        return "\n".join(lines)


def hierarchy(table: Any, by: str = "lab", gain: str = "gain", level: float = 0.95,
              ascending: bool = True) -> HierarchyResult:
    """Rank groups of models by mean gain, with SE and a t-based CI.

    ``by`` is a column (``"lab"``, ``"family"``, ...). ``by="family"`` without a ``family`` column
    derives it from ``model`` (or ``hf_id``) with :func:`family_of`.
    """
    func = "hierarchy"
    df = _as_frame(table, func)
    if by == "family" and "family" not in df.columns:
        src = "model" if "model" in df.columns else ("hf_id" if "hf_id" in df.columns else None)
        if src is None:
            raise ValueError(f"{func}: no 'family' column and no 'model'/'hf_id' to derive it from")
        df["family"] = [family_of(m) for m in df[src]]
    _require(df, [by], func)
    if df[by].isna().any():
        raise ValueError(f"{func}: column {by!r} has missing values")
    g = _numeric(df, gain, func)
    if not 0 < level < 1:
        raise ValueError(f"{func}: level must be in (0, 1)")
    keys = df[by].astype(str).to_numpy()
    rows = [{"group": k, **_group_stats(g[keys == k], level)} for k in dict.fromkeys(keys)]
    out = pd.DataFrame(rows).sort_values("mean", ascending=ascending, kind="stable").reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    lo, hi = out["ci_low"].to_numpy(), out["ci_high"].to_numpy()
    sep = [bool(np.isfinite(hi[i]) and np.isfinite(lo[i + 1]) and
                (hi[i] < lo[i + 1] if ascending else lo[i] > hi[i + 1]))
           for i in range(len(out) - 1)] + [False]
    out["separated_from_next"] = sep
    return HierarchyResult(groups=out, by=by, level=level,
                           stat_tests=_adjacent_tests(out, keys, g, _labels(df), level))


def _perm_p(u: np.ndarray, v: np.ndarray) -> tuple[float, str]:
    """Two-sided permutation p of mean(u) - mean(v): P(|diff_perm| >= |diff_obs|) over the splits."""
    import math

    from scipy import stats

    total = math.comb(u.size + v.size, u.size)
    exact = total <= 20_000
    res = stats.permutation_test((u, v), lambda a, b, axis=-1: np.abs(a.mean(axis=axis) - b.mean(axis=axis)),
                                 vectorized=True, alternative="greater",
                                 n_resamples=np.inf if exact else 20_000, rng=np.random.default_rng(0))
    how = (f"exact permutation (all {total} splits)" if exact
           else "Monte Carlo permutation (20000 resamples, seed 0)")
    return float(res.pvalue), how


def _adjacent_tests(groups: pd.DataFrame, keys: np.ndarray, g: np.ndarray, labels: list, level: float) -> tuple:
    """Each pair of adjacent groups (both n >= 2): difference in mean gain with its Welch CI, the
    permutation p (exact for small groups) and Welch's t p beside it."""
    from scipy import stats

    tests = []
    order = list(groups["group"])
    for a, b in zip(order[:-1], order[1:]):
        xa, xb = g[keys == a], g[keys == b]
        if xa.size < 2 or xb.size < 2:
            continue
        w = stats.ttest_ind(xb, xa, equal_var=False)
        ci = w.confidence_interval(level)
        p, how = _perm_p(xb, xa)
        sel = (keys == a) | (keys == b)
        sub_keys, sub_g, sub_labels = keys[sel], g[sel], [lab for lab, s in zip(labels, sel) if s]

        def loo(keep, sub_keys=sub_keys, sub_g=sub_g, a=a, b=b):
            ua, ub = sub_g[keep][sub_keys[keep] == a], sub_g[keep][sub_keys[keep] == b]
            if ua.size < 2 or ub.size < 2:
                raise ValueError("group too small")
            return float(ub.mean() - ua.mean()), _perm_p(ub, ua)[0]

        diff = float(xb.mean() - xa.mean())
        tests.append(StatTest(
            family="hierarchy", name=f"{b} - {a}", test="difference in mean gain, permutation test",
            n=int(xa.size + xb.size), statistic=diff, effect="difference in mean gain (Welch CI)",
            effect_value=diff, ci_low=float(ci.low), ci_high=float(ci.high), pvalue=p,
            pvalue_method=how, pvalue_other=float(w.pvalue), pvalue_other_method="Welch t",
            **leave_one_out(sub_labels, loo, diff)))
    return with_holm(tests)
