"""Exact small-sample tests whose p-value and interval invert the same test.

A p-value and a confidence interval printed side by side must come from one test: the interval
is the set of parameter values the test does not reject at ``1 - level``. Each result here keeps
what it needs to recompute that set, ``confidence_interval(level)``, like scipy's results, and
says which test it is (``method``).

- :func:`fisher_exact`: a 2x2 table, conditional on its margins (noncentral hypergeometric).
  ``method="blaker"`` (default): Blaker's (2000) exact two-sided test, whose p-value and interval
  invert the same acceptability function; ``method="central"``: the doubled one-sided p with the
  central interval (what ``scipy.stats.contingency.odds_ratio`` gives). scipy's
  ``fisher_exact`` two-sided p (the minimum-likelihood p) matches neither interval.
- :func:`signed_rank_test`: Wilcoxon's signed-rank test of paired differences, exact over all
  ``2^n`` sign flips with midranks (ties allowed), the Hodges-Lehmann estimate and the interval
  that inverts the same test.
- :func:`logistic_exact_test`: the exact conditional test of a logistic slope (the conditional
  distribution of its sufficient statistic ``sum x_i y_i`` given ``sum y_i``). Valid under
  complete separation, where no maximum-likelihood estimate exists and the asymptotic
  likelihood-ratio and Wald tests are not valid.
- :func:`permutation_mean_difference`: difference of two means, exact permutation p over all
  splits (Monte Carlo above 20,000) and the interval inverting it under a shift model.
- :func:`sign_flip_pvalue`: the exact sign-flip test of a mean paired difference over all ``2^n``
  sign patterns, with ties judged relative to the data's own scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from thermo_lens._lazy import scipy_stats as _st
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.result import Result

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["ConfidenceInterval", "FisherExact", "fisher_exact", "SignedRankTest", "signed_rank_test",
           "LogisticExact", "logistic_exact_test", "MeanDifference", "permutation_mean_difference",
           "sign_flip_pvalue", "SIGN_FLIP_MAX_N"]

_TOL = 1e-7  # relative tolerance when comparing probabilities (ties in the exact distributions)


class ConfidenceInterval(NamedTuple):
    """``(low, high)`` as scipy names them."""

    low: float
    high: float


def _check_level(level: float) -> float:
    if not 0 < float(level) < 1:
        raise ThermoLensInputError(f"level must be in (0, 1), got {level!r}")
    return float(level)


def _invert(pvalue_at: Callable[[float], float], estimate: float, scale: float, alpha: float,
            limit: float = math.inf) -> ConfidenceInterval:
    """The connected set ``{theta : pvalue_at(theta) > alpha}`` around ``estimate``.

    Steps out from the estimate by doubling ``scale`` until the test rejects (``+-inf`` when it
    never does within ``limit``), then bisects to the boundary (60 halvings).
    """
    ends = []
    for sign in (-1.0, 1.0):
        inside, step = estimate, scale
        outside = None
        for _ in range(80):
            cand = estimate + sign * step
            if abs(cand) > limit:
                break
            if pvalue_at(cand) <= alpha:
                outside = cand
                break
            inside, step = cand, step * 2
        if outside is None:
            ends.append(sign * math.inf)
            continue
        for _ in range(60):
            mid = (inside + outside) / 2
            if pvalue_at(mid) > alpha:
                inside = mid
            else:
                outside = mid
        ends.append(inside)
    return ConfidenceInterval(float(ends[0]), float(ends[1]))


# ============================================================================ 2x2 table

def _hypergeom_support(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Support of ``table[0, 0]`` given the margins and ``log C(r1, x) + log C(r2, c1 - x)``."""
    (a, b), (c, d) = table
    r1, r2, c1 = a + b, c + d, a + c
    xs = np.arange(max(0, c1 - r2), min(r1, c1) + 1)
    logc = np.array([math.lgamma(r1 + 1) - math.lgamma(x + 1) - math.lgamma(r1 - x + 1)
                     + math.lgamma(r2 + 1) - math.lgamma(c1 - x + 1) - math.lgamma(r2 - c1 + x + 1) for x in xs])
    return xs, logc


