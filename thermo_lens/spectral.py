"""Spectral signature of every attention head: norms of W_V, W_O and of the OV circuit.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", characterises each head by the spectral norms of its value and output matrices;
METHODS.md section 2 fixes the definitions used here (and section 3, end, the paper's "trace
proxy"). Per query head ``h`` of layer ``l`` (TransformerLens convention ``v = x @ W_V``,
``out = z @ W_O``; ``W_V[l, kv_head_of[h]]`` is ``[d_model, d_head]``, ``W_O[l, h]`` is
``[d_head, d_model]``):

- ``W_V_norm = sigma_max(W_V)``, ``W_O_norm = sigma_max(W_O)``, ``ratio = W_V_norm / W_O_norm``;
- ``W_V_frobenius = ||W_V||_F``, ``W_O_frobenius = ||W_O||_F``;
- stable rank ``||W||_F^2 / ||W||_2^2`` (in ``[1, min(d_model, d_head)]``);
- ``ov_norm = sigma_max(W_V W_O)``, the OV circuit's spectral norm, computed from the small
  factors: with ``W_V = Q_V R_V`` and ``W_O^T = Q_O R_O`` (QR), ``W_V W_O = Q_V (R_V R_O^T) Q_O^T``
  has the singular values of the ``d_head x d_head`` matrix ``R_V R_O^T``. The ``d_model x
  d_model`` product is never formed.

Grouped-query / multi-query attention: ``W_V`` has ``n_kv_heads`` heads. Every ``[layer, head]``
tensor is per *query* head (the KV head's value is repeated through ``kv_head_of``); the per-KV-head
values are kept too (``W_V_norm_kv`` ...), with the mapping ``kv_head_of`` itself.

The paper's per-layer convention: ``layer_W_V_norm`` = spectral norm of the whole layer's value
matrix ``[d_model, n_kv_heads * d_head]`` (all heads side by side, as in a fused ``v_proj``),
``layer_W_O_norm`` of the output matrix ``[n_heads * d_head, d_model]``, and the paper's "trace
proxy" ``layer_W_V_norm ** 2`` (it is not a trace; METHODS.md section 3).

Everything is batched over layers and heads (``torch.linalg.geqrf`` / ``svdvals`` /
``matrix_norm`` on stacked tensors), in float32 or float64, whatever the model's dtype.
Weight processing (TransformerLens compatibility mode) changes these numbers; the paper used raw
weights, so processed weights raise a ``UserWarning`` and every result records its state.

Entry points: :func:`spectral_signature` (a model), :func:`signature_from_weights` (stacked
tensors, no model), :func:`signature_from_collected` (for a one-pass profile),
:func:`ov_norm_factored` and :func:`matrix_spectral_norm` (the two batched kernels).
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from thermo_lens.hooks import ThermoLensNumericsError
from thermo_lens.model import ModelView, ThermoLensInputError, as_view
from thermo_lens.result import Result

__all__ = [
    "SpectralSignature",
    "spectral_signature",
    "signature_from_weights",
    "signature_from_collected",
    "ov_norm_factored",
    "matrix_spectral_norm",
    "HEAD_METRICS",
    "KV_HEAD_METRICS",
    "LAYER_METRICS",
]

#: ``[layer, head]`` metrics (per query head), in display order.
HEAD_METRICS: tuple[str, ...] = (
    "W_V_norm", "W_O_norm", "ratio", "ov_norm",
    "W_V_frobenius", "W_O_frobenius", "W_V_stable_rank", "W_O_stable_rank",
)
#: ``[layer, kv_head]`` metrics.
KV_HEAD_METRICS: tuple[str, ...] = ("W_V_norm_kv", "W_V_frobenius_kv", "W_V_stable_rank_kv")
#: ``[layer]`` metrics (the paper's whole-layer convention).
LAYER_METRICS: tuple[str, ...] = ("layer_W_V_norm", "layer_W_O_norm", "layer_ratio", "trace_proxy")

LayerNormMethod = Literal["auto", "svd", "lanczos"]

# Above this size (min side of a layer's matrix) a CPU dense SVD costs seconds per layer
# (4096 x 4096: ~50 s on 2 cores); Lanczos (ARPACK) on the Gram operator gets sigma_max to
# machine precision in ~2 s.
_LANCZOS_MIN_SIDE = 1024
# Elements of W_V + W_O factorised per chunk of layers (bounds the QR workspace to ~1 GB fp32).
_CHUNK_ELEMENTS = 1 << 28
# Per-head matrices up to this many elements (GPT-2's 768 x 64 = 49k) are factorised with one
# CPU thread: batched LAPACK loops over small matrices gain nothing from MKL/OpenMP threads, and
# on shared or oversubscribed cores every call's thread barrier can stall (measured 10-100x
# slower on 2 busy cores). Larger heads (4096 x 128) keep the threads.
_SINGLE_THREAD_MAX_ELEMENTS = 1 << 18


@contextmanager
def _one_thread():
    """Run the block with one intra-op CPU thread, restoring the caller's setting after."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _threads_for(W: Tensor):
    small = W.shape[-2] * W.shape[-1] <= _SINGLE_THREAD_MAX_ELEMENTS
    return _one_thread() if (W.device.type == "cpu" and small) else nullcontext()

