"""The spectral signature of stacked weight tensors: :func:`signature_from_weights` (pure; no model)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.core.registry import metrics
from thermo_lens.core.validate import validates_own_inputs
from thermo_lens.measures.spectral.heads import HeadWeights
from thermo_lens.measures.spectral.kernels import LayerNormMethod, _check_method
from thermo_lens.measures.spectral.kernels import resolve_method
from thermo_lens.measures.spectral.layer_norms import LayerStacks, batched
from thermo_lens.measures.spectral.layer_norms import layer_norms as _layer_norms
from thermo_lens.measures.spectral.signature import KV_HEAD_METRICS, SpectralSignature

__all__ = ["signature_from_weights"]

# Elements of the attention weights read per chunk of layers (128 MiB in bf16, 256 MiB in float32;
# the Gram and eigen workspaces are small beside them). A 7B model: 1 layer per chunk.
_CHUNK_ELEMENTS = 1 << 26
# Elements of the per-head Gram matrices kept across chunks before the metrics run on them (64 MiB
# in float32 on the CPU: 8 layers of a 7B model; 256 MiB on a device: all 32 layers, so that every
# layer's small eigenproblems are one batched call).
_GRAM_ELEMENTS_CPU = 1 << 24
_GRAM_ELEMENTS_DEVICE = 1 << 26
# No function here changes torch's global thread count (``torch.set_num_threads`` is process
# wide: setting and restoring it races with other Python threads running torch); callers who want
# one thread set it themselves, once.


_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _check_dtype(dtype: object) -> torch.dtype:
    if isinstance(dtype, str) and dtype.replace("torch.", "") in _DTYPES:
        return _DTYPES[dtype.replace("torch.", "")]
    if isinstance(dtype, torch.dtype) and dtype in (torch.float32, torch.float64):
        return dtype
    raise ThermoLensInputError(
        f"dtype must be torch.float32 or torch.float64 (norms are always reduced in full "
        f"precision, whatever the model's dtype), got {dtype!r}"
    )


def _check_shapes(W_V: object, W_O: object, kv_head_of: object) -> Tensor:
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
    assert isinstance(W_V, Tensor) and isinstance(W_O, Tensor)  # (checked just above)
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


def _check_all_finite(fro: dict[str, list[Tensor]], start: int, read: "LayerReader") -> None:
    """A NaN/inf weight makes its head's Frobenius norm NaN/inf (``fro[name]``: one ``[layer,
    head]`` tensor per chunk read): one read of a flag for the chunks from ``start`` on, and only
    when it is set a look at the weights, element-wise, for the message (the first affected layer;
    in a layer, the weights in the order named). A Frobenius norm that overflows with finite
    weights raises nothing."""
    flags = [~torch.isfinite(f).all() for v in fro.values() for f in v[start:]]
    if not flags or not bool(torch.stack(flags).any()):
        return
    bad = {k: (~torch.isfinite(torch.cat(v))).flatten(1).any(1).tolist() for k, v in fro.items()}
    for l in range(len(next(iter(bad.values())))):
        for k in fro:
            if bad[k][l]:
                _check_finite(read(l, l + 1)[k], k, l)


def _check_finite(W: Tensor, name: str, first_layer: int = 0) -> None:
    bad = ~torch.isfinite(W).flatten(-2).all(-1)  # [layer, head]
    if bad.any():
        l, h = (int(i) for i in bad.nonzero()[0])
        l += first_layer
        raise ThermoLensNumericsError(
            f"{name} has NaN/inf at layer {l}, head {h} ({int(bad.sum())} head(s) affected); "
            "the checkpoint or its dtype conversion is broken"
        )


@validates_own_inputs
def signature_from_weights(
    W_V: Tensor,
    W_O: Tensor,
    kv_head_of: Tensor | Sequence[int] | None = None,
    *,
    W_Q: Tensor | None = None,
    W_K: Tensor | None = None,
    dtype: torch.dtype | str = torch.float32,
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
            :class:`~thermo_lens.core.model.ThermoLensInputError`.)
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

    Every weight-based metric registered in :mod:`thermo_lens.core.registry` whose weights are given is
    computed. Computed on the device of ``W_V``; results on CPU. Layers are processed in chunks (a
    loop over layer chunks, never over heads) and weights stored in another dtype (bf16) are
    converted in cache, a block of heads or a row panel at a time: no converted copy of the
    weights exists (:func:`compute_signature`).
    """
    dtype = _check_dtype(dtype)
    method_checked = _check_method(layer_norm_method)
    kv = _check_shapes(W_V, W_O, kv_head_of)
    L, K, d_model, d_head = W_V.shape
    H = W_O.shape[1]
    _check_qk(W_Q, W_K, (L, H, d_model, d_head), (L, K, d_model, d_head))
    dev = W_V.device
    given = {k: v for k, v in (("W_V", W_V), ("W_O", W_O), ("W_Q", W_Q), ("W_K", W_K)) if v is not None}

    def read(start: int, stop: int) -> dict[str, Tensor]:
        return {k: v[start:stop].to(dev) for k, v in given.items()}

    return compute_signature(read, tuple(given), (L, H, K, d_model, d_head), kv, dtype=dtype, device=dev,
                             layer_norms=layer_norms, layer_norm_method=method_checked, weights=weights,
                             model=model)


