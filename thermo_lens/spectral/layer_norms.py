"""The paper's whole-layer norms: ``sigma_max`` of a layer's whole value and output matrices.

``layer_W_V_norm`` is the spectral norm of the layer's value matrix ``[d_model, n_kv_heads *
d_head]`` (all heads side by side, as a fused ``v_proj``), ``layer_W_O_norm`` that of its output
matrix ``[n_heads * d_head, d_model]``, and the paper's "trace proxy" is ``layer_W_V_norm ** 2``
(it is not a trace; ``thermo_lens.definitions`` §3).
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from thermo_lens.registry import Metric, register_metric
from thermo_lens.spectral.kernels import LayerNormMethod, matrix_spectral_norm

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
