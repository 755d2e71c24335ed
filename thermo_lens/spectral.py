"""Spectral signature of every attention head: norms of W_V, W_O and of the OV and QK circuits.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", characterises each head by the spectral norms of its value and output matrices;
``thermo_lens.definitions`` §2 fixes the definitions used here (and §3, end, the paper's "trace
proxy"). Per query head ``h`` of layer ``l`` (TransformerLens convention ``v = x @ W_V``,
``out = z @ W_O``; ``W_V[l, kv_head_of[h]]`` is ``[d_model, d_head]``, ``W_O[l, h]`` is
``[d_head, d_model]``):

- ``W_V_norm = sigma_max(W_V)``, ``W_O_norm = sigma_max(W_O)``, ``ratio = W_V_norm / W_O_norm``;
- ``W_V_frobenius = ||W_V||_F``, ``W_O_frobenius = ||W_O||_F``;
- stable rank ``||W||_F^2 / ||W||_2^2`` (in ``[1, min(d_model, d_head)]``);
- ``ov_norm = sigma_max(W_V W_O)``, the OV circuit's spectral norm, computed from the small
  factors: with ``R_V^T R_V = W_V^T W_V`` and ``R_O^T R_O = W_O W_O^T`` (``d_head x d_head``
  square roots of the Gram matrices; ``W_V = Q_V R_V``, ``W_O^T = Q_O R_O`` with orthonormal
  ``Q``), ``W_V W_O = Q_V (R_V R_O^T) Q_O^T`` has the singular values of the ``d_head x d_head``
  matrix ``R_V R_O^T``. The ``d_model x d_model`` product is never formed;
- ``qk_norm = sigma_max(W_Q W_K^T)``, the QK circuit's spectral norm (the bilinear form of the
  attention scores before the ``1/sqrt(d_head)`` scale and any rotary embedding), the same way
  from ``R_Q R_K^T``; ``W_K`` is the query head's KV head.

Each metric is one function registered with :func:`thermo_lens.registry.register_head_metric`
(below); it reads a :class:`HeadWeights` accessor (weights, Gram matrices and factors of a chunk of
layers). Adding a per-head weight metric is one such function (plus an accessor on
:class:`HeadWeights` if it needs a new factor) and its test; the signature, frames, rows, hover
text, panels, the report glossary and the definitions page then carry it.

Grouped-query / multi-query attention: ``W_V`` has ``n_kv_heads`` heads. Every ``[layer, head]``
tensor is per *query* head (the KV head's value is repeated through ``kv_head_of``); the per-KV-head
values are kept too (``W_V_norm_kv`` ...), with the mapping ``kv_head_of`` itself.

The paper's per-layer convention: ``layer_W_V_norm`` = spectral norm of the whole layer's value
matrix ``[d_model, n_kv_heads * d_head]`` (all heads side by side, as in a fused ``v_proj``),
``layer_W_O_norm`` of the output matrix ``[n_heads * d_head, d_model]``, and the paper's "trace
proxy" ``layer_W_V_norm ** 2`` (it is not a trace; ``thermo_lens.definitions`` §3).

Everything is batched over layers and heads (Gram matrices, ``eigh`` / ``eigvalsh`` of
``d_head x d_head`` matrices and ``matrix_norm`` on stacked tensors; the whole-layer norms by
Lanczos on CPU, one matrix at a time, and by batched ``svdvals`` on GPU),
in float32 or float64, whatever the model's dtype: a bf16 model's weights are converted once, a
chunk of layers at a time. :func:`spectral_signature` caches its result per weights fingerprint
(:func:`clear_cache` says exactly when an entry is reused), so re-profiling a model costs nothing
here. No function changes torch's process-wide thread count.
Weight processing (TransformerLens compatibility mode) changes these numbers; the paper used raw
weights, so processed weights raise a ``UserWarning`` and every result records its state.

Entry points: :func:`spectral_signature` (a model, cached), :func:`signature_from_weights`
(stacked tensors, no model, never cached), :func:`signature_from_collected` (for a one-pass profile),
:func:`ov_norm_factored` and :func:`matrix_spectral_norm` (the two batched kernels).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Sequence

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from thermo_lens.errors import ThermoLensNumericsError
from thermo_lens.model import ModelView, as_view
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.registry import Measurement, Metric, metrics, register_head_metric, register_measurement, register_metric
from thermo_lens.result import Result

__all__ = [
    "SpectralSignature",
    "spectral_signature",
    "signature_from_weights",
    "signature_from_collected",
    "clear_cache",
    "ov_norm_factored",
    "matrix_spectral_norm",
    "HEAD_METRICS",
    "KV_HEAD_METRICS",
    "LAYER_METRICS",
]

LayerNormMethod = Literal["auto", "svd", "gram", "lanczos"]

# Elements of W_V + W_O converted and factorised per chunk of layers (256 MiB in float32; with the
# Gram and eigen workspaces a chunk stays well under 1 GiB).  A 7B model: 2 layers per chunk.
_CHUNK_ELEMENTS = 1 << 26
# No function here changes torch's global thread count (``torch.set_num_threads`` is process
# wide: setting and restoring it races with other Python threads running torch); callers who want
# one thread set it themselves, once.

# --------------------------------------------------------------------------------------------
# weight-based head metrics: one registered function each


class HeadWeights:
    """The weights of a chunk of layers, with lazily cached factors, for head metric functions.

    Every attribute is computed once, on first use, in the signature's compute dtype. The square
    root factors ``R`` (``d_head x d_head``, ``R^T R = W^T W``; from the eigendecomposition of the
    small Gram matrix, see :func:`_gram_root`) have the singular values of their matrices, and
    ``W_a W_b^T = Q_a (R_a R_b^T) Q_b^T`` with orthonormal ``Q``, so products of two factors reduce
    to ``d_head x d_head`` matrices.

    Attributes:
        W_V: ``[layer, kv_head, d_model, d_head]``; W_O: ``[layer, head, d_head, d_model]``;
        W_Q: ``[layer, head, d_model, d_head]`` and W_K: ``[layer, kv_head, d_model, d_head]``
            (None when not given: metrics that need them are skipped);
        kv_head_of: ``[head]`` KV head of each query head (on the weights' device).
    """

    def __init__(self, W_V: Tensor, W_O: Tensor, kv_head_of: Tensor, W_Q: Tensor | None = None,
                 W_K: Tensor | None = None):
        self.W_V, self.W_O, self.W_Q, self.W_K = W_V, W_O, W_Q, W_K
        self.kv_head_of = kv_head_of
        self._cache: dict[str, Any] = {}

    def has(self, names: tuple[str, ...]) -> bool:
        return all(getattr(self, n) is not None for n in names)

    def _cached(self, key: str, fn: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def frobenius(self, name: str) -> Tensor:
        """``||W||_F`` of each head's ``name`` (``"W_V"``, ``"W_O"``, ``"W_Q"``, ``"W_K"``)."""
        return self._cached(f"fro_{name}", lambda: torch.linalg.matrix_norm(self._need(name), ord="fro"))

    def gram(self, name: str) -> Float[Tensor, "layer head d_head d_head"]:
        """``W^T W`` of each head's ``name`` (``W_O W_O^T`` for ``W_O``): ``d_head x d_head``."""
        def compute() -> Tensor:
            W = self._need(name)
            return W @ W.mT if name == "W_O" else W.mT @ W
        return self._cached(f"gram_{name}", compute)

    def _eigh(self, name: str) -> tuple[Tensor, Tensor]:
        return self._cached(f"eigh_{name}", lambda: torch.linalg.eigh(self.gram(name)))

    def sigma_max(self, name: str) -> Float[Tensor, "layer head"]:
        """``sigma_max`` of each head's ``name``: the root of its Gram matrix's largest eigenvalue
        (relative error ~ machine epsilon, as from an SVD). From the same cached ``eigh`` as
        :meth:`root` (an ``eigvalsh`` first would repeat the work for the factors the products need)."""
        return self._cached(f"sigma_{name}", lambda: self._eigh(name)[0][..., -1].clamp_min(0).sqrt())

    def root(self, name: str) -> Float[Tensor, "layer head d_head d_head"]:
        """Square root factor ``R`` of each head's ``name``: ``R^T R`` = its Gram matrix."""
        return self._cached(f"root_{name}", lambda: _gram_root(*self._eigh(name)))

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
        w = getattr(self, name)
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


def _sigma_max_of_product(R_a: Tensor, G_b: Tensor) -> Tensor:
    """``sigma_max(Q_a R_a R_b^T Q_b^T)`` = the top singular value of the small ``R_a R_b^T``, as
    the root of the largest eigenvalue of ``R_a G_b R_a^T`` (``G_b = R_b^T R_b``, the Gram matrix
    of ``b``): one batched ``eigvalsh`` of ``d_head x d_head`` symmetric matrices."""
    M = R_a @ G_b @ R_a.mT
    return torch.linalg.eigvalsh(M)[..., -1].clamp_min(0).sqrt()


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


for _name, _symbol, _formula, _unit in (
    ("layer_W_V_norm", "||W_V^layer||_2", "sigma_max of the layer's whole value matrix [d_model, n_kv_heads * "
     "d_head] (all heads side by side, as a fused v_proj; the paper's per-layer convention)", "weight norm"),
    ("layer_W_O_norm", "||W_O^layer||_2", "sigma_max of the layer's whole output matrix [n_heads * d_head, "
     "d_model] (the paper's per-layer convention)", "weight norm"),
    ("layer_ratio", "layer ratio", "layer_W_V_norm / layer_W_O_norm", "ratio"),
    ("trace_proxy", "||W_V^layer||_2^2", "layer_W_V_norm ** 2, the paper's 'trace proxy' (it is not a trace)",
     "squared weight norm"),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape="layer", result="SpectralSignature",
                           section="spectral", paper="D'Elia (2026), sec. 4.3", unit=_unit,
                           frame_kwargs={"per": "layer"}, row=_name))


