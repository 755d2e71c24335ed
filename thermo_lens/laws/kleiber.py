"""Kleiber's law: the bound ``G_max = 10**(1/L)`` (D'Elia 2026, section 4.1, eq. 3, Fig. 1).

Declared tests (``thermo_lens.definitions`` §5): the primary is the paper's quoted claim, Pearson
r of gain vs head density rho (its "r = -0.81, p = 0.014"), with the exact permutation p; the one
secondary hypothesis is gain vs depth L. Spearman on each pair, and gain vs the bound 10^(1/L)
(a function of L, so the same null as gain vs L), are sensitivity tests: reported, never counted
twice. The bound itself is checked model by model for every gain column given (``bounds``):
it is a claim about every block's gain, so ``G_1`` and each gain metric are held to it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass, field, replace
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from thermo_lens.laws.base import (CorrelationResult, LawResult, StatTest, correlation,
                                   correlation_tests, declare)
from thermo_lens.laws.table import Table, _as_frame, _labels, _numeric, _rho, gain_ci

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["KleiberResult", "kleiber_bound", "kleiber", "kleiber_violations", "BOUND_GAINS", "bound_table"]

#: Per-block gain columns held to the bound when present (thermo-lens summary names; ``gain`` is the
#: law's own column).
BOUND_GAINS: tuple[str, ...] = ("gain", "first_block_gain", "penultimate_gain", "last_block_gain",
                                "max_block_gain", "geometric_mean_gain")


def kleiber_bound(n_layers: ArrayLike) -> np.ndarray | float:
    """The paper's bound ``G_max = 10**(1/L)`` (so that ``G_max**L = 10``; paper eq. 3)."""
    L = np.asarray(n_layers, dtype=float)
    if np.any(~np.isfinite(L)) or np.any(L <= 0):
        raise ValueError("kleiber_bound: n_layers must be finite and positive")
    out = 10.0 ** (1.0 / L)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True, repr=False, eq=False)
class KleiberResult(LawResult):
    """Kleiber's law test (D'Elia 2026 section 4.1, Fig. 1).

    Attributes
    ----------
    table:
        Per model: ``model, n_layers, rho, gain, ci_low, ci_high`` (95% t CI of the mean gain over
        prompts when the table gives ``std`` and ``n_prompts``, or its own ``ci_low``/``ci_high``;
        NaN otherwise), ``bound`` (``10**(1/L)``), ``margin`` (``gain - bound``, > 0 is a
        violation), ``violates`` and ``violates_ci`` (the whole CI above the bound).
    gain_vs_depth, gain_vs_rho, gain_vs_bound:
        :class:`CorrelationResult` of the gain against ``n_layers``, head density
        ``rho = n_heads / d_head`` (``None`` when rho was not given) and the bound itself.
    gain_column:
        Which column was used as the gain (its definition matters: see ``thermo_lens.paper.reference``).
    stat_tests:
        Primary: gain vs rho, Pearson, permutation p (gain vs L when rho is not given);
        secondary: gain vs L; sensitivity: Spearman of each, Pearson of gain vs the bound
        (:class:`StatTest`, with effect-size CIs and leave-one-out).
    bounds:
        The bound checked for every gain column (:func:`bound_table`): one row per (metric, model).

    The paper's quoted "r = -0.81, p = 0.014" for this law is ``gain_vs_rho`` on the 8 Pythia
    models (``reference.pythia_family()``); ``gain_vs_depth`` on the same data is r = -0.878,
    p = 0.0041. Leaving out pythia-1b moves gain vs rho to r = -0.715. The bound is a
    claim about a *maximum*; the paper tests it with a correlation of the *mean* gain, and
    pythia-1b (1.216 > 10**(1/16) = 1.155) violates it in the paper's own data; its first-block
    gains ``G_1`` (12-76) violate it for all 8 Pythia models.
    """

    table: pd.DataFrame
    gain_vs_depth: CorrelationResult
    gain_vs_rho: CorrelationResult | None
    gain_vs_bound: CorrelationResult
    gain_column: str
    stat_tests: tuple = ()
    bounds: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def n(self) -> int:
        return len(self.table)

    @property
    def bound(self) -> pd.Series:
        """Per-model ``G_max = 10**(1/L)``, indexed by model."""
        return self.table.set_index("model")["bound"]

    @property
    def violations(self) -> pd.DataFrame:
        """Models whose gain exceeds their bound, with ``margin = gain - bound`` and the gain's CI."""
        return self.table[self.table["violates"]].reset_index(drop=True)

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def summary(self) -> str:
        v = self.violations
        lines = [f"KleiberResult(n={self.n}, gain column {self.gain_column!r}; bound G_max = 10**(1/L))",
                 f"  gain vs depth: {self.gain_vs_depth.summary()}"]
        if self.gain_vs_rho is not None:
            lines.append(f"  gain vs rho:   {self.gain_vs_rho.summary()}")
        lines.append(f"  gain vs bound: {self.gain_vs_bound.summary()}")
        if len(v):
            lines.append(f"  violations ({len(v)}/{self.n}): " + ", ".join(_violation_text(r) for _, r in v.iterrows()))
        else:
            lines.append(f"  violations: none of {self.n}")
        for metric, b in (self.bounds.groupby("metric", sort=False) if len(self.bounds) else ()):
            lines.append(f"  bound under {metric}: {int(b['violates'].sum())}/{len(b)} above it "
                         f"({int(b['violates_ci'].sum())} with the whole 95% CI above; {metric} "
                         f"{b['gain'].min():.4g}-{b['gain'].max():.4g} vs bounds {b['bound'].min():.4g}-{b['bound'].max():.4g})")
        lines += self.tests_summary()
        return "\n".join(lines)


