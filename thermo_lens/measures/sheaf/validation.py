"""Argument checks shared by the sheaf modules: conventions, trace formulas, indices, ``W_V``.

Every check raises :class:`~thermo_lens.core.model.ThermoLensInputError` with what was wrong and what
to pass instead, before any compute.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError

Convention = Literal["directed", "symmetrized"]
TraceFormula = Literal["off_diagonal_mass", "paper_printed"]

CONVENTIONS: tuple[str, ...] = ("directed", "symmetrized")
TRACE_FORMULAS: tuple[str, ...] = ("off_diagonal_mass", "paper_printed")

#: Largest ``n * d_model`` (rows of the Laplacian) that ``.dense()`` builds without being asked.
DENSE_LIMIT = 4096

_EPS = float(torch.finfo(torch.float64).eps)


def _check_convention(convention: object) -> str:
    if convention not in CONVENTIONS:
        raise ThermoLensInputError(
            f"unknown sheaf convention {convention!r}; choose 'directed' (restriction maps "
            "sqrt(A_ij) W_V, the paper's reading) or 'symmetrized' (sqrt((A_ij + A_ji)/2) W_V on "
            "both ends of each edge)"
        )
    return str(convention)


def _as_float64(x: object, what: str) -> Tensor:
    if isinstance(x, Tensor):
        t = x.detach().to("cpu")
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except Exception as err:  # noqa: BLE001 - re-raised with a clearer message
            raise ThermoLensInputError(f"{what} must be a tensor or array, got {type(x).__name__}") from err
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise ThermoLensInputError(f"{what} must hold real numbers, got dtype {t.dtype}")
    return t.to(torch.float64)


def _check_edge(i: object, j: object, n: int) -> tuple[int, int]:
    ints = []
    for name, v in (("i", i), ("j", j)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ThermoLensInputError(f"token index {name} must be an integer, got {v!r}")
        if not 0 <= int(v) < n:
            raise ThermoLensInputError(f"token index {name}={v} is out of range for a prompt of {n} tokens (0..{n - 1})")
        ints.append(int(v))
    if ints[0] == ints[1]:
        raise ThermoLensInputError(
            f"there is no edge {{{i}, {j}}}: the base graph is the complete graph on the tokens "
            "without self-loops (A_ii enters the Laplacian only through the row sums); pass i != j"
        )
    return ints[0], ints[1]


def _check_dense(size: int, max_size: int, what: str, detail: str) -> None:
    if size > max_size:
        raise ThermoLensInputError(
            f"dense() would build {what} as a {size} x {size} float64 matrix ({detail}; "
            f"{size * size * 8 / 2**30:.2f} GiB), above max_size={max_size} rows. Use the factored "
            f"methods (.trace(), .eigenvalues(), L @ x) instead, or call .dense(max_size={size}) "
            "if you really want it."
        )


def _check_index(value: object, n: int, what: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ThermoLensInputError(f"{what} must be an integer, got {value!r}")
    v = int(value)
    if not -n <= v < n:
        raise ThermoLensInputError(f"{what}={value} is out of range: {hint} (0..{n - 1}, or negative from the end)")
    return v % n


def _check_W_V(W_V: Tensor, view: ModelView) -> Tensor:
    shape = tuple(W_V.shape)
    L, d, dh = view.n_layers, view.d_model, view.d_head
    if shape == (L, view.n_kv_heads, d, dh):
        return W_V
    if shape == (L, view.n_heads, d, dh) and view.n_kv_heads != view.n_heads:
        # Per-query-head W_V (repeated): take one query head per KV head.
        first = [int(torch.nonzero(view.kv_head_of == k)[0]) for k in range(view.n_kv_heads)]
        return W_V[:, first]
    raise ThermoLensInputError(
        f"W_V has shape {shape}; expected [layer, kv_head, d_model, d_head] = "
        f"{[L, view.n_kv_heads, d, dh]} (ModelView(model).W_V())"
    )


def _check_formula(formula: object, *, warn: bool = True, stacklevel: int = 3) -> str:
    if formula not in TRACE_FORMULAS:
        raise ThermoLensInputError(
            f"unknown trace formula {formula!r}; choose 'off_diagonal_mass' ((n - sum_i A_ii) "
            "||W_V||_F^2, the trace of the sheaf Laplacian) or 'paper_printed' (the paper's eq. 4, "
            "identically zero for softmax attention)"
        )
    if formula == "paper_printed" and warn:
        warnings.warn(
            "formula='paper_printed' computes the paper's printed eq. 4, (sum_ij A_ij - n) ||W_V||_F^2, "
            "which is identically 0 for softmax attention (every row of A sums to 1); what remains "
            "is float rounding. The paper's notebooks computed formula='off_diagonal_mass', "
            "(n - sum_i A_ii) ||W_V||_F^2, the actual trace of the sheaf Laplacian.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return str(formula)
