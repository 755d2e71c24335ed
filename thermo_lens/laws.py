"""Cross-model "laws", computed with p-values, never asserted (METHODS.md section 5).

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", states five cross-model regularities. This module computes each one as a test on a
plain table with **one row per model** (a ``pandas.DataFrame``; a list of dicts, or of objects with
``.to_row()`` / ``.to_dict()``, is accepted too), so the paper's own numbers
(:mod:`thermo_lens.reference`) and new measurements go through the same code:

- :func:`kleiber`   bound ``G_max = 10**(1/L)`` per model, violations, Pearson/Spearman of gain vs
  depth L and vs head density rho (paper section 4.1, Fig. 1).
- :func:`heritage`  lab x regime contingency table, one Fisher exact test per lab (that lab vs the
  rest, dampener vs not), per-lab mean gain +- SE (paper section 4.2, Fig. 2).
- :func:`crowding`  accuracy of the rule ``rho > rho_crit => dampener`` on a threshold grid, and a
  maximum-likelihood logistic fit of P(dampener) on rho (paper section 5.4 and conclusion).
- :func:`twin`      base vs fine-tuned pairs: is the sign of ``G - 1`` kept? (paper section 5.5).
- :func:`hierarchy` groups (labs, families) ranked by mean gain with SE and t-based 95% CI
  (paper abstract: Pythia (0.80) < Mistral (1.11) < LLaMA (1.48) < Gemma (2.31)).

Regimes (expander / dampener / neutral) always come from the measurement, never from a lab name:
:func:`regime_from_gain` (sign of ``G - 1``, or a confidence interval that excludes 1) and
:func:`add_regimes` (CI from mean, SD and number of prompts).

Every result is a frozen dataclass with named fields (scipy style: ``.statistic``, ``.pvalue``),
``summary()`` and ``to_dict()`` (JSON-friendly). Bad input (missing column, NaN, too few rows)
raises ``ValueError`` naming the column and the rows. This module imports only numpy, scipy and
pandas.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

__all__ = [
    "REGIMES",
    "TestResult",
    "CorrelationResult",
    "KleiberResult",
    "FisherResult",
    "HeritageResult",
    "LogisticFit",
    "CrowdingResult",
    "TwinResult",
    "HierarchyResult",
    "correlation",
    "kleiber_bound",
    "kleiber",
    "regime_from_gain",
    "gain_ci",
    "add_regimes",
    "heritage",
    "crowding",
    "logistic_fit",
    "twin",
    "hierarchy",
    "family_of",
]

#: Regime names, in display order.
REGIMES: tuple[str, ...] = ("expander", "dampener", "neutral")


# --------------------------------------------------------------------------------------------
# input handling


def _as_frame(table: Any, func: str) -> pd.DataFrame:
    """A fresh DataFrame from a DataFrame, a dict of columns or a sequence of rows."""
    if isinstance(table, pd.DataFrame):
        return table.copy()
    if isinstance(table, Mapping):
        return pd.DataFrame(dict(table))
    if isinstance(table, (str, bytes)) or not isinstance(table, Iterable):
        raise TypeError(f"{func}: expected a DataFrame or a list of rows, got {type(table).__name__}")
    rows = []
    for i, obj in enumerate(table):
        if isinstance(obj, Mapping):
            row = dict(obj)
        elif hasattr(obj, "to_row"):
            row = obj.to_row()
        elif hasattr(obj, "to_dict"):
            row = obj.to_dict()
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            row = dataclasses.asdict(obj)
        else:
            raise TypeError(f"{func}: row {i} is a {type(obj).__name__}; expected a dict or an "
                            "object with .to_row() / .to_dict()")
        if isinstance(row, pd.Series):
            row = row.to_dict()
        if not isinstance(row, Mapping):
            raise TypeError(f"{func}: row {i} did not give a mapping of columns")
        rows.append(dict(row))
    if not rows:
        raise ValueError(f"{func}: empty table (no rows)")
    return pd.DataFrame(rows)


def _labels(df: pd.DataFrame) -> list[str]:
    """Row labels for messages and outputs: the ``model`` column if present, else the index."""
    if "model" in df.columns:
        return [str(m) for m in df["model"]]
    return [str(i) for i in df.index]


def _require(df: pd.DataFrame, cols: Sequence[str], func: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{func}: missing column(s) {', '.join(map(repr, missing))}; "
                         f"the table has {', '.join(map(repr, map(str, df.columns)))}")


def _numeric(df: pd.DataFrame, col: str, func: str) -> np.ndarray:
    """Column ``col`` as float64, with errors naming the column and the offending rows."""
    _require(df, [col], func)
    try:
        x = pd.to_numeric(df[col], errors="raise").astype("float64").to_numpy()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{func}: column {col!r} is not numeric ({e})") from None
    bad = ~np.isfinite(x)
    if bad.any():
        names = [lab for lab, b in zip(_labels(df), bad) if b]
        raise ValueError(f"{func}: column {col!r} has NaN/inf for {len(names)} row(s): "
                         f"{', '.join(names[:10])}{' ...' if len(names) > 10 else ''}")
    return x


def _rho(df: pd.DataFrame, rho: str, func: str) -> np.ndarray:
    """Head density: column ``rho`` if present, else ``n_heads / d_head``."""
    if rho in df.columns:
        return _numeric(df, rho, func)
    if "n_heads" in df.columns and "d_head" in df.columns:
        return _numeric(df, "n_heads", func) / _numeric(df, "d_head", func)
    raise ValueError(f"{func}: missing column {rho!r} (head density rho = n_heads / d_head) and "
                     "no 'n_heads' and 'd_head' columns to compute it from")


def _py(v: Any) -> Any:
    """JSON-friendly python value."""
    if isinstance(v, pd.DataFrame):
        return [{k: _py(x) for k, x in r.items()} for r in v.to_dict(orient="records")]
    if isinstance(v, pd.Series):
        return {str(k): _py(x) for k, x in v.items()}
    if isinstance(v, Mapping):
        return {str(k): _py(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_py(x) for x in v]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return float(v)
    if v is pd.NA or v is pd.NaT:
        return None
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return v.to_dict() if hasattr(v, "to_dict") else dataclasses.asdict(v)
    return v


class _Result:
    """Shared behaviour: ``to_dict()`` (JSON-friendly) and ``__repr__`` = ``summary()``."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _py(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def summary(self) -> str:  # pragma: no cover - overridden
        return type(self).__name__

    def __repr__(self) -> str:
        return self.summary()


