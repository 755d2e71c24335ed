"""The heritage lab's section of the study report: each knob's effect on the gain.

The report (:mod:`thermo_lens.report`, a layer below the lab) takes extra sections as functions
``fn(doc)``; :func:`lab_section` is the lab's, passed by ``thermo-lens lab`` and by
``thermo-lens report`` on a lab's ``train/`` folder.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from thermo_lens._lazy import pandas as pd

if TYPE_CHECKING:
    from types import ModuleType

    from thermo_lens.report import Page


__all__ = ["lab_section", "lab_dir_of", "read_tables"]


def lab_dir_of(directory: str | Path) -> Path | None:
    """The lab folder a report directory belongs to (the lab folder itself or its ``train/``
    subfolder), or None when it is not a lab's."""
    d = Path(directory)
    for cand in (d, d.parent):
        if (cand / "lab.json").is_file() and (cand / "effects.csv").is_file():
            return cand
    return None


def lab_section(lab_dir: str | Path) -> Callable[[Page], None]:
    """The section drawing the effects and trajectories of the lab at ``lab_dir`` (``fn(doc)``)."""
    lab_dir = Path(lab_dir)

    def section(doc: Page) -> None:
        from thermo_lens.experiments.lab import views as lab_views

        tables = read_tables(lab_dir)
        if isinstance(tables, str):
            doc.section("heritage-lab", "Heritage lab")
            doc.p(tables, "note")
            return
        runs, eff = tables
        doc.section("heritage-lab", "Heritage lab: what each knob does to the gain")
        if "basis" in eff.columns:  # a lab with budgets and a declared primary family
            _budget_lab(doc, runs, eff, lab_views)
            return
        n = sorted(set(eff["n_seeds"].astype(int))) if len(eff) else []
        doc.p(f"Each knob level is compared with its reference level, paired by seed (same initial weights where "
              f"shapes allow, same batches, same token budget), at the last checkpoint: effect = mean over seeds "
              f"(n = {', '.join(map(str, n)) or '0'}) of level minus reference, 95% Student-t CI over seeds, "
              f"two-sided exact sign-flip permutation p-value (its smallest possible value is 2/2^n). flips_regime: "
              f"the seed means lie on opposite sides of 1. Toy scale: 10^5-parameter models trained for minutes on "
              f"CPU; read an effect as what a knob can do, not what it did in a published model.", "note")
        if len(eff):
            doc.figure("fig-lab-effects", lambda: lab_views.effect_sizes(eff))
            doc.table(eff[["knob", "reference", "level", "metric", "effect", "ci_low", "ci_high", "pvalue",
                           "n_seeds", "flips_regime"]], left=["knob", "reference", "level", "metric"])
        for metric in ("last_block_gain", "penultimate_gain"):
            if len(runs) and metric in runs.columns:
                doc.figure(f"fig-lab-{metric}", functools.partial(lab_views.gain_trajectories, runs, metric))

    return section


def read_tables(lab_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame] | str:
    """``(runs, effects)`` frames of the lab, read without following a link and only when they are
    what the lab wrote (the SHA-256 in ``tables.json``); else why not (shown in the report)."""
    import hashlib
    import io
    import json

    from thermo_lens.experiments.lab.run_record import TABLES_RECORD
    from thermo_lens.core.safe_io import SafeIOError, printable, safe_read_bytes, safe_read_text

    try:
        record = json.loads(safe_read_text(lab_dir / TABLES_RECORD, 1 << 16, follow_symlinks=False, what="lab record"))
        data = {name: safe_read_bytes(lab_dir / name, 1 << 30, follow_symlinks=False, what="lab table")
                for name in ("runs.csv", "effects.csv")}
    except (SafeIOError, ValueError) as e:
        return f"The lab's tables are not shown: {printable(str(e))[:300]}. Rerun the lab to write them."
    bad = [n for n, raw in data.items() if not isinstance(record, dict) or record.get(n) != hashlib.sha256(raw).hexdigest()]
    if bad:
        return (f"The lab's tables are not shown: {', '.join(bad)} in {printable(lab_dir)} do not match what the lab wrote "
                f"(their SHA-256 in {TABLES_RECORD}). Rerun the lab to write them.")

    def frame(raw: bytes) -> pd.DataFrame:
        return pd.read_csv(io.BytesIO(raw)) if raw.strip() else pd.DataFrame()

    return frame(data["runs.csv"]), frame(data["effects.csv"])


def _budget_lab(doc: Page, runs: pd.DataFrame, eff: pd.DataFrame, lab_views: ModuleType) -> None:
    """The section of a lab with training budgets: the declared primary family first, then every
    comparison at the longest budget; trajectories of the longest budget's runs."""
    longest = int(eff.loc[eff["basis"] == "budget", "budget"].max()) if len(eff) else None
    doc.p("Each knob level is compared with its reference level, paired by seed (same initial weights where shapes "
          "allow, same batches), at the last step of each training budget (a complete schedule each) and at matched "
          "validation loss. effect = mean over seeds of level minus reference; ci_low / ci_high = the 95% interval "
          "that inverts the exact two-sided sign-flip test (it excludes 0 exactly when p < 0.05); pvalue_holm = "
          "Holm's adjustment over the declared primary family only (family = primary), every other row is "
          "secondary and unadjusted. A regime (expander / dampener) is decided by the 95% t-interval of an arm's "
          "seed mean against 1; flips_regime is True or False only when both regimes are determined, empty when it "
          "cannot be told. Toy scale: read an effect as what a knob can do, not what it did in a published model.",
          "note")
    cols = ["knob", "reference", "level", "metric", "budget", "effect", "ci_low", "ci_high", "pvalue", "pvalue_holm",
            "n_seeds", "reference_regime", "level_regime", "flips_regime"]
    primary = eff.loc[eff["family"] == "primary"]
    if len(primary):
        doc.html("<h3>Declared primary family</h3>")
        doc.table(primary[cols], left=["knob", "reference", "level", "metric", "reference_regime", "level_regime"])
    if longest is not None:
        at = eff.loc[(eff["basis"] == "budget") & (eff["budget"] == longest)]
        doc.figure("fig-lab-effects", lambda: lab_views.effect_sizes(at))
        doc.html(f"<h3>Every comparison at {longest} steps</h3>")
        doc.table(at[cols], left=["knob", "reference", "level", "metric", "reference_regime", "level_regime"])
    runs_longest = runs.loc[runs["budget"] == longest] if longest is not None and "budget" in runs.columns else runs
    for metric in ("last_block_gain", "penultimate_gain"):
        if len(runs_longest) and metric in runs_longest.columns:
            doc.figure(f"fig-lab-{metric}", functools.partial(lab_views.gain_trajectories, runs_longest, metric))
