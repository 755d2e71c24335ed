"""Every number this folder's README quotes, recomputed from runs.csv and effects.csv.

    python results/heritage-lab-v2/readme_numbers.py

With the package's own functions: the exact sign-flip p and the interval that inverts it
(:func:`thermo_lens.stats.exact.sign_flip_pvalue`, :func:`thermo_lens.experiments.lab.effects.sign_flip_interval`),
the t-interval (:func:`thermo_lens.stats.summarize`), Holm (:func:`thermo_lens.stats.holm`), the
realised detectable shift (:func:`thermo_lens.stats.paired_detectable_shift`: 80% power of the paired
t-test on the realised SD of the 12 seed differences, two-sided, at alpha 0.05 and at 0.05 / 6, the
strictest step of Holm over the primary family) and the regimes (:mod:`thermo_lens.experiments.lab.regimes`).
Nothing is written; it prints.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from thermo_lens.experiments.lab.effects import last_checkpoints, matched_loss_frame, sign_flip_interval
from thermo_lens.experiments.lab.regimes import REGIME_METRICS
from thermo_lens.stats import holm, paired_detectable_shift, summarize
from thermo_lens.stats.exact import sign_flip_pvalue

HERE = Path(__file__).resolve().parent
ARMS = {"weight_decay=0.9": "weight decay 0.9", "optimizer=adamw-b2=0.999": "AdamW b2 0.999",
        "optimizer=sgd-momentum": "SGD (lr 1.0)", "weight_decay=0": "weight decay 0"}
GAINS = {"last_block_gain": "G_L", "penultimate_gain": "G_(L-1)", "first_block_gain": "G_1"}
PRIMARY = ("weight_decay=0.9", "optimizer=adamw-b2=0.999", "optimizer=sgd-momentum")


def paired(final: pd.DataFrame, arm: str, metric: str) -> np.ndarray:
    """``d_s = metric(arm, s) - metric(base, s)`` on the seeds both finished, in seed order."""
    a = final.loc[final["arm"] == "base"].set_index("seed")[metric]
    b = final.loc[final["arm"] == arm].set_index("seed")[metric]
    seeds = sorted(set(a.index) & set(b.index))
    return (b.loc[seeds] - a.loc[seeds]).to_numpy(float)


def describe(d: np.ndarray) -> dict:
    t = summarize(d)
    lo, hi = sign_flip_interval(d)
    return {"n": d.size, "effect": d.mean(), "ci_low": lo, "ci_high": hi, "t_ci_low": t.ci_low,
            "t_ci_high": t.ci_high, "p": sign_flip_pvalue(d), "sd": t.sd, "n_negative": int((d < 0).sum()),
            "detectable_05": paired_detectable_shift(t.sd, d.size, 0.05),
            "detectable_holm": paired_detectable_shift(t.sd, d.size, 0.05 / 6)}


def recompute(runs: pd.DataFrame, effects: pd.DataFrame, matched_budget: int) -> tuple[pd.DataFrame, float]:
    """Every arm's paired effect at every budget and at matched loss, asserted equal to ``effects``.

    Holm is applied over the declared family's analogue at every budget (descriptive outside the
    declared family), and checked against ``effects``' ``pvalue_holm`` where that column has a value.
    """
    rows = []
    for budget in sorted(runs["budget"].unique()):
        final = last_checkpoints(runs.loc[runs["budget"] == budget])
        for arm in ARMS:
            for m in GAINS:
                rows.append({"basis": "budget", "budget": int(budget), "arm": arm, "metric": m,
                             **describe(paired(final, arm, m))})
    matched, target = matched_loss_frame(runs, matched_budget)
    for arm in ARMS:
        for m in GAINS:
            rows.append({"basis": "matched_loss", "budget": matched_budget, "arm": arm, "metric": m,
                         **describe(paired(matched, arm, m))})
    tab = pd.DataFrame(rows)
    tab["holm"] = np.nan
    for _, g in tab.groupby(["basis", "budget"]):
        fam = g.index[g["arm"].isin(PRIMARY) & g["metric"].isin(["last_block_gain", "penultimate_gain"])]
        tab.loc[fam, "holm"] = holm(tab.loc[fam, "p"].to_numpy(float))
    # the committed effects table must say the same (to its 10 significant digits)
    eff = effects.set_index(["basis", "budget", "arm", "metric"])
    for _, r in tab.iterrows():
        e = eff.loc[(r["basis"], r["budget"], r["arm"], r["metric"])]
        for ours, theirs in (("effect", "effect"), ("ci_low", "ci_low"), ("ci_high", "ci_high"), ("p", "pvalue")):
            # an interval below six seeds is unbounded: inf == inf
            assert r[ours] == e[theirs] or abs(r[ours] - e[theirs]) < 1e-7, (r["arm"], r["metric"], ours)
        if not np.isnan(e["pvalue_holm"]):
            assert abs(r["holm"] - e["pvalue_holm"]) < 1e-9
    return tab, target


def main() -> dict:
    runs = pd.read_csv(HERE / "runs.csv")
    tab, target = recompute(runs, pd.read_csv(HERE / "effects.csv"), 600)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 200)
    show = tab.assign(arm=tab["arm"].map(ARMS), metric=tab["metric"].map(GAINS))
    print(f"matched validation loss target: {target:.4f}")
    print(show.round(4).to_string(index=False))
    seeds = last_checkpoints(runs.loc[(runs["budget"] == 600) & (runs["arm"] == "optimizer=sgd-momentum")])
    print(f"SGD at 600 steps: G_L over the 12 seeds {seeds['last_block_gain'].min():.3f} to "
          f"{seeds['last_block_gain'].max():.3f}")
    out = {"table": tab, "target": target}
    if (HERE / "runs-long.csv").is_file():
        out.update(longer_budgets())
    return out


def longer_budgets() -> dict:
    """Amendment 1 (1200 and 2400 steps): the same effects, every one secondary and unadjusted.

    ``effects-long.csv`` carries no Holm column and no ``primary`` row (the amendment makes no new
    primary claim). Holm over the amendment's 16 regime-metric rows (4 knobs x G_L, G_(L-1) x 2
    budgets) is computed here as a robustness note the plan did not fix; it is labelled so.
    """
    runs = pd.read_csv(HERE / "runs-long.csv")
    effects = pd.read_csv(HERE / "effects-long.csv")
    assert (effects["family"] == "secondary").all() and effects["pvalue_holm"].isna().all()
    tab, target = recompute(runs, effects, 2400)
    tab["holm"] = np.nan
    regime_rows = tab.index[(tab["basis"] == "budget") & tab["metric"].isin(list(REGIME_METRICS))]
    tab.loc[regime_rows, "holm16"] = holm(tab.loc[regime_rows, "p"].to_numpy(float))
    final = last_checkpoints(runs)
    means = final.groupby(["arm", "budget"])[["last_block_gain", "penultimate_gain", "first_block_gain",
                                              "val_loss"]].mean()
    show = tab.assign(arm=tab["arm"].map(ARMS), metric=tab["metric"].map(GAINS))
    print(f"\nAmendment 1 (runs-long.csv); matched validation loss target at 2400 steps: {target:.4f}")
    print(show.round(4).to_string(index=False))
    print(means.round(4).to_string())
    return {"long_table": tab, "long_target": target, "long_means": means}


if __name__ == "__main__":
    main()