def _fmt_p(p: float) -> str:
    if not np.isfinite(p):
        return "nan"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


# --------------------------------------------------------------------------------------------
# correlation


@dataclass(frozen=True, repr=False)
class TestResult(_Result):
    """One test statistic and its p-value (like scipy's result objects)."""

    statistic: float
    pvalue: float
    method: str = ""

    def summary(self) -> str:
        return f"TestResult({self.method}: statistic={self.statistic:.4f}, pvalue={_fmt_p(self.pvalue)})"


@dataclass(frozen=True, repr=False)
class CorrelationResult(_Result):
    """Pearson and Spearman correlation of ``y`` on ``x`` over ``n`` models.

    ``statistic``/``pvalue`` are Pearson's r and its two-sided p-value (``scipy.stats.pearsonr``,
    exact t-test under bivariate normality); ``ci_low``/``ci_high`` its 95% CI (Fisher z).
    ``spearman_statistic``/``spearman_pvalue`` are Spearman's rank correlation and p-value
    (``scipy.stats.spearmanr``, t approximation). With 8 models a rank correlation is coarse and no
    p-value here survives a correction for the many correlations one could have tried.
    """

    x: str
    y: str
    n: int
    statistic: float
    pvalue: float
    ci_low: float
    ci_high: float
    spearman_statistic: float
    spearman_pvalue: float

    @property
    def pearson(self) -> TestResult:
        return TestResult(self.statistic, self.pvalue, "pearson")

    @property
    def spearman(self) -> TestResult:
        return TestResult(self.spearman_statistic, self.spearman_pvalue, "spearman")

    def summary(self) -> str:
        return (f"CorrelationResult({self.y} vs {self.x}, n={self.n}: Pearson r={self.statistic:.4f} "
                f"(p={_fmt_p(self.pvalue)}, 95% CI [{self.ci_low:.3f}, {self.ci_high:.3f}]), "
                f"Spearman rho={self.spearman_statistic:.4f} (p={_fmt_p(self.spearman_pvalue)}))")


def correlation(x: Any, y: Any, x_name: str = "x", y_name: str = "y") -> CorrelationResult:
    """Pearson and Spearman correlation of two equal-length numeric vectors (>= 3, finite).

    Raises ``ValueError`` for fewer than 3 points, unequal lengths, NaN/inf or a constant vector
    (where r is undefined).
    """
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y, dtype=float).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"correlation: {x_name!r} has {xa.size} values, {y_name!r} {ya.size}")
    if xa.size < 3:
        raise ValueError(f"correlation of {y_name!r} vs {x_name!r}: need at least 3 rows, got {xa.size}")
    for name, v in ((x_name, xa), (y_name, ya)):
        if not np.all(np.isfinite(v)):
            raise ValueError(f"correlation: {name!r} has NaN/inf")
        if np.all(v == v[0]):
            raise ValueError(f"correlation: {name!r} is constant; the correlation is undefined")
    pr = stats.pearsonr(xa, ya)
    ci = pr.confidence_interval(0.95) if xa.size > 3 else None
    sr = stats.spearmanr(xa, ya)
    return CorrelationResult(
        x=x_name, y=y_name, n=int(xa.size),
        statistic=float(pr.statistic), pvalue=float(pr.pvalue),
        ci_low=float(ci.low) if ci is not None else float("nan"),
        ci_high=float(ci.high) if ci is not None else float("nan"),
        spearman_statistic=float(sr.statistic), spearman_pvalue=float(sr.pvalue),
    )