_DEFINITIONS: dict[str, str] = {
    "W_V_norm": "sigma_max(W_V) of the query head's KV head, W_V [d_model, d_head]",
    "W_O_norm": "sigma_max(W_O), W_O [d_head, d_model]",
    "ratio": "W_V_norm / W_O_norm (per head)",
    "ov_norm": "sigma_max(W_V W_O) from QR factors: svdvals(R_V R_O^T), d_head x d_head",
    "W_V_frobenius": "||W_V||_F",
    "W_O_frobenius": "||W_O||_F",
    "W_V_stable_rank": "||W_V||_F^2 / ||W_V||_2^2",
    "W_O_stable_rank": "||W_O||_F^2 / ||W_O||_2^2",
    "W_V_norm_kv": "sigma_max(W_V) per KV head",
    "W_V_frobenius_kv": "||W_V||_F per KV head",
    "W_V_stable_rank_kv": "||W_V||_F^2 / ||W_V||_2^2 per KV head",
    "layer_W_V_norm": "sigma_max of the layer's value matrix [d_model, n_kv_heads * d_head] (paper)",
    "layer_W_O_norm": "sigma_max of the layer's output matrix [n_heads * d_head, d_model] (paper)",
    "layer_ratio": "layer_W_V_norm / layer_W_O_norm",
    "trace_proxy": "layer_W_V_norm ** 2, the paper's 'trace proxy' (not a trace)",
}


# --------------------------------------------------------------------------------------------
# result