def _nc_pmf(xs: np.ndarray, logc: np.ndarray, log_psi: float) -> np.ndarray:
    w = logc + log_psi * xs
    w = np.exp(w - w.max())
    return w / w.sum()


def _fisher_p(xs: np.ndarray, logc: np.ndarray, x: int, log_psi: float, method: str) -> float:
    pmf = _nc_pmf(xs, logc, log_psi)
    lower, upper = np.cumsum(pmf), np.cumsum(pmf[::-1])[::-1]   # P(X <= y), P(X >= y)
    i = int(np.flatnonzero(xs == x)[0])
    if method == "central":
        return float(min(1.0, 2 * min(lower[i], upper[i])))
    gamma = np.minimum(lower, upper)                              # Blaker's acceptability
    return float(min(1.0, pmf[gamma <= gamma[i] * (1 + _TOL)].sum()))


@dataclass(frozen=True, repr=False)
class FisherExact(Result):
    """Exact conditional test of a 2x2 table's odds ratio (``H0: psi = 1``), two-sided.

    Attributes:
        table: ``((a, b), (c, d))``.
        statistic: the conditional maximum-likelihood odds ratio (``inf``/``0`` at the support's ends).
        sample_odds_ratio: ``a d / (b c)``.
        pvalue: the two-sided p of ``method`` at ``psi = 1``.
        method: ``"blaker"`` or ``"central"`` (the doubled one-sided p).
        pvalue_minlike: scipy's ``fisher_exact`` two-sided p (minimum likelihood), for comparison.
    """

    table: tuple
    statistic: float
    sample_odds_ratio: float
    pvalue: float
    method: str
    pvalue_minlike: float

    def pvalue_at(self, odds_ratio: float) -> float:
        """The test's two-sided p of ``H0: psi = odds_ratio``."""
        xs, logc = _hypergeom_support(np.asarray(self.table))
        return _fisher_p(xs, logc, int(self.table[0][0]), math.log(odds_ratio), self.method)

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """The odds ratios the same test does not reject at ``1 - level`` (its inversion)."""
        alpha = 1 - _check_level(level)
        xs, logc = _hypergeom_support(np.asarray(self.table))
        x = int(self.table[0][0])
        est = math.log(self.statistic) if 0 < self.statistic < math.inf else (
            -5.0 if self.statistic == 0 else 5.0)
        lo, hi = _invert(lambda t: _fisher_p(xs, logc, x, t, self.method), est, 0.25, alpha, limit=60.0)
        return ConfidenceInterval(math.exp(lo) if np.isfinite(lo) else 0.0, math.exp(hi) if np.isfinite(hi) else math.inf)

    def __repr__(self) -> str:
        ci = self.confidence_interval()
        return (f"FisherExact({self.method}: odds ratio {self.statistic:.4g} (conditional MLE), p = {self.pvalue:.4g}, "
                f"95% CI [{ci.low:.4g}, {ci.high:.4g}] inverting the same test; table {self.table})")


