"""The spectral signature cache: one entry per weights fingerprint and arguments (see :func:`clear_cache`)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from torch import Tensor

from thermo_lens.core.model import ModelView
from thermo_lens.measures.spectral.signature import SpectralSignature

__all__ = ["clear_cache"]

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
    and the set of registered spectral metrics (:mod:`thermo_lens.core.registry`).

    Not seen: an edit through ``param.data`` (which has its own version counter) or through
    memory shared outside torch (a numpy view), *and* that leaves the 64 sampled values unchanged.
    After such an edit call ``clear_cache()`` or pass ``cache=False``. Holds at most 16 entries
    (least recently used dropped first) and never a reference to the model.
    """
    with _CACHE_LOCK:
        _CACHE.clear()


def _sample(p: Tensor) -> Tensor:
    """64 evenly spaced elements of a parameter (8 x 8 of a matrix, 64 of a vector), flat, as bytes,
    where the parameter lives."""
    t = p.detach()
    # Indexing, never a reshape, which would copy the transposed / sliced views TransformerLens exposes.
    per_dim = max(1, round(_SAMPLE ** (1 / max(t.ndim, 1))))
    for d in range(t.ndim):
        n = t.shape[d]
        if n > per_dim:
            t = t.index_select(d, torch.linspace(0, n - 1, per_dim, device=t.device).long())
    return t.reshape(-1).view(torch.uint8)


def _weights_fingerprint(view: ModelView) -> tuple:
    """Cheap identity of the attention weights (see :func:`clear_cache`): O(parameters), not
    O(weights). The sampled values of every parameter on one device come to the host in one copy
    (not one round trip per parameter: a warm call on a GPU waits for the device once)."""
    meta: list[tuple] = []
    samples: dict[str, list[Tensor]] = {}
    for l in range(view.n_layers):
        for name, p in view._attn(l).named_parameters():
            meta.append((l, name, p.data_ptr(), p._version, tuple(p.shape), str(p.dtype), str(p.device)))
            samples.setdefault(str(p.device), []).append(_sample(p))
    values = tuple((dev, torch.cat(s).to("cpu").numpy().tobytes()) for dev, s in samples.items())
    return tuple(meta), values