def _violation_text(r: pd.Series) -> str:
    ci = (f", 95% CI [{r['ci_low']:.4f}, {r['ci_high']:.4f}]{' above the bound' if r['violates_ci'] else ''}"
          if np.isfinite(r["ci_low"]) else "")
    return f"{r['model']} ({r['gain']:.4f} > {r['bound']:.4f}, +{r['margin']:.4f}{ci})"


def _gain_ci(df: pd.DataFrame, g: np.ndarray, std: str, n_prompts: str, std_ddof: int | None,
             func: str) -> tuple[np.ndarray, np.ndarray]:
    nan = np.full(len(df), np.nan)
    if "ci_low" in df.columns and "ci_high" in df.columns:
        return (pd.to_numeric(df["ci_low"], errors="coerce").to_numpy(float),
                pd.to_numeric(df["ci_high"], errors="coerce").to_numpy(float))
    if std not in df.columns or n_prompts not in df.columns:
        return nan, nan
    s = pd.to_numeric(df[std], errors="coerce").to_numpy(float)
    k = pd.to_numeric(df[n_prompts], errors="coerce").to_numpy(float)
    if std_ddof is None:  # the reference table records it per row; unknown -> 0 (the wider CI)
        ddof = (pd.to_numeric(df["std_ddof"], errors="coerce").fillna(0).to_numpy(float)
                if "std_ddof" in df.columns else np.ones(len(df)))
    else:
        ddof = np.full(len(df), float(std_ddof))
    lo0, hi0 = gain_ci(g, s, k, std_ddof=0)
    lo1, hi1 = gain_ci(g, s, k, std_ddof=1)
    return np.where(ddof == 0, lo0, lo1), np.where(ddof == 0, hi0, hi1)


