"""The factored sheaf Laplacian ``L = M (x) W_V W_V^T`` of one head, and of all heads of a layer.

In the style of TransformerLens' ``FactoredMatrix``; see :mod:`thermo_lens.measures.sheaf` for the
definition, both conventions and the factorisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict, Unpack, overload

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.result import Result
from thermo_lens.measures.sheaf.gap import SpectralGap, gap_reason
from thermo_lens.measures.sheaf.restriction import RestrictionMaps, _edge_coefficients
from thermo_lens.measures.sheaf.validation import (
    _EPS,
    DENSE_LIMIT,
    _as_float64,
    _check_convention,
    _check_dense,
    _check_edge,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


class LaplacianMetadata(TypedDict, total=False):
    """What a Laplacian built from a pattern may record of where it came from (all optional)."""

    layer: int | None
    head: int | None
    kv_head: int | None
    prompt: str | None
    tokens: tuple[str, ...] | None
    prepend_bos: bool | str | None
    model: dict | None


class LayerMetadata(TypedDict, total=False):
    """What a layer's Laplacian built from patterns may record (each head gets its index itself)."""

    prompt: str | None
    tokens: tuple[str, ...] | None
    prepend_bos: bool | str | None
    model: dict | None


class _Operator:
    """What the head's and the layer's Laplacians share as operators kept factored: ``L @ x`` with a
    tensor or numpy array in and the same out, and ``lambda_2`` from the kernel's dimension.

    A subclass says how ``x`` is cut into blocks (:meth:`_blocks`) and how it acts on them
    (:meth:`_apply`).
    """

    @property
    def size(self) -> int:
        raise NotImplementedError

    def eigenvalues(self) -> Tensor:
        raise NotImplementedError

    def _blocks(self, t: Tensor) -> Tensor:
        """``x`` (float64) as the blocks :meth:`_apply` takes; :class:`ThermoLensInputError` for any other shape."""
        raise NotImplementedError

    def _apply(self, X: Tensor) -> Tensor:
        raise NotImplementedError

    @overload
    def __matmul__(self, x: Tensor) -> Tensor: ...
    @overload
    def __matmul__(self, x: np.ndarray) -> np.ndarray: ...
    @overload
    def __matmul__(self, x: Sequence[object]) -> Tensor: ...

    def __matmul__(self, x: object) -> Tensor | np.ndarray:
        """``L @ x`` without forming ``L``, float64; a flat ``x`` gives a flat result, blocks give
        blocks, a numpy array gives a numpy array (the shapes: the class's docstring)."""
        is_np = isinstance(x, np.ndarray)
        t = _as_float64(x, "the vector x")
        Y = self._apply(self._blocks(t))
        out = Y.reshape(-1) if t.ndim == 1 else Y
        return out.numpy() if is_np else out

    def _gap_value(self, kernel: int) -> float:
        """``lambda_2``: NaN under two dimensions, 0 when the kernel has two or more, else the second
        eigenvalue with the first ``kernel`` (round-off of exact zeros) set to 0."""
        if self.size < 2:
            return math.nan
        if kernel >= 2:
            return 0.0
        ev = self.eigenvalues()
        ev[:kernel] = 0.0
        return float(ev[1])


