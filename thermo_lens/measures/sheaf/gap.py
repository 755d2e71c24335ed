"""The spectral gap of a sheaf Laplacian and the explanation of why it is (usually) zero."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from thermo_lens.core.result import Result
from thermo_lens.measures.sheaf.validation import _EPS


@runtime_checkable
class _Factored(Protocol):
    """What :func:`gap_reason` reads of a factored Laplacian ``L = M (x) W_V W_V^T``."""

    @property
    def n(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def convention(self) -> str: ...
    @property
    def is_diagonal(self) -> bool: ...
    @property
    def M(self) -> torch.Tensor: ...


@dataclass(frozen=True, eq=False)
class SpectralGap(Result):
    """The spectral gap of a sheaf Laplacian, with the reason when it is trivially zero.

    Attributes:
        value: ``lambda_2(L)``, the second-smallest eigenvalue of the full Laplacian (counted with
            multiplicity; the algebraic-connectivity convention). Exactly 0 whenever
            ``dim ker L >= 2``, which is the rule, not the exception (see ``reason``).
        reason: why ``value`` is what it is, in words (which factor supplies the kernel).
        kernel_dim: ``dim ker L = n d_model - (#nonzero eig M) * rank(W_V)``.
        smallest_nonzero: the smallest nonzero eigenvalue of ``L``,
            ``min{mu > 0} * min{sigma_k(W_V) > 0}^2``: the rate at which sheaf diffusion
            ``dx/dt = -L x`` approaches the harmonic sections ``ker L``.
        graph_gap: ``lambda_2(M)``, the second-smallest eigenvalue of the token factor. Under
            ``"symmetrized"`` it is the algebraic connectivity of the attention graph
            ``w_ij = (A_ij + A_ji)/2`` (the meaningful "graph spectral gap"); under causal
            ``"directed"`` ``M = diag(1 - A_ii)`` and it is just a sorted degree. NaN for a
            multi-head total.
        size: ``n d_model`` (rows of ``L``).
        convention: the sheaf convention.
    """

    value: float
    reason: str
    kernel_dim: int
    smallest_nonzero: float
    graph_gap: float
    size: int
    convention: str

    def __float__(self) -> float:
        return float(self.value)

    def __iter__(self) -> Iterator[Any]:
        """``value, reason = L.spectral_gap()``."""
        return iter((self.value, self.reason))

    def __repr__(self) -> str:
        return (
            f"SpectralGap(lambda_2 = {self.value:.6g}, dim ker L = {self.kernel_dim} of {self.size}, "
            f"smallest nonzero = {self.smallest_nonzero:.6g}, graph gap lambda_2(M) = "
            f"{self.graph_gap:.6g}; {self.convention})\n  {self.reason}"
        )


def gap_reason(lap: _Factored, kernel: int, n_nz_mu: int, rank: int) -> str:
    """Why ``lambda_2`` of the Laplacian ``lap`` is what it is, in words (which factor supplies
    the kernel). ``kernel`` = ``dim ker L``, ``n_nz_mu`` = nonzero eigenvalues of ``M``,
    ``rank`` = ``rank(W_V)``."""
    n, d = lap.n, lap.d_model
    if lap.size < 2:
        return "L is 1 x 1: there is no second eigenvalue."
    parts = []
    if kernel >= 2:
        parts.append(f"lambda_2 = 0 trivially: dim ker L = {kernel} >= 2.")
    else:
        parts.append(f"dim ker L = {kernel} <= 1, so lambda_2 is a genuine eigenvalue.")
    if lap.convention == "directed" and lap.is_diagonal and n > 1:
        parts.append(
            "Causal attention gives A_ij A_ji = 0 for i != j, so M = diag(1 - A_ii) is diagonal: "
            "L is block-diagonal over tokens and couples no two tokens; its spectrum is "
            "{(1 - A_ii) sigma_k(W_V)^2} plus zeros."
        )
    if d > rank:
        parts.append(
            f"W_V^T has a kernel of dimension d_model - rank(W_V) = {d} - {rank} = {d - rank} "
            f"in every token's stalk ({n * (d - rank)} zero eigenvalue(s) in all): with d_head < d_model "
            "lambda_2 = 0 whatever the attention mask, causal or not."
        )
    zero_mu = n - n_nz_mu
    if zero_mu:
        if lap.is_diagonal:
            idx = torch.nonzero(lap.M.diagonal() <= 10 * n * _EPS * max(float(lap.M.abs().max()), 1e-300)).flatten().tolist()
            shown = ", ".join(map(str, idx[:8])) + (", ..." if len(idx) > 8 else "")
            parts.append(
                f"Token(s) [{shown}] attend only to themselves (A_ii = 1; token 0 always does under "
                f"causal attention), so their rows of M are zero and their whole stalk "
                f"R^{d} is in the kernel ({zero_mu * rank} zero eigenvalue(s) beyond the W_V kernel)."
            )
        elif lap.convention == "symmetrized":
            parts.append(
                f"M = L_graph(w) has {zero_mu} zero eigenvalue(s) (one per connected component of "
                f"the attention graph: the constant vectors), giving {zero_mu * rank} zero "
                f"eigenvalues of L; the meaningful gap is graph_gap = lambda_2(M)."
            )
        else:
            parts.append(f"M has {zero_mu} zero eigenvalue(s), giving {zero_mu * rank} zero eigenvalue(s) of L.")
    if kernel >= 2:
        parts.append("Use smallest_nonzero / nonzero_eigenvalues() for the informative part of the spectrum.")
    if lap.convention == "directed":
        parts.append("The nonzero spectrum reflects the row-sum weighting of the restriction maps "
                     "(M_ii = sum_{j != i} A_ij), a modelling choice: the column-sum reading has the same "
                     "trace and a different spectrum.")
    return " ".join(parts)
