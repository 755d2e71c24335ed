"""Per-head weight metrics: the :class:`HeadWeights` accessor and one registered function per metric.

Each metric is one function registered with :func:`thermo_lens.core.registry.register_head_metric`; it
reads a :class:`HeadWeights` accessor (weights, Gram matrices and factors of a chunk of layers).
Adding a per-head weight metric is one such function (plus an accessor on :class:`HeadWeights` if
it needs a new factor) and its test; the signature, frames, rows, hover text, panels, the report
glossary and the definitions page then carry it. Definitions: ``thermo_lens.definitions`` §2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.registry import Metric, register_head_metric
from thermo_lens.measures.spectral.kernels import _sigma_max_of_product, gram_matrices, gram_root, top_eigenvalue

_T = TypeVar("_T")

__all__ = ["HeadWeights"]

# --------------------------------------------------------------------------------------------
# weight-based head metrics: one registered function each


class HeadWeights:
    """The weights of a chunk of layers, with lazily cached factors, for head metric functions.

    Every attribute is computed once, on first use, in the signature's compute dtype ``dtype``
    (the weights themselves may be stored in another one, e.g. bf16: the Gram matrices are then
    computed from blocks converted in cache, and :attr:`W_V` ... convert on first use). The square
    root factors ``R`` (``d_head x d_head``, ``R^T R = W^T W``; from the Cholesky factorisation of
    the small Gram matrix, :func:`~thermo_lens.measures.spectral.kernels.gram_root`) have the singular
    values of their matrices, and
    ``W_a W_b^T = Q_a (R_a R_b^T) Q_b^T`` with orthonormal ``Q``, so products of two factors reduce
    to ``d_head x d_head`` matrices.

    Attributes:
        W_V: ``[layer, kv_head, d_model, d_head]``; W_O: ``[layer, head, d_head, d_model]``;
        W_Q: ``[layer, head, d_model, d_head]`` and W_K: ``[layer, kv_head, d_model, d_head]``
            (None when not given: metrics that need them are skipped);
        kv_head_of: ``[head]`` KV head of each query head (on the weights' device);
        dtype: the compute dtype (default: the dtype of ``W_V``).
    """

    def __init__(self, W_V: Tensor, W_O: Tensor, kv_head_of: Tensor, W_Q: Tensor | None = None,
                 W_K: Tensor | None = None, *, dtype: torch.dtype | None = None):
        self._stored: dict[str, Any] = {"W_V": W_V, "W_O": W_O, "W_Q": W_Q, "W_K": W_K}
        self.dtype = W_V.dtype if dtype is None else dtype
        self.kv_head_of = kv_head_of
        self._cache: dict[str, Any] = {}

    @classmethod
    def from_grams(cls, grams: dict[str, Tensor], kv_head_of: Tensor, *, dtype: torch.dtype,
                   load: Callable[[], dict[str, Tensor]]) -> "HeadWeights":
        """The accessor of a group of layers whose Gram matrices (``gram(name)`` of each given
        weight, ``[layer, head, d_head, d_head]`` in ``dtype``) were computed chunk by chunk: the
        metrics then solve every layer's small eigenproblems in one batched call. A metric that reads
        the weights themselves gets them from ``load()`` (the group's weights, read once, on first use)."""
        self = cls.__new__(cls)
        loaded: dict[str, Tensor] = {}

        def deferred(name: str) -> Callable[[], Tensor]:
            def get() -> Tensor:
                if not loaded:
                    loaded.update(load())
                return loaded[name]
            return get

        self._stored = {n: deferred(n) if n in grams else None for n in ("W_V", "W_O", "W_Q", "W_K")}
        self.dtype = dtype
        self.kv_head_of = kv_head_of
        self._cache = {f"gram_{n}": g for n, g in grams.items()}
        return self

    def _weights(self, name: str) -> Tensor | None:
        w = self._stored[name]
        if callable(w):
            w = self._stored[name] = w()
        if w is None or w.dtype == self.dtype:
            return w
        return self._cached(f"weights_{name}", lambda: w.to(self.dtype))

    @property
    def W_V(self) -> Float[Tensor, "layer kv_head d_model d_head"]:
        return self._weights("W_V")  # type: ignore[return-value]  # always given

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]:
        return self._weights("W_O")  # type: ignore[return-value]  # always given

    @property
    def W_Q(self) -> Float[Tensor, "layer head d_model d_head"] | None:
        return self._weights("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "layer kv_head d_model d_head"] | None:
        return self._weights("W_K")

    def has(self, names: tuple[str, ...]) -> bool:
        return all(self._stored.get(n) is not None for n in names)

    def _cached(self, key: str, fn: Callable[[], _T]) -> _T:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def frobenius(self, name: str) -> Tensor:
        """``||W||_F`` of each head's ``name`` (``"W_V"``, ``"W_O"``, ``"W_Q"``, ``"W_K"``): the root
        of the trace of its Gram matrix (the sum of squares, without another pass over ``W``)."""
        return self._cached(f"fro_{name}", lambda: self.gram(name).diagonal(dim1=-2, dim2=-1).sum(-1).sqrt())

    def gram(self, name: str) -> Float[Tensor, "layer head d_head d_head"]:
        """``W^T W`` of each head's ``name`` (``W_O W_O^T`` for ``W_O``): ``d_head x d_head``, in
        :attr:`dtype` (:func:`~thermo_lens.measures.spectral.kernels.gram_matrices`)."""
        return self._cached(f"gram_{name}", lambda: gram_matrices(self._need(name), self.dtype, rows=name == "W_O"))

    def sigma_max(self, name: str) -> Float[Tensor, "layer head"]:
        """``sigma_max`` of each head's ``name``: the root of its Gram matrix's largest eigenvalue
        (:func:`~thermo_lens.measures.spectral.kernels.top_eigenvalue`: relative error ~ machine epsilon, as
        from an SVD)."""
        return self._cached(f"sigma_{name}", lambda: top_eigenvalue(self.gram(name)).sqrt())

    def root(self, name: str) -> Float[Tensor, "layer head d_head d_head"]:
        """Square root factor ``R`` of each head's ``name``: ``R^T R`` = its Gram matrix
        (:func:`~thermo_lens.measures.spectral.kernels.gram_root`: Cholesky, ``eigh`` where it refuses)."""
        return self._cached(f"root_{name}", lambda: gram_root(self.gram(name)))

    @property
    def R_V(self) -> Float[Tensor, "layer kv_head d_head d_head"]:
        """Factor of ``W_V``: ``R_V^T R_V = W_V^T W_V``."""
        return self.root("W_V")

    @property
    def R_O(self) -> Float[Tensor, "layer head d_head d_head"]:
        """Factor of ``W_O^T``: ``R_O^T R_O = W_O W_O^T``."""
        return self.root("W_O")

    @property
    def R_Q(self) -> Float[Tensor, "layer head d_head d_head"]:
        """Factor of ``W_Q``: ``R_Q^T R_Q = W_Q^T W_Q``."""
        return self.root("W_Q")

    @property
    def R_K(self) -> Float[Tensor, "layer kv_head d_head d_head"]:
        """Factor of ``W_K``: ``R_K^T R_K = W_K^T W_K``."""
        return self.root("W_K")

    def _need(self, name: str) -> Tensor:
        w = self._stored[name]
        if callable(w):
            w = self._stored[name] = w()
        if w is None:
            raise ThermoLensInputError(f"this metric needs {name}; pass it to signature_from_weights")
        return w

    @property
    def V_norms(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(sigma_max, Frobenius, stable rank)`` of each KV head's ``W_V``, ``[layer, kv_head]``."""
        return self._cached("V", lambda: _norms(self.frobenius("W_V"), self.sigma_max("W_V")))

    @property
    def O_norms(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(sigma_max, Frobenius, stable rank)`` of each head's ``W_O``, ``[layer, head]``."""
        return self._cached("O", lambda: _norms(self.frobenius("W_O"), self.sigma_max("W_O")))


def _spectral(name: str, symbol: str, formula: str, shape: str = "layer head", *, unit: str = "weight norm",
              weights: tuple[str, ...] = ("W_V", "W_O"), summary_table: bool = False, panel: bool = False,
              paper: str = "D'Elia (2026), sec. 4.3") -> Metric:
    per = "head" if shape == "layer head" else "kv_head"
    return Metric(name, symbol=symbol, formula=formula, shape=shape, result="SpectralSignature",
                  section="spectral", paper=paper, unit=unit, frame_kwargs={"per": per},
                  row=name if shape == "layer head" else None, summary_table=summary_table, panel=panel, weights=weights)


@register_head_metric(_spectral(
    "W_V_norm", "||W_V||_2", "sigma_max(W_V) of the query head's KV head, W_V [d_model, d_head] (v = x W_V)",
    weights=("W_V",), summary_table=True, panel=True))
def _W_V_norm(w: HeadWeights) -> Tensor:
    return w.V_norms[0][:, w.kv_head_of]


@register_head_metric(_spectral(
    "W_O_norm", "||W_O||_2", "sigma_max(W_O), W_O [d_head, d_model] (out = z W_O)", weights=("W_O",),
    summary_table=True, panel=True))
def _W_O_norm(w: HeadWeights) -> Tensor:
    return w.O_norms[0]


@register_head_metric(_spectral(
    "ratio", "||W_V||_2 / ||W_O||_2", "W_V_norm / W_O_norm per head (the mean over heads is a mean of ratios)",
    unit="ratio", summary_table=True))
def _ratio(w: HeadWeights) -> Tensor:
    return w.V_norms[0][:, w.kv_head_of] / w.O_norms[0]


@register_head_metric(_spectral(
    "ov_norm", "||W_V W_O||_2", "sigma_max(W_V W_O), the OV circuit's spectral norm, from the d_head x d_head factors "
    "R^T R = Gram matrix: sigma_max(R_V R_O^T), d_head x d_head (never d_model x d_model); <= W_V_norm * W_O_norm",
    summary_table=True, panel=True, paper=""))
def _ov_norm(w: HeadWeights) -> Tensor:
    return _sigma_max_of_product(w.R_V[:, w.kv_head_of], w.gram("W_O"))


@register_head_metric(_spectral(
    "qk_norm", "||W_Q W_K^T||_2", "sigma_max(W_Q W_K^T), the QK circuit's spectral norm (bilinear attention "
    "score form before the 1/sqrt(d_head) scale and any rotary embedding), from the d_head x d_head factors: "
    "sigma_max(R_Q R_K^T), d_head x d_head; W_K of the query head's KV head under GQA",
    weights=("W_Q", "W_K"), panel=True, paper=""))
def _qk_norm(w: HeadWeights) -> Tensor:
    return _sigma_max_of_product(w.R_Q, w.gram("W_K")[:, w.kv_head_of])


@register_head_metric(_spectral("W_V_frobenius", "||W_V||_F", "Frobenius norm of W_V (of the query head's KV head)",
                                weights=("W_V",), paper=""))
def _W_V_frobenius(w: HeadWeights) -> Tensor:
    return w.V_norms[1][:, w.kv_head_of]


@register_head_metric(_spectral("W_O_frobenius", "||W_O||_F", "Frobenius norm of W_O", weights=("W_O",), paper=""))
def _W_O_frobenius(w: HeadWeights) -> Tensor:
    return w.O_norms[1]


@register_head_metric(_spectral(
    "W_V_stable_rank", "srank(W_V)", "stable rank ||W_V||_F^2 / ||W_V||_2^2, in [1, min(d_model, d_head)] "
    "(NaN for an all-zero matrix)", unit="dimension", weights=("W_V",), paper=""))
def _W_V_stable_rank(w: HeadWeights) -> Tensor:
    return w.V_norms[2][:, w.kv_head_of]


@register_head_metric(_spectral(
    "W_O_stable_rank", "srank(W_O)", "stable rank ||W_O||_F^2 / ||W_O||_2^2, in [1, min(d_model, d_head)]",
    unit="dimension", weights=("W_O",), paper=""))
def _W_O_stable_rank(w: HeadWeights) -> Tensor:
    return w.O_norms[2]


@register_head_metric(_spectral("W_V_norm_kv", "||W_V||_2 (KV head)", "sigma_max(W_V) per KV head",
                                "layer kv_head", weights=("W_V",)))
def _W_V_norm_kv(w: HeadWeights) -> Tensor:
    return w.V_norms[0]


@register_head_metric(_spectral("W_V_frobenius_kv", "||W_V||_F (KV head)", "||W_V||_F per KV head",
                                "layer kv_head", weights=("W_V",), paper=""))
def _W_V_frobenius_kv(w: HeadWeights) -> Tensor:
    return w.V_norms[1]


@register_head_metric(_spectral("W_V_stable_rank_kv", "srank(W_V) (KV head)",
                                "||W_V||_F^2 / ||W_V||_2^2 per KV head", "layer kv_head", unit="dimension",
                                weights=("W_V",), paper=""))
def _W_V_stable_rank_kv(w: HeadWeights) -> Tensor:
    return w.V_norms[2]


def _norms(fro: Float[Tensor, "..."], sigma: Float[Tensor, "..."]) -> tuple[Tensor, Tensor, Tensor]:
    """(sigma_max, Frobenius, stable rank) of ``W`` given ``||W||_F`` and ``sigma_max``."""
    return sigma, fro, fro.square() / sigma.square()
