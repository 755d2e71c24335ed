"""Across-prompt summary statistics: mean, SD (ddof=1), SE and a t-based confidence interval.

Every thermo-lens measurement is made per prompt and then summarised across prompts. The
summary is always the same, and always says what it is:

* ``mean`` of the ``n`` per-prompt values;
* ``sd``: the *sample* standard deviation, ``ddof=1`` (``numpy.std(x, ddof=1)``). The paper's
  result files store ``numpy.std`` with ``ddof=0``; that one is available as :attr:`SummaryStats.sd_ddof0`
  for comparison, never as ``sd``;
* ``se = sd / sqrt(n)`` (``scipy.stats.sem``);
* the ``level`` (default 95%) Student-t interval ``mean +- t_{(1+level)/2, n-1} * se``
  (``scipy.stats.t.interval(level, n - 1, mean, se)``).

With ``n < 2`` the SD, SE and CI are NaN (one prompt has no spread), never zero.

The across-prompt summary every thermo-lens measurement reports (mean, SD with ddof=1, SE, 95% CI); D'Elia (2026),
"Thermodynamic Constraints in Transformer Architectures", Fig. 2 and 7 error bars.

>>> s = summarize([1.0, 1.2, 1.1])
>>> round(s.mean, 3), round(s.sd, 3), s.n
(1.1, 0.1, 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from thermo_lens._lazy import scipy_stats as _st
from thermo_lens.core.result import Result

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    from thermo_lens.stats.exact import ConfidenceInterval

__all__ = ["SummaryStats", "summarize"]

NanPolicy = Literal["propagate", "omit", "raise"]
#: A summary's statistic: a float for a 1-D sample, a float64 array of the remaining shape for a
#: summary over axis 0 of an N-D array.
Stat = float | np.ndarray


@dataclass(frozen=True, repr=False, eq=False)
class SummaryStats(Result):
    """Summary of per-prompt values: ``n``, ``mean``, ``sd`` (ddof=1), ``se``, ``level`` CI.

    Scalar fields are Python floats for a 1-D sample; for a summary over axis 0 of an
    N-D array (e.g. ``[prompt, layer]`` -> per layer) they are numpy arrays of the remaining
    shape.

    Attributes:
        n: number of (non-NaN, with ``nan_policy="omit"``) values.
        mean: sample mean.
        sd: sample standard deviation with ``ddof=1`` (NaN when ``n < 2``).
        se: standard error of the mean, ``sd / sqrt(n)``.
        ci_low, ci_high: the ``level`` Student-t confidence interval of the mean (``n - 1``
            degrees of freedom).
        level: confidence level of the interval (0.95).
        values: the per-prompt values summarised (float64), or None when not kept.
        ddof: always 1; stored so a serialised summary says which SD it holds.
    """

    n: int | np.ndarray
    mean: Stat
    sd: Stat
    se: Stat
    ci_low: Stat
    ci_high: Stat
    level: float = 0.95
    values: np.ndarray | None = None
    ddof: int = 1

    @property
    def ci(self) -> tuple[Stat, Stat]:
        """``(ci_low, ci_high)``."""
        return self.ci_low, self.ci_high

    @property
    def df(self) -> int | np.ndarray:
        """Degrees of freedom of the t interval, ``n - 1`` (an int, or an array as ``n``)."""
        n = np.asarray(self.n)
        return int(n) - 1 if n.ndim == 0 else n - 1

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """``(low, high)``: the ``level`` Student-t interval of the mean,
        ``scipy.stats.t.interval(level, n - 1, mean, se)``, at any level (``ci_low`` / ``ci_high``
        hold the one at :attr:`level`); NaN where ``n < 2``.

        Raises:
            ValueError: ``level`` not in (0, 1).
        """
        from thermo_lens.stats.exact import ConfidenceInterval

        if not 0.0 < level < 1.0:
            raise ValueError(f"confidence_interval: level must be in (0, 1), got {level!r}")
        return ConfidenceInterval(*t_interval(self.mean, self.sd, self.n, level))

    @property
    def sd_ddof0(self) -> float | np.ndarray:
        """Population SD (``numpy.std`` default, ``ddof=0``), as the paper's result files store."""
        n = np.asarray(self.n, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(self.sd, dtype=float) * np.sqrt((n - 1) / n)
            out = np.where(n == 1, 0.0, out)
        return float(out) if out.ndim == 0 else out

    def excludes(self, value: float) -> bool | np.ndarray:
        """Whether the confidence interval excludes ``value`` (False where the CI is NaN)."""
        lo, hi = np.asarray(self.ci_low, dtype=float), np.asarray(self.ci_high, dtype=float)
        out = (lo > value) | (hi < value)
        return bool(out) if out.ndim == 0 else out

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{n, mean, sd, se, ci_low, ci_high, level, sd_ddof}`` (no values)."""
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "se": self.se,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "level": self.level,
                "sd_ddof": self.ddof}

    def format(self, digits: int = 4) -> str:
        """One line: ``mean ± SE (SD ..., ddof=1; 95% CI [lo, hi]; n=..)`` (scalar summaries)."""
        if np.ndim(self.mean) != 0:
            return f"SummaryStats over shape {np.shape(self.mean)} (n={self.n})"
        f = lambda v: f"{v:.{digits}g}"  # noqa: E731
        pct = f"{100 * self.level:g}%"
        return (f"{f(self.mean)} ± {f(self.se)} SE (SD {f(self.sd)}, ddof=1; {pct} CI "
                f"[{f(self.ci_low)}, {f(self.ci_high)}]; n={self.n})")

    def __repr__(self) -> str:
        return f"SummaryStats({self.format()})"


def summarize(
    values: ArrayLike,
    *,
    axis: int = 0,
    level: float | int = 0.95,
    nan_policy: str = "propagate",
    keep_values: bool = True,
) -> SummaryStats:
    """Mean, SD (ddof=1), SE and ``level`` t-CI of ``values`` along ``axis`` (the prompt axis).

    Args:
        values: per-prompt values, ``Float[ArrayLike, "prompt *rest"]`` (list, numpy, tensor).
            Computed in float64.
        axis: the prompt axis (0).
        level: confidence level in (0, 1).
        nan_policy: ``"propagate"`` (a NaN value makes the summary NaN, as scipy),
            ``"omit"`` (drop NaN values; ``n`` counts the rest) or ``"raise"``.
        keep_values: store the float64 values in the summary (``.values``).

    Returns:
        :class:`SummaryStats`; scalars for 1-D input, arrays of the remaining shape otherwise.
    """
    try:
        import torch

        if isinstance(values, torch.Tensor):
            values = values.detach().to("cpu", torch.float64).numpy()
    except ImportError:  # pragma: no cover
        pass
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("summarize: expected per-prompt values (at least 1-D), got a scalar")
    if x.shape[axis] == 0:
        raise ValueError("summarize: no values (the prompt axis is empty)")
    if not 0.0 < level < 1.0:
        raise ValueError(f"summarize: level must be in (0, 1), got {level!r}")
    if nan_policy not in ("propagate", "omit", "raise"):
        raise ValueError(f"summarize: nan_policy must be 'propagate', 'omit' or 'raise', got {nan_policy!r}")
    x = np.moveaxis(x, axis, 0)
    isnan = np.isnan(x)
    if nan_policy == "raise" and isnan.any():
        raise ValueError(f"summarize: {int(isnan.sum())} NaN value(s); pass nan_policy='omit' to drop them")
    with np.errstate(divide="ignore", invalid="ignore"):
        if nan_policy == "omit":
            n = (~isnan).sum(axis=0)
            mean = np.nansum(x, axis=0) / n
            dev = np.where(isnan, 0.0, x - mean)
        else:
            n = np.full(x.shape[1:], x.shape[0])
            mean = x.mean(axis=0)
            dev = x - mean
        sd = np.sqrt((dev ** 2).sum(axis=0) / (n - 1))
        sd = np.where(n >= 2, sd, np.nan)
        se = sd / np.sqrt(n)
        mean = np.where(n >= 1, mean, np.nan)
        ci_low, ci_high = (np.asarray(v) for v in t_interval(mean, sd, n, level))

    def out(a: np.ndarray) -> Stat:
        return float(a) if a.ndim == 0 else a.astype(np.float64)

    def count(a: np.ndarray) -> int | np.ndarray:
        return int(a) if a.ndim == 0 else a.astype(np.int64)
    return SummaryStats(
        n=count(np.asarray(n)), mean=out(np.asarray(mean)), sd=out(np.asarray(sd)),
        se=out(np.asarray(se)), ci_low=out(ci_low), ci_high=out(ci_high),
        level=float(level), values=np.moveaxis(x, 0, axis).copy() if keep_values else None,
    )


# ============================================================================ shared inference
# The one home of the statistics every thermo-lens module uses: the t interval, the regime rule,
# p-value formatting, Holm's adjustment, correlation CIs, exact/permutation p-values, partial
# correlation, the conditional odds ratio and the Kruskal-Wallis effect size. Imported lazily by
# the laws so that ``import thermo_lens.stats`` stays as light as it was.

__all__ += [
    "REGIMES", "t_interval", "regime_from_ci", "format_p", "holm", "fisher_z_ci",
    "permutation_correlation_pvalue", "partial_correlation", "PartialCorrelation",
    "odds_ratio_ci", "kruskal_effect_size", "kruskal_detectable_effect", "paired_detectable_shift",
    "EXACT_PERMUTATION_MAX_N",
]

#: Regime names, in display order.
REGIMES: tuple[str, ...] = ("expander", "dampener", "neutral")

#: Up to this many rows, permutation p-values enumerate all n! pairings (exact); above it they
#: use 20,000 Monte Carlo resamples with a fixed seed (the method string says which).
EXACT_PERMUTATION_MAX_N = 9


def t_interval(mean: ArrayLike, sd: ArrayLike, n: ArrayLike, level: float = 0.95) -> tuple[Any, Any]:
    """Student-t interval ``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)``; NaN where ``n < 2``.

    ``sd`` is the sample SD (ddof=1). The single implementation behind :func:`summarize`,
    ``thermo_lens.laws.gain_ci`` and the laws' group summaries. Scalars in, floats out.
    """
    m = np.asarray(mean, dtype=float)
    s = np.asarray(sd, dtype=float)
    k = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tcrit = _st.t.ppf(0.5 + level / 2.0, np.where(k >= 2, k - 1, np.nan))
        half = np.where(k >= 2, tcrit * s / np.sqrt(k), np.nan)
    lo, hi = m - half, m + half
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


@overload
def regime_from_ci(ci_low: float, ci_high: float, null: float = 1.0) -> str: ...


@overload
def regime_from_ci(ci_low: ArrayLike, ci_high: ArrayLike, null: float = 1.0) -> str | np.ndarray: ...


def regime_from_ci(ci_low: ArrayLike, ci_high: ArrayLike, null: float = 1.0) -> str | np.ndarray:
    """The regime rule: ``"expander"`` if the CI lies above ``null``, ``"dampener"`` if below,
    ``"neutral"`` if it contains ``null``, ``"undetermined"`` where the CI is NaN.

    The single rule behind ``GainResult.regime`` and ``thermo_lens.laws.regime_from_gain``
    (which, without a CI, passes the gain itself as both ends: the paper's sign of ``G - 1``).
    Scalars give a ``str``, arrays an object array.
    """
    lo, hi = np.broadcast_arrays(np.asarray(ci_low, dtype=float), np.asarray(ci_high, dtype=float))
    finite = np.isfinite(lo) & np.isfinite(hi)
    out = np.where(~finite, "undetermined",
                   np.where(lo > null, "expander", np.where(hi < null, "dampener", "neutral")))
    return str(out) if out.ndim == 0 else out.astype(object)


def format_p(p: float) -> str:
    """A p-value as thermo-lens prints it everywhere: 4 decimals, scientific below 0.001."""
    p = float(p)
    if not np.isfinite(p):
        return "nan"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


def holm(pvalues: ArrayLike) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); NaN stays NaN."""
    p = np.asarray(pvalues, dtype=float).ravel()
    adj = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj


def fisher_z_ci(r: float, n: int, level: float = 0.95, *, spearman: bool = False,
                n_controls: int = 0) -> tuple[float, float]:
    """Confidence interval of a correlation by Fisher's z: ``tanh(atanh(r) +- z * se)``.

    ``se = 1 / sqrt(n - 3 - n_controls)`` for Pearson (and partial) r; for Spearman's rho
    ``se = sqrt(1.06 / (n - 3))`` (Fieller, Hartley & Pearson 1957). NaN when ``n - 3 - k < 1``.
    """
    dof = n - 3 - n_controls
    if dof < 1 or not np.isfinite(r):
        return float("nan"), float("nan")
    se = math.sqrt((1.06 if spearman else 1.0) / dof)
    z = math.atanh(min(max(r, -1 + 1e-15), 1 - 1e-15))
    q = float(_st.norm.ppf(0.5 + level / 2))
    return math.tanh(z - q * se), math.tanh(z + q * se)


def _ranks(a: np.ndarray) -> np.ndarray:
    return _st.rankdata(a)


def permutation_correlation_pvalue(x: ArrayLike, y: ArrayLike, method: str = "spearman",
                                   seed: int = 0, n_resamples: int = 20_000,
                                   exact_max_n: int = EXACT_PERMUTATION_MAX_N) -> tuple[float, str]:
    """Two-sided permutation p-value of a Pearson or Spearman correlation, and how it was made.

    Pairs ``x`` with every permutation of ``y`` (``scipy.stats.permutation_test``,
    ``permutation_type="pairings"``): all ``n!`` of them when ``n <= exact_max_n`` (9: exact), else
    ``n_resamples`` random ones with ``seed``. Two-sided as ``P(|r_perm| >= |r_obs|)`` (not scipy's
    default of doubling the smaller tail). Spearman ties get average ranks. Returns
    ``(pvalue, description)``.
    """
    xa, ya = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if method not in ("pearson", "spearman"):
        raise ValueError(f"permutation_correlation_pvalue: method must be 'pearson' or 'spearman', got {method!r}")
    if method == "spearman":
        xa, ya = _ranks(xa), _ranks(ya)
    xc = (xa - xa.mean()) / np.sqrt(((xa - xa.mean()) ** 2).sum())

    def stat(yp, axis=-1):  # |r|: the two-sided p is P(|r_perm| >= |r_obs|)
        yc = yp - yp.mean(axis=axis, keepdims=True)
        return np.abs((yc * xc).sum(axis=axis) / np.sqrt((yc ** 2).sum(axis=axis)))

    n = xa.size
    exact = n <= exact_max_n
    res = _st.permutation_test((ya,), stat, permutation_type="pairings", vectorized=True,
                               n_resamples=np.inf if exact else n_resamples,
                               alternative="greater", rng=np.random.default_rng(seed))
    how = (f"exact permutation (all {math.factorial(n)} pairings)" if exact
           else f"Monte Carlo permutation ({n_resamples} resamples, seed {seed})")
    return float(min(1.0, res.pvalue)), how


@dataclass(frozen=True, repr=False, eq=False)
class PartialCorrelation(Result):
    """Partial correlation ``r(x, y | z)``: Pearson r of the residuals of x and y on z.

    ``pvalue`` from the t statistic with ``n - 2 - k`` df (k controls); ``ci_low``/``ci_high``
    by Fisher z with ``se = 1/sqrt(n - 3 - k)``. ``r_xz`` is the confound's strength, r(x, z).
    """

    x: str
    y: str
    control: str
    n: int
    statistic: float
    pvalue: float
    ci_low: float
    ci_high: float
    r_xz: float
    r_xz_pvalue: float

    @property
    def df(self) -> int:
        """Degrees of freedom of the t statistic behind ``pvalue``: ``n - 3`` (one control)."""
        return self.n - 3

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """``(low, high)``: the ``level`` Fisher-z interval of the partial r, ``se = 1/sqrt(n - 4)``
        (:func:`fisher_z_ci` with one control); ``ci_low`` / ``ci_high`` hold the interval at the level
        :func:`partial_correlation` was given (0.95 by default)."""
        from thermo_lens.stats.exact import ConfidenceInterval

        if not 0.0 < level < 1.0:
            raise ValueError(f"confidence_interval: level must be in (0, 1), got {level!r}")
        return ConfidenceInterval(*fisher_z_ci(self.statistic, self.n, level, n_controls=1))

    def __repr__(self) -> str:
        return (f"PartialCorrelation(r({self.y}, {self.x} | {self.control}) = {self.statistic:.4f}, "
                f"p={format_p(self.pvalue)}, 95% CI [{self.ci_low:.3f}, {self.ci_high:.3f}], n={self.n}; "
                f"confound r({self.x}, {self.control}) = {self.r_xz:.4f})")


def partial_correlation(x: ArrayLike, y: ArrayLike, z: ArrayLike, names: tuple[str, str, str] = ("x", "y", "z"),
                        level: float = 0.95) -> PartialCorrelation:
    """``r(x, y | z)`` with one control ``z`` (see :class:`PartialCorrelation`)."""
    xa, ya, za = (np.asarray(v, dtype=float).ravel() for v in (x, y, z))
    n = xa.size
    if not (ya.size == n == za.size) or n < 4:
        raise ValueError(f"partial_correlation: need >= 4 rows of equal length, got {xa.size}, {ya.size}, {za.size}")
    Z = np.column_stack([np.ones(n), za])

    def resid(v):
        return v - Z @ np.linalg.lstsq(Z, v, rcond=None)[0]

    rx, ry = resid(xa), resid(ya)
    r = float(np.dot(rx, ry) / math.sqrt(np.dot(rx, rx) * np.dot(ry, ry)))
    dof = n - 3
    t = r * math.sqrt(dof / max(1e-300, 1 - r * r))
    p = float(2 * _st.t.sf(abs(t), dof))
    lo, hi = fisher_z_ci(r, n, level, n_controls=1)
    cz = _st.pearsonr(xa, za)
    return PartialCorrelation(x=names[0], y=names[1], control=names[2], n=n, statistic=r, pvalue=p,
                              ci_low=lo, ci_high=hi, r_xz=float(cz.statistic), r_xz_pvalue=float(cz.pvalue))


def odds_ratio_ci(table: ArrayLike, level: float = 0.95) -> tuple[float, float, float]:
    """Conditional maximum-likelihood odds ratio of a 2x2 table with its exact CI.

    ``scipy.stats.contingency.odds_ratio(kind="conditional")``: the estimate and the interval
    that go with Fisher's exact test (the CI excludes 1 exactly when the two-sided test at
    ``1 - level`` rejects, up to the test's two-sided convention). Returns ``(or, low, high)``.
    """
    from scipy.stats.contingency import odds_ratio

    res = odds_ratio(np.asarray(table, dtype=int), kind="conditional")
    ci = res.confidence_interval(level)
    return float(res.statistic), float(ci.low), float(ci.high)


def kruskal_effect_size(h: float, n: int, k: int) -> dict[str, float]:
    """Effect sizes of a Kruskal-Wallis H over ``n`` values in ``k`` groups.

    ``epsilon_squared = H / (n - 1)`` (Tomczak & Tomczak 2014; ``H (n + 1) / (n^2 - 1)``) and
    ``eta_squared_h = (H - k + 1) / (n - k)`` (can be negative for tiny H; not clipped).
    """
    if n <= k or not np.isfinite(h):
        return {"epsilon_squared": float("nan"), "eta_squared_h": float("nan")}
    return {"epsilon_squared": float(h / (n - 1)), "eta_squared_h": float((h - k + 1) / (n - k))}


def kruskal_detectable_effect(n: int, k: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest effect (eta^2) a Kruskal-Wallis test over ``n`` values in ``k`` groups detects
    with probability ``power`` at level ``alpha`` (approximation).

    Uses the one-way ANOVA noncentral chi-square ``chi2(k - 1, lambda = n f^2)`` with
    ``f^2 = eta^2 / (1 - eta^2)``, scaled by the Kruskal-Wallis asymptotic relative efficiency
    ``3 / pi`` (normal data). With 5 categories x 5 prompts it is about 0.33: smaller category
    effects usually go undetected, so a non-significant H is not evidence of robustness.
    """
    from scipy.optimize import brentq

    if n <= k or k < 2:
        return float("nan")
    crit = float(_st.chi2.ppf(1 - alpha, k - 1))

    def gap(eta2: float) -> float:
        lam = (3 / math.pi) * n * eta2 / (1 - eta2)
        return float(_st.ncx2.sf(crit, k - 1, lam)) - power

    return float(brentq(gap, 1e-9, 1 - 1e-9))


def paired_detectable_shift(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The mean paired shift a two-sided one-sample t-test on ``n`` paired differences with
    standard deviation ``sd`` detects with probability ``power`` at level ``alpha``.

    Solves ``P(|T| > t_{1 - alpha/2, n-1}) = power`` for ``T`` noncentral t with ``n - 1`` df and
    noncentrality ``sqrt(n) shift / sd``; returns the shift in the data's units (``sd`` times the
    standardised effect: 0.889 SD at ``n = 12``, alpha 0.05; 1.198 SD at alpha 0.05 / 6). The
    exact sign-flip test has about the t-test's power on near-normal differences, so this is the
    planning figure for it too. Pass ``alpha / m`` for the strictest step of Holm over ``m`` tests.
    """
    from scipy.optimize import brentq

    if n < 2 or not (0 < alpha < 1) or not (0 < power < 1) or not np.isfinite(sd) or sd < 0:
        return float("nan")
    df = n - 1
    crit = float(_st.t.ppf(1 - alpha / 2, df))

    def gap(effect: float) -> float:
        nc = effect * math.sqrt(n)
        lower = float(_st.nct.sf(crit, df, -nc))  # P(T < -crit) by symmetry (scipy's cdf is NaN far out)
        return float(_st.nct.sf(crit, df, nc)) + (lower if np.isfinite(lower) else 0.0) - power

    return float(sd * brentq(gap, 1e-9, 50.0))
