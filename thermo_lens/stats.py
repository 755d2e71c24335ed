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

METHODS.md section 1 ("Across prompts: mean, SD (ddof=1, say so), SE, 95% CI"); D'Elia (2026),
"Thermodynamic Constraints in Transformer Architectures", Fig. 2 and 7 error bars.

>>> s = summarize([1.0, 1.2, 1.1])
>>> round(s.mean, 3), round(s.sd, 3), s.n
(1.1, 0.1, 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as _st

from thermo_lens.result import Result

__all__ = ["SummaryStats", "summarize"]

NanPolicy = Literal["propagate", "omit", "raise"]


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

    n: Any
    mean: Any
    sd: Any
    se: Any
    ci_low: Any
    ci_high: Any
    level: float = 0.95
    values: np.ndarray | None = None
    ddof: int = 1

    @property
    def ci(self) -> tuple[Any, Any]:
        """``(ci_low, ci_high)``."""
        return self.ci_low, self.ci_high

    @property
    def sd_ddof0(self) -> Any:
        """Population SD (``numpy.std`` default, ``ddof=0``), as the paper's result files store."""
        n = np.asarray(self.n, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(self.sd, dtype=float) * np.sqrt((n - 1) / n)
            out = np.where(n == 1, 0.0, out)
        return float(out) if out.ndim == 0 else out

    def excludes(self, value: float) -> Any:
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
    values: Any,
    *,
    axis: int = 0,
    level: float = 0.95,
    nan_policy: NanPolicy = "propagate",
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
        tcrit = _st.t.ppf(0.5 + level / 2.0, np.where(n >= 2, n - 1, np.nan))
        half = tcrit * se
        mean = np.where(n >= 1, mean, np.nan)

    def out(a: np.ndarray, integer: bool = False) -> Any:
        if a.ndim == 0:
            return int(a) if integer else float(a)
        return a.astype(np.int64) if integer else a.astype(np.float64)
    return SummaryStats(
        n=out(np.asarray(n), integer=True), mean=out(np.asarray(mean)), sd=out(np.asarray(sd)),
        se=out(np.asarray(se)), ci_low=out(np.asarray(mean - half)), ci_high=out(np.asarray(mean + half)),
        level=float(level), values=np.moveaxis(x, 0, axis).copy() if keep_values else None,
    )
