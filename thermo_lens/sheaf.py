"""Sheaf restriction maps, the factored sheaf Laplacian, and its trace per head.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", section 5 and appendix D; METHODS.md section 3 (where the two disagree, METHODS.md
is right).

One attention head ``h`` of layer ``l`` on one prompt of ``n`` tokens, with pattern
``A`` (``n x n``, ``A[i, j]`` = attention of query ``i`` to key ``j``, rows sum to 1) and value
weights ``W_V`` (``[d_model, d_head]``, TransformerLens convention ``v = x @ W_V``), defines a
cellular sheaf on the complete graph of the tokens:

* node stalks ``R^{d_model}`` (one per token), edge stalks ``R^{d_head}`` (one per unordered pair
  ``{i, j}``, ``i != j``; no self-loops);
* restriction map from token ``i`` to edge ``{i, j}``: ``rho_ij = sqrt(c_ij) W_V``, i.e.
  ``x_i -> sqrt(c_ij) x_i @ W_V`` (``F_i = sqrt(c_ij) W_V^T`` acting on column vectors), where
  the edge coefficients ``c`` depend on the named *convention*:

  ``"directed"`` (the paper's reading, default)
      ``c_ij = A_ij``: each end of an edge is weighted by its own attention to the other end.
  ``"symmetrized"``
      ``c_ij = c_ji = w_ij = (A_ij + A_ji) / 2`` on both ends of the edge.

* coboundary ``(delta x)_{ij} = rho_ji^T x_j - rho_ij^T x_i`` for ``i < j`` and the Laplacian
  ``L = delta^T delta`` (size ``n d_model``).

Because every map is a scalar times the same ``W_V``, ``L`` factors exactly (Kronecker product,
token-major ordering ``vec(X)`` of ``X [n, d_model]``)::

    L = M (x) S,   S = W_V W_V^T  [d_model, d_model],
    M_ii = sum_{j != i} c_ij,   M_ij = -sqrt(c_ij c_ji)   (i != j).

``directed``: ``M_ii = 1 - A_ii`` for row-stochastic ``A`` and ``M_ij = -sqrt(A_ij A_ji)``;
causal attention has ``A_ij A_ji = 0`` for ``i != j``, so ``M = diag(1 - A_ii)``: the Laplacian
is block-diagonal over tokens, couples no two tokens, and its spectrum is
``{(1 - A_ii) sigma_k(W_V)^2}`` plus zeros. ``symmetrized``: ``M = L_graph(w)``, the weighted
graph Laplacian of the attention graph, with a meaningful graph spectral gap. Both conventions
have the same trace::

    Tr L = Tr M * ||W_V||_F^2 = (sum_{i != j} A_ij) ||W_V||_F^2 = (n - sum_i A_ii) ||W_V||_F^2.

The paper's printed formula (its eq. 4) ``(sum_ij A_ij - n) ||W_V||_F^2`` is identically 0 for
softmax attention; its notebooks computed the off-diagonal-mass version above. Both are offered
by name in :func:`sheaf_traces`.

Multi-head (the paper's Proposition 1): the direct sum of the per-head sheaves has the
block-diagonal Laplacian ``diag(L^(1), ..., L^(H))``; traces add and the spectrum is the union
(:class:`LayerSheafLaplacian`). Note that this is a *construction*: if instead all heads share the
token stalks ``R^{d_model}`` and the edge stalk is the concatenation ``R^{H d_head}``, the
Laplacian is the *sum* ``sum_h M_h (x) W_V^h W_V^h^T`` (traces still add, the spectrum is not the
union): ``LayerSheafLaplacian.dense(structure="shared_stalks")``.

Cost: the trace needs only ``diag(A)`` and ``||W_V^h||_F^2`` (O(n) per head), so
:func:`sheaf_traces` reduces each pattern to its diagonal inside the forward hook
(:func:`thermo_lens.hooks.attention_diagonal`); the ``n x n`` pattern is kept only for the one
layer of :func:`sheaf_laplacian`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterator, Literal, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from thermo_lens.hooks import Collected, Recorder, attention_diagonal, collect
from thermo_lens.model import ModelView, ThermoLensInputError, TokenBatch, as_view, kv_head_map
from thermo_lens.result import Result

__all__ = [
    "CONVENTIONS",
    "TRACE_FORMULAS",
    "DENSE_LIMIT",
    "SheafLaplacian",
    "LayerSheafLaplacian",
    "RestrictionMaps",
    "SpectralGap",
    "SheafTraces",
    "sheaf_laplacian",
    "laplacian_from_collected",
    "attention_pattern",
    "sheaf_traces",
    "traces_from_collected",
]

Convention = Literal["directed", "symmetrized"]
TraceFormula = Literal["off_diagonal_mass", "paper_printed"]

CONVENTIONS: tuple[str, ...] = ("directed", "symmetrized")
TRACE_FORMULAS: tuple[str, ...] = ("off_diagonal_mass", "paper_printed")

#: Largest ``n * d_model`` (rows of the Laplacian) that ``.dense()`` builds without being asked.
DENSE_LIMIT = 4096

_EPS = float(torch.finfo(torch.float64).eps)

TRACE_DEFINITIONS = {
    "off_diagonal_mass": "Tr L = (n - sum_i A_ii) * ||W_V^h||_F^2  (sum over real tokens; "
                         "= Tr(delta^T delta), both conventions)",
    "paper_printed": "(sum_ij A_ij - n) * ||W_V^h||_F^2  (the paper's printed eq. 4; identically 0 "
                     "for softmax attention, up to float rounding)",
}
_TOKEN_SCOPE = "all real tokens (every query position 0..n-1 of each prompt; padding excluded)"


def _check_convention(convention: Any) -> str:
    if convention not in CONVENTIONS:
        raise ThermoLensInputError(
            f"unknown sheaf convention {convention!r}; choose 'directed' (restriction maps "
            "sqrt(A_ij) W_V, the paper's reading) or 'symmetrized' (sqrt((A_ij + A_ji)/2) W_V on "
            "both ends of each edge)"
        )
    return str(convention)


def _as_float64(x: Any, what: str) -> Tensor:
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


def _edge_coefficients(A: Tensor, convention: str) -> Tensor:
    """``c [n, n]`` with ``rho_ij = sqrt(c_ij) W_V``; zero diagonal (no self-loops)."""
    c = A if convention == "directed" else (A + A.T) / 2
    return c.clone().fill_diagonal_(0.0)


# ============================================================================ the factored Laplacian
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


def _check_edge(i: Any, j: Any, n: int) -> tuple[int, int]:
    for name, v in (("i", i), ("j", j)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ThermoLensInputError(f"token index {name} must be an integer, got {v!r}")
        if not 0 <= int(v) < n:
            raise ThermoLensInputError(f"token index {name}={v} is out of range for a prompt of {n} tokens (0..{n - 1})")
    if int(i) == int(j):
        raise ThermoLensInputError(
            f"there is no edge {{{i}, {j}}}: the base graph is the complete graph on the tokens "
            "without self-loops (A_ii enters the Laplacian only through the row sums); pass i != j"
        )
    return int(i), int(j)


@dataclass(frozen=True, eq=False)
class SheafLaplacian(Result):
    """The sheaf Laplacian ``L = M (x) W_V W_V^T`` of one head on one prompt, kept factored.

    In the style of TransformerLens' ``FactoredMatrix``: the ``n d_model x n d_model`` matrix is
    never formed unless asked (:meth:`dense`, small cases only). Build it from a model with
    :func:`sheaf_laplacian` or from raw inputs with :meth:`from_pattern`. See the module docstring
    for the sheaf, both conventions and the factorisation (D'Elia 2026, section 5; METHODS.md
    section 3).

    Attributes:
        pattern: ``[n, n]`` attention pattern ``A`` (query, key), float64.
        W_V: ``[d_model, d_head]`` value weights of the head (its KV head under GQA), float64.
        convention: ``"directed"`` or ``"symmetrized"``.
        layer, head, kv_head: where it came from (None for :meth:`from_pattern`).
        prompt, tokens: the prompt and its token strings (None when unknown).
        prepend_bos: BOS mode used to tokenize ``prompt``.
        model: the model's :meth:`ModelView.metadata` (dtype, weights raw/processed, post-LN...).

    Example::

        L = sheaf_laplacian(model, "The capital of France is", layer=3, head=5)
        L.trace(), L.eigenvalues(), L.spectral_gap()
        y = L @ x                      # x: [n, d_model] or [n * d_model]
        L.restriction_map(4, 1)        # sqrt(A_41) W_V
    """

    pattern: Float[Tensor, "n n"]
    W_V: Float[Tensor, "d_model d_head"]
    convention: str = "directed"
    layer: int | None = None
    head: int | None = None
    kv_head: int | None = None
    prompt: str | None = None
    tokens: tuple[str, ...] | None = None
    prepend_bos: Any = None
    model: dict | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pattern(
        cls,
        A: Float[Tensor, "n n"],
        W_V: Float[Tensor, "d_model d_head"],
        convention: Convention = "directed",
        **metadata: Any,
    ) -> "SheafLaplacian":
        """Build the Laplacian from a pattern ``A [n, n]`` and value weights ``W_V [d_model, d_head]``.

        ``A`` must be square, finite and non-negative (a softmax pattern; rows summing to 1 are
        *not* required: every method follows the coboundary definition, and the trace identity
        ``(n - sum_i A_ii) ||W_V||_F^2`` then reads ``(sum_{i != j} A_ij) ||W_V||_F^2``).
        ``metadata``: optional ``layer``, ``head``, ``kv_head``, ``prompt``, ``tokens``,
        ``prepend_bos``, ``model``.
        """
        convention = _check_convention(convention)
        A64, W64 = _as_float64(A, "the attention pattern A"), _as_float64(W_V, "W_V")
        if A64.ndim != 2 or A64.shape[0] != A64.shape[1] or A64.shape[0] < 1:
            raise ThermoLensInputError(
                f"the attention pattern must be a square [n, n] matrix (query, key) of one head, "
                f"got shape {tuple(A64.shape)}; for a hook_pattern [batch, head, q, k] take "
                "pattern[b, h]"
            )
        if not torch.isfinite(A64).all():
            raise ThermoLensInputError("the attention pattern contains NaN/inf (padding?); crop it to the real tokens")
        if (A64 < 0).any():
            raise ThermoLensInputError(
                f"the attention pattern has negative entries (min {A64.min().item():.3g}); restriction "
                "maps sqrt(A_ij) W_V need A_ij >= 0 (pass the softmax pattern, not the scores)"
            )
        if W64.ndim != 2 or 0 in W64.shape:
            raise ThermoLensInputError(
                f"W_V must be one head's [d_model, d_head] matrix, got shape {tuple(W64.shape)}; "
                "from a model: ModelView(model).W_V()[layer, kv_head]"
            )
        if not torch.isfinite(W64).all():
            raise ThermoLensInputError("W_V contains NaN/inf")
        unknown = set(metadata) - {"layer", "head", "kv_head", "prompt", "tokens", "prepend_bos", "model"}
        if unknown:
            raise TypeError(f"from_pattern() got unexpected keyword(s) {sorted(unknown)}")
        return cls(pattern=A64, W_V=W64, convention=convention, **metadata)

    # ------------------------------------------------------------------ factors
    @property
    def n(self) -> int:
        """Number of tokens."""
        return int(self.pattern.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.W_V.shape[0])

    @property
    def d_head(self) -> int:
        return int(self.W_V.shape[1])

    @property
    def size(self) -> int:
        """``n * d_model``: rows (and columns) of ``L``."""
        return self.n * self.d_model

    @property
    def shape(self) -> tuple[int, int]:
        return (self.size, self.size)

    @cached_property
    def edge_coefficients(self) -> Float[Tensor, "n n"]:
        """``c [n, n]``: ``rho_ij = sqrt(c_ij) W_V``; ``A`` or ``(A + A^T)/2``, zero diagonal."""
        return _edge_coefficients(self.pattern, self.convention)

    @cached_property
    def M(self) -> Float[Tensor, "n n"]:
        """Token factor ``M [n, n]``: ``M_ii = sum_{j != i} c_ij``, ``M_ij = -sqrt(c_ij c_ji)``.

        Symmetric positive semi-definite (``M = sum_{i<j} u u^T`` with
        ``u = sqrt(c_ji) e_j - sqrt(c_ij) e_i``). Directed + causal: ``diag(1 - A_ii)``;
        symmetrized: the graph Laplacian of ``w = (A + A^T)/2``.
        """
        c = self.edge_coefficients
        if self.convention == "symmetrized":
            off = -c
        else:
            off = -torch.sqrt(c * c.T)
        M = off.clone()
        M.diagonal().copy_(c.sum(dim=1))  # the off-diagonal row sum: exact 0 for a one-hot row
        return M

    @cached_property
    def is_diagonal(self) -> bool:
        """True when ``M`` is diagonal (causal attention under ``"directed"``): no token coupling."""
        M = self.M
        return bool((M - torch.diag(M.diagonal())).abs().max() == 0) if self.n > 1 else True

    @property
    def is_causal(self) -> bool:
        """True when the pattern is lower-triangular (no query attends to a later key)."""
        return bool(torch.triu(self.pattern, diagonal=1).abs().max() == 0) if self.n > 1 else True

    @cached_property
    def stalk(self) -> Float[Tensor, "d_model d_model"]:
        """Stalk factor ``S = W_V W_V^T [d_model, d_model]`` (formed lazily, float64)."""
        return self.W_V @ self.W_V.T

    @cached_property
    def _sigma(self) -> Tensor:
        """Singular values of ``W_V``, padded with zeros to ``d_model`` (descending)."""
        s = torch.linalg.svdvals(self.W_V)
        pad = self.d_model - s.numel()
        return torch.cat([s, s.new_zeros(pad)]) if pad > 0 else s[: self.d_model]

    @cached_property
    def _mu(self) -> Tensor:
        """Eigenvalues of ``M`` (ascending)."""
        if self.is_diagonal:
            return torch.sort(self.M.diagonal().clone()).values
        return torch.linalg.eigvalsh(self.M)

    def _factor_ranks(self) -> tuple[Tensor, Tensor]:
        """Masks of the nonzero eigenvalues of ``M`` and nonzero singular values of ``W_V``."""
        mu, s = self._mu, self._sigma
        mu_scale = float(mu.abs().max()) if mu.numel() else 0.0
        s_scale = float(s.max()) if s.numel() else 0.0
        nz_mu = mu > 10 * self.n * _EPS * mu_scale if mu_scale > 0 else torch.zeros_like(mu, dtype=torch.bool)
        nz_s = s > max(self.W_V.shape) * _EPS * s_scale if s_scale > 0 else torch.zeros_like(s, dtype=torch.bool)
        return nz_mu, nz_s

    @property
    def rank_W_V(self) -> int:
        return int(self._factor_ranks()[1].sum())

    # ------------------------------------------------------------------ FactoredMatrix-style API
    @property
    def off_diagonal_mass(self) -> float:
        """``Tr M = sum_{i != j} A_ij`` (= ``n - sum_i A_ii`` for row-stochastic ``A``)."""
        return float(self.M.diagonal().sum())

    def trace(self) -> float:
        """``Tr L = Tr M * ||W_V||_F^2 = (n - sum_i A_ii) ||W_V||_F^2`` (both conventions)."""
        return self.off_diagonal_mass * float(self.W_V.pow(2).sum())

    def norm(self) -> float:
        """Frobenius norm ``||L||_F = ||M||_F ||W_V W_V^T||_F`` (from the factors)."""
        return float(torch.linalg.matrix_norm(self.M)) * float(self._sigma.pow(4).sum().sqrt())

    def eigenvalues(self) -> Float[Tensor, "n_d_model"]:
        """The full spectrum of ``L`` (``n d_model`` values, ascending, float64), from the factors.

        ``eig(M (x) S) = {mu_a * sigma_k(W_V)^2}`` for the ``n`` eigenvalues ``mu_a`` of ``M`` and
        the ``d_model`` eigenvalues ``sigma_k^2`` of ``S = W_V W_V^T`` (``min(d_model, d_head)``
        squared singular values, then zeros: ``W_V^T`` has a kernel of dimension
        ``d_model - rank(W_V)``). Cost ``O(n^3 + d_model d_head^2)`` plus a sort (``O(n)`` for
        ``M`` diagonal, i.e. causal attention under ``"directed"``), instead of
        ``O((n d_model)^3)``.
        """
        ev = (self._mu[:, None] * self._sigma.pow(2)[None, :]).reshape(-1)
        return torch.sort(ev).values

    def nonzero_eigenvalues(self, tol: float | None = None) -> Float[Tensor, "nonzero"]:
        """The nonzero part of the spectrum (ascending).

        Args:
            tol: keep eigenvalues ``> tol``. Default (None): decide on the factors, keeping
                ``mu_a sigma_k^2`` for the numerically nonzero ``mu_a`` (``> 10 n eps max|mu|``) and
                ``sigma_k`` (``> max(d_model, d_head) eps sigma_max``, numpy's ``matrix_rank``
                rule), so structural zeros never leak in as round-off.
        """
        if tol is not None:
            ev = self.eigenvalues()
            return ev[ev > float(tol)]
        nz_mu, nz_s = self._factor_ranks()
        ev = (self._mu[nz_mu][:, None] * self._sigma[nz_s].pow(2)[None, :]).reshape(-1)
        return torch.sort(ev).values

    @property
    def kernel_dim(self) -> int:
        """``dim ker L = n d_model - (#nonzero eig M) * rank(W_V)`` (H^0, the global sections)."""
        nz_mu, nz_s = self._factor_ranks()
        return self.size - int(nz_mu.sum()) * int(nz_s.sum())

    def spectral_gap(self) -> SpectralGap:
        """``lambda_2(L)`` with the reason it is (usually trivially) zero; see :class:`SpectralGap`.

        Under causal ``"directed"`` attention the gap is trivially 0: ``M = diag(1 - A_ii)``,
        token 0 has ``A_00 = 1`` (a zero row, its whole stalk in the kernel), and ``W_V^T`` has a
        kernel of dimension ``d_model - d_head`` in every token's stalk. The informative numbers are
        the nonzero spectrum (:meth:`nonzero_eigenvalues`, ``smallest_nonzero``) and, under
        ``"symmetrized"``, the attention graph's gap ``graph_gap = lambda_2(M)``.
        """
        nz_mu, nz_s = self._factor_ranks()
        n_nz_mu, rank = int(nz_mu.sum()), int(nz_s.sum())
        kernel = self.size - n_nz_mu * rank
        mu, s = self._mu, self._sigma
        smallest = float(mu[nz_mu].min() * s[nz_s].min() ** 2) if n_nz_mu and rank else math.nan
        graph_gap = float(mu[1]) if self.n >= 2 else math.nan
        if self.size < 2:
            value = math.nan
        elif kernel >= 2:
            value = 0.0
        else:
            ev = self.eigenvalues()
            ev[:kernel] = 0.0
            value = float(ev[1])
        return SpectralGap(
            value=value, reason=self._gap_reason(kernel, n_nz_mu, rank), kernel_dim=kernel,
            smallest_nonzero=smallest, graph_gap=graph_gap, size=self.size, convention=self.convention,
        )

    def _gap_reason(self, kernel: int, n_nz_mu: int, rank: int) -> str:
        n, d = self.n, self.d_model
        if self.size < 2:
            return "L is 1 x 1: there is no second eigenvalue."
        parts = []
        if kernel >= 2:
            parts.append(f"lambda_2 = 0 trivially: dim ker L = {kernel} >= 2.")
        else:
            parts.append(f"dim ker L = {kernel} <= 1, so lambda_2 is a genuine eigenvalue.")
        if self.convention == "directed" and self.is_diagonal and n > 1:
            parts.append(
                "Causal attention gives A_ij A_ji = 0 for i != j, so M = diag(1 - A_ii) is diagonal: "
                "L is block-diagonal over tokens and couples no two tokens; its spectrum is "
                "{(1 - A_ii) sigma_k(W_V)^2} plus zeros."
            )
        if d > rank:
            parts.append(
                f"W_V^T has a kernel of dimension d_model - rank(W_V) = {d} - {rank} = {d - rank} "
                f"in every token's stalk ({n * (d - rank)} zero eigenvalue(s) in all)."
            )
        zero_mu = n - n_nz_mu
        if zero_mu:
            if self.is_diagonal:
                idx = torch.nonzero(self.M.diagonal() <= 10 * n * _EPS * max(float(self.M.abs().max()), 1e-300)).flatten().tolist()
                shown = ", ".join(map(str, idx[:8])) + (", ..." if len(idx) > 8 else "")
                parts.append(
                    f"Token(s) [{shown}] attend only to themselves (A_ii = 1; token 0 always does under "
                    f"causal attention), so their rows of M are zero and their whole stalk "
                    f"R^{d} is in the kernel ({zero_mu * rank} zero eigenvalue(s) beyond the W_V kernel)."
                )
            elif self.convention == "symmetrized":
                parts.append(
                    f"M = L_graph(w) has {zero_mu} zero eigenvalue(s) (one per connected component of "
                    f"the attention graph: the constant vectors), giving {zero_mu * rank} zero "
                    f"eigenvalues of L; the meaningful gap is graph_gap = lambda_2(M)."
                )
            else:
                parts.append(f"M has {zero_mu} zero eigenvalue(s), giving {zero_mu * rank} zero eigenvalue(s) of L.")
        if kernel >= 2:
            parts.append("Use smallest_nonzero / nonzero_eigenvalues() for the informative part of the spectrum.")
        return " ".join(parts)

    # ------------------------------------------------------------------ products
    def __matmul__(self, x: Any) -> Any:
        """``L @ x`` without forming ``L``: ``(M (x) S) vec(X) = vec(M X S)`` (``S`` symmetric).

        ``x``: a vector of length ``n d_model`` (token-major: ``x[i * d_model + k]`` is coordinate
        ``k`` of token ``i``) or ``[..., n, d_model]``. Returns the same shape, float64, as a
        tensor (a numpy array for numpy input). Cost ``O(n d_model d_head + n^2 d_model)``
        (``O(n d_model d_head)`` when ``M`` is diagonal).
        """
        is_np = isinstance(x, np.ndarray)
        t = _as_float64(x, "the vector x")
        n, d = self.n, self.d_model
        if t.ndim == 1:
            if t.numel() != n * d:
                raise ThermoLensInputError(f"L @ x: x has length {t.numel()}, expected n * d_model = {n} * {d} = {n * d}")
            X = t.reshape(n, d)
        elif t.shape[-2:] == (n, d):
            X = t
        else:
            raise ThermoLensInputError(
                f"L @ x: x has shape {tuple(t.shape)}; expected [{n * d}] or [..., {n}, {d}] (n, d_model)"
            )
        XS = (X @ self.W_V) @ self.W_V.T
        Y = self.M.diagonal()[:, None] * XS if self.is_diagonal else self.M @ XS
        out = Y.reshape(-1) if t.ndim == 1 else Y
        return out.numpy() if is_np else out

    def dense(self, max_size: int = DENSE_LIMIT) -> Float[Tensor, "n_d_model n_d_model"]:
        """Assemble ``L = kron(M, W_V W_V^T)`` as a dense float64 matrix (verification, small views).

        Refuses when ``n * d_model > max_size`` (default :data:`DENSE_LIMIT` = 4096, a 128 MB
        matrix): pass a larger ``max_size`` to override.
        """
        _check_dense(self.size, max_size, "the Laplacian", f"{self.n} tokens x d_model {self.d_model}")
        return torch.kron(self.M, self.stalk)

    # ------------------------------------------------------------------ restriction maps
    def restriction_map(self, i: int, j: int) -> Float[Tensor, "d_model d_head"]:
        """``rho_ij = sqrt(c_ij) W_V [d_model, d_head]``: token ``i``'s stalk -> edge ``{i, j}``.

        ``x_i -> x_i @ rho_ij`` (TransformerLens convention); ``c = A`` (``"directed"``) or
        ``(A + A^T)/2`` (``"symmetrized"``).
        """
        i, j = _check_edge(i, j, self.n)
        return torch.sqrt(self.edge_coefficients[i, j]) * self.W_V

    def restriction_maps(self) -> RestrictionMaps:
        """All ``n (n - 1)`` restriction maps, lazily (see :class:`RestrictionMaps`)."""
        return RestrictionMaps(torch.sqrt(self.edge_coefficients), self.W_V, self.convention)

    # ------------------------------------------------------------------ display
    def to_frame(self) -> pd.DataFrame:
        """One row per token: ``A_ii``, the degree ``M_ii`` and its share of the trace."""
        wv2 = float(self.W_V.pow(2).sum())
        deg = self.M.diagonal()
        return pd.DataFrame({
            "layer": self.layer, "head": self.head, "kv_head": self.kv_head,
            "position": np.arange(self.n),
            "token": list(self.tokens) if self.tokens is not None else [None] * self.n,
            "A_ii": self.pattern.diagonal().numpy(),
            "degree": deg.numpy(),
            "trace_contribution": (deg * wv2).numpy(),
            "W_V_frob_sq": wv2,
            "convention": self.convention,
            "prepend_bos": self.prepend_bos,
        })

    def __repr__(self) -> str:
        where = []
        if self.layer is not None:
            where.append(f"layer {self.layer}")
        if self.head is not None:
            kv = f" (kv head {self.kv_head})" if self.kv_head is not None and self.kv_head != self.head else ""
            where.append(f"head {self.head}{kv}")
        where_s = ", ".join(where) + ": " if where else ""
        causal = "causal" if self.is_causal else "bidirectional"
        model = f", {self.model.get('name')} ({self.model.get('dtype')}, weights {self.model.get('weights')})" if self.model else ""
        return (
            f"SheafLaplacian({where_s}M (x) W_V W_V^T, {self.convention}, {causal} pattern; n={self.n} "
            f"tokens, d_model={self.d_model}, d_head={self.d_head}, size {self.size}; "
            f"trace={self.trace():.6g}{model})"
        )


def _check_dense(size: int, max_size: int, what: str, detail: str) -> None:
    if size > max_size:
        raise ThermoLensInputError(
            f"dense() would build {what} as a {size} x {size} float64 matrix ({detail}; "
            f"{size * size * 8 / 2**30:.2f} GiB), above max_size={max_size} rows. Use the factored "
            f"methods (.trace(), .eigenvalues(), L @ x) instead, or call .dense(max_size={size}) "
            "if you really want it."
        )


@dataclass(frozen=True, eq=False)
class LayerSheafLaplacian(Result):
    """All heads of one layer: the block-diagonal ``diag(L^(1), ..., L^(H))`` (Proposition 1).

    The direct sum of the per-head sheaves (each head with its own copy of the token stalks).
    ``trace()`` is the sum of the head traces (Corollary 1), ``eigenvalues()`` the union of the
    head spectra, ``L @ x`` acts on ``[head, n, d_model]``. Index it for a head:
    ``layer_L[h]`` is that head's :class:`SheafLaplacian`.
    """

    heads: tuple[SheafLaplacian, ...]
    layer: int | None = None

    def __post_init__(self) -> None:
        if not self.heads:
            raise ThermoLensInputError("a LayerSheafLaplacian needs at least one head")
        if len({(h.n, h.d_model) for h in self.heads}) != 1:
            raise ThermoLensInputError("all heads of a layer must share n and d_model")

    @classmethod
    def from_patterns(
        cls,
        A: Float[Tensor, "head n n"],
        W_V: Float[Tensor, "head d_model d_head"],
        convention: Convention = "directed",
        **metadata: Any,
    ) -> "LayerSheafLaplacian":
        """From per-head patterns ``[head, n, n]`` and per-(query-)head ``W_V [head, d_model, d_head]``."""
        if len(A) != len(W_V):
            raise ThermoLensInputError(f"got {len(A)} patterns but {len(W_V)} W_V matrices; pass one per head")
        layer = metadata.pop("layer", None)
        heads = tuple(
            SheafLaplacian.from_pattern(A[h], W_V[h], convention, layer=layer, head=h, **metadata)
            for h in range(len(A))
        )
        return cls(heads=heads, layer=layer)

    def __getitem__(self, head: int) -> SheafLaplacian:
        return self.heads[head]

    def __len__(self) -> int:
        return len(self.heads)

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def n(self) -> int:
        return self.heads[0].n

    @property
    def d_model(self) -> int:
        return self.heads[0].d_model

    @property
    def size(self) -> int:
        """``n_heads * n * d_model``."""
        return self.n_heads * self.heads[0].size

    @property
    def convention(self) -> str:
        return self.heads[0].convention

    def head_traces(self) -> Float[Tensor, "head"]:
        return torch.tensor([h.trace() for h in self.heads], dtype=torch.float64)

    def trace(self) -> float:
        """Sum of the head traces."""
        return float(self.head_traces().sum())

    def eigenvalues(self) -> Float[Tensor, "spectrum"]:
        """Union of the head spectra (``n_heads n d_model`` values, ascending)."""
        return torch.sort(torch.cat([h.eigenvalues() for h in self.heads])).values

    def nonzero_eigenvalues(self, tol: float | None = None) -> Float[Tensor, "nonzero"]:
        return torch.sort(torch.cat([h.nonzero_eigenvalues(tol) for h in self.heads])).values

    @property
    def kernel_dim(self) -> int:
        return sum(h.kernel_dim for h in self.heads)

    def spectral_gap(self) -> SpectralGap:
        """``lambda_2`` of the block-diagonal total; the kernel is the direct sum of the heads'."""
        gaps = [h.spectral_gap() for h in self.heads]
        kernel = sum(g.kernel_dim for g in gaps)
        nz = [g.smallest_nonzero for g in gaps if not math.isnan(g.smallest_nonzero)]
        if kernel >= 2:
            value = 0.0
        else:
            ev = self.eigenvalues()
            ev[:kernel] = 0.0
            value = float(ev[1])
        reason = (
            f"Block-diagonal over {self.n_heads} heads: the kernel is the direct sum of the heads' "
            f"kernels (dims {[g.kernel_dim for g in gaps]}). Head 0: {gaps[0].reason}"
        )
        return SpectralGap(value=value, reason=reason, kernel_dim=kernel,
                           smallest_nonzero=min(nz) if nz else math.nan, graph_gap=math.nan,
                           size=self.size, convention=self.convention)

    def __matmul__(self, x: Any) -> Any:
        """Block-diagonal product: ``x`` is ``[n_heads * n * d_model]`` or ``[head, n, d_model]``."""
        is_np = isinstance(x, np.ndarray)
        t = _as_float64(x, "the vector x")
        H, n, d = self.n_heads, self.n, self.d_model
        if t.ndim == 1 and t.numel() == H * n * d:
            X = t.reshape(H, n, d)
        elif tuple(t.shape) == (H, n, d):
            X = t
        else:
            raise ThermoLensInputError(
                f"layer L @ x: x has shape {tuple(t.shape)}; expected [{H * n * d}] or [{H}, {n}, {d}] "
                "(head, n, d_model)"
            )
        Y = torch.stack([h @ X[k] for k, h in enumerate(self.heads)])
        out = Y.reshape(-1) if t.ndim == 1 else Y
        return out.numpy() if is_np else out

    def dense(self, max_size: int = DENSE_LIMIT, structure: Literal["direct_sum", "shared_stalks"] = "direct_sum") -> Tensor:
        """Dense total Laplacian (float64, small cases only).

        ``structure="direct_sum"`` (default, the paper's Proposition 1): ``block_diag(L^(h))``,
        size ``n_heads n d_model``. ``"shared_stalks"``: all heads act on the same token stalks
        ``R^{d_model}`` with edge stalk ``R^{n_heads d_head}`` (the concatenated multi-head value
        map), giving ``sum_h M_h (x) W_V^h W_V^h^T`` of size ``n d_model``: same trace, different
        spectrum.
        """
        if structure == "direct_sum":
            _check_dense(self.size, max_size, "the block-diagonal layer Laplacian",
                         f"{self.n_heads} heads x {self.n} tokens x d_model {self.d_model}")
            return torch.block_diag(*[h.dense(max_size=max_size) for h in self.heads])
        if structure == "shared_stalks":
            size = self.heads[0].size
            _check_dense(size, max_size, "the shared-stalk layer Laplacian", f"{self.n} tokens x d_model {self.d_model}")
            return sum(torch.kron(h.M, h.stalk) for h in self.heads)
        raise ThermoLensInputError(f"unknown structure {structure!r}; choose 'direct_sum' or 'shared_stalks'")

    def to_frame(self) -> pd.DataFrame:
        """Per head and token (see :meth:`SheafLaplacian.to_frame`)."""
        return pd.concat([h.to_frame() for h in self.heads], ignore_index=True)

    def __repr__(self) -> str:
        h0 = self.heads[0]
        return (
            f"LayerSheafLaplacian(layer {self.layer}: block-diagonal over {self.n_heads} heads, "
            f"{self.convention}; n={self.n} tokens, d_model={self.d_model}, d_head={h0.d_head}, "
            f"size {self.size}; trace={self.trace():.6g} = sum of head traces "
            f"[{', '.join(f'{t:.4g}' for t in self.head_traces().tolist())}])"
        )


# ============================================================================ from a model
def _pattern_key(layer: int, head: int | None) -> str:
    return f"attn_pattern.{layer}" if head is None else f"attn_pattern.{layer}.{head}"


def attention_pattern(layer: int, head: int | None = None) -> Callable[[ModelView, Recorder], None]:
    """Reduction (for :func:`thermo_lens.hooks.collect`) that keeps one layer's full pattern.

    Records ``(f"attn_pattern.{layer}[.{head}]", 0)``: ``[batch, head, q, k]`` float32 (one head
    when ``head`` is given), NaN on padded rows and columns. The ``n x n`` pattern is what the
    Laplacian needs and what the trace does not: use it for a single layer, one prompt per batch
    (batches of different padded widths cannot be stacked), never for all layers.
    """

    def reduction(view: ModelView, rec: Recorder) -> None:
        name = view.pattern_hook_name(layer)

        def fn(a: Tensor, batch: TokenBatch) -> Tensor:
            p = (a[:, head: head + 1] if head is not None else a).float()
            mask = batch.mask.to(a.device)
            pair = (mask[:, :, None] & mask[:, None, :])[:, None]
            if not torch.isfinite(p.masked_select(pair)).all():
                rec.nonfinite.append(name)
            return p.masked_fill(~pair, float("nan"))

        rec.add(name, (_pattern_key(layer, head), 0), fn)

    return reduction


def _check_index(value: Any, n: int, what: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ThermoLensInputError(f"{what} must be an integer, got {value!r}")
    v = int(value)
    if not -n <= v < n:
        raise ThermoLensInputError(f"{what}={value} is out of range: {hint} (0..{n - 1}, or negative from the end)")
    return v % n


def laplacian_from_collected(
    collected: Collected,
    layer: int,
    head: int | None = None,
    *,
    prompt_index: int = 0,
    convention: Convention = "directed",
    W_V: Float[Tensor, "layer kv_head d_model d_head"] | None = None,
) -> SheafLaplacian | LayerSheafLaplacian:
    """Pure part of :func:`sheaf_laplacian`: the Laplacian from a pass that recorded the pattern.

    Args:
        collected: from :func:`thermo_lens.hooks.collect` with :func:`attention_pattern`
            ``(layer, head)`` (or ``(layer)``, all heads) among its reductions.
        layer, head: the head (``None``: all heads, a :class:`LayerSheafLaplacian`).
        prompt_index: which prompt of ``collected``.
        convention: ``"directed"`` or ``"symmetrized"``.
        W_V: ``[layer, kv_head, d_model, d_head]`` value weights (default: read from the model).
    """
    convention = _check_convention(convention)
    view = collected.view
    layer = _check_index(layer, view.n_layers, "layer", f"the model has {view.n_layers} layers")
    if head is not None:
        head = _check_index(head, view.n_heads, "head", f"the model has {view.n_heads} heads per layer")
    names = collected.recorder.names
    key = _pattern_key(layer, head)
    if key not in names and _pattern_key(layer, None) in names:
        key, sel = _pattern_key(layer, None), head
    elif key in names:
        sel = 0 if head is not None else None
    else:
        raise ThermoLensInputError(
            f"this collection has no attention pattern of layer {layer}; run collect(...) with "
            f"thermo_lens.sheaf.attention_pattern({layer}{', ' + str(head) if head is not None else ''}) "
            "among the reductions (the trace-only reductions keep just the diagonal)"
        )
    p = _check_index(prompt_index, len(collected.prompts), "prompt_index", f"{len(collected.prompts)} prompts were run")
    stacked = collected.stack(key)[0]  # batches of different widths are NaN-padded
    n = int(collected.lengths[p])
    pat = stacked[p, :, :n, :n]
    if W_V is None:
        W_V = view.W_V()
        view.warn_if_processed("||W_V||_F^2 and every sheaf trace differ from the raw model's", stacklevel=3)
    W_V = _check_W_V(W_V, view)[layer]
    kv = view.kv_head_of
    meta = dict(prompt=collected.prompts[p], prepend_bos=collected.prepend_bos, model=view.metadata(),
                tokens=_token_strings(view, collected.prompts[p], collected.prepend_bos, n))
    if head is not None:
        return SheafLaplacian.from_pattern(pat[sel] if sel is not None else pat[0], W_V[int(kv[head])], convention,
                                           layer=layer, head=head, kv_head=int(kv[head]), **meta)
    heads = tuple(
        SheafLaplacian.from_pattern(pat[h], W_V[int(kv[h])], convention, layer=layer, head=h, kv_head=int(kv[h]), **meta)
        for h in range(view.n_heads)
    )
    return LayerSheafLaplacian(heads=heads, layer=layer)


def _token_strings(view: ModelView, prompt: str, prepend_bos: Any, n: int) -> tuple[str, ...] | None:
    try:
        ids = view.encode(prompt, prepend_bos)[:n]
        return tuple(str(t) for t in view.tokenizer.convert_ids_to_tokens(ids))
    except Exception:  # noqa: BLE001 - token strings are a display nicety
        return None


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


def sheaf_laplacian(
    model: Any,
    prompt: str,
    layer: int,
    head: int | None = None,
    *,
    convention: Convention = "directed",
    prepend_bos: Any = True,
    truncate: bool = False,
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
) -> SheafLaplacian | LayerSheafLaplacian:
    """The factored sheaf Laplacian of one head (or all heads) of one layer on one prompt.

    One forward pass keeps only that layer's pattern (``blocks.{layer}.attn.hook_pattern``, that
    head's ``n x n`` slice); ``W_V`` is the head's value matrix (its KV head under grouped-query
    attention). See the module docstring for the definition and conventions (D'Elia 2026,
    section 5; METHODS.md section 3).

    Args:
        model: a TransformerLens model (``TransformerBridge``) or :class:`ModelView`.
        prompt: one prompt string.
        layer: block index (0-based; negative counts from the end).
        head: query head index; ``None`` gives a :class:`LayerSheafLaplacian` over all heads.
        convention: ``"directed"`` (``rho_ij = sqrt(A_ij) W_V``, default) or ``"symmetrized"``.
        prepend_bos: ``True``, ``False`` or ``"tokenizer"`` (as in :func:`residual_gain`).
        truncate: cut a prompt longer than the context instead of raising.
        fwd_hooks: your own hooks, run in the same pass before the pattern is read.

    Returns:
        :class:`SheafLaplacian` (or :class:`LayerSheafLaplacian` when ``head is None``).
    """
    if not isinstance(prompt, str):
        raise ThermoLensInputError(
            f"sheaf_laplacian takes one prompt string, got {type(prompt).__name__}; for the traces "
            "of many prompts use sheaf_traces(model, prompts)"
        )
    convention = _check_convention(convention)
    view = as_view(model)
    layer = _check_index(layer, view.n_layers, "layer", f"{view.name} has {view.n_layers} layers")
    if head is not None:
        head = _check_index(head, view.n_heads, "head", f"{view.name} has {view.n_heads} heads per layer")
    got = collect(view, [prompt], [attention_pattern(layer, head)], prepend_bos=prepend_bos,
                  batch_size=1, truncate=truncate, fwd_hooks=fwd_hooks, progress=False)
    return laplacian_from_collected(got, layer, head, convention=convention)


# ============================================================================ traces for all heads
@dataclass(frozen=True, eq=False)
class SheafTraces(Result):
    """Sheaf Laplacian traces of every head on every prompt, from one forward pass.

    ``trace[p, l, h] = (n_p - sum_i A^{l,h}_ii) * ||W_V^{l,h}||_F^2`` (``formula="off_diagonal_mass"``,
    the trace of ``delta^T delta`` under either convention; METHODS.md section 3), or the paper's
    printed ``(sum_ij A_ij - n_p) ||W_V||_F^2`` (``formula="paper_printed"``, identically 0 for
    softmax attention). Under GQA ``W_V^{l,h}`` is the KV head ``kv_head_of[h]`` of query head ``h``.

    Attributes:
        trace: ``[prompt, layer, head]`` float64, under ``formula``.
        off_diagonal_mass: ``[prompt, layer, head]`` ``sum_i (1 - A_ii)`` over real tokens.
        attention_mass: ``[prompt, layer, head]`` ``sum_{i,j} A_ij`` over real tokens (``= n``).
        W_V_frob_sq: ``[layer, head]`` ``||W_V||_F^2`` per query head (float64 from the weights).
        n_tokens: ``[prompt]`` real tokens (BOS included when prepended).
        formula, definition: the formula's name and its text.
        token_scope: which positions enter the sums.
        prompts, prepend_bos, truncated: the inputs and how they were tokenized.
        model: :meth:`ModelView.metadata` (name, dtype, weights raw/processed, post-LN, ...).
    """

    trace: Float[Tensor, "prompt layer head"]
    off_diagonal_mass: Float[Tensor, "prompt layer head"]
    attention_mass: Float[Tensor, "prompt layer head"]
    W_V_frob_sq: Float[Tensor, "layer head"]
    n_tokens: Int[Tensor, "prompt"]
    formula: str
    definition: str
    token_scope: str
    prompts: tuple[str, ...]
    prepend_bos: Any
    truncated: tuple[bool, ...]
    model: dict

    @property
    def layer_trace(self) -> Float[Tensor, "prompt layer"]:
        """Per prompt and layer, the sum over heads (the block-diagonal layer Laplacian's trace)."""
        return self.trace.sum(dim=-1)

    @property
    def mean_layer_trace(self) -> Float[Tensor, "layer"]:
        """``T_l``: layer trace averaged over prompts (the input of L*, METHODS.md section 4)."""
        return self.layer_trace.mean(dim=0)

    @property
    def mean_trace(self) -> float:
        """Mean over layers of :attr:`mean_layer_trace`: the paper's "mean trace" per model
        (its "GPT-2 62,696 vs OPT-125m 2,368", over 4 prompts in float32)."""
        return float(self.mean_layer_trace.mean())

    @property
    def n_prompts(self) -> int:
        return int(self.trace.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.trace.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.trace.shape[2])

    def l_star(self, variant: str = "argmax_abs_gradient") -> Any:
        """L* from these traces (:func:`thermo_lens.depth.l_star_from_traces`)."""
        from thermo_lens.depth import l_star_from_traces

        return l_star_from_traces(self, variant=variant)

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (prompt, layer, head)."""
        P, L, H = self.trace.shape
        p, l, h = np.meshgrid(np.arange(P), np.arange(L), np.arange(H), indexing="ij")
        p, l, h = p.ravel(), l.ravel(), h.ravel()
        kv = kv_head_map(H, self.model.get("n_kv_heads")).numpy()
        return pd.DataFrame({
            "model": self.model.get("name"),
            "prompt_index": p,
            "prompt": np.asarray(self.prompts, dtype=object)[p],
            "layer": l,
            "head": h,
            "kv_head": kv[h],
            "trace": self.trace.numpy().ravel(),
            "off_diagonal_mass": self.off_diagonal_mass.numpy().ravel(),
            "attention_mass": self.attention_mass.numpy().ravel(),
            "W_V_frob_sq": self.W_V_frob_sq.numpy()[l, h],
            "n_tokens": self.n_tokens.numpy()[p],
            "formula": self.formula,
            "token_scope": "all",
            "prepend_bos": self.prepend_bos,
            "weights": self.model.get("weights"),
            "dtype": self.model.get("dtype"),
            "post_ln": self.model.get("post_ln"),
        })

    def __repr__(self) -> str:
        m = self.model
        lt = self.mean_layer_trace.tolist()
        shown = ", ".join(f"{v:.4g}" for v in lt[:12]) + (", ..." if len(lt) > 12 else "")
        flags = " post-LN" if m.get("post_ln") else ""
        return (
            f"SheafTraces({m.get('name')}: {self.n_prompts} prompts x {self.n_layers} layers x "
            f"{self.n_heads} heads; formula {self.formula!r}: {self.definition}; BOS={self.prepend_bos!r}, "
            f"weights {m.get('weights')}, {m.get('dtype')}{flags})\n"
            f"  mean layer trace T_l (sum over heads, mean over prompts): [{shown}]\n"
            f"  mean trace (mean over layers): {self.mean_trace:.6g}"
        )


def _check_formula(formula: Any, *, warn: bool = True, stacklevel: int = 3) -> str:
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


def _w_v_frob_sq(W_V: Tensor, view: ModelView) -> Tensor:
    """``[layer, head]`` ``||W_V||_F^2`` per query head, float64, one layer at a time."""
    W_V = _check_W_V(W_V, view)
    per_kv = torch.stack([W_V[l].double().pow(2).sum(dim=(-1, -2)) for l in range(W_V.shape[0])])
    return per_kv[:, view.kv_head_of]


def traces_from_collected(
    collected: Collected,
    *,
    formula: TraceFormula = "off_diagonal_mass",
    W_V: Float[Tensor, "layer kv_head d_model d_head"] | None = None,
) -> SheafTraces:
    """Pure part of :func:`sheaf_traces`: the traces from a pass that ran ``attention_diagonal``.

    Args:
        collected: from :func:`thermo_lens.hooks.collect` with
            :func:`thermo_lens.hooks.attention_diagonal` among its reductions (a profile runs one
            pass with every reduction and derives every metric from it).
        formula: ``"off_diagonal_mass"`` (default) or ``"paper_printed"`` (warns; see
            :func:`sheaf_traces`).
        W_V: ``[layer, kv_head, d_model, d_head]`` (default: ``collected.view.W_V()``).
    """
    return _traces(collected, _check_formula(formula, stacklevel=3), W_V=W_V)


def _traces(collected: Collected, formula: str, W_V: Tensor | None) -> SheafTraces:
    view = collected.view
    view.warn_if_processed("||W_V||_F^2 and every sheaf trace differ from the raw model's", stacklevel=3)
    if not {"attn_diag", "attn_mass"} <= collected.recorder.names:
        raise ThermoLensInputError(
            "this collection has no attention diagonal; run collect(...) with "
            "thermo_lens.hooks.attention_diagonal among the reductions"
        )
    diag = collected.stack("attn_diag").double()  # [L, P, H, pos], NaN on padding
    mass = collected.stack("attn_mass").double()  # [L, P, H]
    n = collected.lengths.to(torch.float64)
    off = torch.nansum(1.0 - diag, dim=-1)  # sum_i (1 - A_ii): exact 0 for a one-hot row
    wv2 = _w_v_frob_sq(view.W_V() if W_V is None else W_V, view)  # [L, H]
    if formula == "off_diagonal_mass":
        trace = off * wv2[:, None, :]
    else:
        trace = (mass - n[None, :, None]) * wv2[:, None, :]
    return SheafTraces(
        trace=trace.permute(1, 0, 2).contiguous(),
        off_diagonal_mass=off.permute(1, 0, 2).contiguous(),
        attention_mass=mass.permute(1, 0, 2).contiguous(),
        W_V_frob_sq=wv2,
        n_tokens=collected.lengths.clone(),
        formula=formula,
        definition=TRACE_DEFINITIONS[formula],
        token_scope=_TOKEN_SCOPE,
        prompts=tuple(collected.prompts),
        prepend_bos=collected.prepend_bos,
        truncated=tuple(collected.truncated),
        model=view.metadata(),
    )


def sheaf_traces(
    model: Any,
    prompts: Sequence[str],
    *,
    prepend_bos: Any = True,
    batch_size: int = 8,
    formula: TraceFormula = "off_diagonal_mass",
    truncate: bool = False,
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    progress: bool | None = None,
) -> SheafTraces:
    """Sheaf Laplacian trace of every head, layer and prompt in one forward pass.

    ``Tr L^{(l,h)} = (n - sum_i A_ii) ||W_V^{(l,h)}||_F^2``: the off-diagonal attention mass times
    the squared Frobenius norm of the head's value matrix (METHODS.md section 3; the trace of
    ``delta^T delta`` for either convention). The pattern is reduced to its diagonal inside the
    hook; no ``n x n`` pattern is stored.

    ``formula="paper_printed"`` gives the paper's printed eq. 4, ``(sum_ij A_ij - n) ||W_V||_F^2``,
    for reproduction only: softmax rows sum to 1, so it is identically 0 up to float rounding
    (a ``UserWarning`` says so). The paper's notebooks (and its "GPT-2 62,696 vs OPT-125m 2,368")
    computed the off-diagonal-mass version.

    Args:
        model: a TransformerLens model or :class:`ModelView`.
        prompts: the prompt strings (e.g. ``thermo_lens.prompts.get("paper25").prompts``).
        prepend_bos: ``True``, ``False`` or ``"tokenizer"``, exactly as in ``residual_gain``.
        batch_size: prompts per forward pass.
        formula: ``"off_diagonal_mass"`` (default) or ``"paper_printed"``.
        truncate: cut prompts longer than the context instead of raising.
        fwd_hooks: your own hooks (ablations, patching), run in the same pass first.
        progress: progress bar (default: when there is more than one batch).
    """
    formula = _check_formula(formula, stacklevel=3)  # fail (or warn) before any compute
    view = as_view(model)
    got = collect(view, prompts, [attention_diagonal], prepend_bos=prepend_bos, batch_size=batch_size,
                  truncate=truncate, fwd_hooks=fwd_hooks, progress=progress)
    return _traces(got, formula, W_V=None)
