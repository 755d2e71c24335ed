"""The :class:`SpectralSignature` result: every registered spectral metric per layer and head."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from jaxtyping import Float, Int
from torch import Tensor

import thermo_lens.measures.spectral.heads  # noqa: F401  (registers the head metrics, in display order)
import thermo_lens.measures.spectral.layer_norms  # noqa: F401  (then the per-layer metrics)
from thermo_lens._lazy import pandas as pd
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.registry import metrics
from thermo_lens.core.result import Result

__all__ = ["SpectralSignature", "HEAD_METRICS", "KV_HEAD_METRICS", "LAYER_METRICS"]


def _names(shape: str) -> tuple[str, ...]:
    return tuple(m.name for m in metrics(result="SpectralSignature", shape=shape, load=False))


#: ``[layer, head]`` metrics (per query head), in display order (from the metric registry).
HEAD_METRICS: tuple[str, ...] = _names("layer head")
#: ``[layer, kv_head]`` metrics.
KV_HEAD_METRICS: tuple[str, ...] = _names("layer kv_head")
#: ``[layer]`` metrics (the paper's whole-layer convention).
LAYER_METRICS: tuple[str, ...] = _names("layer")


@dataclass(frozen=True, eq=False)
class SpectralSignature(Result):
    """Spectral signature of every head (``thermo_lens.definitions`` §2; D'Elia 2026).

    ``[layer, head]`` tensors are per query head, TransformerLens style (like ``head_detector``).
    Every registered weight-based metric (:mod:`thermo_lens.core.registry`, e.g. ``W_V_norm``,
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
            (on the Gram operator, to ~1e-6 or machine precision; ``"lanczos (gram for k of n)"`` when
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
        return super().__getattr__(name)  # n_layers, n_heads, n_kv_heads: the sizes of the named dimensions

    @property
    def definitions(self) -> dict[str, str]:
        """Formula of every metric in this signature (from :mod:`thermo_lens.core.registry`)."""
        present = {*self.head_metrics, *self.kv_head_metrics, *LAYER_METRICS}
        return {m.name: m.formula for m in metrics(result="SpectralSignature", load=False) if m.name in present}

    # ------------------------------------------------------------------ geometry
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
        if self.layer_W_V_norm is not None and self.layer_W_O_norm is not None:
            lv, lo = _np(self.layer_W_V_norm), _np(self.layer_W_O_norm)
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


def _metric_weights(name: str) -> tuple[str, ...]:
    return next((m.weights for m in metrics(result="SpectralSignature", load=False) if m.name == name), ())


# Schema-1 field names of SpectralSignature (one field per metric).
_V1_HEAD_FIELDS = ("W_V_norm", "W_O_norm", "ratio", "ov_norm", "W_V_frobenius", "W_O_frobenius",
                   "W_V_stable_rank", "W_O_stable_rank")
_V1_KV_FIELDS = ("W_V_norm_kv", "W_V_frobenius_kv", "W_V_stable_rank_kv")
