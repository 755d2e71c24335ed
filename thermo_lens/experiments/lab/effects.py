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
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from thermo_lens.stats.exact import sign_flip_pvalue

if TYPE_CHECKING:
    import pandas as pd
    from numpy.typing import ArrayLike


__all__ = ["PairedEffect", "paired_effect", "effects_frame", "budget_effects_frame", "matched_loss_frame",
           "sign_flip_pvalue", "sign_flip_interval", "regime_of", "flip_by_intervals", "METRICS", "GAIN_METRICS"]

GAIN_METRICS = ("last_block_gain", "penultimate_gain", "first_block_gain", "geometric_mean_gain",
                "total_amplification", "max_block_gain")
METRICS = GAIN_METRICS + ("W_V_W_O_ratio", "val_loss")


def _mean(x: np.ndarray, axis: int = -1) -> np.floating | np.ndarray:
    return np.mean(x, axis=axis)


def last_checkpoints(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``runs`` at each run's last checkpoint (a run = one arm, seed and budget)."""
    return runs.loc[runs.groupby("run")["step"].transform("max") == runs["step"]]


@dataclass(frozen=True)
class PairedEffect:
    """Mean seed-paired difference, its CI, the exact permutation p-value and ``n`` seeds."""

    effect: float
    ci_low: float
    ci_high: float
    pvalue: float
    n: int
    min_pvalue: float


def paired_effect(reference: ArrayLike, level: ArrayLike, *, confidence: float = 0.95) -> PairedEffect:
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


def effects_frame(runs: pd.DataFrame, comparisons: Sequence[tuple[str, Any, Any, str, str]],
                  metrics: Sequence[str] = METRICS, step: int | None = None) -> pd.DataFrame:
    """One row per (knob, level, metric): the paired effect at the last checkpoint (or ``step``).

    Args:
        runs: :func:`thermo_lens.experiments.lab.run.runs_frame` (``arm, seed, step`` and the metric columns).
        comparisons: ``(knob, reference level, level, reference arm, arm)`` tuples
            (:meth:`~thermo_lens.experiments.lab.spec.LabSpec.comparisons`).
        metrics: columns to compare.
        step: the checkpoint compared (default: each run's last).

    Only seeds finished at both levels enter a comparison (``n_seeds`` says how many).
    """
    import pandas as pd

    cols = ["knob", "reference", "level", "metric", "effect", "ci_low", "ci_high", "pvalue", "n_seeds",
            "min_pvalue", "reference_mean", "level_mean", "flips_regime", "seeds_flipped", "reference_arm", "arm",
            "step"]
    rows: list[dict[str, Any]] = []
    if len(runs) == 0:
        return pd.DataFrame(rows, columns=cols)
    if step is None:
        final = last_checkpoints(runs)
    else:
        final = runs.loc[runs["step"] == step]
    for (knob, ref_level, level, ref_arm, arm), m, pair in _seed_pairs(final, comparisons, metrics):
        x, y, seeds = pair.x, pair.y, pair.seeds
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
                     "step": int(pair.level_runs.loc[seeds, "step"].max()) if seeds else None})
    return pd.DataFrame(rows, columns=cols)


@dataclass(frozen=True)
class _SeedPair:
    """One comparison's values of one metric on the seeds finished in both arms (seed order)."""

    x: np.ndarray  # reference arm, [seed]
    y: np.ndarray  # compared arm, [seed]
    seeds: list[Any]
    n_left_out: int  # seeds finished in one arm only
    level_runs: pd.DataFrame  # the compared arm's rows, indexed by seed


def _seed_pairs(final: pd.DataFrame, comparisons: Sequence[tuple[str, Any, Any, str, str]],
                metrics: Sequence[str]) -> Iterator[tuple[tuple[str, Any, Any, str, str], str, _SeedPair]]:
    """``(comparison, metric, pair)`` for every comparison and every metric ``final`` has: the
    seed-paired values both effects frames compare (only seeds finished in both arms)."""
    for comp in comparisons:
        _knob, _ref_level, _level, ref_arm, arm = comp
        a = final.loc[final["arm"] == ref_arm].set_index("seed")
        b = final.loc[final["arm"] == arm].set_index("seed")
        seeds = sorted(set(a.index) & set(b.index))
        left_out = int(len(set(a.index) | set(b.index)) - len(seeds))
        for m in metrics:
            if m in final.columns:
                yield comp, m, _SeedPair(a.loc[seeds, m].to_numpy(float), b.loc[seeds, m].to_numpy(float),
                                         seeds, left_out, b)