@dataclass(frozen=True, eq=False)
class SpectralSignature(Result):
    """Spectral signature of every head (METHODS.md section 2; D'Elia 2026).

    ``[layer, head]`` tensors are per query head, TransformerLens style (like ``head_detector``).

    Attributes:
        W_V_norm: ``Float[Tensor, "layer head"]`` sigma_max(W_V) of the head's KV head.
        W_O_norm: ``Float[Tensor, "layer head"]`` sigma_max(W_O).
        ratio: ``Float[Tensor, "layer head"]`` ``W_V_norm / W_O_norm``.
        ov_norm: ``Float[Tensor, "layer head"]`` sigma_max(W_V W_O), from the d_head x d_head
            QR factors (never d_model x d_model). ``ov_norm <= W_V_norm * W_O_norm``.
        W_V_frobenius, W_O_frobenius: ``Float[Tensor, "layer head"]`` Frobenius norms.
        W_V_stable_rank, W_O_stable_rank: ``Float[Tensor, "layer head"]``
            ``||W||_F^2 / ||W||_2^2`` (NaN for an all-zero matrix).
        W_V_norm_kv, W_V_frobenius_kv, W_V_stable_rank_kv: ``Float[Tensor, "layer kv_head"]``
            the same per KV head (equal to the per-head tensors without GQA/MQA).
        kv_head_of: ``Int[Tensor, "head"]`` the KV head each query head reads.
        layer_W_V_norm: ``Float[Tensor, "layer"]`` sigma_max of the whole layer's value matrix
            ``[d_model, n_kv_heads * d_head]`` (the paper's per-layer convention), or None when
            skipped (``layer_norms=False``).
        layer_W_O_norm: ``Float[Tensor, "layer"]`` sigma_max of ``[n_heads * d_head, d_model]``.
        layer_ratio: ``Float[Tensor, "layer"]`` ``layer_W_V_norm / layer_W_O_norm``.
        trace_proxy: ``Float[Tensor, "layer"]`` ``layer_W_V_norm ** 2``, the paper's "trace proxy".
        dtype: compute dtype of every tensor (``"float32"`` or ``"float64"``).
        weights: ``"raw"``, ``"processed"`` (LayerNorm folded / writing weights centered) or
            ``"unknown"`` (tensors given directly).
        layer_norm_method: how the layer norms were computed: ``"svd"`` (dense, batched),
            ``"lanczos"`` (ARPACK on the Gram operator, to machine precision) or ``"skipped"``.
        model: the model's metadata (:meth:`ModelView.metadata`; geometry only when built from
            tensors).
    """

    W_V_norm: Float[Tensor, "layer head"]
    W_O_norm: Float[Tensor, "layer head"]
    ratio: Float[Tensor, "layer head"]
    ov_norm: Float[Tensor, "layer head"]
    W_V_frobenius: Float[Tensor, "layer head"]
    W_O_frobenius: Float[Tensor, "layer head"]
    W_V_stable_rank: Float[Tensor, "layer head"]
    W_O_stable_rank: Float[Tensor, "layer head"]
    W_V_norm_kv: Float[Tensor, "layer kv_head"]
    W_V_frobenius_kv: Float[Tensor, "layer kv_head"]
    W_V_stable_rank_kv: Float[Tensor, "layer kv_head"]
    kv_head_of: Int[Tensor, "head"]
    layer_W_V_norm: Float[Tensor, "layer"] | None
    layer_W_O_norm: Float[Tensor, "layer"] | None
    layer_ratio: Float[Tensor, "layer"] | None
    trace_proxy: Float[Tensor, "layer"] | None
    dtype: str
    weights: str
    layer_norm_method: str
    model: dict

    definitions: ClassVar[dict[str, str]] = _DEFINITIONS

    # ------------------------------------------------------------------ geometry
    @property
    def n_layers(self) -> int:
        return int(self.W_O_norm.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_O_norm.shape[1])

    @property
    def n_kv_heads(self) -> int:
        return int(self.W_V_norm_kv.shape[1])

    @property
    def d_head(self) -> int:
        return int(self.model["d_head"])

    @property
    def d_model(self) -> int:
        return int(self.model["d_model"])

    @property
    def rho(self) -> float:
        """Dimensional crowding ``n_heads / d_head`` (true d_head from the config)."""
        return self.n_heads / self.d_head

    @property
    def name(self) -> str:
        return str(self.model.get("name") or "weights")

    # ------------------------------------------------------------------ summaries
    def summary(self) -> dict[str, Any]:
        """Model-level summary: the mean over layers and heads of every ``[layer, head]`` metric
        (the ``ratio`` entry is the mean of per-head ratios, not a ratio of means), the mean over
        layers of every per-layer metric (``layer_W_V_norm`` ...), geometry, ``rho`` and the
        definition (dtype, weights)."""
        out: dict[str, Any] = {
            "model": self.name,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "rho": self.rho,
        }
        for m in HEAD_METRICS:
            out[m] = _mean(getattr(self, m))
        for m in LAYER_METRICS:
            t = getattr(self, m)
            out[m] = _mean(t) if t is not None else None
        out.update(dtype=self.dtype, weights=self.weights, aggregation="mean over layers and heads")
        return out

    def to_row(self) -> dict[str, Any]:
        """One flat row for cross-model tables (:mod:`thermo_lens.laws` reads ``model``, ``rho``)."""
        row = self.summary()
        row.pop("aggregation")
        row.update(post_ln=self.model.get("post_ln"), layer_norm_method=self.layer_norm_method)
        return row

    def to_frame(self, level: Literal["head", "kv_head", "layer"] = "head") -> pd.DataFrame:
        """Tidy frame: one row per ``(layer, head)`` (default), per ``(layer, kv_head)`` or per
        ``layer`` (the paper's whole-layer norms plus the per-layer means of the head metrics),
        one column per metric, plus ``model``, ``weights`` and ``dtype`` columns."""
        L = self.n_layers
        if level == "head":
            H = self.n_heads
            data = {"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
                    "kv_head": np.tile(self.kv_head_of.numpy(), L)}
            data.update({m: _np(getattr(self, m)).reshape(-1) for m in HEAD_METRICS})
        elif level == "kv_head":
            K = self.n_kv_heads
            data = {"layer": np.repeat(np.arange(L), K), "kv_head": np.tile(np.arange(K), L)}
            data.update({m: _np(getattr(self, m)).reshape(-1) for m in KV_HEAD_METRICS})
        elif level == "layer":
            data = {"layer": np.arange(L)}
            for m in LAYER_METRICS:
                t = getattr(self, m)
                data[m] = _np(t) if t is not None else np.full(L, np.nan)
            data.update({f"mean_{m}": _np(getattr(self, m)).mean(axis=1) for m in HEAD_METRICS})
        else:
            raise ThermoLensInputError(
                f"level must be 'head', 'kv_head' or 'layer', got {level!r}"
            )
        df = pd.DataFrame(data)
        df["model"], df["weights"], df["dtype"] = self.name, self.weights, self.dtype
        df.attrs.update(definitions=dict(self.definitions), model=dict(self.model))
        return df

    def __repr__(self) -> str:
        s = self.summary()
        g = (f"{self.n_layers} layers x {self.n_heads} heads"
             + (f" ({self.n_kv_heads} KV heads)" if self.n_kv_heads != self.n_heads else "")
             + f", d_model={self.d_model}, d_head={self.d_head}, rho=n_heads/d_head={self.rho:.3g}")
        lines = [
            f"SpectralSignature({self.name}: {g}; weights {self.weights}, {self.dtype})",
            "  mean over layers x heads:"
            f" ||W_V||_2={s['W_V_norm']:.4g}  ||W_O||_2={s['W_O_norm']:.4g}"
            f"  ratio={s['ratio']:.4g}  ||W_V W_O||_2={s['ov_norm']:.4g}",
            f"    ||W_V||_F={s['W_V_frobenius']:.4g}  ||W_O||_F={s['W_O_frobenius']:.4g}"
            f"  stable rank W_V={s['W_V_stable_rank']:.3g}  W_O={s['W_O_stable_rank']:.3g}"
            f"  (max {min(self.d_model, self.d_head)})",
        ]
        if self.layer_W_V_norm is not None:
            lv, lo = _np(self.layer_W_V_norm), _np(self.layer_W_O_norm)
            lines.append(
                f"  per layer, all heads ({self.layer_norm_method}): ||W_V||_2 {lv.min():.4g}..{lv.max():.4g}"
                f", ||W_O||_2 {lo.min():.4g}..{lo.max():.4g}, trace proxy ||W_V||_2^2 mean"
                f" {s['trace_proxy']:.4g}"
            )
        lines.append("  [layer, head] tensors: " + ", ".join(HEAD_METRICS)
                     + "; .to_frame(), .summary()")
        return "\n".join(lines)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _mean(t: Tensor) -> float:
    return float(t.double().nanmean()) if t.numel() else math.nan


