"""The paper's whole-layer norms: ``sigma_max`` of a layer's whole value and output matrices.

``layer_W_V_norm`` is the spectral norm of the layer's value matrix ``[d_model, n_kv_heads *
d_head]`` (all heads side by side, as a fused ``v_proj``), ``layer_W_O_norm`` that of its output
matrix ``[n_heads * d_head, d_model]``, and the paper's "trace proxy" is ``layer_W_V_norm ** 2``
(it is not a trace; ``thermo_lens.definitions`` §3).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.registry import Metric, register_metric
from thermo_lens.spectral.kernels import (LayerNormMethod, RowPanels, lanczos_norms, matrix_spectral_norm,
                                         resolve_method)

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


def layer_norms(
    W_V: Float[Tensor, "layer kv_head d_model d_head"],
    W_O: Float[Tensor, "layer head d_head d_model"],
    dtype: torch.dtype,
    method: LayerNormMethod,
) -> tuple[Float[Tensor, " layer"], Float[Tensor, " layer"], str]:
    """The paper's whole-layer norms of a chunk of layers: ``sigma_max`` of each layer's value
    matrix ``[d_model, kv_head * d_head]`` (heads side by side, as a fused ``v_proj``) and of its
    output matrix ``[head * d_head, d_model]``, computed in ``dtype``, and the method used (one
    name, or one per matrix; :func:`~thermo_lens.spectral.kernels.matrix_spectral_norm`).

    The weights may be stored in another dtype (bf16): Lanczos (``"auto"``) reads them as
    stored, a layer at a time (the output matrix is a view of ``W_O``; the value matrix is laid out
    row-major once per layer, in the stored dtype), and converts each row panel in cache; no
    converted copy of a whole layer exists on CPU (a GPU converts one matrix at a time: 64 MiB at
    7B width, two matrix-vector kernels per step). ``"svd"`` and ``"gram"`` convert the chunk.
    """
    L, K, d_model, d_head = W_V.shape
    H = W_O.shape[1]
    if resolve_method(method) == "lanczos":
        values = (_value_matrix(W_V[l]) for l in range(L))
        lv, mv = lanczos_norms(values, L, dtype)
        lo, mo = lanczos_norms((W_O[l].reshape(H * d_head, d_model) for l in range(L)), L, dtype)
        lv, lo = lv.to(W_V.device), lo.to(W_V.device)
    else:
        lv, mv = matrix_spectral_norm(W_V.to(dtype).permute(0, 2, 1, 3).reshape(L, d_model, K * d_head), method)
        lo, mo = matrix_spectral_norm(W_O.to(dtype).reshape(L, H * d_head, d_model), method)
    return lv, lo, mv if mv == mo else f"{mv} (W_V), {mo} (W_O)"


def _value_matrix(W_V: Float[Tensor, "kv_head d_model d_head"]) -> Tensor | RowPanels:
    """A layer's value matrix ``[d_model, kv_head * d_head]`` as a view of the weights (a fused
    ``v_proj``, as HF and the bridge store it), or, when the heads are stored one after another
    (TransformerLens' ``W_V``, stacked tensors) and no view exists, its transpose as the heads'
    row panels ``W_V[h]^T`` (same singular values), read in place instead of copied."""
    K, d_model, d_head = W_V.shape
    try:
        return W_V.permute(1, 0, 2).view(d_model, K * d_head)
    except RuntimeError:
        return RowPanels([W_V[h].mT for h in range(K)])
