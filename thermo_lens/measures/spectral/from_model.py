"""The spectral signature of a model: :func:`spectral_signature` (cached) and :func:`signature_from_collected`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np
import torch
from torch import Tensor

from thermo_lens.core import offload
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.registry import metrics
from thermo_lens.core.validate import validates_own_inputs
from thermo_lens.measures.spectral.cache import _CACHE, _CACHE_LOCK, _CACHE_SIZE, _weights_fingerprint
from thermo_lens.measures.spectral.from_weights import _check_dtype, compute_signature
from thermo_lens.measures.spectral.kernels import _check_method
from thermo_lens.measures.spectral.signature import SpectralSignature

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["spectral_signature", "signature_from_collected", "SpectralOptions"]


class SpectralOptions(TypedDict, total=False):
    """The keyword options of :func:`spectral_signature` (for :func:`signature_from_collected`)."""

    dtype: torch.dtype | str
    layer_norms: bool
    layer_norm_method: str
    device: torch.device | str | None
    cache: bool
    layers: int | Sequence[int] | None
    heads: int | Sequence[int] | None


@validates_own_inputs
def spectral_signature(
    model: TransformerLensModel | ModelView,
    *,
    dtype: torch.dtype | str = torch.float32,
    layer_norms: bool = True,
    layer_norm_method: str = "auto",
    device: torch.device | str | None = None,
    cache: bool = True,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
) -> SpectralSignature:
    """Spectral signature of every head of ``model`` (weights only; no forward pass).

    Args:
        model: a TransformerLens model (``TransformerBridge`` or legacy ``HookedTransformer``) or
            a :class:`~thermo_lens.core.model.ModelView`.
        dtype: ``torch.float32`` (default) or ``torch.float64``; weights are upcast whatever the
            model's dtype (a bf16 model gives float32 results).
        layer_norms: also compute the paper's whole-layer norms and trace proxy (default ``True``).
        layer_norm_method: ``"auto"`` (the default) / ``"svd"`` / ``"gram"`` / ``"lanczos"``
            (:func:`matrix_spectral_norm`).
        device: where to compute; default the model's device when it is a GPU, else CPU.
        cache: reuse the signature computed earlier in this process for the same weights and
            arguments (see :func:`clear_cache` for exactly when an entry is reused); ``False``
            always recomputes (and stores nothing). Default ``True``.
        layers, heads: compute only these layers / query heads (ints or lists; negative from the
            end, as everywhere in thermo-lens); ``None`` (the default): all of them. The tensors keep the model's full ``[layer, head]``
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
    from thermo_lens.core import validate

    view = as_view(model)
    dtype = _check_dtype(dtype)
    layer_norms = validate.boolean("layer_norms", layer_norms)
    device = validate.device(device)
    view.warn_if_processed(
        "W_V/W_O norms, stable ranks, OV norms and the trace proxy differ from the raw model's "
        "(centering subtracts W_O's mean over d_model)", stacklevel=2)
    method_checked = _check_method(layer_norm_method)
    if device is None:
        device = view.device if view.device.type == "cuda" else torch.device("cpu")
    sel_layers = _select_indices(layers, view.n_layers, "layer")
    sel_heads = _select_indices(heads, view.n_heads, "head")
    key = None
    # An offloaded model's weights are read from its offload map layer by layer and never cached
    # (sampling them for the cache key would load every layer once more).
    if cache and not offload.is_offloaded(view.model):
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
    # Weights are read a chunk of layers at a time as the model stores them (a layer of a large
    # model is a view of its parameters: no copy, no transposition; a bf16 model stays bf16) and
    # converted to ``dtype`` in cache inside compute_signature: no copy of the model's attention
    # weights exists, in any dtype.
    native = view.dtype if view.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else dtype
    dev = torch.device(device)

    def read(start: int, stop: int) -> dict[str, Tensor]:
        names = ("W_V", "W_O", "W_Q", "W_K")
        per_layer = []
        for l in sel_layers[start:stop]:
            with offload.materialised(view._attn(l), f"layer {l}'s attention weights"):  # loaded once per layer
                per_layer.append({name: view.stored_weights(name, l, device=dev).to(dev, native) for name in names})
        if len(per_layer) == 1:  # a view of the stored layer, no copy
            return {name: per_layer[0][name][None] for name in names}
        return {name: torch.stack([w[name] for w in per_layer]) for name in names}

    geometry = (len(sel_layers), view.n_heads, view.n_kv_heads, view.d_model, view.d_head)
    sig = compute_signature(
        read, ("W_V", "W_O", "W_Q", "W_K"), geometry, view.kv_head_of, dtype=dtype, device=dev,
        layer_norms=layer_norms, layer_norm_method=method_checked, weights=view.weight_state,
        model=view.metadata(),
    )
    if layers is not None or heads is not None:
        sig = _scatter(sig, sel_layers, sel_heads, view)
    if key is not None:
        with _CACHE_LOCK:
            _CACHE[key] = sig
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return sig


def _select_indices(sel: object, n: int, what: str) -> list[int]:
    """``sel`` (None, an int or a list; negative from the end) as sorted unique indices in 0..n-1."""
    if sel is None:
        return list(range(n))
    items = [sel] if isinstance(sel, (int, np.integer)) or not isinstance(sel, Iterable) else list(sel)
    bad = [i for i in items if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= int(i) < n]
    if bad or not items:
        raise ThermoLensInputError(f"{what}(s) {bad or items} out of range: 0..{n - 1} (negative from the end)")
    return sorted({int(i) % n for i in items if isinstance(i, (int, np.integer))})  # (every one, after the check)


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


def signature_from_collected(collected: object, **kwargs: Unpack[SpectralOptions]) -> SpectralSignature:
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