def fisher_exact(table: ArrayLike, method: str = "blaker") -> FisherExact:
    """Exact two-sided test of independence in a 2x2 table with a matching odds-ratio interval.

    ``method="blaker"`` (default): Blaker's test (p = the probability, under ``psi``, of the tables
    no more acceptable than the observed one, acceptability = the smaller tail); its interval
    inverts it and lies inside the central one. ``method="central"``: the doubled one-sided p,
    whose inversion is the central interval of ``scipy.stats.contingency.odds_ratio``.
    """
    t = np.asarray(table)
    if t.shape != (2, 2) or np.any(t < 0) or not np.all(t == np.round(t)):
        raise ThermoLensInputError(f"fisher_exact: expected a 2x2 table of non-negative counts, got {table!r}")
    if method not in ("blaker", "central"):
        raise ThermoLensInputError(f"fisher_exact: method must be 'blaker' or 'central', got {method!r}")
    t = t.astype(int)
    tup = ((int(t[0, 0]), int(t[0, 1])), (int(t[1, 0]), int(t[1, 1])))
    from scipy.stats.contingency import odds_ratio

    cond = float(odds_ratio(t, kind="conditional").statistic)
    a, b, c, d = t.ravel()
    sample = (a * d / (b * c)) if b * c else (math.inf if a * d else math.nan)
    xs, logc = _hypergeom_support(t)
    return FisherExact(table=tup, statistic=cond, sample_odds_ratio=float(sample),
                       pvalue=_fisher_p(xs, logc, int(a), 0.0, method), method=method,
                       pvalue_minlike=float(_st.fisher_exact(t).pvalue))


# ============================================================================ signed ranks

def _signed_rank_p(d: np.ndarray) -> tuple[float, float, int]:
    """Two-sided exact p of Wilcoxon's signed-rank statistic on ``d`` (zeros dropped, midranks).

    Returns ``(W+, p, n_nonzero)``. The null distribution of ``W+`` over the ``2^n`` sign flips is
    counted exactly on doubled ranks (integers); it is symmetric, so the doubled smaller tail is
    ``P(|W+ - E| >= |w - E|)``.
    """
    d = d[d != 0]
    n = d.size
    if n == 0:
        return 0.0, 1.0, 0
    r2 = np.rint(2 * _st.rankdata(np.abs(d))).astype(int)        # doubled midranks
    counts = np.zeros(int(r2.sum()) + 1)
    counts[0] = 1.0
    for r in r2:
        counts[r:] = counts[r:] + counts[:-r]  # RHS from the old counts: each rank once
    probs = counts / counts.sum()
    w2 = int(r2[d > 0].sum())
    lower, upper = probs[: w2 + 1].sum(), probs[w2:].sum()
    return w2 / 2, float(min(1.0, 2 * min(lower, upper))), n


@dataclass(frozen=True, repr=False)
class SignedRankTest(Result):
    """Wilcoxon's signed-rank test of paired differences ``d = x - y`` (``H0``: symmetric about 0).

    Attributes:
        differences: ``[pair]`` the differences tested (float64).
        statistic: ``W+``, the sum of the ranks of the positive differences (midranks).
        pvalue: two-sided, exact over all ``2^n`` sign flips (zeros dropped).
        n: pairs with a nonzero difference.
        estimate: the Hodges-Lehmann estimate (median of the Walsh averages ``(d_i + d_j) / 2``).
        method: what was computed.
    """

    differences: np.ndarray
    statistic: float
    pvalue: float
    n: int
    estimate: float
    method: str = "Wilcoxon signed-rank, exact over all sign flips (midranks, zeros dropped)"

    def pvalue_at(self, shift: float) -> float:
        """The same test of ``H0``: the differences are symmetric about ``shift``."""
        return _signed_rank_p(self.differences - shift)[1]

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """The shifts the same test does not reject at ``1 - level``: the exact Hodges-Lehmann interval
        (infinite on a side where no shift is rejected: with ``n <= 5`` pairs nothing is at 5%)."""
        alpha = 1 - _check_level(level)
        scale = float(np.ptp(self.differences)) / 8 or 1.0
        return _invert(self.pvalue_at, self.estimate, scale, alpha)

    def __repr__(self) -> str:
        ci = self.confidence_interval()
        return (f"SignedRankTest(W+ = {self.statistic:g}, n = {self.n}, p = {self.pvalue:.4g}; Hodges-Lehmann "
                f"{self.estimate:.4g}, 95% CI [{ci.low:.4g}, {ci.high:.4g}] inverting the same test)")