@dataclass(frozen=True, eq=False)
class SheafLaplacian(Result, _Operator):
    """The sheaf Laplacian ``L = M (x) W_V W_V^T`` of one head on one prompt, kept factored.

    In the style of TransformerLens' ``FactoredMatrix``: the ``n d_model x n d_model`` matrix is
    never formed unless asked (:meth:`dense`, small cases only). Build it from a model with
    :func:`sheaf_laplacian` or from raw inputs with :meth:`from_pattern`. See the module docstring
    for the sheaf, both conventions and the factorisation (D'Elia 2026, section 5;
    ``thermo_lens.definitions`` §3).

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
    prepend_bos: bool | str | None = None
    model: dict | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pattern(
        cls,
        A: Tensor | ArrayLike,
        W_V: Tensor | ArrayLike,
        convention: str = "directed",
        **metadata: Unpack[LaplacianMetadata],
    ) -> "SheafLaplacian":
        """Build the Laplacian from a pattern ``A [n, n]`` and value weights ``W_V [d_model, d_head]``
        (tensors or arrays; checked here, with clear errors).

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

    def eigenvalues(self) -> Float[Tensor, " n_d_model"]:
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

    def nonzero_eigenvalues(self, tol: float | None = None) -> Float[Tensor, " nonzero"]:
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

        For any head with ``d_head < d_model`` the gap is 0 whatever the mask: ``W_V^T`` has a kernel
        of dimension ``d_model - rank(W_V)`` in every token's stalk. Causal ``"directed"`` attention
        adds more zeros (``M = diag(1 - A_ii)``, token 0 has ``A_00 = 1``). The spectrum depends on the
        row-sum weighting of the restriction maps, a modelling choice (see :mod:`thermo_lens.measures.sheaf`:
        the column-sum reading has the same trace and a different spectrum). The informative numbers are
        the nonzero spectrum (:meth:`nonzero_eigenvalues`, ``smallest_nonzero``) and, under
        ``"symmetrized"``, the attention graph's gap ``graph_gap = lambda_2(M)``.
        """
        nz_mu, nz_s = self._factor_ranks()
        n_nz_mu, rank = int(nz_mu.sum()), int(nz_s.sum())
        kernel = self.size - n_nz_mu * rank
        mu, s = self._mu, self._sigma
        smallest = float(mu[nz_mu].min() * s[nz_s].min() ** 2) if n_nz_mu and rank else math.nan
        graph_gap = float(mu[1]) if self.n >= 2 else math.nan
        return SpectralGap(
            value=self._gap_value(kernel), reason=gap_reason(self, kernel, n_nz_mu, rank), kernel_dim=kernel,
            smallest_nonzero=smallest, graph_gap=graph_gap, size=self.size, convention=self.convention,
        )

    # ------------------------------------------------------------------ products
    def _blocks(self, t: Tensor) -> Tensor:
        """``L @ x`` takes a vector of length ``n d_model`` (token-major: ``x[i * d_model + k]`` is
        coordinate ``k`` of token ``i``) or ``[..., n, d_model]``, and returns the same shape."""
        n, d = self.n, self.d_model
        if t.ndim == 1:
            if t.numel() != n * d:
                raise ThermoLensInputError(f"L @ x: x has length {t.numel()}, expected n * d_model = {n} * {d} = {n * d}")
            return t.reshape(n, d)
        if t.shape[-2:] == (n, d):
            return t
        raise ThermoLensInputError(
            f"L @ x: x has shape {tuple(t.shape)}; expected [{n * d}] or [..., {n}, {d}] (n, d_model)"
        )

    def _apply(self, X: Tensor) -> Tensor:
        """``(M (x) S) vec(X) = vec(M X S)`` (``S = W_V W_V^T`` symmetric) without forming ``L``: cost
        ``O(n d_model d_head + n^2 d_model)`` (``O(n d_model d_head)`` when ``M`` is diagonal)."""
        XS = (X @ self.W_V) @ self.W_V.T
        return self.M.diagonal()[:, None] * XS if self.is_diagonal else self.M @ XS

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


@dataclass(frozen=True, eq=False)
class LayerSheafLaplacian(Result, _Operator):
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
        convention: str = "directed",
        *,
        layer: int | None = None,
        **metadata: Unpack[LayerMetadata],
    ) -> "LayerSheafLaplacian":
        """From per-head patterns ``[head, n, n]`` and per-(query-)head ``W_V [head, d_model, d_head]``."""
        if len(A) != len(W_V):
            raise ThermoLensInputError(f"got {len(A)} patterns but {len(W_V)} W_V matrices; pass one per head")
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

    def head_traces(self) -> Float[Tensor, " head"]:
        return torch.tensor([h.trace() for h in self.heads], dtype=torch.float64)

    def trace(self) -> float:
        """Sum of the head traces."""
        return float(self.head_traces().sum())

    def eigenvalues(self) -> Float[Tensor, " spectrum"]:
        """Union of the head spectra (``n_heads n d_model`` values, ascending)."""
        return torch.sort(torch.cat([h.eigenvalues() for h in self.heads])).values

    def nonzero_eigenvalues(self, tol: float | None = None) -> Float[Tensor, " nonzero"]:
        return torch.sort(torch.cat([h.nonzero_eigenvalues(tol) for h in self.heads])).values

    @property
    def kernel_dim(self) -> int:
        return sum(h.kernel_dim for h in self.heads)

    def spectral_gap(self) -> SpectralGap:
        """``lambda_2`` of the block-diagonal total; the kernel is the direct sum of the heads'."""
        gaps = [h.spectral_gap() for h in self.heads]
        kernel = sum(g.kernel_dim for g in gaps)
        nz = [g.smallest_nonzero for g in gaps if not math.isnan(g.smallest_nonzero)]
        reason = (
            f"Block-diagonal over {self.n_heads} heads: the kernel is the direct sum of the heads' "
            f"kernels (dims {[g.kernel_dim for g in gaps]}). Head 0: {gaps[0].reason}"
        )
        return SpectralGap(value=self._gap_value(kernel), reason=reason, kernel_dim=kernel,
                           smallest_nonzero=min(nz) if nz else math.nan, graph_gap=math.nan,
                           size=self.size, convention=self.convention)

    def _blocks(self, t: Tensor) -> Tensor:
        """Block-diagonal product: ``L @ x`` takes ``[n_heads * n * d_model]`` or ``[head, n, d_model]``."""
        H, n, d = self.n_heads, self.n, self.d_model
        if t.ndim == 1 and t.numel() == H * n * d:
            return t.reshape(H, n, d)
        if tuple(t.shape) == (H, n, d):
            return t
        raise ThermoLensInputError(
            f"layer L @ x: x has shape {tuple(t.shape)}; expected [{H * n * d}] or [{H}, {n}, {d}] "
            "(head, n, d_model)"
        )

    def _apply(self, X: Tensor) -> Tensor:
        return torch.stack([h @ X[k] for k, h in enumerate(self.heads)])

    def dense(self, max_size: int = DENSE_LIMIT, structure: str = "direct_sum") -> Tensor:
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
            return torch.stack([torch.kron(h.M, h.stalk) for h in self.heads]).sum(dim=0)
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
