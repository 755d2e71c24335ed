"""The paper's L* prediction (eq. 6) and the fit-free baselines reported beside it.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", section 5.3, eq. 6:
``L* = L (0.11 + 0.012 L + 4.9 / H)`` with ``L`` blocks and ``H`` query heads per layer, calibrated
on 0-based argmax values; ALiBi models are outside its scope (``thermo_lens.definitions`` §4).
A formula of a measure, so it lives with the measure; :mod:`thermo_lens.paper.lstar` re-exports it
and compares it with the baselines on the paper's validation models.

Eq. 6 is quadratic in ``L``, so for deep models it predicts ``L* > L``, outside the network
(``L = 80, H = 64`` gives 91.7): :func:`predicted_l_star` warns when that happens.
"""

from __future__ import annotations

import warnings

import numpy as np

from thermo_lens.core.errors import ThermoLensInputError, ThermoLensWarning

__all__ = ["PREDICTED_DEFINITION", "L_STAR_BASELINES", "LStarBeyondDepthWarning", "predicted_l_star",
           "l_star_baselines"]

PREDICTED_DEFINITION = "L* = L * (0.11 + 0.012 L + 4.9 / H) (D'Elia 2026, eq. 6)"

#: Trivial L* predictors, reported beside eq. 6.
L_STAR_BASELINES: dict[str, str] = {
    "half_depth": "L* = L / 2 (no fit)",
    "constant_fraction_loo": "L* = c L, c = mean of emp/L over the *other* models (leave-one-out, so not in-sample)",
}


class LStarBeyondDepthWarning(ThermoLensWarning):
    """Eq. 6 predicted an L* outside the network (larger than its depth L)."""


def _positive_int(v: object, what: str) -> int:
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