def signed_rank_test(x: ArrayLike, y: ArrayLike | None = None) -> SignedRankTest:
    """Exact Wilcoxon signed-rank test of ``x - y`` (or of ``x`` alone) with its matched interval."""
    xa = np.asarray(x, dtype=float).ravel()
    d = xa - np.asarray(y, dtype=float).ravel() if y is not None else xa
    if d.size < 1 or not np.all(np.isfinite(d)):
        raise ThermoLensInputError("signed_rank_test: need at least one finite paired difference")
    w, p, n = _signed_rank_p(d)
    walsh = (d[:, None] + d[None, :])[np.triu_indices(d.size)] / 2
    return SignedRankTest(differences=d.astype(np.float64), statistic=w, pvalue=p, n=n,
                          estimate=float(np.median(walsh)))


# ============================================================================ logistic slope

_MAX_LABELINGS = 200_000


@dataclass(frozen=True, repr=False)
class LogisticExact(Result):
    """Exact conditional test of the slope of a logistic regression of ``y`` on ``x``.

    Conditioning on ``k = sum y`` removes the intercept: under ``H0: beta = 0`` every labeling with
    ``k`` positives is equally likely, and ``T = sum x_i y_i`` is the slope's sufficient statistic.

    Attributes:
        x, y: the data (``y`` 0/1).
        statistic: the observed ``T``.
        pvalue: ``P(T >= t)`` (``alternative="greater"``), ``P(T <= t)`` (``"less"``) or the doubled
            smaller tail (``"two-sided"``), exact over all ``C(n, k)`` labelings (or Monte Carlo).
        alternative, method: as computed.
        separated: True when ``t`` is an end of the support: the classes are separated by ``x``
            and the maximum-likelihood slope is infinite.
    """

    x: np.ndarray
    y: np.ndarray
    statistic: float
    pvalue: float
    alternative: str
    method: str
    separated: bool

    def _support(self) -> np.ndarray | None:
        n, k = self.x.size, int(self.y.sum())
        if math.comb(n, k) > _MAX_LABELINGS:
            return None
        idx = np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
        return self.x[idx].sum(axis=1)

    def pvalue_at(self, slope: float) -> float:
        """The same test of ``H0: beta = slope`` (needs the exact distribution)."""
        ts = self._support()
        if ts is None:
            return math.nan
        return _tail_p(ts, self.statistic, slope, self.alternative)

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """Slopes the same test does not reject: ``[low, inf)`` for ``"greater"``, ``(-inf, high]``
        for ``"less"``, both ends for ``"two-sided"``. NaN under Monte Carlo."""
        alpha = 1 - _check_level(level)
        ts = self._support()
        if ts is None:
            return ConfidenceInterval(math.nan, math.nan)
        scale = 1.0 / (float(np.std(self.x)) or 1.0)
        lo, hi = _invert(lambda b: _tail_p(ts, self.statistic, b, self.alternative), 0.0, scale, alpha,
                         limit=1e4 * scale)
        if _tail_p(ts, self.statistic, 0.0, self.alternative) <= alpha:  # 0 rejected: start inside the set
            est = self._median_unbiased()
            lo, hi = _invert(lambda b: _tail_p(ts, self.statistic, b, self.alternative), est, scale, alpha,
                             limit=1e4 * scale)
        return ConfidenceInterval(lo, hi)

    def _median_unbiased(self) -> float:
        ts = self._support()
        assert ts is not None  # only called with the exact distribution
        scale = 1.0 / (float(np.std(self.x)) or 1.0)
        for b in np.arange(-200, 201) * scale / 4:
            if _tail_p(ts, self.statistic, float(b), self.alternative) > 0.5:
                return float(b)
        return 0.0

    def __repr__(self) -> str:
        ci = self.confidence_interval()
        return (f"LogisticExact(T = sum x*y = {self.statistic:.4g}, p = {self.pvalue:.4g} ({self.alternative}; "
                f"{self.method}), 95% CI of the slope [{ci.low:.4g}, {ci.high:.4g}]"
                f"{'; separated: no finite MLE' if self.separated else ''})")