# --------------------------------------------------------------------------------------------
# batched kernels


def _r_factor(W: Float[Tensor, "... m n"]) -> Float[Tensor, "... k n"]:
    """``R`` of the reduced QR ``W = Q R`` (``k = min(m, n)``), batched.

    ``W`` and ``R`` have the same singular values and ``W^T W = R^T R``. ``geqrf`` (Householder,
    backward stable) without forming ``Q``; column-major input avoids a transposing copy in
    LAPACK.
    """
    k = min(W.shape[-2], W.shape[-1])
    if W.device.type == "cpu" and W.stride(-2) != 1:
        W = W.mT.contiguous().mT
    a, _ = torch.geqrf(W)
    return torch.triu(a[..., :k, :])


def ov_norm_factored(
    W_V: Float[Tensor, "... d_model d_head"], W_O: Float[Tensor, "... d_head d_model"]
) -> Float[Tensor, "..."]:
    """``sigma_max(W_V @ W_O)`` for stacks of heads, without forming ``d_model x d_model``.

    With ``W_V = Q_V R_V`` and ``W_O^T = Q_O R_O``, ``W_V W_O = Q_V (R_V R_O^T) Q_O^T``, so its
    singular values are those of the small ``R_V R_O^T``. Leading dimensions broadcast.
    """
    with _threads_for(W_V):
        R_V, R_O = _r_factor(W_V), _r_factor(W_O.mT)
    with _threads_for(R_V):
        return torch.linalg.svdvals(R_V @ R_O.mT)[..., 0]