def kleiber(table: Table, gain: str = "gain", n_layers: str = "n_layers",
            rho: str | None = "rho", std: str = "std", n_prompts: str = "n_prompts",
            std_ddof: int | None = None, bound_gains: Sequence[str] | None = None) -> KleiberResult:
    """Test the paper's "Kleiber's law" ``G_max = 10**(1/L)`` on one row per model.

    Parameters
    ----------
    table:
        Columns ``n_layers`` and ``gain`` (names selectable), and ``rho`` (or ``n_heads`` and
        ``d_head``, from which ``rho = n_heads / d_head``); ``model`` names rows if present.
        Optional ``ci_low``/``ci_high``, or ``std`` and ``n_prompts`` (with ``std_ddof``), give
        each violation its 95% CI.
    gain:
        Gain column, e.g. ``"gain"`` from ``reference.gains()`` (the paper's penultimate-block
        gain) or a thermo-lens summary such as ``last_block_gain``.
    rho:
        Head-density column; ``None`` skips the gain-vs-rho correlation (e.g. when the geometry of
        some models is unknown).
    std_ddof:
        ddof of ``std``; ``None`` reads a ``std_ddof`` column (missing values: 0, the wider CI),
        else assumes 1.
    bound_gains:
        Gain columns to hold to the bound (``bounds``); ``None``: ``gain`` and every column of
        :data:`BOUND_GAINS` the table has.

    Returns a :class:`KleiberResult`. Needs at least 3 models; NaN anywhere used is an error.
    """
    func = "kleiber"
    df = _as_frame(table, func)
    g = _numeric(df, gain, func)
    L = _numeric(df, n_layers, func)
    if np.any(L <= 0):
        raise ValueError(f"{func}: column {n_layers!r} must be positive")
    r = _rho(df, rho, func) if rho is not None else None
    if len(df) < 3:
        raise ValueError(f"{func}: need at least 3 models for a correlation, got {len(df)}")
    bound = np.asarray(kleiber_bound(L))
    lo, hi = _gain_ci(df, g, std, n_prompts, std_ddof, func)
    labels = _labels(df)
    out = pd.DataFrame({
        "model": labels, "n_layers": L, "rho": r if r is not None else np.nan, "gain": g,
        "ci_low": lo, "ci_high": hi, "bound": bound, "margin": g - bound, "violates": g > bound,
        "violates_ci": np.isfinite(lo) & (lo > bound),
    })
    depth = correlation(L, g, n_layers, gain)
    by_rho = correlation(r, g, rho or "rho", gain) if r is not None else None
    by_bound = correlation(bound, g, "10**(1/L)", gain)
    depth_null = "gain and depth L independent"
    tests: list[StatTest] = []
    if r is not None and by_rho is not None:
        tests += correlation_tests("kleiber", "gain vs rho", r, g, labels, by_rho, role="primary",
                                   hypothesis="gain and head density rho independent (the paper's quoted r)")
    tests += correlation_tests("kleiber", "gain vs depth L", L, g, labels, depth,
                               role="secondary" if r is not None else "primary", hypothesis=depth_null)
    bound_test = correlation_tests("kleiber", "gain vs bound 10^(1/L)", bound, g, labels, by_bound,
                                   role="sensitivity", hypothesis=depth_null)[0]
    tests.append(replace(bound_test, note="10^(1/L) is a function of L: the null of gain vs depth L"))
    return KleiberResult(table=out, gain_vs_depth=depth, gain_vs_rho=by_rho, gain_vs_bound=by_bound,
                         gain_column=gain, stat_tests=declare(tests),
                         bounds=bound_table(df, bound_gains if bound_gains is not None else
                                            [gain] + [c for c in BOUND_GAINS if c != gain and c in df.columns],
                                            n_layers=n_layers, std=std, n_prompts=n_prompts, std_ddof=std_ddof,
                                            gain=gain))