def _tail_p(ts: np.ndarray, t: float, beta: float, alternative: str) -> float:
    w = beta * (ts - ts.max())
    w = np.exp(w - w.max())
    w = w / w.sum()
    tol = _TOL * max(1.0, abs(t))
    upper = float(w[ts >= t - tol].sum())
    lower = float(w[ts <= t + tol].sum())
    if alternative == "greater":
        return upper
    if alternative == "less":
        return lower
    return min(1.0, 2 * min(upper, lower))


def logistic_exact_test(x: ArrayLike, y: ArrayLike, alternative: str = "two-sided", seed: int = 0,
                        n_resamples: int = 20_000) -> LogisticExact:
    """Exact conditional test of ``beta = 0`` in ``logit P(y = 1) = a + beta x`` (see :class:`LogisticExact`).

    All ``C(n, k)`` labelings are enumerated up to 200,000; above, ``n_resamples`` random ones
    with ``seed`` (the method says so, and the interval is NaN).
    """
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y).ravel()
    if xa.shape != ya.shape or xa.size < 2 or not np.all(np.isfinite(xa)) or not np.all(np.isin(ya, (0, 1))):
        raise ThermoLensInputError("logistic_exact_test: x finite, y 0/1, equal lengths >= 2")
    if alternative not in ("two-sided", "greater", "less"):
        raise ThermoLensInputError(f"logistic_exact_test: alternative {alternative!r}")
    ya = ya.astype(int)
    n, k = xa.size, int(ya.sum())
    t = float(xa[ya == 1].sum())
    total = math.comb(n, k)
    if total <= _MAX_LABELINGS:
        idx = np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
        ts = xa[idx].sum(axis=1)
        how = f"exact conditional (all {total} labelings with {k} positives)"
    else:
        rng = np.random.default_rng(seed)
        labs = rng.permuted(np.tile(ya, (n_resamples, 1)), axis=1)
        ts = labs @ xa
        how = f"Monte Carlo conditional ({n_resamples} labelings, seed {seed})"
    tol = _TOL * max(1.0, abs(t))
    separated = bool(k not in (0, n) and (t >= ts.max() - tol or t <= ts.min() + tol))
    return LogisticExact(x=xa, y=ya, statistic=t, pvalue=_tail_p(ts, t, 0.0, alternative),
                         alternative=alternative, method=how, separated=separated)


# ============================================================================ two means

@dataclass(frozen=True, repr=False)
class MeanDifference(Result):
    """Difference of two means ``mean(u) - mean(v)``, permutation p and the interval inverting it.

    Attributes:
        u, v: the two samples.
        statistic: ``mean(u) - mean(v)``.
        pvalue: two-sided ``P(|D_perm| >= |D_obs|)`` over all splits (exact up to 20,000; else
            Monte Carlo with ``seed``).
        method: what was computed.
    """

    u: np.ndarray
    v: np.ndarray
    statistic: float
    pvalue: float
    method: str
    seed: int = 0

    def _splits(self) -> np.ndarray:
        n, m = self.u.size, self.u.size + self.v.size
        total = math.comb(m, n)
        if total <= 20_000:
            idx = np.array(list(combinations(range(m), n)), dtype=np.int64).reshape(-1, n)
            mask = np.zeros((total, m), dtype=bool)
            np.put_along_axis(mask, idx, True, axis=1)
            return mask
        rng = np.random.default_rng(self.seed)
        base = np.r_[np.ones(n, bool), np.zeros(m - n, bool)]
        return rng.permuted(np.tile(base, (20_000, 1)), axis=1)

    def pvalue_at(self, shift: float, _splits: np.ndarray | None = None) -> float:
        """The same test of ``H0``: ``u - shift`` and ``v`` are exchangeable (a shift model)."""
        z = np.r_[self.u - shift, self.v]
        mask = self._splits() if _splits is None else _splits
        n, m = self.u.size, z.size
        d = (mask @ z) / n - ((~mask) @ z) / (m - n)
        obs = abs(float(np.mean(self.u - shift) - np.mean(self.v)))
        return float(np.mean(np.abs(d) >= obs - _TOL * max(1.0, obs)))

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """Shifts the permutation test does not reject at ``1 - level`` (infinite where none is)."""
        alpha = 1 - _check_level(level)
        mask = self._splits()
        scale = float(np.std(np.r_[self.u, self.v])) / 4 or 1.0
        return _invert(lambda s: self.pvalue_at(s, mask), self.statistic, scale, alpha)

    def __repr__(self) -> str:
        ci = self.confidence_interval()
        return (f"MeanDifference({self.statistic:.4g}, p = {self.pvalue:.4g} ({self.method}), "
                f"95% CI [{ci.low:.4g}, {ci.high:.4g}] inverting the same test)")