def matrix_spectral_norm(
    W: Float[Tensor, "... m n"], method: LayerNormMethod = "auto"
) -> tuple[Float[Tensor, "..."], str]:
    """Exact ``sigma_max`` of a stack of (possibly large) matrices, and the method used.

    ``"svd"``: batched ``torch.linalg.svdvals``. ``"lanczos"``: ARPACK (``scipy eigsh``,
    ``tol=0``: machine precision of ``W.dtype``) on the Gram operator of the smaller side, one
    matrix at a time; a CPU dense SVD of a 4096 x 4096 matrix takes ~50 s on 2 cores, Lanczos ~2 s.
    ``"auto"``: ``"svd"`` on GPU or when ``min(m, n) <= 1024``, else ``"lanczos"``.
    """
    if method not in ("auto", "svd", "lanczos"):
        raise ThermoLensInputError(
            f"layer_norm_method must be 'auto', 'svd' or 'lanczos', got {method!r}"
        )
    small = min(W.shape[-2], W.shape[-1])
    if method == "auto":
        method = "svd" if (W.device.type != "cpu" or small <= _LANCZOS_MIN_SIDE) else "lanczos"
    if method == "svd" or small < 3:  # ARPACK needs k < n
        return torch.linalg.svdvals(W)[..., 0], "svd"
    from scipy.sparse.linalg import LinearOperator, eigsh

    flat = W.detach().reshape(-1, *W.shape[-2:]).to("cpu")
    out = torch.empty(flat.shape[0], dtype=W.dtype)
    for i, w in enumerate(flat):
        a = w.numpy()
        if a.shape[0] < a.shape[1]:
            a = a.T
        a = np.ascontiguousarray(a)  # [m, n], m >= n: Gram operator a^T a is n x n
        n = a.shape[1]
        op = LinearOperator((n, n), matvec=lambda v, a=a: a.T @ (a @ v), dtype=a.dtype)
        v0 = np.random.default_rng(0).standard_normal(n).astype(a.dtype)
        lam = eigsh(op, k=1, which="LA", v0=v0, tol=0, return_eigenvectors=False)[0]
        out[i] = math.sqrt(max(float(lam), 0.0))
    return out.reshape(W.shape[:-2]).to(W.device), "lanczos"


def _norms(W: Float[Tensor, "... m n"], R: Float[Tensor, "... k n"]) -> tuple[Tensor, Tensor, Tensor]:
    """(sigma_max, Frobenius, stable rank) of ``W`` given its R factor."""
    with _threads_for(R):
        sigma = torch.linalg.svdvals(R)[..., 0]
    fro = torch.linalg.matrix_norm(W, ord="fro")
    return sigma, fro, fro.square() / sigma.square()


# --------------------------------------------------------------------------------------------
# pure function on tensors


_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _check_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, str) and dtype.replace("torch.", "") in _DTYPES:
        return _DTYPES[dtype.replace("torch.", "")]
    if dtype in (torch.float32, torch.float64):
        return dtype
    raise ThermoLensInputError(
        f"dtype must be torch.float32 or torch.float64 (norms are always reduced in full "
        f"precision, whatever the model's dtype), got {dtype!r}"
    )


def _check_shapes(W_V: Any, W_O: Any, kv_head_of: Any) -> Tensor:
    for name, w, dims in (("W_V", W_V, "[layer, kv_head, d_model, d_head]"),
                          ("W_O", W_O, "[layer, head, d_head, d_model]")):
        if not isinstance(w, Tensor):
            raise ThermoLensInputError(f"{name} must be a torch.Tensor {dims}, got {type(w).__name__}")
        if w.ndim != 4:
            raise ThermoLensInputError(
                f"{name} must be 4-D {dims}, got shape {tuple(w.shape)}"
                + ("; for one layer use W[None]" if w.ndim == 3 else "")
            )
        if not w.is_floating_point():
            raise ThermoLensInputError(f"{name} must be floating point, got {w.dtype}")
    L, K, d_model, d_head = W_V.shape
    if W_O.shape[0] != L or W_O.shape[2] != d_head or W_O.shape[3] != d_model:
        raise ThermoLensInputError(
            f"W_V {tuple(W_V.shape)} [layer, kv_head, d_model, d_head] and W_O {tuple(W_O.shape)} "
            "[layer, head, d_head, d_model] disagree on layer, d_model or d_head"
        )
    H = W_O.shape[1]
    if min(L, K, H, d_model, d_head) == 0:
        raise ThermoLensInputError(f"empty weights: W_V {tuple(W_V.shape)}, W_O {tuple(W_O.shape)}")
    if kv_head_of is None:
        if H % K:
            raise ThermoLensInputError(
                f"n_heads={H} is not a multiple of n_kv_heads={K}; pass kv_head_of [head] explicitly"
            )
        return torch.arange(H) // (H // K)
    kv = torch.as_tensor(kv_head_of).to("cpu", torch.long).reshape(-1)
    if kv.numel() != H or (kv < 0).any() or (kv >= K).any():
        raise ThermoLensInputError(
            f"kv_head_of must give, for each of the {H} query heads, a KV head in [0, {K}); "
            f"got {kv.tolist()}"
        )
    return kv