# --------------------------------------------------------------------------------------------
# Kleiber


def kleiber_bound(n_layers: Any) -> np.ndarray | float:
    """The paper's bound ``G_max = 10**(1/L)`` (so that ``G_max**L = 10``; paper eq. 3)."""
    L = np.asarray(n_layers, dtype=float)
    if np.any(~np.isfinite(L)) or np.any(L <= 0):
        raise ValueError("kleiber_bound: n_layers must be finite and positive")
    out = 10.0 ** (1.0 / L)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True, repr=False, eq=False)
class KleiberResult(_Result):
    """Kleiber's law test (D'Elia 2026 section 4.1, Fig. 1; METHODS.md section 5).

    Attributes
    ----------
    table:
        Per model: ``model, n_layers, rho, gain, bound`` (``10**(1/L)``), ``margin``
        (``gain - bound``, > 0 is a violation), ``violates``.
    gain_vs_depth, gain_vs_rho, gain_vs_bound:
        :class:`CorrelationResult` of the gain against ``n_layers``, head density
        ``rho = n_heads / d_head`` (``None`` when rho was not given) and the bound itself.
    gain_column:
        Which column was used as the gain (its definition matters: see ``thermo_lens.reference``).

    The paper's quoted "r = -0.81, p = 0.014" for this law is ``gain_vs_rho`` on the 8 Pythia
    models (``reference.pythia_family()``); ``gain_vs_depth`` on the same data is r = -0.878,
    p = 0.0041. The bound is a claim about a *maximum*; the paper tests it with a correlation of the
    *mean* gain, and pythia-1b (1.216 > 10**(1/16) = 1.155) violates it in the paper's own data.
    """

    table: pd.DataFrame
    gain_vs_depth: CorrelationResult
    gain_vs_rho: CorrelationResult | None
    gain_vs_bound: CorrelationResult
    gain_column: str

    @property
    def n(self) -> int:
        return len(self.table)

    @property
    def bound(self) -> pd.Series:
        """Per-model ``G_max = 10**(1/L)``, indexed by model."""
        return self.table.set_index("model")["bound"]

    @property
    def violations(self) -> pd.DataFrame:
        """Models whose gain exceeds their bound, with ``margin = gain - bound``."""
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
            viol = ", ".join(f"{m} ({g:.4f} > {b:.4f}, +{d:.4f})"
                             for m, g, b, d in zip(v["model"], v["gain"], v["bound"], v["margin"]))
            lines.append(f"  violations ({len(v)}/{self.n}): {viol}")
        else:
            lines.append(f"  violations: none of {self.n}")
        return "\n".join(lines)