# ------------------------------------------------------------------ v2: budgets, matched loss, family
# The exact sign-flip test itself lives in the stats module (thermo_lens.stats.exact.sign_flip_pvalue).

def sign_flip_interval(d: ArrayLike, level: float = 0.95) -> tuple[float, float]:
    """The interval that inverts :func:`sign_flip_pvalue`: the shifts ``delta`` with
    ``p(d - delta) > 1 - level``, found by bisection on each side of the mean. Unbounded
    (``-inf``/``inf``) when even an extreme shift cannot reach ``1 - level`` (``2 / 2**n >= 1 - level``:
    fewer than 6 seeds at 95%)."""
    x = np.asarray(d, dtype=float)
    n = x.size
    if n < 2 or not np.all(np.isfinite(x)):
        return float("nan"), float("nan")
    alpha = 1.0 - level
    if 2.0 / 2 ** n >= alpha:
        return float("-inf"), float("inf")
    from thermo_lens.stats.exact import _invert  # the package's test inversion (Blaker, signed-rank, ...)

    span = float(np.ptp(x)) + abs(float(x.mean())) or 1.0  # the data's scale
    lo, hi = _invert(lambda shift: sign_flip_pvalue(x, shift), float(x.mean()), span, alpha)
    return lo, hi


def regime_of(values: ArrayLike, level: float = 0.95) -> str:
    """``"expander"`` when the t-interval of the seed mean of a gain lies above 1, ``"dampener"``
    below 1, ``"undetermined"`` when it contains 1 (or fewer than 2 seeds)."""
    from thermo_lens.stats import summarize

    v = np.asarray(values, dtype=float)
    if v.size < 2 or not np.all(np.isfinite(v)):
        return "undetermined"
    s = summarize(v, level=level)
    return "expander" if s.ci_low > 1 else "dampener" if s.ci_high < 1 else "undetermined"


def flip_by_intervals(reference_regime: str, level_regime: str) -> bool | None:
    """True/False when both regimes are determined (they differ / agree); None: cannot tell."""
    if "undetermined" in (reference_regime, level_regime):
        return None
    return reference_regime != level_regime


def matched_loss_frame(runs: pd.DataFrame, budget: int, target: float | None = None,
                       metrics: Sequence[str] = METRICS) -> tuple[Any, float]:
    """Every ``budget`` run's metrics at the first step its validation loss reaches ``target``.

    Linear interpolation in step between the two checkpoints that bracket the crossing. ``target``
    defaults to the largest of the arms' seed-mean final validation losses (so every arm reaches it
    in the mean). Runs that never reach it are left out. Returns ``(frame with arm, seed, step and
    the metrics, target)``.
    """
    import pandas as pd

    df = runs.loc[runs["budget"] == budget]
    if target is None:
        target = float(last_checkpoints(df).groupby("arm")["val_loss"].mean().max())
    rows = []
    for run, g in df.sort_values("step").groupby("run"):
        g = g.loc[g["val_loss"].notna()]
        loss, steps = g["val_loss"].to_numpy(float), g["step"].to_numpy(float)
        hit = np.nonzero(loss <= target)[0]
        if not hit.size:
            continue
        j = int(hit[0])
        row = {"run": run, "arm": g["arm"].iloc[0], "seed": g["seed"].iloc[0]}
        if j == 0:
            w, i0, i1 = 0.0, 0, 0
        else:
            i0, i1 = j - 1, j
            w = (loss[i0] - target) / (loss[i0] - loss[i1]) if loss[i0] != loss[i1] else 1.0
        row["step"] = steps[i0] + w * (steps[i1] - steps[i0])
        for m in metrics:
            if m in g.columns:
                v = g[m].to_numpy(float)
                row[m] = v[i0] + w * (v[i1] - v[i0])
        rows.append(row)
    return pd.DataFrame(rows), float(target)


