"""What every law result carries: one declared primary test, a secondary family, sensitivity tests.

A law is a handful of tests on a handful of models (8 Pythia, 16 survey models). Each test is a
:class:`StatTest`: the test, ``n``, an effect size with its 95% CI, the p-value that is valid at
that ``n`` (exact or permutation where the sample is small), and a leave-one-out sensitivity:
which single model moves the statistic most, and which one, left out, weakens the result most.

Every law declares its tests' roles (``thermo_lens.definitions`` §5):

- ``"primary"``: the one test of the paper's claim, declared before looking; not adjusted.
- ``"secondary"``: further hypotheses, each a *distinct* null; Holm adjusts over them (the family).
- ``"sensitivity"``: the same null as a primary or secondary test, by another statistic (Spearman
  beside Pearson, the logistic slope beside the threshold rule, another labelling); reported
  beside it, never counted again in a family (``pvalue_holm`` NaN).

Law results subclass :class:`thermo_lens.core.result.Result`, so they round-trip through JSON exactly;
``repr`` is ``summary()``, which prints the tests by role.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from thermo_lens.laws.table import _py
from thermo_lens.core.result import Result
from thermo_lens.stats import fisher_z_ci, format_p, holm, permutation_correlation_pvalue

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["LawResult", "StatTest", "TestResult", "CorrelationResult", "correlation",
           "tests_frame", "leave_one_out", "declare", "ROLES"]

#: Test roles, in display order (see the module docstring).
ROLES: tuple[str, ...] = ("primary", "secondary", "sensitivity")

_fmt_p = format_p  # the one p-value format (thermo_lens.stats.format_p)
_NAN = float("nan")


class LawResult(Result):
    """Base of the law results: JSON round-trip (``to_json``), ``to_dict()`` and ``repr = summary()``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly plain data (frames as lists of records)."""
        return {f.name: _py(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]  # subclasses are dataclasses

    def summary(self) -> str:  # pragma: no cover - overridden
        return type(self).__name__

    def __repr__(self) -> str:
        return self.summary()

    @property
    def tests(self) -> tuple["StatTest", ...]:
        """The law's tests (empty for results without any)."""
        return tuple(getattr(self, "stat_tests", ()) or ())

    @property
    def primary(self) -> "StatTest | None":
        """The declared primary test (None when the data cannot carry one)."""
        return next((t for t in self.tests if t.role == "primary"), None)

    def tests_by_role(self, role: str) -> tuple["StatTest", ...]:
        """The tests of one role: ``"primary"``, ``"secondary"`` or ``"sensitivity"``."""
        return tuple(t for t in self.tests if t.role == role)

    def tests_summary(self) -> list[str]:
        """The tests as indented lines, grouped by role, with what Holm was applied over."""
        lines = []
        for role in ROLES:
            ts = self.tests_by_role(role)
            if not ts:
                continue
            head = {"primary": "primary test (declared; not adjusted)",
                    "secondary": f"secondary tests ({len(ts)} distinct null(s); Holm over them)",
                    "sensitivity": "sensitivity (a null already tested above, by another statistic; not adjusted)"}[role]
            lines.append(f"  {head}:")
            lines += [f"    {t.summary()}" for t in ts]
        return lines

    def tests_frame(self) -> pd.DataFrame:
        """One row per test: see :class:`StatTest`."""
        return tests_frame(self.tests)


