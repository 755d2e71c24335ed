"""The paper's L* prediction (eq. 6) and the trivial baselines it must beat.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", section 5.3, eq. 6:
``L* = L (0.11 + 0.012 L + 4.9 / H)`` with ``L`` blocks and ``H`` query heads per layer,
calibrated on 0-based argmax values; ALiBi models are out of its scope.

A prediction is only as good as its baselines. :data:`L_STAR_BASELINES` names the trivial
predictors reported beside eq. 6 everywhere (``half_depth = L/2`` needs no fit at all). On the
paper's own six validation models (its Fig. A2, values read off the plot) eq. 6 scores 15.70% under
the paper's ``|pred - emp| / L`` and ``L/2`` 15.97%; under the standard absolute percentage error
``|pred - emp| / emp`` ``L/2`` is better (23.1% vs 28.8%). Eq. 6 is quadratic in ``L``, so for
deep models it predicts ``L* > L``, outside the network (``L = 80, H = 64`` gives 91.7):
:func:`predicted_l_star` warns when that happens.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from thermo_lens._lazy import pandas as pd
from thermo_lens.errors import ThermoLensWarning

__all__ = ["PREDICTED_DEFINITION", "L_STAR_BASELINES", "predicted_l_star", "l_star_baselines",
           "l_star_comparison", "LStarBeyondDepthWarning"]

PREDICTED_DEFINITION = "L* = L * (0.11 + 0.012 L + 4.9 / H) (D'Elia 2026, eq. 6)"

#: Trivial L* predictors, reported beside eq. 6.
L_STAR_BASELINES: dict[str, str] = {
    "half_depth": "L* = L / 2 (no fit)",
    "constant_fraction_loo": "L* = c L, c = mean of emp/L over the *other* models (leave-one-out, so not in-sample)",
}


class LStarBeyondDepthWarning(ThermoLensWarning):
    """Eq. 6 predicted an L* outside the network (larger than its depth L)."""


def _positive_int(v: Any, what: str) -> int:
    from thermo_lens.errors import ThermoLensInputError

    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
        raise ThermoLensInputError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def predicted_l_star(n_layers: int, n_heads: int, *, warn: bool = True) -> float:
    """The paper's predicted L* (eq. 6): ``L * (0.11 + 0.012 L + 4.9 / H)``.

    Args:
        n_layers: ``L``, blocks in the model.
        n_heads: ``H``, (query) attention heads per layer.
        warn: emit :class:`LStarBeyondDepthWarning` when the prediction exceeds ``L`` (it does
            for deep models: ``L = 80, H = 64`` gives 91.7; the 0-based L* is at most ``L - 1``).

    Example: ``predicted_l_star(12, 12) == 12 * (0.11 + 0.144 + 4.9 / 12) = 7.948``.
    """
    L, H = _positive_int(n_layers, "n_layers"), _positive_int(n_heads, "n_heads")
    pred = L * (0.11 + 0.012 * L + 4.9 / H)
    if warn and pred > L:
        warnings.warn(f"eq. 6 predicts L* = {pred:.4g} for L = {L}, H = {H}: beyond the network's "
                      f"{L} blocks (the formula is quadratic in L; the paper validated it on models with L <= 24)",
                      LStarBeyondDepthWarning, stacklevel=2)
    return pred


def l_star_baselines(n_layers: int) -> dict[str, float]:
    """The fit-free baselines for one model: ``{"half_depth": L / 2}``."""
    return {"half_depth": _positive_int(n_layers, "n_layers") / 2.0}


def l_star_comparison(table: Any, empirical: str = "empirical", n_layers: str = "n_layers",
                      n_heads: str = "n_heads") -> pd.DataFrame:
    """Eq. 6 against the trivial baselines on a table of models with an empirical L*.

    ``table`` has one row per model with columns ``n_layers``, ``n_heads`` and ``empirical``
    (``model`` names rows if present). Returns one row per (model, predictor) with ``predicted``,
    ``paper_error = |pred - emp| / L`` and ``ape = |pred - emp| / emp`` (fractions), for the
    predictors ``eq6``, ``half_depth`` and ``constant_fraction_loo`` (:data:`L_STAR_BASELINES`);
    ``.groupby("predictor")[["paper_error", "ape"]].mean()`` gives the headline numbers.
    """
    df = pd.DataFrame(table).reset_index(drop=True)
    for c in (empirical, n_layers, n_heads):
        if c not in df.columns:
            raise ValueError(f"l_star_comparison: missing column {c!r}")
    L = df[n_layers].astype(float).to_numpy()
    H = df[n_heads].astype(int).to_numpy()
    emp = df[empirical].astype(float).to_numpy()
    if len(df) < 2 or not np.all(np.isfinite(emp)):
        raise ValueError("l_star_comparison: need >= 2 models with a finite empirical L*")
    frac = emp / L
    preds = {
        "eq6": np.array([predicted_l_star(int(a), int(b), warn=False) for a, b in zip(L, H)]),
        "half_depth": L / 2.0,
        "constant_fraction_loo": np.array([np.mean(np.delete(frac, i)) for i in range(len(L))]) * L,
    }
    names = df["model"].astype(str).tolist() if "model" in df.columns else [str(i) for i in range(len(df))]
    rows = []
    for pname, p in preds.items():
        for i in range(len(L)):
            rows.append({"model": names[i], "predictor": pname, "n_layers": int(L[i]), "n_heads": int(H[i]),
                         "empirical": emp[i], "predicted": float(p[i]),
                         "paper_error": abs(p[i] - emp[i]) / L[i],
                         "ape": abs(p[i] - emp[i]) / emp[i] if emp[i] != 0 else math.nan})
    return pd.DataFrame(rows)
