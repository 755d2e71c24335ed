"""Maximum-likelihood logistic regression of a binary outcome on one predictor (crowding's fit)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
from dataclasses import dataclass

import numpy as np

from thermo_lens.laws.base import LawResult, _fmt_p

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["LogisticFit", "logistic_fit"]


@dataclass(frozen=True, repr=False)
class LogisticFit(LawResult):
    """Maximum-likelihood logistic regression ``P(y = 1) = 1 / (1 + exp(-(intercept + slope * x)))``.

    Fitted by minimising the negative log-likelihood with ``scipy.optimize.minimize`` (Newton-CG,
    analytic gradient and Hessian). ``intercept_se``/``slope_se`` from the inverse observed
    information; ``slope_pvalue`` the Wald test; ``lr_statistic``/``lr_pvalue`` the likelihood-ratio
    test against the intercept-only model (chi-square, 1 df). ``x50 = -intercept / slope`` is the x
    where P = 0.5 (a fitted critical rho).

    If the classes are separated by x (perfectly, or with ties at the boundary), the maximum
    likelihood estimate does not exist: ``separated`` is True, ``slope`` is ``+-inf`` (its sign is
    the direction of the separation), ``intercept`` and the standard errors are NaN, ``x50`` is the
    midpoint of the gap, ``lr_statistic`` uses the supremum of the likelihood and ``lr_pvalue`` is
    NaN: the chi-square reference of the LR (and Wald) test needs a finite MLE, so no asymptotic p
    is valid. Use :func:`thermo_lens.stats.exact.logistic_exact_test` (the exact conditional test).
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

    def predict_proba(self, x: ArrayLike) -> np.ndarray | float:
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
                f"(p={_fmt_p(self.lr_pvalue) if np.isfinite(self.lr_pvalue) else 'not valid: separation'}), "
                f"x at P=0.5: {self.x50:.4g})")


def logistic_fit(x: ArrayLike, y: ArrayLike) -> LogisticFit:
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
    from scipy import optimize, stats

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
            slope_pvalue=nan, lr_statistic=lr, lr_pvalue=nan, loglik=ll,
            loglik_null=ll0, x50=float(np.mean(gap)), separated=True, converged=False, n=n,
            n_positive=k,
            note=("complete" if complete else "quasi-complete") + " separation: no finite MLE, no valid asymptotic p",
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
