"""The paper's whole-layer norms: ``sigma_max`` of a layer's whole value and output matrices.

``layer_W_V_norm`` is the spectral norm of the layer's value matrix ``[d_model, n_kv_heads *
d_head]`` (all heads side by side, as a fused ``v_proj``), ``layer_W_O_norm`` that of its output
matrix ``[n_heads * d_head, d_model]``, and the paper's "trace proxy" is ``layer_W_V_norm ** 2``
(it is not a trace; ``thermo_lens.definitions`` §3).
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.registry import Metric, register_metric
from thermo_lens.measures.spectral.kernels import (LayerNormMethod, RowPanels, lanczos_norms, matrix_spectral_norm,
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
    name, or one per matrix; :func:`~thermo_lens.measures.spectral.kernels.matrix_spectral_norm`).

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


def batched(device: torch.device) -> bool:
    """Whether the whole-layer norms on ``device`` step every layer's matrices together
    (:class:`LayerStacks`): on any accelerator, where a launch and a host round trip per step and
    matrix cost more than the step itself. The CPU keeps the per-matrix path (a bf16 matrix
    converted in cache a panel at a time, and each matrix stopping at its own step)."""
    return torch.device(device).type != "cpu"


#: Bytes the float32 stacks of the batched whole-layer norms may take off a GPU (a host test).
_HOST_STACK_BYTES = 1 << 30


class LayerStacks:
    """The whole-layer value and output matrices of ``L`` layers, converted to ``dtype`` into
    stacks on the device as chunks of layers arrive (:meth:`add`), and their ``sigma_max`` by
    :func:`~thermo_lens.measures.spectral.lanczos.lanczos_sigma_max_batched`: one batched product per
    Lanczos step for all matrices of a stack.

    Each matrix is stacked in the orientation whose Gram operator acts on its smaller side (on
    the ``d_model`` side when square): the value matrix as ``V^T [kv_head * d_head, d_model]`` or
    ``V [d_model, kv_head * d_head]``, the output matrix as ``O [head * d_head, d_model]`` or its
    transpose. When the two have one shape (LLaMA-2, GPT-2) they share one stack of ``2 L``
    matrices; otherwise (GQA) each has its own, stepped one after the other.

    Memory: the stacks of all layers in ``dtype`` (64 matrices of 4096 x 4096 in float32 at 7B:
    4 GiB), at most a quarter of the device's free memory: beyond that, layers are taken in groups
    that fit, each group its own batched iteration (``budget`` bytes; default as said, 1 GiB on
    the host).
    """

    def __init__(self, L: int, H: int, K: int, d_model: int, d_head: int, dtype: torch.dtype,
                 device: torch.device, budget: int | None = None):
        from thermo_lens.measures.spectral.lanczos import lanczos_sigma_max_batched

        self._lanczos = lanczos_sigma_max_batched
        self.L, self.H, self.K, self.d_head, self.d_model = L, H, K, d_head, d_model
        self.dtype, self.device = dtype, torch.device(device)
        self.v_transposed = K * d_head >= d_model  # V^T [K d_head, d_model]
        self.o_transposed = H * d_head < d_model  # O^T [d_model, H d_head]
        v_shape = (K * d_head, d_model) if self.v_transposed else (d_model, K * d_head)
        o_shape = (d_model, H * d_head) if self.o_transposed else (H * d_head, d_model)
        self.shared = v_shape == o_shape
        if budget is None:
            budget = (torch.cuda.mem_get_info(self.device)[0] // 4 if self.device.type == "cuda"
                      else _HOST_STACK_BYTES)
        per_layer = (v_shape[0] * v_shape[1] + o_shape[0] * o_shape[1]) * torch.finfo(dtype).bits // 8
        self.group = max(1, min(L, budget // per_layer))
        g = self.group
        if self.shared:
            both = torch.empty(2 * g, *v_shape, dtype=dtype, device=self.device)
            self.v, self.o = both[:g], both[g:]
            self.stacks = [both]
        else:
            self.v = torch.empty(g, *v_shape, dtype=dtype, device=self.device)
            self.o = torch.empty(g, *o_shape, dtype=dtype, device=self.device)
            self.stacks = [self.v, self.o]
        self.filled = 0  # layers of the current group in the stacks
        self.done = 0  # layers whose norms are computed
        self.lv: list[Tensor] = []
        self.lo: list[Tensor] = []
        self.fallback = 0

    def add(self, W_V: Float[Tensor, "layer kv_head d_model d_head"],
            W_O: Float[Tensor, "layer head d_head d_model"]) -> None:
        """The next layers' weights, as stored (any dtype, views of fused parameters)."""
        s = 0
        while s < W_V.shape[0]:
            n = min(W_V.shape[0] - s, self.group - self.filled)
            a, b = self.filled, self.filled + n
            v, o = W_V[s:s + n], W_O[s:s + n]
            if self.v_transposed:
                self.v[a:b].view(n, self.K, self.d_head, self.d_model).copy_(v.mT)
            else:
                self.v[a:b].view(n, self.d_model, self.K, self.d_head).copy_(v.permute(0, 2, 1, 3))
            if self.o_transposed:
                self.o[a:b].view(n, self.d_model, self.H, self.d_head).copy_(o.permute(0, 3, 1, 2))
            else:
                self.o[a:b].view(n, self.H, self.d_head, self.d_model).copy_(o)
            self.filled, s = b, s + n
            if self.filled == self.group or self.done + self.filled == self.L:
                self._run()

    def _run(self) -> None:
        n = self.filled
        if self.shared:
            g = self.group
            both = self.stacks[0]
            M = both if n == g else torch.cat([both[:n], both[g:g + n]])
            s = self._norms(M)
            self.lv.append(s[:n])
            self.lo.append(s[n:])
        else:
            self.lv.append(self._norms(self.v[:n]))
            self.lo.append(self._norms(self.o[:n]))
        self.done += n
        self.filled = 0

    def _norms(self, M: Tensor) -> Tensor:
        sigma, _ = self._lanczos(M)  # numpy, on the host
        out = torch.from_numpy(sigma).to(self.dtype)
        bad = np.flatnonzero(np.isnan(sigma))
        for i in bad:  # not converged within 300 steps (rare): the Gram eigenvalue instead
            if bool(torch.isfinite(M[int(i)]).all()):  # NaN weights: reported by the caller's check
                out[i] = matrix_spectral_norm(M[int(i)], "gram")[0].to("cpu", self.dtype)
        self.fallback += len(bad)
        return out

    def result(self) -> tuple[Float[Tensor, " layer"], Float[Tensor, " layer"], str]:
        """``(layer_W_V_norm, layer_W_O_norm, method)`` on the host, once every layer was added."""
        if self.done != self.L:
            raise RuntimeError(f"LayerStacks: {self.done} of {self.L} layers added")
        method = "lanczos" if not self.fallback else f"lanczos (gram for {self.fallback} of {2 * self.L})"
        return torch.cat(self.lv), torch.cat(self.lo), method