def kleiber(table: Any, gain: str = "gain", n_layers: str = "n_layers",
            rho: str | None = "rho") -> KleiberResult:
    """Test the paper's "Kleiber's law" ``G_max = 10**(1/L)`` on one row per model.

    Parameters
    ----------
    table:
        Columns ``n_layers`` and ``gain`` (names selectable), and ``rho`` (or ``n_heads`` and
        ``d_head``, from which ``rho = n_heads / d_head``); ``model`` names rows if present.
    gain:
        Gain column, e.g. ``"gain"`` from ``reference.gains()`` (the paper's penultimate-block
        gain) or a thermo-lens summary such as ``last_block_gain``.
    rho:
        Head-density column; ``None`` skips the gain-vs-rho correlation (e.g. when the geometry of
        some models is unknown).

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
    out = pd.DataFrame({
        "model": _labels(df),
        "n_layers": L,
        "rho": r if r is not None else np.nan,
        "gain": g,
        "bound": bound,
        "margin": g - bound,
        "violates": g > bound,
    })
    return KleiberResult(
        table=out,
        gain_vs_depth=correlation(L, g, n_layers, gain),
        gain_vs_rho=correlation(r, g, rho or "rho", gain) if r is not None else None,
        gain_vs_bound=correlation(bound, g, "10**(1/L)", gain),
        gain_column=gain,
    )


# --------------------------------------------------------------------------------------------
# regimes


def regime_from_gain(gain: Any, ci_low: Any = None, ci_high: Any = None) -> str | np.ndarray:
    """Regime of a gain measurement: ``"expander"``, ``"dampener"`` or ``"neutral"``.

    With a confidence interval (``ci_low``, ``ci_high``): expander if ``ci_low > 1``, dampener if
    ``ci_high < 1``, neutral if the CI contains 1 (METHODS.md section 1). Without one, the paper's
    rule, the sign of ``G - 1`` (``G > 1`` expander, ``G < 1`` dampener, ``G == 1`` neutral).
    Scalars give a ``str``, arrays an array of ``str``. Never derived from a lab name.
    """
    g = np.asarray(gain, dtype=float)
    if np.any(~np.isfinite(g)):
        raise ValueError("regime_from_gain: gain has NaN/inf")
    if (ci_low is None) != (ci_high is None):
        raise ValueError("regime_from_gain: give both ci_low and ci_high, or neither")
    if ci_low is None:
        lo = hi = g
    else:
        lo = np.broadcast_to(np.asarray(ci_low, dtype=float), g.shape)
        hi = np.broadcast_to(np.asarray(ci_high, dtype=float), g.shape)
        if np.any(~np.isfinite(lo)) or np.any(~np.isfinite(hi)):
            raise ValueError("regime_from_gain: CI has NaN/inf (e.g. n = 1 prompt); "
                             "drop the CI to use the sign of G - 1")
        if np.any(lo > hi):
            raise ValueError("regime_from_gain: ci_low > ci_high")
    out = np.where(lo > 1.0, "expander", np.where(hi < 1.0, "dampener", "neutral"))
    return str(out) if out.ndim == 0 else out.astype(object)


def gain_ci(mean: Any, std: Any, n: Any, std_ddof: int = 1,
            level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """t-based confidence interval of a mean gain over ``n`` prompts.

    ``SE = s / sqrt(n)`` with ``s`` the sample SD (ddof=1); a ``std`` computed with ddof=0 (as the
    paper's files are, ``np.std``) is converted first: ``s = std * sqrt(n / (n - 1))``. The CI is
    ``mean +- t_{level}(n-1) * SE``; NaN where ``n < 2``.
    """
    m = np.asarray(mean, dtype=float)
    s = np.asarray(std, dtype=float)
    k = np.asarray(n, dtype=float)
    if std_ddof not in (0, 1):
        raise ValueError("gain_ci: std_ddof must be 0 or 1")
    if not 0 < level < 1:
        raise ValueError("gain_ci: level must be in (0, 1)")
    with np.errstate(divide="ignore", invalid="ignore"):
        s1 = s * np.sqrt(k / (k - 1)) if std_ddof == 0 else s
        se = s1 / np.sqrt(k)
        t = stats.t.ppf(0.5 + level / 2, np.where(k > 1, k - 1, np.nan))
        half = np.where(k > 1, t * se, np.nan)
    return m - half, m + half


def add_regimes(table: Any, gain: str = "gain", std: str = "std", n: str = "n_prompts",
                std_ddof: int = 1, level: float = 0.95) -> pd.DataFrame:
    """Copy of ``table`` with ``ci_low``, ``ci_high`` (:func:`gain_ci`) and ``regime`` columns.

    ``regime`` comes from the CI (:func:`regime_from_gain`). For the paper's reference table pass
    ``std_ddof=0`` (its SDs are ``np.std``; where a file does not say, ddof=0 is the conservative
    assumption: it gives the wider CI).
    """
    func = "add_regimes"
    df = _as_frame(table, func)
    m, s, k = _numeric(df, gain, func), _numeric(df, std, func), _numeric(df, n, func)
    if np.any(k < 2):
        names = [lab for lab, kk in zip(_labels(df), k) if kk < 2]
        raise ValueError(f"{func}: column {n!r} < 2 for {', '.join(names)}: no CI from one prompt")
    lo, hi = gain_ci(m, s, k, std_ddof=std_ddof, level=level)
    df["ci_low"], df["ci_high"] = lo, hi
    df["regime"] = regime_from_gain(m, lo, hi)
    return df


def _regimes(df: pd.DataFrame, regime: str, gain: str, func: str) -> tuple[np.ndarray, str]:
    """Regime per row: column ``regime``, else from CI columns, else from the sign of G - 1."""
    if regime in df.columns:
        r = df[regime]
        if r.isna().any():
            raise ValueError(f"{func}: column {regime!r} has missing values")
        vals = r.astype(str).str.lower().to_numpy()
        bad = sorted(set(vals) - set(REGIMES))
        if bad:
            raise ValueError(f"{func}: column {regime!r} has values {bad}; expected {list(REGIMES)}")
        return vals.astype(object), f"column {regime!r}"
    if gain not in df.columns:
        raise ValueError(f"{func}: missing column {regime!r} and no {gain!r} column to derive it from")
    g = _numeric(df, gain, func)
    if "ci_low" in df.columns and "ci_high" in df.columns:
        return (regime_from_gain(g, _numeric(df, "ci_low", func), _numeric(df, "ci_high", func)),
                f"CI of {gain!r} (ci_low, ci_high)")
    return regime_from_gain(g), f"sign of {gain!r} - 1"


def _group_stats(x: np.ndarray, level: float = 0.95) -> dict[str, float]:
    n = x.size
    mean = float(np.mean(x))
    if n > 1:
        sd = float(np.std(x, ddof=1))
        se = sd / math.sqrt(n)
        half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
        lo, hi = mean - half, mean + half
    else:
        sd = se = lo = hi = float("nan")
    return {"n": n, "mean": mean, "sd": sd, "se": se, "ci_low": lo, "ci_high": hi,
            "min": float(np.min(x)), "max": float(np.max(x))}


def _holm(p: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values."""
    p = np.asarray(p, dtype=float)
    m = p.size
    order = np.argsort(p)
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj


# --------------------------------------------------------------------------------------------
# heritage


@dataclass(frozen=True, repr=False)
class FisherResult(_Result):
    """Fisher exact test of one lab vs the rest, dampener vs not (``scipy.stats.fisher_exact``).

    ``table`` is ``((lab & dampener, lab & not), (rest & dampener, rest & not))``; ``statistic`` the
    sample odds ratio (``inf``/``0`` when a cell is empty); ``pvalue`` as scipy gives it for
    ``alternative``; ``pvalue_holm`` Holm-adjusted over all labs tested together.
    """

    lab: str
    table: tuple[tuple[int, int], tuple[int, int]]
    statistic: float
    pvalue: float
    pvalue_holm: float
    alternative: str = "two-sided"

    @property
    def odds_ratio(self) -> float:
        return self.statistic

    def summary(self) -> str:
        return (f"FisherResult({self.lab} vs rest: table={self.table}, odds ratio={self.statistic:.3g}, "
                f"p={_fmt_p(self.pvalue)}, Holm p={_fmt_p(self.pvalue_holm)}, {self.alternative})")


@dataclass(frozen=True, repr=False, eq=False)
class HeritageResult(_Result):
    """Training-heritage test (D'Elia 2026 section 4.2, Fig. 2; METHODS.md section 5).

    Attributes
    ----------
    contingency:
        Lab x regime counts (columns ``expander, dampener, neutral``).
    labs:
        Per lab: ``n, n_dampener, frac_dampener``, Fisher ``odds_ratio, pvalue, pvalue_holm``, and
        mean gain with ``sd`` (ddof=1), ``se = sd / sqrt(n)`` and t 95% CI (NaN for n = 1).
    fisher:
        Lab -> :class:`FisherResult`.
    regime_source:
        Where the regimes came from (a column, a CI, or the sign of G - 1).

    The paper reports "EleutherAI 80% dampening, all other labs 100% expansion, Fisher p < 0.001".
    """

    contingency: pd.DataFrame
    labs: pd.DataFrame
    fisher: dict[str, FisherResult]
    regime_source: str

    def to_frame(self) -> pd.DataFrame:
        return self.labs.copy()

    def summary(self) -> str:
        lines = [f"HeritageResult({len(self.labs)} labs, {int(self.labs['n'].sum())} models; "
                 f"regimes from {self.regime_source})"]
        for _, r in self.labs.iterrows():
            se = "" if not np.isfinite(r["se"]) else f" +- {r['se']:.4f} (SE)"
            mean = "" if not np.isfinite(r["mean_gain"]) else f", mean gain {r['mean_gain']:.4f}{se}"
            lines.append(f"  {r['lab']}: {int(r['n_dampener'])}/{int(r['n'])} dampeners{mean}; "
                         f"Fisher OR={r['odds_ratio']:.3g}, p={_fmt_p(r['pvalue'])} "
                         f"(Holm {_fmt_p(r['pvalue_holm'])})")
        return "\n".join(lines)


def heritage(table: Any, lab: str = "lab", regime: str = "regime", gain: str = "gain",
             alternative: str = "two-sided") -> HeritageResult:
    """Lab x regime contingency, per-lab Fisher exact tests and per-lab mean gain +- SE.

    Regimes are taken from column ``regime`` if present (values expander/dampener/neutral, e.g.
    from :func:`add_regimes`); else from columns ``ci_low``/``ci_high`` if present; else from the
    sign of ``gain - 1`` (the paper's rule). For each lab a 2x2 Fisher exact test compares that lab
    with all other labs on dampener vs non-dampener (expander or neutral). Per-lab mean gain uses
    ``gain`` (skipped, NaN, if that column is absent); SE from the SD with ddof=1, only for n > 1.
    Needs at least 2 labs.
    """
    func = "heritage"
    df = _as_frame(table, func)
    _require(df, [lab], func)
    if df[lab].isna().any():
        raise ValueError(f"{func}: column {lab!r} has missing values")
    labs_col = df[lab].astype(str).to_numpy()
    reg, source = _regimes(df, regime, gain, func)
    g = _numeric(df, gain, func) if gain in df.columns else None
    order = list(dict.fromkeys(labs_col))
    if len(order) < 2:
        raise ValueError(f"{func}: need at least 2 labs in column {lab!r}, got {order}")
    cont = (pd.crosstab(pd.Categorical(labs_col, categories=order),
                        pd.Categorical(reg, categories=list(REGIMES)), dropna=False)
            .rename_axis(index=lab, columns="regime"))
    damp = reg == "dampener"
    rows, fisher, pvals = [], {}, []
    for name in order:
        inlab = labs_col == name
        t = ((int(np.sum(inlab & damp)), int(np.sum(inlab & ~damp))),
             (int(np.sum(~inlab & damp)), int(np.sum(~inlab & ~damp))))
        res = stats.fisher_exact(t, alternative=alternative)
        pvals.append(float(res.pvalue))
        st = _group_stats(g[inlab]) if g is not None else dict.fromkeys(
            ("mean", "sd", "se", "ci_low", "ci_high"), float("nan"))
        rows.append({"lab": name, "n": int(inlab.sum()), "n_dampener": t[0][0],
                     "frac_dampener": t[0][0] / int(inlab.sum()),
                     "odds_ratio": float(res.statistic), "pvalue": float(res.pvalue),
                     "mean_gain": st["mean"], "sd": st["sd"], "se": st["se"],
                     "ci_low": st["ci_low"], "ci_high": st["ci_high"], "_t": t})
    holm = _holm(np.array(pvals))
    for r, ph in zip(rows, holm):
        r["pvalue_holm"] = float(ph)
        fisher[r["lab"]] = FisherResult(r["lab"], r.pop("_t"), r["odds_ratio"], r["pvalue"],
                                        float(ph), alternative)
    labs = pd.DataFrame(rows)[["lab", "n", "n_dampener", "frac_dampener", "odds_ratio", "pvalue",
                              "pvalue_holm", "mean_gain", "sd", "se", "ci_low", "ci_high"]]
    return HeritageResult(contingency=cont, labs=labs, fisher=fisher, regime_source=source)


# --------------------------------------------------------------------------------------------
# crowding


@dataclass(frozen=True, repr=False)
class LogisticFit(_Result):
    """Maximum-likelihood logistic regression ``P(y = 1) = 1 / (1 + exp(-(intercept + slope * x)))``.

    Fitted by minimising the negative log-likelihood with ``scipy.optimize.minimize`` (Newton-CG,
    analytic gradient and Hessian). ``intercept_se``/``slope_se`` from the inverse observed
    information; ``slope_pvalue`` the Wald test; ``lr_statistic``/``lr_pvalue`` the likelihood-ratio
    test against the intercept-only model (chi-square, 1 df). ``x50 = -intercept / slope`` is the x
    where P = 0.5 (a fitted critical rho).

    If the classes are separated by x (perfectly, or with ties at the boundary), the maximum
    likelihood estimate does not exist: ``separated`` is True, ``slope`` is ``+-inf`` (its sign is
    the direction of the separation), ``intercept`` and the standard errors are NaN, ``x50`` is the
    midpoint of the gap, and the LR test uses the supremum of the likelihood.
    """

    intercept: float
    slope: float
    intercept_se: float
    slope_se: float
    slope_pvalue: float
    lr_statistic: float
    lr_pvalue: float
    loglik: float
    loglik_null: float
    x50: float
    separated: bool
    converged: bool
    n: int
    n_positive: int
    note: str = ""

    def predict_proba(self, x: Any) -> np.ndarray:
        """Fitted P(y = 1) at ``x`` (a step function at ``x50`` when separated)."""
        xa = np.asarray(x, dtype=float)
        if self.separated:
            return np.where((xa - self.x50) * np.sign(self.slope) > 0, 1.0,
                            np.where(xa == self.x50, 0.5, 0.0))
        return 1.0 / (1.0 + np.exp(-(self.intercept + self.slope * xa)))

    def summary(self) -> str:
        if self.n_positive in (0, self.n):
            return f"LogisticFit(n={self.n}: {self.note})"
        sep = " SEPARATED (no finite MLE)" if self.separated else ""
        return (f"LogisticFit(n={self.n}, {self.n_positive} positive{sep}: intercept={self.intercept:.4g} "
                f"(SE {self.intercept_se:.3g}), slope={self.slope:.4g} (SE {self.slope_se:.3g}, "
                f"Wald p={_fmt_p(self.slope_pvalue)}), LR chi2={self.lr_statistic:.3f} "
                f"(p={_fmt_p(self.lr_pvalue)}), x at P=0.5: {self.x50:.4g})")


def logistic_fit(x: Any, y: Any) -> LogisticFit:
    """Logistic regression of binary ``y`` (0/1 or bool) on one predictor ``x``; see :class:`LogisticFit`."""
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y).ravel()
    if xa.shape != ya.shape:
        raise ValueError("logistic_fit: x and y differ in length")
    if xa.size < 3:
        raise ValueError(f"logistic_fit: need at least 3 rows, got {xa.size}")
    if not np.all(np.isfinite(xa)):
        raise ValueError("logistic_fit: x has NaN/inf")
    if not np.all(np.isin(ya, (0, 1))):
        raise ValueError("logistic_fit: y must be 0/1 or bool")
    ya = ya.astype(float)
    n, k = int(xa.size), int(ya.sum())
    nan = float("nan")
    if k in (0, n):
        note = f"only one class ({'all' if k else 'no'} positives): nothing to fit"
        return LogisticFit(nan, nan, nan, nan, nan, 0.0, 1.0, 0.0, 0.0, nan, False, False, n, k, note)
    if np.all(xa == xa[0]):
        raise ValueError("logistic_fit: x is constant; the slope is not identifiable")
    p0 = k / n
    ll0 = float(k * math.log(p0) + (n - k) * math.log(1 - p0))
    # Fit on standardised x for conditioning, then transform back.
    mu, sd = float(xa.mean()), float(xa.std())
    X = np.column_stack([np.ones(n), (xa - mu) / sd])

    def nll(b):
        eta = X @ b
        return float(np.sum(np.logaddexp(0.0, eta) - ya * eta))

    def grad(b):
        return X.T @ (1.0 / (1.0 + np.exp(-(X @ b))) - ya)

    def hess(b):
        p = 1.0 / (1.0 + np.exp(-(X @ b)))
        return (X * (p * (1 - p))[:, None]).T @ X

    x0, x1 = xa[ya == 0], xa[ya == 1]
    up = x0.max() <= x1.min()   # all negatives at or below all positives
    down = x1.max() <= x0.min()
    separated = bool(up or down)
    res = optimize.minimize(nll, np.array([math.log(p0 / (1 - p0)), 0.0]), jac=grad, hess=hess,
                            method="Newton-CG", options={"maxiter": 200, "xtol": 1e-10})
    ll = -float(res.fun)
    if separated:
        complete = (x0.max() < x1.min()) if up else (x1.max() < x0.min())
        if complete:
            ll = 0.0  # supremum of the likelihood under complete separation
        gap = (x0.max(), x1.min()) if up else (x1.max(), x0.min())
        lr = max(0.0, 2 * (ll - ll0))
        return LogisticFit(
            intercept=nan, slope=math.inf if up else -math.inf, intercept_se=nan, slope_se=nan,
            slope_pvalue=nan, lr_statistic=lr, lr_pvalue=float(stats.chi2.sf(lr, 1)), loglik=ll,
            loglik_null=ll0, x50=float(np.mean(gap)), separated=True, converged=False, n=n,
            n_positive=k,
            note=("complete" if complete else "quasi-complete") + " separation: no finite MLE",
        )
    b_std = res.x
    slope = float(b_std[1] / sd)
    intercept = float(b_std[0] - b_std[1] * mu / sd)
    # Covariance in the original parameterisation: J cov_std J^T.
    try:
        cov_std = np.linalg.inv(hess(b_std))
        J = np.array([[1.0, -mu / sd], [0.0, 1.0 / sd]])
        cov = J @ cov_std @ J.T
        se_i, se_s = (float(math.sqrt(v)) if v > 0 else nan for v in np.diag(cov))
    except np.linalg.LinAlgError:
        se_i = se_s = nan
    z = slope / se_s if np.isfinite(se_s) and se_s > 0 else nan
    lr = max(0.0, 2 * (ll - ll0))
    return LogisticFit(
        intercept=intercept, slope=slope, intercept_se=se_i, slope_se=se_s,
        slope_pvalue=float(2 * stats.norm.sf(abs(z))) if np.isfinite(z) else nan,
        lr_statistic=lr, lr_pvalue=float(stats.chi2.sf(lr, 1)), loglik=ll, loglik_null=ll0,
        x50=-intercept / slope if slope != 0 else nan, separated=False, converged=bool(res.success),
        n=n, n_positive=k, note="" if res.success else f"optimizer: {res.message}",
    )


