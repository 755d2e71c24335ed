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

Each metric is one function registered with :func:`thermo_lens.core.registry.register_head_metric`
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

Everything is batched over heads and layers (the per-head Gram matrices of a chunk of layers, then
Cholesky factors and largest eigenvalues of ``d_head x d_head`` matrices for a group of chunks, all
layers of a 7B model on a GPU, in one call each: ``eigvalsh`` on CPU, repeated squaring on a GPU;
the Gram products are the arithmetic floor of any exact method) and the whole-layer norms are
computed by Lanczos (cuSOLVER's float32 SVD was ~1e-4 off and 60 times slower at 7B width): on the
CPU one matrix at a time, one pass over it per step; on a device every layer's matrices together,
one batched product per step, the coefficients read back every few steps
(:mod:`~thermo_lens.measures.spectral.lanczos`), in float32 or float64, whatever the model's dtype.
Weights are read as stored, a chunk of layers at a time (a layer of a large model is a view of its
parameters). On the CPU a bf16 model's weights are converted in cache, a block of heads or a row
panel at a time: no converted copy of the weights exists. A device stacks the whole-layer matrices
in the compute dtype for the batched Lanczos (4 GiB in float32 at 7B; at most a quarter of its
free memory, else a group of layers at a time).
:func:`spectral_signature` caches its result per weights fingerprint
(:func:`clear_cache` says exactly when an entry is reused), so re-profiling a model costs nothing
here. No function changes torch's process-wide thread count.
Weight processing (TransformerLens compatibility mode) changes these numbers; the paper used raw
weights, so processed weights raise a ``UserWarning`` and every result records its state.

Entry points: :func:`spectral_signature` (a model, cached), :func:`signature_from_weights`
(stacked tensors, no model, never cached), :func:`signature_from_collected` (for a one-pass profile),
:func:`ov_norm_factored` and :func:`matrix_spectral_norm` (the two batched kernels).

Layout (one concept per module): :mod:`~thermo_lens.measures.spectral.kernels` (Gram roots, factored
products, whole-matrix norms), :mod:`~thermo_lens.measures.spectral.heads` (:class:`HeadWeights` and the
registered head metrics), :mod:`~thermo_lens.measures.spectral.layer_norms` (whole-layer norms),
:mod:`~thermo_lens.measures.spectral.lanczos` (Lanczos on a stack of matrices at once),
:mod:`~thermo_lens.measures.spectral.signature` (the result), :mod:`~thermo_lens.measures.spectral.from_weights`
(stacked tensors), :mod:`~thermo_lens.measures.spectral.from_model` (a model) and
:mod:`~thermo_lens.measures.spectral.cache` (the fingerprint cache). Importing the package registers every
spectral metric (:mod:`thermo_lens.core.registry` lists it as a provider).
"""

from __future__ import annotations

from thermo_lens.core.registry import BuildContext, Measurement, Options, register_measurement
from thermo_lens.measures.spectral.cache import clear_cache
from thermo_lens.measures.spectral.from_model import signature_from_collected, spectral_signature
from thermo_lens.measures.spectral.from_weights import signature_from_weights
from thermo_lens.measures.spectral.heads import HeadWeights
from thermo_lens.measures.spectral.kernels import matrix_spectral_norm, ov_norm_factored
from thermo_lens.measures.spectral.signature import HEAD_METRICS, KV_HEAD_METRICS, LAYER_METRICS, SpectralSignature

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
    "HeadWeights",
]


# ---------------------------------------------------------------------------- the measurement
# Registered here, in the package the registry lists as a provider (measurements are ordered by
# their class's module).
@register_measurement
class Spectral(Measurement[Options]):
    """The spectral signature of the attention heads, from the weights (:class:`SpectralSignature`)."""

    name = "spectral"
    title = "Spectral signature of the attention heads"
    summary = ("per head: sigma_max and Frobenius norms of W_V and W_O, their ratio, stable ranks, the OV and QK "
               "circuits' spectral norms; per layer the whole layer's value/output norms (from the weights, no pass)")
    result = SpectralSignature
    section = "spectral"
    needs_pass = False

    def build(self, ctx: BuildContext) -> SpectralSignature:
        return spectral_signature(ctx.view)