def kleiber_violations(*tables: Table, names: Iterable[object] | None = None, gain: str = "gain",
                       n_layers: str = "n_layers", std: str = "std", n_prompts: str = "n_prompts",
                       std_ddof: int | None = None) -> pd.DataFrame:
    """Every model that exceeds its bound ``10**(1/L)``, over every table passed, with CIs.

    ``tables``: one or more tables (as :func:`kleiber` takes); ``names``: a label per table
    (default ``table0, table1, ...``), recorded in column ``table``. A model present in several
    tables is listed once per table (the measurements differ). Columns: ``table, model, n_layers,
    gain, ci_low, ci_high, bound, margin, violates_ci``; sorted by table then margin.
    """
    func = "kleiber_violations"
    if not tables:
        raise ValueError(f"{func}: pass at least one table")
    names = list(names) if names is not None else [f"table{i}" for i in range(len(tables))]
    if len(names) != len(tables):
        raise ValueError(f"{func}: {len(tables)} tables but {len(names)} names")
    frames = []
    for name, t in zip(names, tables):
        df = _as_frame(t, func)
        g = _numeric(df, gain, func)
        L = _numeric(df, n_layers, func)
        bound = np.asarray(kleiber_bound(L))
        lo, hi = _gain_ci(df, g, std, n_prompts, std_ddof, func)
        f = pd.DataFrame({"table": str(name), "model": _labels(df), "n_layers": L, "gain": g,
                          "ci_low": lo, "ci_high": hi, "bound": bound, "margin": g - bound,
                          "violates_ci": np.isfinite(lo) & (lo > bound)})
        frames.append(f[f["margin"] > 0].sort_values("margin", ascending=False, kind="stable"))
    return pd.concat(frames, ignore_index=True)



def bound_table(table: Table, gains: Sequence[str] | None = None, n_layers: str = "n_layers", std: str = "std",
                n_prompts: str = "n_prompts", std_ddof: int | None = None, gain: str = "gain") -> pd.DataFrame:
    """Each gain column against the bound ``10**(1/L)``, model by model.

    ``gains``: the columns (``None``: every column of :data:`BOUND_GAINS` present). A column
    ``c`` gets its 95% CI from ``c_ci_low``/``c_ci_high`` when present; the column ``gain`` also from
    ``ci_low``/``ci_high`` or ``std`` and ``n_prompts`` (as :func:`kleiber`). Rows with a missing
    value are skipped. Columns: ``metric, model, n_layers, gain, ci_low, ci_high, bound, margin,
    violates, violates_ci``.
    """
    func = "bound_table"
    df = _as_frame(table, func)
    cols = [c for c in (BOUND_GAINS if gains is None else gains) if c in df.columns]
    missing = [c for c in (gains or ()) if c not in df.columns]
    if missing:
        raise ValueError(f"{func}: no column(s) {missing}; the table has {list(map(str, df.columns))}")
    frames = []
    labels = np.array(_labels(df))
    for c in cols:
        g = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        L = pd.to_numeric(df[n_layers], errors="coerce").to_numpy(float)
        ok = np.isfinite(g) & np.isfinite(L) & (L > 0)
        if not ok.any():
            continue
        if f"{c}_ci_low" in df.columns and f"{c}_ci_high" in df.columns:
            lo = pd.to_numeric(df[f"{c}_ci_low"], errors="coerce").to_numpy(float)
            hi = pd.to_numeric(df[f"{c}_ci_high"], errors="coerce").to_numpy(float)
        elif c == gain:
            lo, hi = _gain_ci(df, g, std, n_prompts, std_ddof, func)
        else:
            lo = hi = np.full(len(df), np.nan)
        b = 10.0 ** (1.0 / np.where(ok, L, 1.0))
        frames.append(pd.DataFrame({
            "metric": c, "model": labels[ok], "n_layers": L[ok], "gain": g[ok], "ci_low": lo[ok], "ci_high": hi[ok],
            "bound": b[ok], "margin": (g - b)[ok], "violates": (g > b)[ok],
            "violates_ci": (np.isfinite(lo) & (lo > b))[ok]}))
    if not frames:
        return pd.DataFrame(columns=["metric", "model", "n_layers", "gain", "ci_low", "ci_high", "bound", "margin",
                                     "violates", "violates_ci"])
    return pd.concat(frames, ignore_index=True)