@dataclass(frozen=True, repr=False, eq=False)
class StatTest(LawResult):
    """One test of a law, with everything a reader needs to weigh it.

    Attributes:
        family: the law it belongs to (Holm adjusts over the tests of one family).
        name: what is tested (``"gain vs rho: Pearson"``).
        test: the test and its null (``"Pearson r, t test (exact under bivariate normality)"``).
        n: number of models (or pairs).
        statistic: the test statistic (r, odds ratio, accuracy, ...).
        effect, effect_value, ci_low, ci_high: the effect-size name, value and its 95% CI.
        pvalue, pvalue_method: the p-value used for inference and how it was computed
            (exact / permutation at small n).
        pvalue_other, pvalue_other_method: a second p-value for comparison (e.g. Spearman's
            t approximation beside the exact permutation p), or NaN.
        pvalue_holm: Holm-adjusted ``pvalue`` over the family.
        loo_model, loo_statistic, loo_pvalue: the model whose removal changes ``statistic`` the
            most, and the statistic and p without it.
        loo_worst_model, loo_worst_pvalue: the model whose removal gives the largest p.
        note: caveats (separation, ties, n = 1 groups, ...).
        role: ``"primary"``, ``"secondary"`` or ``"sensitivity"`` (see the module docstring).
        hypothesis: the null in words; two tests with the same null are one hypothesis.
        ci_method: what the interval is and whether it inverts the test behind ``pvalue``.
        alternative: ``"two-sided"``, ``"greater"`` or ``"less"`` (of ``pvalue``).
    """

    family: str
    name: str
    test: str
    n: int
    statistic: float
    effect: str
    effect_value: float
    ci_low: float
    ci_high: float
    pvalue: float
    pvalue_method: str
    pvalue_other: float = _NAN
    pvalue_other_method: str = ""
    pvalue_holm: float = _NAN
    loo_model: str = ""
    loo_statistic: float = _NAN
    loo_pvalue: float = _NAN
    loo_worst_model: str = ""
    loo_worst_pvalue: float = _NAN
    note: str = ""
    role: str = "secondary"
    hypothesis: str = ""
    ci_method: str = ""
    alternative: str = "two-sided"

    @property
    def loo_change(self) -> float:
        """Largest change of the statistic when one model is left out (``loo - full``)."""
        return self.loo_statistic - self.statistic

    def row(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["loo_change"] = self.loo_change
        return d

    def summary(self) -> str:
        ci = (f" [{self.ci_low:.3g}, {self.ci_high:.3g}]" if np.isfinite(self.ci_low) or np.isfinite(self.ci_high)
              else "")
        other = (f"; {self.pvalue_other_method} p={_fmt_p(self.pvalue_other)}"
                 if np.isfinite(self.pvalue_other) else "")
        loo = ""
        if self.loo_model:
            loo = (f"; leave-one-out: without {self.loo_model} {self.loo_statistic:.3g} "
                   f"(p={_fmt_p(self.loo_pvalue)})")
            if self.loo_worst_model and self.loo_worst_model != self.loo_model:
                loo += f", weakest without {self.loo_worst_model} (p={_fmt_p(self.loo_worst_pvalue)})"
        note = f"; {self.note}" if self.note else ""
        holm = f", Holm p={_fmt_p(self.pvalue_holm)}" if self.role == "secondary" else ""
        side = "" if self.alternative == "two-sided" else f", one-sided ({self.alternative})"
        cim = f" ({self.ci_method})" if self.ci_method and ci else ""
        return (f"{self.name}: {self.effect} = {self.effect_value:.4g}{ci}{cim}, n={self.n}, "
                f"p={_fmt_p(self.pvalue)} ({self.pvalue_method}{side}{other}){holm}"
                f"{loo}{note}")


def tests_frame(tests: Sequence[StatTest]) -> pd.DataFrame:
    """A frame with one row per :class:`StatTest`."""
    return pd.DataFrame([t.row() for t in tests])


def declare(tests: Sequence[StatTest]) -> tuple[StatTest, ...]:
    """The tests in role order with ``pvalue_holm`` filled by role.

    At most one ``primary`` (its own family: ``pvalue_holm = pvalue``); Holm over the
    ``secondary`` tests, which must test distinct nulls (``hypothesis``); NaN for ``sensitivity``
    tests, whose null is already one of the others'. Raises ``ValueError`` on a second primary,
    an unknown role or two secondary tests of one null: a law that declares them is wrong.
    """
    roles = [t.role for t in tests]
    if any(r not in ROLES for r in roles) or roles.count("primary") > 1:
        raise ValueError(f"declare: roles must be one primary and any of {ROLES[1:]}, got {roles}")
    sec = [t for t in tests if t.role == "secondary"]
    nulls = [t.hypothesis or t.name for t in sec]
    if len(set(nulls)) != len(nulls):
        raise ValueError(f"declare: two secondary tests of one null ({nulls}); make one a sensitivity test")
    adj = iter(holm([t.pvalue for t in sec])) if sec else iter(())
    out = []
    for role in ROLES:
        for t in tests:
            if t.role == role:
                h = t.pvalue if role == "primary" else (float(next(adj)) if role == "secondary" else _NAN)
                out.append(replace(t, pvalue_holm=h))
    return tuple(out)


def leave_one_out(labels: Sequence[str], fn: Callable[[np.ndarray], tuple[float, float]],
                  statistic: float) -> dict[str, Any]:
    """Recompute ``(statistic, p) = fn(keep_mask)`` leaving out each row in turn.

    Returns ``loo_model/loo_statistic/loo_pvalue`` (largest ``|change|`` of the statistic; infinite
    statistics compare by their p) and ``loo_worst_model/loo_worst_pvalue`` (largest p).
    """
    n = len(labels)
    best = (-1.0, "", _NAN, _NAN)
    worst = (-1.0, "", _NAN)
    for i in range(n):
        keep = np.ones(n, dtype=bool)
        keep[i] = False
        try:
            s, p = fn(keep)
        except ValueError:  # e.g. a constant column or a single class without this row
            continue
        if math.isnan(s):  # undefined without this row (e.g. its group is empty): no statistic
            change = -math.inf
        elif np.isfinite(s) and np.isfinite(statistic):
            change = abs(s - statistic)
        else:
            change = 0.0 if s == statistic else math.inf
        if change > best[0]:
            best = (change, str(labels[i]), float(s), float(p))
        if np.isfinite(p) and p > worst[0]:
            worst = (float(p), str(labels[i]), float(p))
    return {"loo_model": best[1], "loo_statistic": best[2], "loo_pvalue": best[3],
            "loo_worst_model": worst[1], "loo_worst_pvalue": worst[2]}


# --------------------------------------------------------------------------------------------
# correlation


@dataclass(frozen=True, repr=False)
class TestResult(LawResult):
    """One test statistic and its p-value (like scipy's result objects)."""

    statistic: float
    pvalue: float
    method: str = ""

    def summary(self) -> str:
        return f"TestResult({self.method}: statistic={self.statistic:.4f}, pvalue={_fmt_p(self.pvalue)})"


@dataclass(frozen=True, repr=False)
class CorrelationResult(LawResult):
    """Pearson and Spearman correlation of ``y`` on ``x`` over ``n`` models.

    ``statistic``/``pvalue``: Pearson's r and its two-sided p (``scipy.stats.pearsonr``: exact
    under bivariate normality); ``ci_low``/``ci_high`` its 95% CI (Fisher z);
    ``pvalue_permutation`` the two-sided permutation p (exact over all ``n!`` pairings for
    ``n <= 9``). ``spearman_statistic``/``spearman_pvalue``: Spearman's rho and scipy's
    t-approximation p; ``spearman_pvalue_exact`` its permutation p (exact for ``n <= 9``: at
    ``n = 8`` the t approximation is too small, e.g. 0.0014 vs 0.0036) and
    ``spearman_ci_low``/``spearman_ci_high`` a Fisher-z CI with the Fieller variance 1.06/(n-3).
    ``permutation_method`` says how the permutation p-values were made.
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
    pvalue_permutation: float = _NAN
    spearman_pvalue_exact: float = _NAN
    spearman_ci_low: float = _NAN
    spearman_ci_high: float = _NAN
    permutation_method: str = ""

    @property
    def pearson(self) -> TestResult:
        return TestResult(self.statistic, self.pvalue, "pearson")

    @property
    def spearman(self) -> TestResult:
        return TestResult(self.spearman_statistic, self.spearman_pvalue, "spearman")

    def summary(self) -> str:
        return (f"CorrelationResult({self.y} vs {self.x}, n={self.n}: Pearson r={self.statistic:.4f} "
                f"(p={_fmt_p(self.pvalue)}, 95% CI [{self.ci_low:.3f}, {self.ci_high:.3f}]), "
                f"Spearman rho={self.spearman_statistic:.4f} (p={_fmt_p(self.spearman_pvalue_exact)} "
                f"permutation, {_fmt_p(self.spearman_pvalue)} t-approx.))")


def _check_xy(x: ArrayLike, y: ArrayLike, x_name: str, y_name: str) -> tuple[np.ndarray, np.ndarray]:
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
    return xa, ya


def correlation(x: ArrayLike, y: ArrayLike, x_name: str = "x", y_name: str = "y") -> CorrelationResult:
    """Pearson and Spearman correlation of two equal-length numeric vectors (>= 3, finite).

    Raises ``ValueError`` for fewer than 3 points, unequal lengths, NaN/inf or a constant vector
    (where r is undefined). See :class:`CorrelationResult` for the p-values and CIs.
    """
    from scipy import stats

    xa, ya = _check_xy(x, y, x_name, y_name)
    pr = stats.pearsonr(xa, ya)
    ci = pr.confidence_interval(0.95) if xa.size > 3 else None
    sr = stats.spearmanr(xa, ya)
    pp, how = permutation_correlation_pvalue(xa, ya, "pearson")
    sp, _ = permutation_correlation_pvalue(xa, ya, "spearman")
    slo, shi = fisher_z_ci(float(sr.statistic), xa.size, spearman=True)
    return CorrelationResult(
        x=x_name, y=y_name, n=int(xa.size),
        statistic=float(pr.statistic), pvalue=float(pr.pvalue),
        ci_low=float(ci.low) if ci is not None else _NAN,
        ci_high=float(ci.high) if ci is not None else _NAN,
        spearman_statistic=float(sr.statistic), spearman_pvalue=float(sr.pvalue),
        pvalue_permutation=pp, spearman_pvalue_exact=sp, spearman_ci_low=slo, spearman_ci_high=shi,
        permutation_method=how,
    )


def correlation_tests(family: str, label: str, x: np.ndarray, y: np.ndarray, labels: Sequence[str],
                      c: CorrelationResult, *, role: str = "secondary", hypothesis: str = "") -> list[StatTest]:
    """The Pearson test of one correlation (``role``) and Spearman's beside it (``"sensitivity"``:
    the same null, independence of ``x`` and ``y``, by ranks), each with leave-one-out.

    Pearson's p is the permutation p (exact over all ``n!`` pairings for ``n <= 9``: valid without
    normality at small ``n``), with the t test's p beside it; its interval is Fisher's z.
    """
    from scipy import stats

    # Leave-one-out p-values: exact up to 8 rows (the Pythia sweep), else 5,000 resamples (cost).
    def loo_pearson(keep):
        r = stats.pearsonr(x[keep], y[keep])
        return float(r.statistic), permutation_correlation_pvalue(x[keep], y[keep], "pearson", exact_max_n=8,
                                                                  n_resamples=5000)[0]

    def loo_spearman(keep):
        r = stats.spearmanr(x[keep], y[keep]).statistic
        return float(r), permutation_correlation_pvalue(x[keep], y[keep], "spearman", exact_max_n=8,
                                                        n_resamples=5000)[0]

    null = hypothesis or f"{label}: independent"
    zci = "Fisher z, approximate: it inverts the z test of atanh r, not the permutation test"
    pearson = StatTest(
        family=family, name=f"{label}: Pearson", test="Pearson r, permutation test", n=c.n,
        statistic=c.statistic, effect="r", effect_value=c.statistic, ci_low=c.ci_low, ci_high=c.ci_high,
        pvalue=c.pvalue_permutation, pvalue_method=c.permutation_method, pvalue_other=c.pvalue,
        pvalue_other_method="t test (exact under bivariate normality)", role=role, hypothesis=null, ci_method=zci,
        **leave_one_out(labels, loo_pearson, c.statistic))
    spearman = StatTest(
        family=family, name=f"{label}: Spearman", test="Spearman rank correlation, permutation test",
        n=c.n, statistic=c.spearman_statistic, effect="rho_s", effect_value=c.spearman_statistic,
        ci_low=c.spearman_ci_low, ci_high=c.spearman_ci_high, pvalue=c.spearman_pvalue_exact,
        pvalue_method=c.permutation_method, pvalue_other=c.spearman_pvalue,
        pvalue_other_method="t approximation", role="sensitivity", hypothesis=null,
        ci_method="Fisher z with the Fieller variance 1.06/(n-3), approximate",
        note=f"the same null as the Pearson test of {label}, by ranks",
        **leave_one_out(labels, loo_spearman, c.spearman_statistic))
    return [pearson, spearman]