#: ``read(start, stop)`` -> the weights of layers ``start .. stop - 1`` (positions in the list of
#: layers computed): ``{"W_V": [layer, kv_head, d_model, d_head], "W_O": [layer, head, d_head,
#: d_model], "W_Q": ..., "W_K": ...}`` in their stored dtype (bf16 stays bf16), on the compute device.
LayerReader = Callable[[int, int], dict[str, Tensor]]


def compute_signature(
    read: LayerReader,
    names: tuple[str, ...],
    geometry: tuple[int, int, int, int, int],
    kv: Tensor,
    *,
    dtype: torch.dtype,
    device: torch.device,
    layer_norms: bool,
    layer_norm_method: LayerNormMethod,
    weights: str,
    model: dict | None,
) -> SpectralSignature:
    """The signature of ``L`` layers read a chunk at a time from ``read`` (checked weights of the
    given ``names``; ``geometry = (L, H, K, d_model, d_head)``): the one loop behind
    :func:`signature_from_weights` (slices of tensors) and
    :func:`~thermo_lens.measures.spectral.spectral_signature` (a model's layers, read as needed).

    Per chunk of layers: the per-head Gram matrices (the arithmetic floor of every exact method:
    weights converted to ``dtype`` a block in cache at a time) and, on the CPU, the whole-layer
    norms one matrix at a time. Per group of chunks (the Gram matrices of 8 layers of a 7B model on
    the CPU, all of them on a device): one finiteness flag read, then the registered metrics, every
    layer's small eigenproblems in one batched call. On a device the whole-layer matrices are
    stacked as chunks arrive (:class:`~thermo_lens.measures.spectral.layer_norms.LayerStacks`, converted to
    ``dtype``) and stepped together by one batched Lanczos iteration. Nothing else holds more than
    one chunk of weights: reading layer by layer (an offloaded model) needs only another ``read``.
    """
    L, H, K, d_model, d_head = geometry
    kv_dev = kv.to(device)
    todo = [m for m in metrics(result="SpectralSignature", computed=True, load=False) if set(m.weights) <= set(names)]
    per_layer = sum((H if n in ("W_O", "W_Q") else K) * d_model * d_head for n in names)
    step = max(1, _CHUNK_ELEMENTS // per_layer)
    # The Gram matrices of a group of chunks are kept and the metrics computed once per group:
    # every layer's small eigenproblems in one batched call (all layers of a 7B model on a GPU).
    gram_per_layer = sum((H if n in ("W_O", "W_Q") else K) * d_head * d_head for n in names)
    budget = _GRAM_ELEMENTS_CPU if torch.device(device).type == "cpu" else _GRAM_ELEMENTS_DEVICE
    group = step * max(1, budget // (gram_per_layer * step))
    kernels = {m.name: m.compute for m in todo if m.compute is not None}  # all of them (computed=True)
    parts: dict[str, list[Tensor]] = {name: [] for name in kernels}
    fro: dict[str, list[Tensor]] = {n: [] for n in names}
    grams: dict[str, list[Tensor]] = {n: [] for n in names}
    layer_parts: list[tuple[Tensor, Tensor]] = []
    methods: set[str] = set()
    stacks = None
    if layer_norms and resolve_method(layer_norm_method) == "lanczos" and batched(device):
        stacks = LayerStacks(L, H, K, d_model, d_head, dtype, torch.device(device))
    first = 0  # first layer of the current group
    checked = 0  # chunks whose weights are known to be finite
    for s in range(0, L, step):
        stop = min(L, s + step)
        chunk = read(s, stop)
        w = HeadWeights(chunk["W_V"], chunk["W_O"], kv_dev, W_Q=chunk.get("W_Q"), W_K=chunk.get("W_K"), dtype=dtype)
        for k in names:
            grams[k].append(w.gram(k))
            fro[k].append(w.frobenius(k))
        if layer_norms and stacks is None:  # checked before the per-chunk layer norms see the weights
            _check_all_finite(fro, checked, read)
            checked = len(fro[names[0]])
            lv, lo, method = _layer_norms(chunk["W_V"], chunk["W_O"], dtype, layer_norm_method)
            layer_parts.append((lv, lo))
            methods.add(method)
        group_done = stop - first >= group or stop == L
        if group_done:  # on a device: one read per group, before any eigenproblem sees the weights
            _check_all_finite(fro, checked, read)
            checked = len(fro[names[0]])
            n_chunks = len(grams[names[0]])
            g = HeadWeights.from_grams({k: torch.cat(v) for k, v in grams.items()}, kv_dev, dtype=dtype,
                                       load=lambda a=first, b=stop: read(a, b))  # type: ignore[misc]
            for k in names:
                g._cache[f"fro_{k}"] = torch.cat(fro[k][-n_chunks:])
            for name, compute in kernels.items():
                parts[name].append(compute(g))
            grams = {n: [] for n in names}
            first = stop
            del g
        if stacks is not None:
            stacks.add(chunk["W_V"], chunk["W_O"])
        del chunk, w
    values = {name: torch.cat(p).to("cpu") for name, p in parts.items()}

    if stacks is not None:
        lv, lo, method = stacks.result()
        layer_parts, methods = [(lv, lo)], {method}
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


def _check_qk(W_Q: object, W_K: object, q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> None:
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