def permutation_mean_difference(u: ArrayLike, v: ArrayLike, seed: int = 0) -> MeanDifference:
    """Permutation test of ``mean(u) = mean(v)`` with its shift-model interval (see :class:`MeanDifference`)."""
    ua, va = np.asarray(u, dtype=float).ravel(), np.asarray(v, dtype=float).ravel()
    if ua.size < 1 or va.size < 1 or not (np.all(np.isfinite(ua)) and np.all(np.isfinite(va))):
        raise ThermoLensInputError("permutation_mean_difference: two non-empty finite samples")
    total = math.comb(ua.size + va.size, ua.size)
    how = (f"exact permutation (all {total} splits)" if total <= 20_000
           else f"Monte Carlo permutation (20000 splits, seed {seed})")
    res = MeanDifference(u=ua, v=va, statistic=float(ua.mean() - va.mean()), pvalue=math.nan, method=how, seed=seed)
    return MeanDifference(u=ua, v=va, statistic=res.statistic, pvalue=res.pvalue_at(0.0), method=how, seed=seed)


# ============================================================================ sign flips

#: Largest ``n`` the exact sign-flip test enumerates (``2^16`` patterns).
SIGN_FLIP_MAX_N = 16
_TIE_RTOL = 1e-9  # ties of |mean| relative to the data's scale (rounding is ~ n * 1e-16 of it)


def _sign_patterns(n: int) -> np.ndarray:
    """All ``2**n`` sign vectors, ``[2**n, n]``."""
    idx = np.arange(2 ** n)[:, None]
    return np.where((idx >> np.arange(n)[None, :]) & 1, -1.0, 1.0)


def sign_flip_pvalue(d: ArrayLike, shift: float = 0.0) -> float:
    """Exact two-sided sign-flip p of ``H0``: the differences ``d - shift`` are symmetric about 0.

    The share of all ``2^n`` sign patterns ``s`` whose ``|mean(s * (d - shift))|`` reaches the
    observed ``|mean(d - shift)|``. Patterns that tie with the observed one count; a tie is judged
    relative to the data's own scale (``1e-9`` of ``mean |d - shift|``, far above float64 rounding
    and far below any real difference), so ``p(c * d) = p(d)`` for every scale ``c > 0``. NaN for
    ``n = 0``, ``n > 16`` or non-finite data.
    """
    x = np.asarray(d, dtype=float).ravel() - shift
    n = x.size
    if n == 0 or n > SIGN_FLIP_MAX_N or not np.all(np.isfinite(x)):
        return float("nan")
    scale = float(np.mean(np.abs(x)))
    stats_ = np.abs(_sign_patterns(n) @ x) / n
    observed = abs(float(x.mean()))
    return float(np.mean(stats_ >= observed - _TIE_RTOL * scale))
