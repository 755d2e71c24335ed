"""Table coercion and measured regimes for the cross-model laws.

Every law takes a plain table with **one row per model**: a ``pandas.DataFrame``, a dict of
columns, or a list of dicts / objects with ``.to_row()`` / ``.to_dict()``. Bad input (missing
column, NaN, too few rows) raises ``ValueError`` naming the column and the rows.

Regimes (expander / dampener / neutral) always come from the measurement, never from a lab name:
:func:`regime_from_gain` (sign of ``G - 1``, or a confidence interval that excludes 1) and
:func:`add_regimes` (a t interval from mean, SD and number of prompts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np
import pandas as pd

from thermo_lens.stats import REGIMES, regime_from_ci, t_interval

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["REGIMES", "regime_from_gain", "gain_ci", "add_regimes"]

#: A per-model table as the laws take it: a DataFrame, a dict of columns, or rows (dicts, objects
#: with ``.to_row()`` / ``.to_dict()``, dataclasses).
Table: TypeAlias = Union[pd.DataFrame, Mapping[str, object], Iterable[object]]


def _as_frame(table: Table, func: str) -> pd.DataFrame:
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


def _py(v: object) -> object:
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
        return _py(v.to_dict() if hasattr(v, "to_dict") else dataclasses.asdict(v))
    return v


def regime_from_gain(gain: ArrayLike, ci_low: ArrayLike | None = None, ci_high: ArrayLike | None = None) -> str | np.ndarray:
    """Regime of a gain measurement: ``"expander"``, ``"dampener"`` or ``"neutral"``.

    With a confidence interval (``ci_low``, ``ci_high``): expander if ``ci_low > 1``, dampener if
    ``ci_high < 1``, neutral if the CI contains 1 (:func:`thermo_lens.stats.regime_from_ci`, the
    rule ``GainResult.regime`` uses). Without one, the paper's rule, the sign of ``G - 1``
    (``G > 1`` expander, ``G < 1`` dampener, ``G == 1`` neutral). Scalars give a ``str``, arrays
    an array of ``str``. Never derived from a lab name.
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
    return regime_from_ci(lo, hi, 1.0)


def gain_ci(mean: ArrayLike, std: ArrayLike, n: ArrayLike, std_ddof: int = 1,
            level: float = 0.95) -> tuple[np.float64, np.float64] | tuple[np.ndarray, np.ndarray]:
    """t-based confidence interval of a mean gain over ``n`` prompts (``numpy.float64`` for scalar
    input, arrays otherwise).

    ``SE = s / sqrt(n)`` with ``s`` the sample SD (ddof=1); a ``std`` computed with ddof=0 (as the
    paper's files are, ``np.std``) is converted first: ``s = std * sqrt(n / (n - 1))``. The CI is
    ``mean +- t_{level}(n-1) * SE`` (:func:`thermo_lens.stats.t_interval`); NaN where ``n < 2``.
    With 5 prompts the t quantile is ``t_4 = 2.78``: such a CI is wide, and a regime read from it
    is a statement about those 5 prompts only.
    """
    if std_ddof not in (0, 1):
        raise ValueError("gain_ci: std_ddof must be 0 or 1")
    if not 0 < level < 1:
        raise ValueError("gain_ci: level must be in (0, 1)")
    m = np.asarray(mean, dtype=float)
    s = np.asarray(std, dtype=float)
    k = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        s1 = s * np.sqrt(k / (k - 1)) if std_ddof == 0 else s
    lo, hi = t_interval(m, s1, k, level)
    if np.ndim(lo) == 0:
        return np.float64(lo), np.float64(hi)
    return np.asarray(lo), np.asarray(hi)


def add_regimes(table: Table, gain: str = "gain", std: str = "std", n: str = "n_prompts",
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
        return (regime_from_gain(g, _numeric(df, "ci_low", func), _numeric(df, "ci_high", func)),  # type: ignore[return-value]  # array input gives an array
                f"CI of {gain!r} (ci_low, ci_high)")
    return regime_from_gain(g), f"sign of {gain!r} - 1"  # type: ignore[return-value]  # array input gives an array


def _group_stats(x: np.ndarray, level: float = 0.95) -> dict[str, Any]:
    """n, mean, SD (ddof=1), SE and t CI of one group (NaN spread for n = 1)."""
    n = x.size
    mean = float(np.mean(x))
    sd = float(np.std(x, ddof=1)) if n > 1 else float("nan")
    se = sd / np.sqrt(n) if n > 1 else float("nan")
    lo, hi = t_interval(mean, sd, n, level)
    return {"n": n, "mean": mean, "sd": sd, "se": float(se), "ci_low": lo, "ci_high": hi,
            "min": float(np.min(x)), "max": float(np.max(x))}
