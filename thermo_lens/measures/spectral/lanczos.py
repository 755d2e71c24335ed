"""Lanczos on a stack of matrices at once: ``sigma_max`` of every whole-layer matrix of a model
with one batched product per step (the device path of the paper's whole-layer norms).

:func:`~thermo_lens.measures.spectral.kernels._lanczos_sigma_max` runs one matrix at a time and decides
after every step, on the host, whether to stop: on a GPU that is a launch sequence and three
host round trips per step and matrix (64 matrices x ~50 steps at LLaMA-2-7B width). Here all
matrices of a stack ``M [batch, r, n]`` step together: each step is two batched matrix-vector
products (``M^T (M q)``), a batched full reorthogonalisation and a norm, a fixed number of ops
whatever the batch, and the Lanczos coefficients stay on the device. Every ``check_every`` steps
they are read back in one copy and the tridiagonal eigenproblems are solved on the host in float64.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["lanczos_sigma_max_batched", "CHECK_EVERY"]

#: Steps between two reads of the Lanczos coefficients (each read waits for the device).
CHECK_EVERY = 8


def _start_vector(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The seeded start vector of the per-matrix path (:func:`_lanczos_sigma_max`): the same
    Krylov spaces, so both paths see the same iteration."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(n, generator=gen, dtype=dtype).to(device)
    return q / q.norm()


def lanczos_sigma_max_batched(
    M: Float[Tensor, "batch r n"], max_steps: int = 300, *, check_every: int = CHECK_EVERY
) -> tuple[np.ndarray, np.ndarray]:
    """``sigma_max`` of every matrix of a stack by Lanczos on its Gram operator ``M^T M`` (never
    formed), all matrices stepped together, with full reorthogonalisation, in ``M.dtype``.

    Returns ``(sigma [batch], steps [batch])`` as numpy arrays on the host (float64 from the
    ``M.dtype`` iteration, int64): ``sigma`` is NaN for a matrix that has not converged within
    ``max_steps`` steps (the caller falls back to another method) and ``steps`` the step at which
    each matrix stopped (-1: not converged).

    The stopping rule is that of the per-matrix path (:func:`_lanczos_sigma_max`): the top Ritz
    value ``theta`` has not moved by more than four machine epsilons (relative) over the last two
    steps and its residual ``beta_k |y_k|`` is below ``sqrt(eps) * theta``; an invariant subspace
    (``beta_k <= eps |alpha_0|``) or an exhausted Krylov space (``min(r, n) + (n > min(r, n))``
    steps) stops at once. It is evaluated every ``check_every`` steps (and at the step where the
    Krylov space is exhausted), not after every step: a matrix may take up to ``check_every - 1``
    steps more than the per-matrix path, which only moves ``theta`` closer to ``sigma_max^2``
    (Ritz values of a growing Krylov space never decrease and never exceed it). An invariant
    subspace found between two checks is found retrospectively, at the step it occurred.

    Matrices that have stopped keep stepping with the rest (their coefficients after the stop are
    never read): the product stays one batched launch, with no data-dependent shapes.
    """
    B, r, n = M.shape
    dtype, dev = M.dtype, M.device
    eps = torch.finfo(dtype).eps
    tiny = torch.finfo(dtype).tiny
    exact_at = min(r, n) + (n > min(r, n))
    steps = min(exact_at, max_steps)
    Q = torch.empty(B, steps + 1, n, dtype=dtype, device=dev)
    Q[:, 0] = _start_vector(n, dtype, dev)
    coef = torch.zeros(B, 2, steps, dtype=dtype, device=dev)  # alpha, beta: read back in one copy
    sigma = np.full(B, np.nan)
    stopped = np.full(B, -1)
    for k in range(steps):
        q = Q[:, k, :, None]  # [B, n, 1]
        w = torch.bmm(M.mT, torch.bmm(M, q))  # [B, n, 1]: M^T (M q)
        coef[:, 0, k] = torch.bmm(q.mT, w)[:, 0, 0]
        Bk = Q[:, :k + 1]  # [B, k + 1, n]
        for _ in range(2):  # twice: full reorthogonalisation in finite precision
            w = torch.baddbmm(w, Bk.mT, torch.bmm(Bk, w), alpha=-1)
        beta = torch.linalg.vector_norm(w, dim=(1, 2))
        coef[:, 1, k] = beta
        Q[:, k + 1] = w[..., 0] / beta.clamp_min(tiny)[:, None]
        if (k + 1) % check_every == 0 or k + 1 == steps:
            # The one host read of this check; the rest of the check is numpy on the host.
            host = coef[:, :, :k + 1].to("cpu", torch.float64).numpy()
            _check(host, k, eps, exact_at, sigma, stopped)
            if (stopped >= 0).all():
                break
    return sigma, stopped


def _top(alpha: np.ndarray, beta: np.ndarray, vector: bool = False) -> tuple[float, float]:
    """The largest eigenvalue of the symmetric tridiagonal matrix with diagonal ``alpha [k]`` and
    off-diagonal ``beta [k - 1]`` (float64), and with ``vector`` the last component of its unit
    eigenvector (else NaN).

    LAPACK's bisection and inverse iteration for one eigenpair of a tridiagonal matrix (``stebz`` /
    ``stein``): O(k) work per matrix and no BLAS threads. A dense batched ``eigh`` of the ``k x k``
    matrices costs O(k^3) each, and on a host whose cores are busy its threads made a check of 64
    matrices of 56 steps take seconds (measured on a loaded 2-core machine)."""
    from scipy.linalg import eigh_tridiagonal  # here: importing thermo_lens stays free of scipy.linalg

    k = alpha.shape[0]
    if not vector:
        w = eigh_tridiagonal(alpha, beta, eigvals_only=True, select="i", select_range=(k - 1, k - 1))
        return float(w[0]), math.nan
    w, v = eigh_tridiagonal(alpha, beta, select="i", select_range=(k - 1, k - 1))
    return float(w[0]), float(v[-1, 0])


def _check(coef: np.ndarray, k: int, eps: float, exact_at: int, sigma: np.ndarray, stopped: np.ndarray) -> None:
    """Stop the matrices that have converged by step ``k`` (in place: ``sigma`` the root of
    ``theta``, ``stopped`` the step), from their coefficients ``coef [batch, 2, k + 1]`` (host,
    float64; numpy and LAPACK on the host, so that nothing here is a device op)."""
    alpha, beta = coef[:, 0], coef[:, 1]
    for i in np.flatnonzero(stopped < 0):
        # An invariant subspace between two checks: stop at the first step it occurred (T's top
        # eigenvalue is then exact), as the per-matrix path does.
        broke = beta[i] <= eps * abs(alpha[i, 0])
        if broke.any():
            j = int(broke.argmax())
            sigma[i] = math.sqrt(max(_top(alpha[i, :j + 1], beta[i, :j])[0], 0.0))
            stopped[i] = j
            continue
        theta, y_last = _top(alpha[i, :k + 1], beta[i, :k], vector=True)
        conv = k + 1 >= exact_at or (
            k >= 2 and beta[i, k] * abs(y_last) <= math.sqrt(eps) * theta
            and abs(theta - _top(alpha[i, :k - 1], beta[i, :k - 2])[0]) <= 4 * eps * theta)
        if conv:
            sigma[i] = math.sqrt(max(theta, 0.0))
            stopped[i] = k