def _names(shape: str) -> tuple[str, ...]:
    return tuple(m.name for m in metrics(result="SpectralSignature", shape=shape, load=False))


#: ``[layer, head]`` metrics (per query head), in display order (from the metric registry).
HEAD_METRICS: tuple[str, ...] = _names("layer head")
#: ``[layer, kv_head]`` metrics.
KV_HEAD_METRICS: tuple[str, ...] = _names("layer kv_head")
#: ``[layer]`` metrics (the paper's whole-layer convention).
LAYER_METRICS: tuple[str, ...] = _names("layer")


# --------------------------------------------------------------------------------------------
# result


@dataclass(frozen=True, eq=False)
class SpectralSignature(Result):
    """Spectral signature of every head (``thermo_lens.definitions`` §2; D'Elia 2026).

    ``[layer, head]`` tensors are per query head, TransformerLens style (like ``head_detector``).
    Every registered weight-based metric (:mod:`thermo_lens.registry`, e.g. ``W_V_norm``,
    ``ov_norm``, ``qk_norm``) is stored in :attr:`head_metrics` / :attr:`kv_head_metrics` and is
    also an attribute: ``sig.ov_norm``. :attr:`definitions` gives each one's formula.

    Attributes:
        head_metrics: name -> ``Float[Tensor, "layer head"]``: ``W_V_norm`` (sigma_max(W_V) of
            the head's KV head), ``W_O_norm``, ``ratio``, ``ov_norm`` (sigma_max(W_V W_O) from the
            d_head x d_head Gram factors; ``<= W_V_norm * W_O_norm``), ``qk_norm`` (sigma_max(W_Q
            W_K^T); only when the query/key weights were given), Frobenius norms and stable ranks
            (NaN for an all-zero matrix).
        kv_head_metrics: name -> ``Float[Tensor, "layer kv_head"]``: ``W_V_norm_kv``,
            ``W_V_frobenius_kv``, ``W_V_stable_rank_kv`` (equal to the per-head tensors without
            GQA/MQA).
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
            ``"gram"`` (largest eigenvalue of the smaller-side Gram matrix, batched), ``"lanczos"``
            (on the Gram operator, to machine precision; ``"lanczos (gram for k of n)"`` when
            ``k`` matrices fell back to ``"gram"``) or ``"skipped"``.
        model: the model's metadata (:meth:`ModelView.metadata`; geometry only when built from
            tensors).
    """

    schema_version: ClassVar[int] = 2

    head_metrics: dict[str, Float[Tensor, "layer head"]]
    kv_head_metrics: dict[str, Float[Tensor, "layer kv_head"]]
    kv_head_of: Int[Tensor, " head"]
    layer_W_V_norm: Float[Tensor, " layer"] | None
    layer_W_O_norm: Float[Tensor, " layer"] | None
    layer_ratio: Float[Tensor, " layer"] | None
    trace_proxy: Float[Tensor, " layer"] | None
    dtype: str
    weights: str
    layer_norm_method: str
    model: dict

    @classmethod
    def migrate(cls, fields: dict[str, Any], version: int) -> dict[str, Any]:
        """Schema 1 stored each per-head metric as its own field; schema 2 keeps them in dicts."""
        fields = super().migrate(fields, version)
        if version < 2:
            fields = dict(fields)
            fields["head_metrics"] = {m: fields.pop(m) for m in _V1_HEAD_FIELDS if m in fields}
            fields["kv_head_metrics"] = {m: fields.pop(m) for m in _V1_KV_FIELDS if m in fields}
        return fields

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: registered metrics are attributes too.
        for store in ("head_metrics", "kv_head_metrics"):
            values = self.__dict__.get(store)
            if values is not None and name in values:
                return values[name]
        if _metric_weights(name):
            raise AttributeError(
                f"{name} was not computed for this signature (it needs "
                f"{' and '.join(_metric_weights(name))}; spectral_signature(model) computes every metric)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def definitions(self) -> dict[str, str]:
        """Formula of every metric in this signature (from :mod:`thermo_lens.registry`)."""
        present = {*self.head_metrics, *self.kv_head_metrics, *LAYER_METRICS}
        return {m.name: m.formula for m in metrics(result="SpectralSignature", load=False) if m.name in present}

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
    def means(self) -> dict[str, Any]:
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
        for m, t in self.head_metrics.items():
            out[m] = _mean(t)
        for m in LAYER_METRICS:
            t = getattr(self, m)
            out[m] = _mean(t) if t is not None else None
        out.update(dtype=self.dtype, weights=self.weights, aggregation="mean over layers and heads")
        return out

    def summary(self) -> dict[str, Any]:
        """Deprecated: the model-level means are :meth:`means`. (``summary()`` is text on every other
        result; this one will follow.)"""
        warnings.warn("SpectralSignature.summary() is deprecated: use .means() (same dict); summary() will "
                      "return text like every other result's", DeprecationWarning, stacklevel=2)
        return self.means()

    def to_row(self) -> dict[str, Any]:
        """One flat row for cross-model tables (:mod:`thermo_lens.laws` reads ``model``, ``rho``)."""
        row = self.means()
        row.pop("aggregation")
        row.update(post_ln=self.model.get("post_ln"), layer_norm_method=self.layer_norm_method)
        return row

    def to_frame(self, per: str = "head", *, level: str | None = None) -> pd.DataFrame:
        """Tidy frame: one row per ``(layer, head)`` (default), per ``(layer, kv_head)`` or per
        ``layer`` (the paper's whole-layer norms plus the per-layer means of the head metrics),
        one column per metric, plus ``model``, ``weights`` and ``dtype`` columns.

        ``level=`` is the deprecated name of ``per`` (``level`` is a confidence level elsewhere).
        """
        if level is not None:
            warnings.warn("SpectralSignature.to_frame(level=...) is deprecated: use per=...", DeprecationWarning,
                          stacklevel=2)
            per = level
        L = self.n_layers
        if per == "head":
            H = self.n_heads
            data = {"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
                    "kv_head": np.tile(self.kv_head_of.numpy(), L)}
            data.update({m: _np(t).reshape(-1) for m, t in self.head_metrics.items()})
        elif per == "kv_head":
            K = self.n_kv_heads
            data = {"layer": np.repeat(np.arange(L), K), "kv_head": np.tile(np.arange(K), L)}
            data.update({m: _np(t).reshape(-1) for m, t in self.kv_head_metrics.items()})
        elif per == "layer":
            data = {"layer": np.arange(L)}
            for m in LAYER_METRICS:
                t = getattr(self, m)
                data[m] = _np(t) if t is not None else np.full(L, np.nan)
            data.update({f"mean_{m}": _np(t).mean(axis=1) for m, t in self.head_metrics.items()})
        else:
            raise ThermoLensInputError(
                f"per must be 'head', 'kv_head' or 'layer', got {per!r}"
            )
        df = pd.DataFrame(data)
        df["model"], df["weights"], df["dtype"] = self.name, self.weights, self.dtype
        df.attrs.update(definitions=dict(self.definitions), model=dict(self.model))
        return df

    def __repr__(self) -> str:
        s = self.means()
        g = (f"{self.n_layers} layers x {self.n_heads} heads"
             + (f" ({self.n_kv_heads} KV heads)" if self.n_kv_heads != self.n_heads else "")
             + f", d_model={self.d_model}, d_head={self.d_head}, rho=n_heads/d_head={self.rho:.3g}")
        lines = [
            f"SpectralSignature({self.name}: {g}; weights {self.weights}, {self.dtype})",
            "  mean over layers x heads:"
            f" ||W_V||_2={s['W_V_norm']:.4g}  ||W_O||_2={s['W_O_norm']:.4g}"
            f"  ratio={s['ratio']:.4g}  ||W_V W_O||_2={s['ov_norm']:.4g}"
            + (f"  ||W_Q W_K^T||_2={s['qk_norm']:.4g}" if "qk_norm" in s else ""),
            f"    ||W_V||_F={s['W_V_frobenius']:.4g}  ||W_O||_F={s['W_O_frobenius']:.4g}"
            f"  stable rank W_V={s['W_V_stable_rank']:.3g}  W_O={s['W_O_stable_rank']:.3g}"
            f"  (max {min(self.d_model, self.d_head)})",
        ]
        if self.layer_W_V_norm is not None:
            lv, lo = _np(self.layer_W_V_norm), _np(self.layer_W_O_norm)  # type: ignore[arg-type]
            lines.append(
                f"  per layer, all heads ({self.layer_norm_method}): ||W_V||_2 {lv.min():.4g}..{lv.max():.4g}"
                f", ||W_O||_2 {lo.min():.4g}..{lo.max():.4g}, trace proxy ||W_V||_2^2 mean"
                f" {s['trace_proxy']:.4g}"
            )
        lines.append("  [layer, head] tensors: " + ", ".join(self.head_metrics)
                     + "; .to_frame(), .means()")
        return "\n".join(lines)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _mean(t: Tensor) -> float:
    return float(t.double().nanmean()) if t.numel() else math.nan


# --------------------------------------------------------------------------------------------
# batched kernels


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


def _layer_norms(
    W_V: Float[Tensor, "layer kv_head d_model d_head"],
    W_O: Float[Tensor, "layer head d_head d_model"],
    method: LayerNormMethod,
) -> tuple[Float[Tensor, " layer"], Float[Tensor, " layer"], str]:
    """The paper's whole-layer norms: ``sigma_max`` of the layer's value matrix
    ``[d_model, kv_head * d_head]`` (heads side by side, as a fused ``v_proj``) and of its output
    matrix ``[head * d_head, d_model]``, and the method used (one name, or one per matrix)."""
    L, K, d_model, d_head = W_V.shape
    H = W_O.shape[1]
    lv, mv = matrix_spectral_norm(W_V.permute(0, 2, 1, 3).reshape(L, d_model, K * d_head), method)
    lo, mo = matrix_spectral_norm(W_O.reshape(L, H * d_head, d_model), method)
    return lv, lo, mv if mv == mo else f"{mv} (W_V), {mo} (W_O)"


def _norms(fro: Float[Tensor, "..."], sigma: Float[Tensor, "..."]) -> tuple[Tensor, Tensor, Tensor]:
    """(sigma_max, Frobenius, stable rank) of ``W`` given ``||W||_F`` and ``sigma_max``."""
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


def _check_finite(W: Tensor, name: str, first_layer: int = 0) -> None:
    bad = ~torch.isfinite(W).flatten(-2).all(-1)  # [layer, head]
    if bad.any():
        l, h = (int(i) for i in bad.nonzero()[0])
        l += first_layer
        raise ThermoLensNumericsError(
            f"{name} has NaN/inf at layer {l}, head {h} ({int(bad.sum())} head(s) affected); "
            "the checkpoint or its dtype conversion is broken"
        )


def signature_from_weights(
    W_V: Any,
    W_O: Any,
    kv_head_of: Any = None,
    *,
    W_Q: Any = None,
    W_K: Any = None,
    dtype: Any = torch.float32,
    layer_norms: bool = True,
    layer_norm_method: str = "auto",
    weights: str = "unknown",
    model: dict | None = None,
) -> SpectralSignature:
    """:class:`SpectralSignature` of stacked weights (pure; no model needed).

    Args:
        W_V: value weights ``Float[Tensor, "layer kv_head d_model d_head"]`` (``v = x @ W_V``).
        W_O: output weights ``Float[Tensor, "layer head d_head d_model"]``. (Checked here, with a
            clear error, rather than annotated: bad input is documented to raise
            :class:`~thermo_lens.model.ThermoLensInputError`.)
        kv_head_of: ``[head]`` KV head of each query head; default ``h // (H // H_kv)`` (the
            ``repeat_interleave`` layout of HF and TransformerLens).
        W_Q: query weights ``[layer, head, d_model, d_head]`` and W_K: key weights
            ``[layer, kv_head, d_model, d_head]``, for the QK metrics (``qk_norm``); without them
            those metrics are not computed.
        dtype: ``torch.float32`` or ``torch.float64`` for every computation and result.
        layer_norms: compute the paper's whole-layer norms (``layer_W_V_norm`` ...).
        layer_norm_method: ``"auto"``, ``"svd"``, ``"gram"`` or ``"lanczos"`` (see
            :func:`matrix_spectral_norm`).
        weights: ``"raw"``, ``"processed"`` or ``"unknown"`` (recorded).
        model: metadata to record (:meth:`ModelView.metadata`); geometry is filled in from shapes.

    Every weight-based metric registered in :mod:`thermo_lens.registry` whose weights are given is
    computed. Computed on the device of ``W_V``; results on CPU. Layers are processed in chunks so
    the Gram and eigen workspaces stay under ~1 GiB (a loop over layer chunks, never over heads); each chunk is
    converted to ``dtype`` once, and that copy feeds every metric and the whole-layer norms.
    """
    dtype = _check_dtype(dtype)
    _check_method(layer_norm_method)
    kv = _check_shapes(W_V, W_O, kv_head_of)
    L, K, d_model, d_head = W_V.shape
    H = W_O.shape[1]
    _check_qk(W_Q, W_K, (L, H, d_model, d_head), (L, K, d_model, d_head))
    dev = W_V.device
    kv_dev = kv.to(dev)
    given = {"W_V": W_V, "W_O": W_O.to(dev), "W_Q": W_Q, "W_K": W_K}
    given = {k: v.to(dev) for k, v in given.items() if v is not None}
    todo = [m for m in metrics(result="SpectralSignature", computed=True, load=False) if set(m.weights) <= set(given)]

    per_layer = sum(w[0].numel() for w in given.values())
    step = max(1, _CHUNK_ELEMENTS // per_layer)
    parts: dict[str, list[Tensor]] = {m.name: [] for m in todo}
    layer_parts: list[tuple[Tensor, Tensor]] = []
    methods: set[str] = set()
    for s in range(0, L, step):
        # The only conversion of these layers (e.g. bf16 -> float32): a chunk at a time, so a 7B
        # model never holds a second full-precision copy of its attention weights.
        chunk = {k: v[s:s + step].to(dtype) for k, v in given.items()}
        w = HeadWeights(chunk["W_V"], chunk["W_O"], kv_dev, W_Q=chunk.get("W_Q"), W_K=chunk.get("W_K"))
        # A NaN/inf weight makes its head's Frobenius norm NaN/inf: only then look element-wise
        # (for the message), instead of an isfinite pass over every weight.
        for k in chunk:
            if not torch.isfinite(w.frobenius(k)).all():
                _check_finite(given[k][s:s + step], k, s)
        for m in todo:
            parts[m.name].append(m.compute(w))  # type: ignore[misc]
        if layer_norms:
            lv, lo, method = _layer_norms(w.W_V, w.W_O, layer_norm_method)  # type: ignore[arg-type]
            layer_parts.append((lv, lo))
            methods.add(method)
    values = {name: torch.cat(p).to("cpu") for name, p in parts.items()}

    if layer_norms:
        lv, lo = (torch.cat(p).to("cpu") for p in zip(*layer_parts))
        method = ", ".join(sorted(methods))
        layer: dict[str, Tensor | None] = dict(layer_W_V_norm=lv, layer_W_O_norm=lo, layer_ratio=lv / lo,
                                               trace_proxy=lv.square())
    else:
        method = "skipped"
        layer = dict(layer_W_V_norm=None, layer_W_O_norm=None, layer_ratio=None, trace_proxy=None)

    meta = dict(model or {})
    meta.update(n_layers=L, n_heads=H, n_kv_heads=K, d_model=d_model, d_head=d_head, rho=H / d_head)
    kv_names = set(KV_HEAD_METRICS)
    return SpectralSignature(
        head_metrics={k: v for k, v in values.items() if k not in kv_names},
        kv_head_metrics={k: v for k, v in values.items() if k in kv_names},
        kv_head_of=kv.clone(), **layer,
        dtype=str(dtype).replace("torch.", ""), weights=weights, layer_norm_method=method,
        model=meta,
    )


def _check_qk(W_Q: Any, W_K: Any, q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> None:
    if (W_Q is None) != (W_K is None):
        raise ThermoLensInputError("pass both W_Q and W_K (the QK metrics need the two), or neither")
    for name, w, shape, dims in (("W_Q", W_Q, q_shape, "[layer, head, d_model, d_head]"),
                                 ("W_K", W_K, k_shape, "[layer, kv_head, d_model, d_head]")):
        if w is None:
            continue
        if not isinstance(w, Tensor) or not w.is_floating_point():
            raise ThermoLensInputError(f"{name} must be a floating-point torch.Tensor {dims}")
        if tuple(w.shape) != shape:
            raise ThermoLensInputError(f"{name} has shape {tuple(w.shape)}; expected {dims} = {list(shape)}")
        # NaN/inf: found per chunk from the Frobenius norms in signature_from_weights.


def _metric_weights(name: str) -> tuple[str, ...]:
    return next((m.weights for m in metrics(result="SpectralSignature", load=False) if m.name == name), ())


# Schema-1 field names of SpectralSignature (one field per metric).
_V1_HEAD_FIELDS = ("W_V_norm", "W_O_norm", "ratio", "ov_norm", "W_V_frobenius", "W_O_frobenius",
                   "W_V_stable_rank", "W_O_stable_rank")
_V1_KV_FIELDS = ("W_V_norm_kv", "W_V_frobenius_kv", "W_V_stable_rank_kv")


# --------------------------------------------------------------------------------------------
# model entry points


def spectral_signature(
    model: Any,
    *,
    dtype: torch.dtype | str = torch.float32,
    layer_norms: Any = True,
    layer_norm_method: str = "auto",
    device: Any = None,
    cache: bool = True,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
) -> SpectralSignature:
    """Spectral signature of every head of ``model`` (weights only; no forward pass).

    Args:
        model: a TransformerLens model (``TransformerBridge`` or legacy ``HookedTransformer``) or
            a :class:`~thermo_lens.model.ModelView`.
        dtype: ``torch.float32`` (default) or ``torch.float64``; weights are upcast whatever the
            model's dtype (a bf16 model gives float32 results).
        layer_norms: also compute the paper's whole-layer norms and trace proxy.
        layer_norm_method: ``"auto"`` / ``"svd"`` / ``"gram"`` / ``"lanczos"``
            (:func:`matrix_spectral_norm`).
        device: where to compute; default the model's device when it is a GPU, else CPU.
        cache: reuse the signature computed earlier in this process for the same weights and
            arguments (see :func:`clear_cache` for exactly when an entry is reused); ``False``
            always recomputes (and stores nothing).
        layers, heads: compute only these layers / query heads (ints or lists; negative from the
            end, as everywhere in thermo-lens). The tensors keep the model's full ``[layer, head]``
            shape, with NaN where nothing was computed, so ``layer`` and ``head`` keep their meaning.

    Returns:
        :class:`SpectralSignature` with ``[layer, head]`` tensors (per query head), per-KV-head
        tensors, the ``kv_head_of`` mapping and per-layer norms (``thermo_lens.definitions`` §2).

    Warns:
        UserWarning: the model's weights are processed (LayerNorm folded / centered), which
            changes the numbers; the paper used raw weights.

    Example::

        sig = thermo_lens.spectral_signature(model)
        sig.ov_norm            # [layer, head]
        sig.to_frame()         # tidy: layer, head, kv_head, W_V_norm, ...
    """
    from thermo_lens import validate

    view = as_view(model)
    dtype = _check_dtype(dtype)
    layer_norms = validate.boolean("layer_norms", layer_norms)
    device = validate.device(device)
    view.warn_if_processed(
        "W_V/W_O norms, stable ranks, OV norms and the trace proxy differ from the raw model's "
        "(centering subtracts W_O's mean over d_model)", stacklevel=2)
    _check_method(layer_norm_method)
    if device is None:
        device = view.device if view.device.type == "cuda" else torch.device("cpu")
    sel_layers = _select_indices(layers, view.n_layers, "layer")
    sel_heads = _select_indices(heads, view.n_heads, "head")
    key = None
    if cache:
        # The registered metrics are part of the key: a metric registered later is computed.
        registered = tuple((m.name, m.compute) for m in metrics(result="SpectralSignature", computed=True, load=False))
        key = (_weights_fingerprint(view), dtype, bool(layer_norms), layer_norm_method,
               str(torch.device(device)), repr(sorted(view.metadata().items())), registered,
               None if layers is None else tuple(sel_layers), None if heads is None else tuple(sel_heads))
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
    # Weights are stacked in the model's own dtype (a bf16 model stays bf16 here) and converted
    # to ``dtype`` once, a chunk of layers at a time, inside signature_from_weights.
    native = view.dtype if view.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else dtype
    W_V = view.W_V(native, layers=sel_layers).to(device)
    W_O = view.W_O(native, layers=sel_layers).to(device)
    W_Q = view.W_Q(native, layers=sel_layers).to(device)
    W_K = view.W_K(native, layers=sel_layers).to(device)
    sig = signature_from_weights(
        W_V, W_O, view.kv_head_of, W_Q=W_Q, W_K=W_K, dtype=dtype, layer_norms=layer_norms,
        layer_norm_method=layer_norm_method, weights=view.weight_state, model=view.metadata(),
    )
    if layers is not None or heads is not None:
        sig = _scatter(sig, sel_layers, sel_heads, view)
    if key is not None:
        with _CACHE_LOCK:
            _CACHE[key] = sig
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return sig


def _select_indices(sel: Any, n: int, what: str) -> list[int]:
    """``sel`` (None, an int or a list; negative from the end) as sorted unique indices in 0..n-1."""
    if sel is None:
        return list(range(n))
    items = [sel] if isinstance(sel, (int, np.integer)) else list(sel)
    bad = [i for i in items if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= int(i) < n]
    if bad or not items:
        raise ThermoLensInputError(f"{what}(s) {bad or items} out of range: 0..{n - 1} (negative from the end)")
    return sorted({int(i) % n for i in items})


def _scatter(sig: SpectralSignature, layers: list[int], heads: list[int], view: ModelView) -> SpectralSignature:
    """Place a signature of the selected layers into full-size NaN tensors (and mask unselected heads)."""
    import dataclasses

    L, idx = view.n_layers, torch.as_tensor(layers)
    head_mask = torch.zeros(view.n_heads, dtype=torch.bool)
    head_mask[heads] = True
    kv_mask = torch.zeros(view.n_kv_heads, dtype=torch.bool)
    kv_mask[view.kv_head_of[head_mask]] = True

    def full(t: Tensor, mask: Tensor | None) -> Tensor:
        out_t = torch.full((L, *t.shape[1:]), float("nan"), dtype=t.dtype)
        out_t[idx] = t.to("cpu")
        if mask is not None:
            out_t[:, ~mask] = float("nan")
        return out_t

    out: dict[str, Any] = {
        "head_metrics": {k: full(v, head_mask) for k, v in sig.head_metrics.items()},
        "kv_head_metrics": {k: full(v, kv_mask) for k, v in sig.kv_head_metrics.items()},
    }
    for name in ("layer_W_V_norm", "layer_W_O_norm", "layer_ratio", "trace_proxy"):
        t = getattr(sig, name)
        if isinstance(t, Tensor):
            out[name] = full(t, None)
    return dataclasses.replace(sig, **out)


# --------------------------------------------------------------------------------------------
# the signature cache

_CACHE_SIZE = 16
_CACHE: "OrderedDict[tuple, SpectralSignature]" = OrderedDict()
_CACHE_LOCK = threading.Lock()
_SAMPLE = 64  # elements sampled (evenly spaced) from each attention parameter


def clear_cache() -> None:
    """Forget every cached :class:`SpectralSignature` (see :func:`spectral_signature`).

    A cached signature is reused only when all of these are unchanged: for every attention
    parameter of every layer (``model.blocks[l].attn``: Q/K/V/O weights and biases, fused or not)
    its storage address (``data_ptr``), its autograd version counter (bumped by every in-place
    torch operation on the parameter or a view of it: ``W.mul_(2)``, ``W[...] = x`` under
    ``no_grad``, ``copy_``, ``load_state_dict``), its shape, dtype and device, and the values of
    64 sampled elements (8 evenly spaced rows x 8 evenly spaced columns of a matrix, 64 evenly
    spaced entries of a vector); plus the model's metadata (name, geometry, dtype, raw/processed
    weights), the arguments (``dtype``, ``layer_norms``, ``layer_norm_method``, ``device``,
    ``layers``, ``heads``)
    and the set of registered spectral metrics (:mod:`thermo_lens.registry`).

    Not seen: an edit through ``param.data`` (which has its own version counter) or through
    memory shared outside torch (a numpy view), *and* that leaves the 64 sampled values unchanged.
    After such an edit call ``clear_cache()`` or pass ``cache=False``. Holds at most 16 entries
    (least recently used dropped first) and never a reference to the model.
    """
    with _CACHE_LOCK:
        _CACHE.clear()


def _param_key(name: str, p: Tensor) -> tuple:
    t = p.detach()
    # Evenly spaced indices along every dimension (8 x 8 of a matrix, 64 of a vector): indexing,
    # never a reshape, which would copy the transposed / sliced views TransformerLens exposes.
    per_dim = max(1, round(_SAMPLE ** (1 / max(t.ndim, 1))))
    for d in range(t.ndim):
        n = t.shape[d]
        if n > per_dim:
            t = t.index_select(d, torch.linspace(0, n - 1, per_dim, device=t.device).long())
    sample = t.contiguous().to("cpu")
    return (name, p.data_ptr(), p._version, tuple(p.shape), str(p.dtype), str(p.device),
            sample.view(torch.uint8).numpy().tobytes())


def _weights_fingerprint(view: ModelView) -> tuple:
    """Cheap identity of the attention weights (see :func:`clear_cache`): O(parameters), not
    O(weights)."""
    out = []
    for l in range(view.n_layers):
        attn = view._attn(l)
        out.append(tuple(_param_key(n, p) for n, p in attn.named_parameters()))
    return tuple(out)


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


# ---------------------------------------------------------------------------- the measurement
def _build(ctx: Any) -> SpectralSignature:
    return spectral_signature(ctx.view)


register_measurement(Measurement(
    "spectral", title="Spectral signature of the attention heads", result="SpectralSignature", section="spectral",
    summary="per head: sigma_max and Frobenius norms of W_V and W_O, their ratio, stable ranks, the OV and QK "
            "circuits' spectral norms; per layer the whole layer's value/output norms (from the weights, no pass)",
    build=_build,
))
