"""Kleiber's law: the bound ``G_max = 10**(1/L)`` (D'Elia 2026, section 4.1, eq. 3, Fig. 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from thermo_lens.laws.base import (CorrelationResult, LawResult, StatTest, correlation,
                                   correlation_tests, with_holm)
from thermo_lens.laws.table import _as_frame, _labels, _numeric, _rho, gain_ci

__all__ = ["KleiberResult", "kleiber_bound", "kleiber", "kleiber_violations"]


def kleiber_bound(n_layers: Any) -> np.ndarray | float:
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
        Which column was used as the gain (its definition matters: see ``thermo_lens.reference``).
    stat_tests:
        The six tests (Pearson and Spearman of each correlation) with effect-size CIs, exact
        Spearman p, Holm over the six and leave-one-out sensitivity (:class:`StatTest`).

    The paper's quoted "r = -0.81, p = 0.014" for this law is ``gain_vs_rho`` on the 8 Pythia
    models (``reference.pythia_family()``); ``gain_vs_depth`` on the same data is r = -0.878,
    p = 0.0041. Leaving out pythia-1b moves gain vs rho to r = -0.715, p = 0.071. The bound is a
    claim about a *maximum*; the paper tests it with a correlation of the *mean* gain, and
    pythia-1b (1.216 > 10**(1/16) = 1.155) violates it in the paper's own data.
    """

    table: pd.DataFrame
    gain_vs_depth: CorrelationResult
    gain_vs_rho: CorrelationResult | None
    gain_vs_bound: CorrelationResult
    gain_column: str
    stat_tests: tuple = ()

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
        lines.append(f"  tests ({len(self.tests)}; Holm over all of them):")
        lines += [f"    {t.summary()}" for t in self.tests]
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


def kleiber(table: Any, gain: str = "gain", n_layers: str = "n_layers",
            rho: str | None = "rho", std: str = "std", n_prompts: str = "n_prompts",
            std_ddof: int | None = None) -> KleiberResult:
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
    tests: list[StatTest] = correlation_tests("kleiber", "gain vs depth L", L, g, labels, depth)
    if by_rho is not None:
        tests += correlation_tests("kleiber", "gain vs rho", r, g, labels, by_rho)  # type: ignore[arg-type]
    tests += correlation_tests("kleiber", "gain vs bound 10^(1/L)", bound, g, labels, by_bound)
    return KleiberResult(table=out, gain_vs_depth=depth, gain_vs_rho=by_rho, gain_vs_bound=by_bound,
                         gain_column=gain, stat_tests=with_holm(tests))


def kleiber_violations(*tables: Any, names: Any = None, gain: str = "gain",
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

