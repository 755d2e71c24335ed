"""The regime of every arm at every budget, and whether a knob flips it: the lab's per-budget table.

A budget lab (``[lab] budgets``) trains every arm x seed once per budget. For one gain metric
(``last_block_gain`` = G_L, ``penultimate_gain`` = G_(L-1)) this module decides, for each arm and
budget, the **regime** by the rule the analysis plan fixes (:func:`thermo_lens.experiments.lab.effects.regime_of`):

* ``"expander"`` when the 95% Student-t interval of the arm's seed-mean gain lies above 1,
  ``"dampener"`` when it lies below 1, ``"undetermined"`` when it contains 1;
* ``"incomplete"`` when fewer than ``min_seeds`` seeds finished that budget (no regime is claimed
  from an incomplete cell);

and, for each arm against the reference arm at the same budget, whether the knob **flips** it:
``True`` / ``False`` only when both regimes are determined
(:func:`~thermo_lens.experiments.lab.effects.flip_by_intervals`), ``None`` ("cannot tell") otherwise.

Only finished runs count: a run enters at its checkpoint ``step == budget``; an interrupted run of
a resumable lab (checkpoints short of its budget) is left out and counted. Several ``runs.csv``
files of labs that share seeds and arms (e.g. a lab and its longer-budget amendment) are
concatenated before the table is made (:func:`read_runs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import os

    import pandas as pd


__all__ = ["REGIME_METRICS", "read_runs", "arm_regimes", "knob_flips", "format_regimes"]

#: The two gains whose regime the heritage lab's question is about, with their display names.
REGIME_METRICS: dict[str, str] = {"last_block_gain": "G_L", "penultimate_gain": "G_(L-1)"}


def read_runs(paths: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """The rows of several lab ``runs.csv`` files, concatenated (missing files are an error)."""
    import pandas as pd

    from thermo_lens.core.errors import ThermoLensInputError

    frames = []
    for p in paths:
        try:
            frames.append(pd.read_csv(p))
        except FileNotFoundError:
            raise ThermoLensInputError(f"no runs.csv at {p}: pass the runs.csv of a finished or running lab") from None
    if not frames:
        raise ThermoLensInputError("read_runs: no runs.csv given")
    need = {"arm", "seed", "budget", "step"}
    for p, f in zip(paths, frames):
        if not need <= set(f.columns):
            raise ThermoLensInputError(f"{p} lacks the columns {sorted(need - set(f.columns))}: it is not a budget "
                                       "lab's runs.csv")
    return pd.concat(frames, ignore_index=True)


def _finished(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows at the checkpoint ``step == budget`` (each finished run once; later duplicates dropped)."""
    done = runs.loc[runs["step"] == runs["budget"]]
    return done.drop_duplicates(subset=["arm", "seed", "budget"], keep="last")


def arm_regimes(runs: pd.DataFrame, metrics: Sequence[str] = tuple(REGIME_METRICS), *, min_seeds: int | None = None,
                level: float = 0.95) -> pd.DataFrame:
    """One row per (metric, arm, budget): the seed-mean gain, its t-interval and the regime.

    Args:
        runs: a budget lab's runs frame (``arm, seed, budget, step`` and the metric columns), or
            several concatenated (:func:`read_runs`).
        metrics: gain columns.
        min_seeds: seeds a cell needs for a regime (default: the number of distinct seeds in
            ``runs``); below it the regime is ``"incomplete"``.
        level: the interval's confidence level.

    Returns:
        ``metric, arm, budget, n_seeds, mean, t_ci_low, t_ci_high, n_below_1, regime,
        n_unfinished`` (``n_unfinished``: runs of that arm and budget with rows but no checkpoint at
        the budget, i.e. interrupted).
    """
    import pandas as pd

    from thermo_lens.experiments.lab.effects import regime_of
    from thermo_lens.stats import summarize

    done = _finished(runs)
    need = int(min_seeds) if min_seeds is not None else int(runs["seed"].nunique())
    started = runs.groupby(["arm", "budget"])["seed"].nunique()
    rows = []
    for m in metrics:
        if m not in runs.columns:
            continue
        for (arm, budget), g in done.groupby(["arm", "budget"], sort=True):
            v = g.sort_values("seed")[m].to_numpy(float)
            s = summarize(v, level=level) if v.size >= 2 else None
            regime = regime_of(v, level) if v.size >= need else "incomplete"
            rows.append({"metric": m, "arm": arm, "budget": int(budget), "n_seeds": int(v.size),
                         "mean": float(v.mean()), "t_ci_low": float(s.ci_low) if s else np.nan,
                         "t_ci_high": float(s.ci_high) if s else np.nan, "n_below_1": int((v < 1).sum()),
                         "regime": regime,
                         "n_unfinished": int(started.get((arm, budget), 0)) - int(v.size)})
    return pd.DataFrame(rows, columns=["metric", "arm", "budget", "n_seeds", "mean", "t_ci_low", "t_ci_high",
                                       "n_below_1", "regime", "n_unfinished"])