def budget_effects_frame(runs: pd.DataFrame, comparisons: Sequence[tuple[str, Any, Any, str, str]], *,
                         budgets: Sequence[int], primary: Sequence[tuple[str, Any]] = (),
                         primary_metrics: Sequence[str] = ("last_block_gain", "penultimate_gain"),
                         metrics: Sequence[str] = METRICS, level: float = 0.95) -> pd.DataFrame:
    """Seed-paired effects at every budget's last step and at matched validation loss (largest
    budget), with the declared primary family Holm-adjusted.

    One row per (basis, budget, knob, level, metric): ``basis`` is ``"budget"`` (each run's last
    step) or ``"matched_loss"``; ``effect`` the mean paired difference; ``ci_low``/``ci_high`` the
    interval that inverts the exact sign-flip test (so it excludes 0 exactly when ``pvalue`` <
    ``1 - level``); ``t_ci_low``/``t_ci_high`` the t-interval; ``family`` ``"primary"`` (the declared
    (knob, level) x ``primary_metrics`` at the largest budget; ``pvalue_holm`` is Holm's adjustment
    over exactly these) or ``"secondary"`` (unadjusted); for gains ``reference_regime``,
    ``level_regime`` (t-interval of the seed mean against 1) and ``flips_regime`` (True / False when
    both are determined, None: cannot tell).
    """
    import pandas as pd

    from thermo_lens.stats import holm, summarize

    largest = max(budgets)
    bases: list[tuple[str, int, Any, float | None]] = []
    for b in budgets:
        df = runs.loc[runs["budget"] == b]
        bases.append(("budget", b, last_checkpoints(df), None))
    if len(runs) and "val_loss" in runs.columns and (runs["budget"] == largest).any():
        matched, target = matched_loss_frame(runs, largest, metrics=metrics)
        bases.append(("matched_loss", largest, matched, target))
    rows = []
    prim = {(k, lv) for k, lv in primary}
    for basis, b, final, matched_target in bases:
        if not len(final):
            continue
        for (knob, ref_level, lv, ref_arm, arm), m, pair in _seed_pairs(final, comparisons, metrics):
            x, y, seeds = pair.x, pair.y, pair.seeds
            d = y - x
            t = summarize(d, level=level) if len(d) >= 2 else None
            lo, hi = sign_flip_interval(d, level)
            is_primary = basis == "budget" and b == largest and (knob, lv) in prim and m in primary_metrics
            row = {"basis": basis, "budget": b, "knob": knob, "reference": ref_level, "level": lv, "metric": m,
                   "effect": float(d.mean()) if len(d) else np.nan, "ci_low": lo, "ci_high": hi,
                   "t_ci_low": float(t.ci_low) if t else np.nan, "t_ci_high": float(t.ci_high) if t else np.nan,
                   "pvalue": sign_flip_pvalue(d), "pvalue_holm": np.nan,
                   "family": "primary" if is_primary else "secondary", "n_seeds": len(seeds),
                   "n_left_out": pair.n_left_out,
                   "min_pvalue": min(1.0, 2.0 / 2 ** len(seeds)) if seeds else np.nan,
                   "reference_mean": float(x.mean()) if len(x) else np.nan,
                   "level_mean": float(y.mean()) if len(y) else np.nan,
                   "reference_regime": None, "level_regime": None, "flips_regime": None,
                   "matched_val_loss": matched_target, "reference_arm": ref_arm, "arm": arm}
            if m in GAIN_METRICS and len(seeds):
                row["reference_regime"], row["level_regime"] = regime_of(x, level), regime_of(y, level)
                row["flips_regime"] = flip_by_intervals(row["reference_regime"], row["level_regime"])
            rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        fam = out.index[(out["family"] == "primary") & out["pvalue"].notna()]
        if len(fam):
            out.loc[fam, "pvalue_holm"] = holm(out.loc[fam, "pvalue"].to_numpy(float))
    return out