@dataclass(frozen=True, repr=False, eq=False)
class CrowdingResult(_Result):
    """Dimensional-crowding test (D'Elia 2026 section 5.4 and conclusion; METHODS.md section 5).

    The paper: head density ``rho = n_heads / d_head`` (true d_head) above a critical
    ``rho_crit ~ 0.15-0.20`` makes a model a dampener.

    Attributes
    ----------
    thresholds:
        Per threshold: ``threshold, accuracy, tp, fp, tn, fn`` of the rule
        ``rho > threshold => dampener`` (dampener = positive class).
    best_threshold, best_accuracy:
        The smallest threshold reaching the maximum accuracy (``best_thresholds`` lists all ties).
    baseline_accuracy:
        Accuracy of always predicting the majority class: the rule must beat this to mean anything.
    logistic:
        :class:`LogisticFit` of P(dampener) on rho (slope > 0 is the paper's direction).
    """

    table: pd.DataFrame
    thresholds: pd.DataFrame
    best_threshold: float
    best_accuracy: float
    best_thresholds: tuple[float, ...]
    baseline_accuracy: float
    logistic: LogisticFit
    n: int
    n_dampener: int
    regime_source: str

    def to_frame(self) -> pd.DataFrame:
        return self.thresholds.copy()

    def summary(self) -> str:
        t = self.thresholds["threshold"]
        return "\n".join([
            f"CrowdingResult(n={self.n}, {self.n_dampener} dampeners; regimes from {self.regime_source})",
            f"  rule rho > rho_crit => dampener, rho_crit in [{t.min():.4g}, {t.max():.4g}]: "
            f"best accuracy {self.best_accuracy:.4f} at {self.best_threshold:.4g} "
            f"(majority-class baseline {self.baseline_accuracy:.4f})",
            f"  {self.logistic.summary()}",
        ])


