"""What each knob does: seed-paired effects with 95% CIs, permutation tests and regime flips.

For a knob level against its reference level, at the last checkpoint of every seed:

* the seed-level difference ``d_s = metric(level, seed s) - metric(reference, seed s)``; the two
  runs of a seed share initial weights (where shapes allow) and batch order, so the difference is
  paired;
* ``effect`` = mean of ``d_s``; ``ci_low``/``ci_high`` = the 95% Student-t interval over seeds
  (``n_seeds - 1`` degrees of freedom; :func:`thermo_lens.stats.summarize`), NaN with one seed;
* ``pvalue``: two-sided sign-flip permutation test of mean ``d_s = 0``
  (``scipy.stats.permutation_test`` with ``permutation_type="samples"``, exact: all
  ``2**n_seeds`` sign patterns). With ``n`` seeds the smallest attainable p-value is ``2 / 2**n``
  (0.25 for 3 seeds, 0.0625 for 5): ``min_pvalue`` says so in every row;
* ``flips_regime`` (gain metrics only): the across-seed means at the two levels lie on opposite
  sides of 1 (expander vs dampener); ``seeds_flipped`` counts seeds whose own pair straddles 1.

Toy scale: these are 10^5-parameter models trained for minutes. An effect here is evidence about
what a knob *can* do to the gain, not about what it did in any published model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["PairedEffect", "paired_effect", "effects_frame", "METRICS", "GAIN_METRICS"]

GAIN_METRICS = ("last_block_gain", "penultimate_gain", "first_block_gain", "geometric_mean_gain",
                "total_amplification", "max_block_gain")
METRICS = GAIN_METRICS + ("W_V_W_O_ratio", "val_loss")


def _mean(x: np.ndarray, axis: int = -1) -> Any:
    return np.mean(x, axis=axis)


@dataclass(frozen=True)
class PairedEffect:
    """Mean seed-paired difference, its CI, the exact permutation p-value and ``n`` seeds."""

    effect: float
    ci_low: float
    ci_high: float
    pvalue: float
    n: int
    min_pvalue: float


def paired_effect(reference: Any, level: Any, *, confidence: float = 0.95) -> PairedEffect:
    """Mean paired difference ``level - reference``, its t CI and the exact sign-flip p-value.

    Args:
        reference, level: per-seed values, aligned by seed (same length).
        confidence: CI level (0.95).
    """
    from scipy import stats

    from thermo_lens.stats import summarize

    a, b = np.asarray(reference, dtype=float), np.asarray(level, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"reference and level must be 1-D and aligned by seed; got shapes {a.shape}, {b.shape}")
    d = b - a
    n = int(d.size)
    nan = float("nan")
    if n == 0 or not np.all(np.isfinite(d)):
        return PairedEffect(effect=nan, ci_low=nan, ci_high=nan, pvalue=nan, n=n, min_pvalue=nan)
    s = summarize(d, level=confidence)
    if n >= 2 and np.any(d != 0):
        res = stats.permutation_test((d,), _mean, permutation_type="samples", n_resamples=np.inf,
                                     alternative="two-sided", vectorized=True)
        p = float(res.pvalue)
    else:
        p = 1.0 if n >= 2 else nan
    return PairedEffect(effect=float(s.mean), ci_low=float(s.ci_low), ci_high=float(s.ci_high), pvalue=p, n=n,
                        min_pvalue=min(1.0, 2.0 / 2 ** n) if n else nan)


def effects_frame(runs: Any, comparisons: Sequence[tuple[str, Any, Any, str, str]],
                  metrics: Sequence[str] = METRICS, step: int | None = None) -> Any:
    """One row per (knob, level, metric): the paired effect at the last checkpoint (or ``step``).

    Args:
        runs: :func:`thermo_lens.lab.run.runs_frame` (``arm, seed, step`` and the metric columns).
        comparisons: ``(knob, reference level, level, reference arm, arm)`` tuples
            (:meth:`~thermo_lens.lab.spec.LabSpec.comparisons`).
        metrics: columns to compare.
        step: the checkpoint compared (default: each run's last).

    Only seeds finished at both levels enter a comparison (``n_seeds`` says how many).
    """
    import pandas as pd

    cols = ["knob", "reference", "level", "metric", "effect", "ci_low", "ci_high", "pvalue", "n_seeds",
            "min_pvalue", "reference_mean", "level_mean", "flips_regime", "seeds_flipped", "reference_arm", "arm",
            "step"]
    rows = []  # type: ignore[var-annotated]
    if len(runs) == 0:
        return pd.DataFrame(rows, columns=cols)
    if step is None:
        final = runs.loc[runs.groupby("run")["step"].transform("max") == runs["step"]]
    else:
        final = runs.loc[runs["step"] == step]
    for knob, ref_level, level, ref_arm, arm in comparisons:
        a = final.loc[final["arm"] == ref_arm].set_index("seed")
        b = final.loc[final["arm"] == arm].set_index("seed")
        seeds = sorted(set(a.index) & set(b.index))
        for m in metrics:
            if m not in final.columns:
                continue
            x, y = a.loc[seeds, m].to_numpy(float), b.loc[seeds, m].to_numpy(float)
            e = paired_effect(x, y)
            flips, n_flipped = None, None
            if m in GAIN_METRICS and seeds:
                flips = bool((np.mean(x) - 1.0) * (np.mean(y) - 1.0) < 0)
                n_flipped = int(np.sum((x - 1.0) * (y - 1.0) < 0))
            rows.append({"knob": knob, "reference": ref_level, "level": level, "metric": m, "effect": e.effect,
                         "ci_low": e.ci_low, "ci_high": e.ci_high, "pvalue": e.pvalue, "n_seeds": e.n,
                         "min_pvalue": e.min_pvalue, "reference_mean": float(np.mean(x)) if seeds else np.nan,
                         "level_mean": float(np.mean(y)) if seeds else np.nan, "flips_regime": flips,
                         "seeds_flipped": n_flipped, "reference_arm": ref_arm, "arm": arm,
                         "step": int(b.loc[seeds, "step"].max()) if seeds else None})
    return pd.DataFrame(rows, columns=cols)