def _check_finite(W: Tensor, name: str) -> None:
    bad = ~torch.isfinite(W).flatten(-2).all(-1)  # [layer, head]
    if bad.any():
        l, h = (int(i) for i in bad.nonzero()[0])
        raise ThermoLensNumericsError(
            f"{name} has NaN/inf at layer {l}, head {h} ({int(bad.sum())} head(s) affected); "
            "the checkpoint or its dtype conversion is broken"
        )


def signature_from_weights(
    W_V: Float[Tensor, "layer kv_head d_model d_head"],
    W_O: Float[Tensor, "layer head d_head d_model"],
    kv_head_of: Int[Tensor, "head"] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    layer_norms: bool = True,
    layer_norm_method: LayerNormMethod = "auto",
    weights: str = "unknown",
    model: dict | None = None,
) -> SpectralSignature:
    """:class:`SpectralSignature` of stacked weights (pure; no model needed).

    Args:
        W_V: value weights ``[layer, kv_head, d_model, d_head]`` (``v = x @ W_V``).
        W_O: output weights ``[layer, head, d_head, d_model]``.
        kv_head_of: ``[head]`` KV head of each query head; default ``h // (H // H_kv)`` (the
            ``repeat_interleave`` layout of HF and TransformerLens).
        dtype: ``torch.float32`` or ``torch.float64`` for every computation and result.
        layer_norms: compute the paper's whole-layer norms (``layer_W_V_norm`` ...).
        layer_norm_method: ``"auto"``, ``"svd"`` or ``"lanczos"`` (see
            :func:`matrix_spectral_norm`).
        weights: ``"raw"``, ``"processed"`` or ``"unknown"`` (recorded).
        model: metadata to record (:meth:`ModelView.metadata`); geometry is filled in from shapes.

    Computed on the device of ``W_V``; results on CPU. Layers are processed in chunks so the QR
    workspace stays under ~1 GB (a loop over layer chunks, never over heads).
    """
    dtype = _check_dtype(dtype)
    kv = _check_shapes(W_V, W_O, kv_head_of)
    _check_finite(W_V, "W_V")
    _check_finite(W_O, "W_O")
    L, K, d_model, d_head = W_V.shape
    H = W_O.shape[1]
    dev = W_V.device
    W_O = W_O.to(dev)
    kv_dev = kv.to(dev)

    per_layer = (K + H) * d_model * d_head
    step = max(1, _CHUNK_ELEMENTS // per_layer)
    parts: list[tuple[Tensor, ...]] = []
    for s in range(0, L, step):
        wv = W_V[s:s + step].to(dtype)
        wo = W_O[s:s + step].to(dtype)
        with _threads_for(wv):
            R_V = _r_factor(wv)  # [l, kv, k, d_head]
            R_O = _r_factor(wo.mT)  # [l, head, k, d_head]
        v_sig, v_fro, v_sr = _norms(wv, R_V)
        o_sig, o_fro, o_sr = _norms(wo.mT, R_O)
        with _threads_for(R_V):
            ov = torch.linalg.svdvals(R_V[:, kv_dev] @ R_O.mT)[..., 0]
        parts.append((v_sig, v_fro, v_sr, o_sig, o_fro, o_sr, ov))
    v_sig, v_fro, v_sr, o_sig, o_fro, o_sr, ov = (torch.cat(p).to("cpu") for p in zip(*parts))

    if layer_norms:
        # The layer's value matrix [d_model, kv_head * d_head] and output [head * d_head, d_model].
        W_V_layer = W_V.to(dtype).permute(0, 2, 1, 3).reshape(L, d_model, K * d_head)
        W_O_layer = W_O.to(dtype).reshape(L, H * d_head, d_model)
        lv, method = matrix_spectral_norm(W_V_layer, layer_norm_method)
        lo, method_o = matrix_spectral_norm(W_O_layer, layer_norm_method)
        lv, lo = lv.to("cpu"), lo.to("cpu")
        method = method if method == method_o else f"{method} (W_V), {method_o} (W_O)"
        layer = dict(layer_W_V_norm=lv, layer_W_O_norm=lo, layer_ratio=lv / lo, trace_proxy=lv.square())
    else:
        method = "skipped"
        layer = dict(layer_W_V_norm=None, layer_W_O_norm=None, layer_ratio=None, trace_proxy=None)

    meta = dict(model or {})
    meta.update(n_layers=L, n_heads=H, n_kv_heads=K, d_model=d_model, d_head=d_head, rho=H / d_head)
    return SpectralSignature(
        W_V_norm=v_sig[:, kv], W_O_norm=o_sig, ratio=v_sig[:, kv] / o_sig, ov_norm=ov,
        W_V_frobenius=v_fro[:, kv], W_O_frobenius=o_fro,
        W_V_stable_rank=v_sr[:, kv], W_O_stable_rank=o_sr,
        W_V_norm_kv=v_sig, W_V_frobenius_kv=v_fro, W_V_stable_rank_kv=v_sr,
        kv_head_of=kv.clone(), **layer,
        dtype=str(dtype).replace("torch.", ""), weights=weights, layer_norm_method=method,
        model=meta,
    )


# --------------------------------------------------------------------------------------------
# model entry points


def spectral_signature(
    model: Any,
    *,
    dtype: torch.dtype = torch.float32,
    layer_norms: bool = True,
    layer_norm_method: LayerNormMethod = "auto",
    device: str | torch.device | None = None,
) -> SpectralSignature:
    """Spectral signature of every head of ``model`` (weights only; no forward pass).

    Args:
        model: a TransformerLens model (``TransformerBridge`` or legacy ``HookedTransformer``) or
            a :class:`~thermo_lens.model.ModelView`.
        dtype: ``torch.float32`` (default) or ``torch.float64``; weights are upcast whatever the
            model's dtype (a bf16 model gives float32 results).
        layer_norms: also compute the paper's whole-layer norms and trace proxy.
        layer_norm_method: ``"auto"`` / ``"svd"`` / ``"lanczos"`` (:func:`matrix_spectral_norm`).
        device: where to compute; default the model's device when it is a GPU, else CPU.

    Returns:
        :class:`SpectralSignature` with ``[layer, head]`` tensors (per query head), per-KV-head
        tensors, the ``kv_head_of`` mapping and per-layer norms (METHODS.md section 2).

    Warns:
        UserWarning: the model's weights are processed (LayerNorm folded / centered), which
            changes the numbers; the paper used raw weights.

    Example::

        sig = thermo_lens.spectral_signature(model)
        sig.ov_norm            # [layer, head]
        sig.to_frame()         # tidy: layer, head, kv_head, W_V_norm, ...
    """
    view = as_view(model)
    dtype = _check_dtype(dtype)
    view.warn_if_processed(
        "W_V/W_O norms, stable ranks, OV norms and the trace proxy differ from the raw model's "
        "(centering subtracts W_O's mean over d_model)", stacklevel=2)
    if device is None:
        device = view.device if view.device.type == "cuda" else torch.device("cpu")
    W_V, W_O = view.W_V(dtype).to(device), view.W_O(dtype).to(device)
    return signature_from_weights(
        W_V, W_O, view.kv_head_of, dtype=dtype, layer_norms=layer_norms,
        layer_norm_method=layer_norm_method, weights=view.weight_state, model=view.metadata(),
    )


def signature_from_collected(collected: Any, **kwargs: Any) -> SpectralSignature:
    """Spectral signature of the model behind a :class:`~thermo_lens.hooks.Collected`.

    The signature depends on weights only, so a one-pass ``profile()`` gets it without adding
    anything to the forward pass; ``kwargs`` go to :func:`spectral_signature`.
    """
    view = getattr(collected, "view", None)
    if not isinstance(view, ModelView):
        raise ThermoLensInputError(
            f"expected a thermo_lens.hooks.Collected (with a .view), got {type(collected).__name__}"
        )
    return spectral_signature(view, **kwargs)