def crowding(table: Any, thresholds: Any = None, rho: str = "rho", regime: str = "regime",
             gain: str = "gain") -> CrowdingResult:
    """Accuracy of ``rho > rho_crit => dampener`` over a threshold grid, and a logistic fit.

    ``rho`` from column ``rho`` or ``n_heads / d_head``. The outcome "dampener" comes from column
    ``regime`` if present, else from ``ci_low``/``ci_high``, else ``gain < 1`` (the paper's H25
    used ``G < 1``); neutral models count as non-dampeners. ``thresholds`` defaults to
    ``np.linspace(0.15, 0.20, 11)`` (the paper's rho_crit range). The rule is strict (``>``); note
    the paper's own hypothesis file used ``rho >= 0.2``.
    """
    func = "crowding"
    df = _as_frame(table, func)
    r = _rho(df, rho, func)
    reg, source = _regimes(df, regime, gain, func)
    if len(df) < 3:
        raise ValueError(f"{func}: need at least 3 models, got {len(df)}")
    ths = np.linspace(0.15, 0.20, 11) if thresholds is None else np.atleast_1d(
        np.asarray(thresholds, dtype=float))
    if ths.size == 0 or not np.all(np.isfinite(ths)):
        raise ValueError(f"{func}: thresholds must be a non-empty list of finite numbers")
    y = reg == "dampener"
    rows = []
    for th in ths:
        pred = r > th
        tp, fp = int(np.sum(pred & y)), int(np.sum(pred & ~y))
        tn, fn = int(np.sum(~pred & ~y)), int(np.sum(~pred & y))
        rows.append({"threshold": float(th), "accuracy": (tp + tn) / len(y),
                     "tp": tp, "fp": fp, "tn": tn, "fn": fn})
    acc = pd.DataFrame(rows)
    best = float(acc["accuracy"].max())
    ties = tuple(float(t) for t in acc.loc[np.isclose(acc["accuracy"], best), "threshold"])
    per_model = pd.DataFrame({"model": _labels(df), "rho": r, "regime": reg, "dampener": y})
    return CrowdingResult(
        table=per_model, thresholds=acc, best_threshold=min(ties), best_accuracy=best,
        best_thresholds=ties, baseline_accuracy=float(max(y.mean(), 1 - y.mean())),
        logistic=logistic_fit(r, y.astype(int)), n=len(y), n_dampener=int(y.sum()),
        regime_source=source,
    )


