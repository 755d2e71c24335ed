"""Batched linear-algebra kernels of the spectral signature (``thermo_lens.definitions`` §2).

- :func:`_gram_root`: the ``d_head x d_head`` square-root factor ``R`` (``R^T R = W^T W``) of a
  head from the eigendecomposition of its Gram matrix;
- :func:`_sigma_max_of_product` / :func:`ov_norm_factored`: ``sigma_max`` of a product of two
  heads' matrices (the OV and QK circuits) from those factors, never forming ``d_model x d_model``;
- :func:`matrix_spectral_norm` (and :func:`_lanczos_sigma_max`): ``sigma_max`` of large matrices
  (the paper's whole-layer norms) by dense SVD, the Gram eigenvalue or Lanczos.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.errors import ThermoLensInputError

LayerNormMethod = Literal["auto", "svd", "gram", "lanczos"]


def _gram_root(lam: Float[Tensor, "... n"], U: Float[Tensor, "... n n"]) -> Float[Tensor, "... n n"]:
    """``R = diag(sqrt(lam)) U^T`` from the eigendecomposition ``G = U diag(lam) U^T`` of a Gram
    matrix ``G = W^T W``: ``R^T R = G``, so ``R`` has the singular values of ``W`` and ``W = Q R``
    with orthonormal ``Q``.

    Why not a QR of ``W``: one batched ``d_head x d_head`` matmul plus ``eigh`` is 2-3x faster on
    CPU than ``geqrf`` of the tall ``[d_model, d_head]`` matrices (LAPACK's Householder QR is
    memory-bound there). The top singular values are as accurate: the largest eigenvalue of a
    Gram matrix has relative error ~ machine epsilon, and the rows of ``R`` that rounding can
    disturb by up to ``sqrt(eps) * ||W||`` are those of (near-)zero eigenvalues, orthogonal to the
    top singular directions, which they move only to second order (tests compare with dense SVDs
    in float64 to 1e-10, rank-deficient heads included).
    """
    return lam.clamp_min(0).sqrt()[..., :, None] * U.mT


def ov_norm_factored(
    W_V: Float[Tensor, "... d_model d_head"], W_O: Float[Tensor, "... d_head d_model"]
) -> Float[Tensor, "..."]:
    """``sigma_max(W_V @ W_O)`` for stacks of heads, without forming ``d_model x d_model``.

    With ``R_V^T R_V = W_V^T W_V`` and ``R_O^T R_O = W_O W_O^T`` (``d_head x d_head``),
    ``W_V W_O = Q_V (R_V R_O^T) Q_O^T`` with orthonormal ``Q``, so its singular values are those of
    the small ``R_V R_O^T``. Leading dimensions broadcast.
    """
    R_V = _gram_root(*torch.linalg.eigh(W_V.mT @ W_V))
    return _sigma_max_of_product(R_V, W_O @ W_O.mT)


def _sigma_max_of_product(R_a: Tensor, G_b: Tensor) -> Tensor:
    """``sigma_max(Q_a R_a R_b^T Q_b^T)`` = the top singular value of the small ``R_a R_b^T``, as
    the root of the largest eigenvalue of ``R_a G_b R_a^T`` (``G_b = R_b^T R_b``, the Gram matrix
    of ``b``): one batched ``eigvalsh`` of ``d_head x d_head`` symmetric matrices."""
    M = R_a @ G_b @ R_a.mT
    return torch.linalg.eigvalsh(M)[..., -1].clamp_min(0).sqrt()


def _lanczos_sigma_max(W: Float[Tensor, "m n"], max_steps: int = 300) -> float | None:
    """``sigma_max`` of one matrix by Lanczos on its smaller-side Gram operator (``W^T W`` or
    ``W W^T``, never formed), with full reorthogonalisation; ``None`` if not converged.

    Converged when the top Ritz value ``theta`` of the tridiagonal matrix has not moved by more
    than a few machine epsilons (relative) over the last four steps and its residual
    ``beta_k |y_k|`` is below ``sqrt(eps) * theta`` (an eigenvalue of the operator lies within
    ``residual^2 / gap`` of ``theta``). A seeded random start vector: repeatable.
    """
    if W.shape[0] < W.shape[1]:
        W = W.mT
    n = W.shape[1]
    steps = min(n, max_steps)
    eps = torch.finfo(W.dtype).eps
    gen = torch.Generator(device="cpu").manual_seed(0)
    Q = torch.empty(steps + 1, n, dtype=W.dtype, device=W.device)
    q = torch.randn(n, generator=gen, dtype=W.dtype).to(W.device)
    Q[0] = q / q.norm()
    alpha: list[float] = []
    beta: list[float] = []
    prev = None
    for k in range(steps):
        v = W.mT @ (W @ Q[k])
        alpha.append(float(torch.dot(v, Q[k])))
        B = Q[:k + 1]
        v = v - B.mT @ (B @ v)
        v = v - B.mT @ (B @ v)  # twice: full reorthogonalisation in finite precision
        beta.append(float(v.norm()))
        done = beta[-1] <= eps * abs(alpha[0])  # an invariant subspace: T's eigenvalues are exact
        if not done:
            Q[k + 1] = v / beta[-1]
        if done or (k + 1) % 4 == 0 or k + 1 == steps:
            # The k x k tridiagonal matrix, float64 on CPU (torch, not numpy: numpy's BLAS would
            # start its own thread pool, outside the caller's torch thread setting).
            a = torch.tensor(alpha, dtype=torch.float64)
            b = torch.tensor(beta[:-1], dtype=torch.float64)
            lam, Y = torch.linalg.eigh(torch.diag(a) + torch.diag(b, 1) + torch.diag(b, -1))
            theta, resid = float(lam[-1]), beta[-1] * abs(float(Y[-1, -1]))
            if done or (prev is not None and abs(theta - prev) <= 4 * eps * theta
                        and resid <= math.sqrt(eps) * theta) or k + 1 == n:
                return math.sqrt(max(theta, 0.0))
            prev = theta
    return None


def matrix_spectral_norm(
    W: Float[Tensor, "... m n"], method: str = "auto"
) -> tuple[Float[Tensor, "..."], str]:
    """``sigma_max`` of a stack of (possibly large) matrices, and the method used.

    ``"svd"``: batched ``torch.linalg.svdvals``. ``"gram"``: ``sqrt`` of the largest eigenvalue
    of the smaller-side Gram matrix ``W^T W`` (or ``W W^T``), batched ``eigvalsh`` (backward
    stable: the largest eigenvalue has relative error ~ machine epsilon, so ``sigma_max`` too).
    ``"lanczos"``: Lanczos on the smaller-side Gram operator, one matrix at a time, to machine
    precision of ``W.dtype`` (:func:`_lanczos_sigma_max`; a matrix that has not converged within
    300 steps falls back to ``"gram"``, and the method says so). ``"auto"``: ``"svd"`` on GPU,
    ``"lanczos"`` on CPU (GPT-2-small's 24 whole-layer matrices: ~0.3 s against ~1 s for
    ``"gram"`` with random weights, ~0.06 s with a decaying spectrum as trained weights have;
    a 4096 x 4096 dense SVD takes ~50 s on 2 cores).
    """
    _check_method(method)
    if method == "auto":
        method = "svd" if W.device.type != "cpu" else "lanczos"
    if method == "gram":
        G = W.mT @ W if W.shape[-1] <= W.shape[-2] else W @ W.mT
        lam = torch.linalg.eigvalsh(G)[..., -1]
        return lam.clamp_min(0).sqrt(), "gram"
    if method == "svd":
        return torch.linalg.svdvals(W)[..., 0], "svd"
    flat = W.detach().reshape(-1, *W.shape[-2:])
    out = torch.empty(flat.shape[0], dtype=W.dtype)
    fallback = 0
    for i, w in enumerate(flat):
        s = _lanczos_sigma_max(w)
        if s is None:
            fallback += 1
            s = float(matrix_spectral_norm(w, "gram")[0])
        out[i] = s
    note = "lanczos" if not fallback else f"lanczos (gram for {fallback} of {flat.shape[0]})"
    return out.reshape(W.shape[:-2]).to(W.device), note


def _check_method(method: Any) -> None:
    if method not in ("auto", "svd", "gram", "lanczos"):
        raise ThermoLensInputError(
            f"layer_norm_method must be 'auto', 'svd', 'gram' or 'lanczos', got {method!r}"
        )
