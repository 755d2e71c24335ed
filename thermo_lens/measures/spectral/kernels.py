"""Batched linear-algebra kernels of the spectral signature (``thermo_lens.definitions`` §2).

- :func:`gram_root`: the ``d_head x d_head`` square-root factor ``R`` (``R^T R = W^T W``) of a
  head from the Cholesky factorisation of its Gram matrix (:func:`_gram_root`, from its
  eigendecomposition, where Cholesky refuses);
- :func:`_sigma_max_of_product` / :func:`ov_norm_factored`: ``sigma_max`` of a product of two
  heads' matrices (the OV and QK circuits) from those factors, never forming ``d_model x d_model``;
- :func:`gram_matrices`: the per-head Gram matrices from weights as stored (bf16, views of fused
  parameters), converted in cache a block at a time;
- :func:`matrix_spectral_norm` (and :func:`_lanczos_sigma_max` on :class:`_GramOperator`, one
  pass over the matrix per step): ``sigma_max`` of large matrices (the paper's whole-layer norms)
  by dense SVD, the Gram eigenvalue or Lanczos.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError

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


def gram_root(G: Float[Tensor, "... n n"]) -> Float[Tensor, "... n n"]:
    """A square-root factor ``R`` of each Gram matrix of a stack (``R^T R = G``): ``L^T`` from the
    Cholesky factorisation ``G = L L^T``, or :func:`_gram_root` (from ``eigh``) for a matrix
    Cholesky refuses (a rank-deficient head: a zero pivot).

    Why Cholesky: a batch of 128 x 128 factorisations costs a fifth of ``eigh`` on CPU (3 ms
    against 17 ms for a 7B layer's 32 heads), and any ``R`` with ``R^T R = G`` serves the products
    (``R`` is determined up to an orthogonal factor on the left, which no singular value sees).
    Backward stable: a completed factorisation has ``L L^T = G + E`` with ``||E|| ~ eps tr(G)``,
    the same order as the rounding of ``G`` itself (tests compare with float64 SVDs to 1e-10,
    rank-deficient and nearly singular heads included).
    """
    L, info = torch.linalg.cholesky_ex(G)
    R = L.mT
    bad = info != 0
    if bool(bad.any()):
        R = R.clone()
        R[bad] = _gram_root(*torch.linalg.eigh(G[bad]))
    return R


def ov_norm_factored(
    W_V: Float[Tensor, "... d_model d_head"], W_O: Float[Tensor, "... d_head d_model"]
) -> Float[Tensor, "..."]:
    """``sigma_max(W_V @ W_O)`` for stacks of heads, without forming ``d_model x d_model``.

    With ``R_V^T R_V = W_V^T W_V`` and ``R_O^T R_O = W_O W_O^T`` (``d_head x d_head``),
    ``W_V W_O = Q_V (R_V R_O^T) Q_O^T`` with orthonormal ``Q``, so its singular values are those of
    the small ``R_V R_O^T``. Leading dimensions broadcast. Half-precision weights (bf16, fp16) are
    reduced in float32, as :func:`matrix_spectral_norm` does.
    """
    for name, w in (("W_V", W_V), ("W_O", W_O)):
        if not isinstance(w, Tensor) or not w.is_floating_point() or w.ndim < 2:
            raise ThermoLensInputError(f"ov_norm_factored: {name} must be a floating-point tensor [..., m, n]")
    dtype = torch.promote_types(_full_precision(W_V.dtype), _full_precision(W_O.dtype))
    W_V, W_O = W_V.to(dtype), W_O.to(dtype)
    return _sigma_max_of_product(gram_root(W_V.mT @ W_V), W_O @ W_O.mT)


def _full_precision(dtype: torch.dtype) -> torch.dtype:
    """float32 for a half-precision dtype (bf16, fp16), else ``dtype``: norms are reduced in full
    precision (LAPACK has no bf16 routines; bf16 arithmetic would be ~1% off)."""
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def _sigma_max_of_product(R_a: Tensor, G_b: Tensor) -> Tensor:
    """``sigma_max(Q_a R_a R_b^T Q_b^T)`` = the top singular value of the small ``R_a R_b^T``, as
    the root of the largest eigenvalue of ``R_a G_b R_a^T`` (``G_b = R_b^T R_b``, the Gram matrix
    of ``b``): one batched :func:`top_eigenvalue` of ``d_head x d_head`` symmetric matrices."""
    M = R_a @ G_b @ R_a.mT
    return top_eigenvalue(M).sqrt()


#: Relative error bound of :func:`_top_eigenvalue_by_squaring` in exact arithmetic.
SQUARING_TOLERANCE = 1e-9


def top_eigenvalue(G: Float[Tensor, "... n n"]) -> Float[Tensor, "..."]:
    """The largest eigenvalue of each symmetric positive semi-definite ``G`` (a head's Gram matrix,
    ``d_head x d_head``), clamped at 0, in ``G.dtype`` on ``G``'s device.

    On CPU: LAPACK's batched ``eigvalsh`` (backward stable: relative error ~ machine epsilon).
    On CUDA: :func:`_top_eigenvalue_by_squaring` (cuSOLVER's ``syevd`` of a batch of 128 x 128
    matrices runs one matrix at a time: 53 ms for a 7B layer's 32 heads on an H200, 300 times
    the layer's Gram products, and its float32 eigenvalues were 1.7e-5 off float64 there).
    Elsewhere (MPS has no float64), on the CPU.
    """
    if G.shape[-1] == 0:
        return G.new_zeros(G.shape[:-2])
    if G.device.type == "cuda":
        return _top_eigenvalue_by_squaring(G)
    if G.device.type != "cpu":
        return torch.linalg.eigvalsh(G.cpu())[..., -1].clamp_min(0).to(G.device)
    return torch.linalg.eigvalsh(G)[..., -1].clamp_min(0)


def _top_eigenvalue_by_squaring(G: Float[Tensor, "... n n"], tol: float = SQUARING_TOLERANCE) -> Float[Tensor, "..."]:
    """``lambda_max`` of symmetric PSD matrices by repeated squaring, batched, in float64.

    ``P = (G / s)^p`` with ``p = 2^k`` from ``k`` squarings (each renormalised by its largest
    diagonal entry, which for a PSD matrix is its largest entry: nothing overflows, and what
    underflows is negligible by construction), then the Rayleigh quotient of ``G`` at the column
    ``x = P e_j`` of ``P``'s largest diagonal entry. Its error is bounded for any spectrum, gap or
    none: with ``G = sum_i lambda_i v_i v_i^T`` and ``lambda_i = lambda_1 (1 - d_i)``,
    ``lambda_1 - RQ = sum_i (lambda_1 - lambda_i) w_i`` with weights
    ``w_i = lambda_i^(2p) v_ij^2 / |x|^2``; ``|x|^2 >= P_jj^2 >= (lambda_1^p / n)^2`` (the largest
    diagonal entry is at least the trace over ``n``), so
    ``(lambda_1 - RQ) / lambda_1 <= n^2 max_d d (1 - d)^(2p) <= n^2 / (2 e p)``. ``k`` is chosen so
    that this is at most ``tol``. The Rayleigh quotient never exceeds ``lambda_1``. Eigenvalues
    close to ``lambda_1`` (a tie, a crowded top) cost nothing: they are what the bound allows.
    Cost: ``k`` (~42 for ``n = 128``) batched ``n x n`` products, a few milliseconds for a 7B
    layer, in place of one eigendecomposition per matrix.
    """
    n = G.shape[-1]
    A = G.to(torch.float64)
    A = (A + A.mT) / 2
    k = max(1, math.ceil(math.log2(n * n / (2 * math.e * tol))))
    scale = A.diagonal(dim1=-2, dim2=-1).amax(-1)
    zero = scale <= 0  # a PSD matrix with a zero diagonal is zero
    P = A / torch.where(zero, 1.0, scale)[..., None, None]
    tiny = torch.finfo(torch.float64).tiny
    for i in range(k):
        P = P @ P
        # Renormalised every 4th squaring (and last): from a largest entry of 1, four squarings
        # reach at most n^15 (no overflow in float64 for n < 10^20), and the largest diagonal
        # entry never falls (P^2_jj >= P_jj^2 = 1): fewer kernel launches, nothing lost.
        if i % 4 == 3 or i == k - 1:
            P = P / P.diagonal(dim1=-2, dim2=-1).amax(-1).clamp_min(tiny)[..., None, None]
    j = P.diagonal(dim1=-2, dim2=-1).argmax(-1)
    x = torch.gather(P, -1, j[..., None, None].expand(*P.shape[:-1], 1))  # [..., n, 1]
    rq = (x.mT @ A @ x)[..., 0, 0] / (x.mT @ x)[..., 0, 0].clamp_min(tiny)
    return torch.where(zero, 0.0, rq).clamp_min(0).to(G.dtype)


# Elements of one block of heads converted at a time for the Gram products (2 MiB in float32: one
# head of a 7B model, a dozen of GPT-2-small's), and of one row panel of the Lanczos operator: both
# stay in cache between their conversion and their products.
_BLOCK_ELEMENTS = 1 << 19
_PANEL_ELEMENTS = 1 << 19


def _empty_in_layout(src: Tensor, dtype: torch.dtype) -> Tensor:
    """An empty dense tensor of ``src``'s shape whose dimensions are laid out in ``src``'s order
    (by decreasing stride), so that ``copy_`` from ``src`` (a view of a transposed or fused
    parameter, say) reads it in memory order instead of transposing element by element."""
    strides = src.stride()
    order = sorted(range(src.ndim), key=lambda d: -strides[d])
    buf = torch.empty([src.shape[d] for d in order], dtype=dtype, device=src.device)
    return buf.permute([order.index(d) for d in range(src.ndim)])


def gram_matrices(W: Float[Tensor, "... m n"], dtype: torch.dtype, *, rows: bool = False,
                  blocked: bool | None = None) -> Float[Tensor, "... k k"]:
    """``W^T W`` (``k = n``), or ``W W^T`` with ``rows=True`` (``k = m``), of every matrix of a
    stack, computed in ``dtype``: the per-head Gram matrices, ``d_head x d_head``.

    Weights stored in another dtype (a bf16 model) are converted a block of ~2 MiB at a time into
    one reused buffer laid out as the weights are (a head of a fused, transposed ``v_proj`` stays
    column-major: no transposing copy), so the products read each converted block from cache and
    no converted copy of the stack exists. ``blocked``: default on CPU; a GPU converts the stack at
    once (its kernels want large batches).
    """
    if blocked is None:
        blocked = W.device.type == "cpu"
    if W.dtype == dtype or not blocked:
        W = W.to(dtype)
        return W @ W.mT if rows else W.mT @ W
    m, n = W.shape[-2:]
    k = m if rows else n
    flat = W.reshape(-1, m, n)
    out = torch.empty(flat.shape[0], k, k, dtype=dtype, device=W.device)
    step = max(1, _BLOCK_ELEMENTS // max(1, m * n))
    buf = _empty_in_layout(flat[:step], dtype)
    for i in range(0, flat.shape[0], step):
        B = buf[:min(step, flat.shape[0] - i)]
        B.copy_(flat[i:i + step])
        if rows:
            torch.matmul(B, B.mT, out=out[i:i + B.shape[0]])
        else:
            torch.matmul(B.mT, B, out=out[i:i + B.shape[0]])
    return out.reshape(*W.shape[:-2], k, k)


class RowPanels:
    """A matrix ``[m, n]`` given as its row panels ``[m_i, n]`` (stacked top to bottom), each a
    dense view in any layout: a layer's value matrix ``W_V^T = [kv_head * d_head, d_model]`` whose
    panels are the heads' ``W_V[h]^T`` when the heads are stored one after another (the whole
    matrix is then no view of the weights, and a row-major copy of a 7B layer costs 14 ms; the
    Lanczos operator reads the panels in place)."""

    def __init__(self, panels: list[Tensor]):
        n = panels[0].shape[1]
        if any(P.ndim != 2 or P.shape[1] != n or P.dtype != panels[0].dtype for P in panels):
            raise ThermoLensInputError("RowPanels: every panel must be [rows, n] of one dtype")
        self.panels = panels
        self.shape = (sum(P.shape[0] for P in panels), n)
        self.dtype, self.device = panels[0].dtype, panels[0].device

    def dense(self) -> Tensor:
        return torch.cat(self.panels)


class _GramOperator:
    """``x -> W^T (W x)`` for one matrix ``W [m, n]`` in ``dtype``, ``W`` read once per product.

    ``W`` is taken a row panel at a time (~2 MiB, or the panels of a :class:`RowPanels`):
    ``W^T W x = sum_i P_i^T (P_i x)``, so each panel stays in cache between its two matrix-vector
    products and the pass costs one read of ``W`` from memory, not two. A panel stored in another
    dtype (bf16) is converted in cache, into a buffer laid out as the panel is (row- or
    column-major), so a bf16 matrix costs half the memory traffic of a float32 copy. The operator
    is bound by memory bandwidth: one product reads all of ``W``.
    """

    def __init__(self, W: Float[Tensor, "m n"] | RowPanels, dtype: torch.dtype):
        if W.device.type != "cpu":
            # A GPU has no cache to convert in and wants few large kernels: the matrix is converted
            # once (64 MiB in float32 at 7B width), one panel, and each product is two
            # matrix-vector kernels, not three small ones per 2 MiB panel (launch-bound).
            self.panels = [(W.dense() if isinstance(W, RowPanels) else W).to(dtype)]
        elif isinstance(W, RowPanels):
            self.panels = W.panels
        else:
            m, n = W.shape
            r = max(1, min(m, _PANEL_ELEMENTS // max(1, n)))
            self.panels = [W[i:i + r] for i in range(0, m, r)]
        big = max(self.panels, key=lambda P: P.shape[0])
        self.buf = None if big.dtype == dtype else _empty_in_layout(big, dtype)
        self.y = torch.empty(big.shape[0], dtype=dtype, device=W.device)

    def __call__(self, x: Float[Tensor, " n"], out: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
        out.zero_()
        for P in self.panels:
            if self.buf is not None:
                P = self.buf[:P.shape[0]].copy_(P)
            y = self.y[:P.shape[0]]
            torch.mv(P, x, out=y)
            out.addmv_(P.mT, y)
        return out


def _lanczos_sigma_max(W: Float[Tensor, "m n"] | RowPanels, max_steps: int = 300, *,
                       dtype: torch.dtype | None = None) -> float | None:
    """``sigma_max`` of one matrix by Lanczos on a Gram operator (``W^T W`` or ``W W^T``, never
    formed; :class:`_GramOperator`), with full reorthogonalisation, in ``dtype``
    (default ``W.dtype``: a bf16 ``W`` is read as stored and converted in cache); ``None`` if not
    converged.

    Converged when the top Ritz value ``theta`` of the tridiagonal matrix has not moved by more
    than four machine epsilons (relative) over the last two steps and its residual
    ``beta_k |y_k|`` is below ``sqrt(eps) * theta`` (an eigenvalue of the operator lies within
    ``residual^2 / gap`` of ``theta``). Checked after every step (the ``k x k`` tridiagonal
    eigenproblem costs microseconds beside a pass over ``W``): a matrix whose top singular value
    stands apart converges in a dozen steps, and each step saved is a read of ``W``. On a square
    Gaussian matrix (the slowest case: the top of its spectrum is crowded at the Marchenko-Pastur
    edge, where ``theta`` creeps up by ~15% of its remaining error per step) this stops ~1e-6
    (relative) below ``sigma_max``; on spectra with a gap, at machine precision. A seeded random
    start vector: repeatable.
    """
    dtype = W.dtype if dtype is None else dtype
    # The Gram operator of the orientation whose rows are contiguous (a panel is then one block of
    # memory); without a preference, of the smaller side. Its size n may exceed the rank
    # r = min(m, n) of W: the Krylov space is then exhausted after r + 1 steps, not n, and the top
    # Ritz value is exact there. Given panels are read as given.
    if isinstance(W, Tensor):
        rows_contiguous = [A.stride(-1) == 1 or A.shape[-1] == 1 for A in (W, W.mT)]
        if rows_contiguous[1] and not rows_contiguous[0] or (
                rows_contiguous[0] == rows_contiguous[1] and W.shape[0] < W.shape[1]):
            W = W.mT
    n = W.shape[1]
    exact_at = min(W.shape) + (n > min(W.shape))
    op = _GramOperator(W, dtype)
    steps = min(exact_at, max_steps)
    eps = torch.finfo(dtype).eps
    gen = torch.Generator(device="cpu").manual_seed(0)
    Q = torch.empty(steps + 1, n, dtype=dtype, device=W.device)
    q = torch.randn(n, generator=gen, dtype=dtype).to(W.device)
    Q[0] = q / q.norm()
    v = torch.empty(n, dtype=dtype, device=W.device)
    alpha: list[float] = []
    beta: list[float] = []
    thetas: list[float] = []
    for k in range(steps):
        w = op(Q[k], v)
        alpha.append(float(torch.dot(w, Q[k])))
        B = Q[:k + 1]
        w.addmv_(B.mT, B @ w, alpha=-1)
        w.addmv_(B.mT, B @ w, alpha=-1)  # twice: full reorthogonalisation in finite precision
        beta.append(float(w.norm()))
        done = beta[-1] <= eps * abs(alpha[0])  # an invariant subspace: T's eigenvalues are exact
        if not done:
            Q[k + 1] = w / beta[-1]
        # The k x k tridiagonal matrix, float64 on CPU (torch, not numpy: numpy's BLAS would
        # start its own thread pool, outside the caller's torch thread setting).
        a = torch.tensor(alpha, dtype=torch.float64)
        b = torch.tensor(beta[:-1], dtype=torch.float64)
        lam, Y = torch.linalg.eigh(torch.diag(a) + torch.diag(b, 1) + torch.diag(b, -1))
        theta, resid = float(lam[-1]), beta[-1] * abs(float(Y[-1, -1]))
        thetas.append(theta)
        if done or (k >= 2 and abs(theta - thetas[-3]) <= 4 * eps * theta
                    and resid <= math.sqrt(eps) * theta) or k + 1 == exact_at:
            return math.sqrt(max(theta, 0.0))
    return None


def lanczos_norms(mats: Iterable[Tensor | RowPanels], n: int, dtype: torch.dtype,
                  sigma: Callable[[Any], float | None] | None = None) -> tuple[Tensor, str]:
    """``sigma_max`` of ``n`` matrices taken one at a time from ``mats`` (a generator can build
    each just before it is used) by :func:`_lanczos_sigma_max` in ``dtype``, and the method: a
    matrix that has not converged within 300 steps falls back to ``"gram"`` and the method says
    how many did (``"lanczos (gram for 1 of 12)"``). Results on CPU."""
    out = torch.empty(n, dtype=dtype)
    fallback = 0
    for i, w in enumerate(mats):
        s = sigma(w) if sigma is not None else _lanczos_sigma_max(w, dtype=dtype)
        if s is None:
            fallback += 1
            s = float(matrix_spectral_norm((w.dense() if isinstance(w, RowPanels) else w).to(dtype), "gram")[0])
        out[i] = s
    return out, "lanczos" if not fallback else f"lanczos (gram for {fallback} of {n})"


def matrix_spectral_norm(
    W: Float[Tensor, "... m n"], method: str = "auto"
) -> tuple[Float[Tensor, "..."], str]:
    """``sigma_max`` of a stack of (possibly large) matrices, and the method used.

    Computed and returned in ``W.dtype`` (float32 or float64); a half-precision ``W`` (bf16, fp16:
    a model's stored weights) in float32, Lanczos converting it a row panel at a time in cache.

    ``"svd"``: batched ``torch.linalg.svdvals``. ``"gram"``: ``sqrt`` of the largest eigenvalue
    of the smaller-side Gram matrix ``W^T W`` (or ``W W^T``), batched ``eigvalsh`` (backward
    stable: the largest eigenvalue has relative error ~ machine epsilon, so ``sigma_max`` too).
    ``"lanczos"``: Lanczos on the smaller-side Gram operator, one matrix at a time, until the top
    Ritz value stops moving (:func:`_lanczos_sigma_max`: machine precision of the compute dtype
    where the top singular value stands apart, ~1e-6 relative on a crowded Gaussian spectrum; a
    matrix that has not converged within 300 steps falls back to ``"gram"``, and the method says
    so). ``"auto"``: ``"lanczos"`` on every device (one pass over the matrix per step, bound by
    memory bandwidth: a 4096 x 4096 bf16 matrix with Gaussian weights takes ~52 steps of ~3.3 ms
    on one CPU core, a spectrum with a gap, as trained weights have, ~13; a 4096 x 4096 dense SVD
    takes ~50 s on 2 cores). On an H200 the 64 whole-layer matrices of a 7B model took 1.09 s by
    Lanczos (1.0e-7 from float64), 5.4 s by ``"gram"`` (5.2e-7) and 61 s by ``"svd"``, whose
    float32 cuSOLVER result was 1.3e-4 to 4.3e-4 off float64 (``benchmarks/gpu.py``): on a GPU,
    ``"svd"`` and ``"gram"`` in float32 are ~1e-4 accurate, exact in float64.
    """
    _check_method(method)
    if not isinstance(W, Tensor) or not W.is_floating_point() or W.ndim < 2:
        got = f"{W.dtype} tensor of shape {tuple(W.shape)}" if isinstance(W, Tensor) else type(W).__name__
        raise ThermoLensInputError(f"matrix_spectral_norm needs a floating-point tensor [..., m, n], got {got}")
    dtype = _full_precision(W.dtype)  # a bf16 model's weights: reduced in float32
    method = resolve_method(method)
    if method != "lanczos":
        W = W.to(dtype)
    if method == "gram":
        G = W.mT @ W if W.shape[-1] <= W.shape[-2] else W @ W.mT
        lam = torch.linalg.eigvalsh(G)[..., -1]
        return lam.clamp_min(0).sqrt(), "gram"
    if method == "svd":
        return torch.linalg.svdvals(W)[..., 0], "svd"
    flat = W.detach().reshape(-1, *W.shape[-2:])
    # Looked up at call time: tests substitute _lanczos_sigma_max to force the fallback.
    out, note = lanczos_norms(flat, flat.shape[0], dtype, sigma=lambda w: _lanczos_sigma_max(w, dtype=dtype))
    return out.reshape(W.shape[:-2]).to(W.device), note


def resolve_method(method: str) -> str:
    """What ``"auto"`` means for the whole-layer norms: Lanczos, on every device (see
    :func:`matrix_spectral_norm`); any other method is itself."""
    return "lanczos" if method == "auto" else method


def _check_method(method: object) -> LayerNormMethod:
    """``method``, checked (a specific error instead of a type checker's for a public argument)."""
    if method not in ("auto", "svd", "gram", "lanczos"):
        raise ThermoLensInputError(
            f"layer_norm_method must be 'auto', 'svd', 'gram' or 'lanczos', got {method!r}"
        )
    return method