# --------------------------------------------------------------------------------------------
# twin


@dataclass(frozen=True, repr=False, eq=False)
class TwinResult(_Result):
    """Base vs fine-tuned test (D'Elia 2026 section 5.5; METHODS.md section 5).

    ``pairs`` per pair: ``base, model, base_gain, ft_gain``, ``base_sign``/``ft_sign`` (sign of
    ``G - 1``: +1 expander, -1 dampener, 0 exactly neutral), ``sign_kept``, ``delta = ft - base``,
    ``relative_change = (ft - base) / |base - 1|`` (change relative to the base's distance from
    neutrality: -1 means the fine-tune moved exactly to G = 1; < -1 with an expander base means the
    sign flipped) and ``ratio = ft / base``.
    The paper: "RLHF modulates magnitude (up to 50%) but cannot invert sign. Gemma: 2.32 -> 1.15".
    """

    pairs: pd.DataFrame

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
        return "\n".join(lines)


def twin(table: Any, model: str = "model", base: str = "base", gain: str = "gain") -> TwinResult:
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
    return TwinResult(pairs=pairs)


# --------------------------------------------------------------------------------------------
# hierarchy

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
class HierarchyResult(_Result):
    """Groups ranked by mean gain (D'Elia 2026 abstract; METHODS.md section 5).

    ``groups`` per group: ``rank, group, n, mean, sd`` (ddof=1), ``se``, ``ci_low, ci_high``
    (t distribution, n - 1 df, NaN for n = 1), ``min, max``. ``separated_from_next``: whether the
    group's CI and the next group's CI are disjoint (a crude check; NaN CIs count as not separated).
    """

    groups: pd.DataFrame
    by: str
    level: float

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
    return HierarchyResult(groups=out, by=by, level=level)