def knob_flips(regimes: pd.DataFrame, reference_arm: str = "base") -> pd.DataFrame:
    """One row per (metric, budget, arm other than the reference): does the knob flip the regime?

    ``flips`` is True / False when both regimes are determined (they differ / agree) and None
    ("cannot tell") when either is undetermined or incomplete.
    """
    import pandas as pd

    from thermo_lens.experiments.lab.effects import flip_by_intervals

    rows = []
    for (m, b), g in regimes.groupby(["metric", "budget"], sort=True):
        ref = g.loc[g["arm"] == reference_arm, "regime"]
        ref_regime = str(ref.iloc[0]) if len(ref) else "incomplete"
        for _, r in g.loc[g["arm"] != reference_arm].iterrows():
            lv = str(r["regime"])
            flips = flip_by_intervals(*(x if x in ("expander", "dampener") else "undetermined"
                                        for x in (ref_regime, lv)))
            rows.append({"metric": m, "budget": int(b), "arm": r["arm"], "reference_regime": ref_regime,
                         "level_regime": lv, "flips": flips})
    return pd.DataFrame(rows, columns=["metric", "budget", "arm", "reference_regime", "level_regime", "flips"])


def format_regimes(regimes: pd.DataFrame, flips: pd.DataFrame, reference_arm: str = "base") -> str:
    """The two tables as text: per metric, a line per arm and budget, then one verdict per budget."""
    lines = ["Regime of each arm's seed-mean gain by its 95% t-interval against 1 (expander: above 1; "
             "dampener: below 1; undetermined: contains 1; incomplete: fewer seeds than required, no claim). "
             "A knob flips the regime only where both regimes are determined and differ."]
    for m, g in regimes.groupby("metric", sort=False):
        lines.append("")
        lines.append(f"{REGIME_METRICS.get(m, m)} ({m})")
        lines.append(f"  {'arm':<28} {'budget':>6} {'n':>3} {'mean':>7}  {'95% t-interval':<18} {'<1':>3}  regime")
        for _, r in g.sort_values(["arm", "budget"], key=lambda c: c.map(
                lambda a: (a != reference_arm, a)) if c.name == "arm" else c).iterrows():
            ci = f"[{r['t_ci_low']:.4f}, {r['t_ci_high']:.4f}]"
            extra = f" ({r['n_unfinished']} unfinished)" if r["n_unfinished"] else ""
            lines.append(f"  {r['arm']:<28} {r['budget']:>6} {r['n_seeds']:>3} {r['mean']:>7.4f}  {ci:<18} "
                         f"{r['n_below_1']:>3}  {r['regime']}{extra}")
        fm = flips.loc[flips["metric"] == m]
        for b, fb in fm.groupby("budget", sort=True):
            regs = g.loc[g["budget"] == b, "regime"]
            every = ", every arm a determined " + regs.iloc[0] if regs.nunique() == 1 and regs.iloc[0] in (
                "expander", "dampener") else ""
            yes = [a for a, f in zip(fb["arm"], fb["flips"]) if f is True]
            no = [a for a, f in zip(fb["arm"], fb["flips"]) if f is False]
            unknown = [a for a, f in zip(fb["arm"], fb["flips"]) if f is None or f != f]
            parts = []
            if yes:
                parts.append("flipped by " + ", ".join(yes))
            if no:
                parts.append("not flipped by " + ("any knob" if len(no) == len(fb) else ", ".join(no)))
            if unknown:
                parts.append("cannot tell for " + ", ".join(unknown))
            verdict = "; ".join(parts)
            lines.append(f"  budget {b}: reference {fb['reference_regime'].iloc[0]}{every}; {verdict}")
    return "\n".join(lines)
