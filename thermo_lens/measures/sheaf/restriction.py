"""Restriction maps ``rho_ij = sqrt(c_ij) W_V`` of one head, kept lazy.

The edge coefficients ``c`` are ``A`` (``"directed"``) or ``(A + A^T)/2`` (``"symmetrized"``);
see :mod:`thermo_lens.measures.sheaf` for the sheaf they define.
"""

from __future__ import annotations

from typing import Iterator

from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.measures.sheaf.validation import _check_edge


def _edge_coefficients(A: Tensor, convention: str) -> Tensor:
    """``c [n, n]`` with ``rho_ij = sqrt(c_ij) W_V``; zero diagonal (no self-loops)."""
    c = A if convention == "directed" else (A + A.T) / 2
    return c.clone().fill_diagonal_(0.0)


class RestrictionMaps:
    """Lazy view of the restriction maps ``rho_ij = sqrt(c_ij) W_V`` of one head.

    ``maps[i, j]`` is the ``[d_model, d_head]`` map from token ``i``'s stalk to the edge stalk of
    ``{i, j}`` (``x_i -> x_i @ maps[i, j]``); ``c = A`` (``"directed"``) or ``(A + A^T)/2``
    (``"symmetrized"``). Nothing is materialised until indexed; iterating yields
    ``(i, j, rho_ij)`` over the ``n (n - 1)`` ordered pairs ``i != j`` (causal attention makes
    ``rho_ij = 0`` for ``j > i`` under ``"directed"``).

    Attributes:
        coefficients: ``[n, n]`` the scalars ``sqrt(c_ij)`` (zero diagonal).
        W_V: ``[d_model, d_head]``.
    """

    def __init__(self, coefficients: Float[Tensor, "n n"], W_V: Float[Tensor, "d_model d_head"], convention: str):
        self.coefficients = coefficients
        self.W_V = W_V
        self.convention = convention

    @property
    def n(self) -> int:
        return int(self.coefficients.shape[0])

    def __len__(self) -> int:
        return self.n * (self.n - 1)

    def __getitem__(self, ij: tuple[int, int]) -> Float[Tensor, "d_model d_head"]:
        try:
            i, j = ij
        except (TypeError, ValueError):
            raise ThermoLensInputError(f"index restriction maps with a pair: maps[i, j], got {ij!r}") from None
        i, j = _check_edge(i, j, self.n)
        return self.coefficients[i, j] * self.W_V

    def __iter__(self) -> Iterator[tuple[int, int, Tensor]]:
        for i in range(self.n):
            for j in range(self.n):
                if i != j:
                    yield i, j, self.coefficients[i, j] * self.W_V

    def __repr__(self) -> str:
        d_model, d_head = self.W_V.shape
        return (
            f"RestrictionMaps({self.n} tokens, {len(self)} maps rho_ij = sqrt(c_ij) W_V of shape "
            f"[{d_model}, {d_head}], {self.convention}; lazy)"
        )
