"""What several in-pass reductions share inside one batch: products of the same activation, made once,
and per-layer results finished together.

Why: on a GPU every op a hook dispatches is a kernel launch, and the host's time to dispatch them
(not the device's arithmetic) bounded a ``profile()`` (issue: ``thermo_lens.core.census``). Two kinds of
repetition made most of those ops:

* several reductions read the same activation and made the same product of it: the per-token norms of
  a residual state (the gain, the anisotropy and the attribution's scale each took them), the scoped
  float32 rows of a head output (the attribution and the head write norms). :func:`shared` makes such a
  product once per batch and hook point (:func:`token_norms`, :func:`scoped_rows`);
* every layer finished its small result with the same few element-wise ops (mask the padding, count
  the finite entries, convert, divide by the token counts): :class:`PerLayer` keeps each layer's
  small result until the last of the reduction's hooks in the batch, then finishes all layers with one
  op each on their stack and records them with one copy (:meth:`Recorder.put_rows`).

Both live for one batch (:meth:`Recorder.per_batch`). A product is keyed by its hook point and the
activation it was made from (the same memory, layout and version: all reductions at a hook point run
when it fires, one after another, after any user hook there), and only the latest hook point's products are kept: the activation is
held until the next hook point that shares a product (a weak reference does not do: PyTorch clears
it when the hook's Python object goes, though the tensor lives on).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence, TypeVar

import torch
from torch import Tensor

from thermo_lens.core.passes import Recorder

__all__ = ["as_float32", "shared", "token_norms", "scoped_rows", "PerLayer"]

_CACHE = ("hook products",)
T = TypeVar("T")


def as_float32(x: Tensor) -> Tensor:
    """``x`` in float32 (``x`` itself when it is: no op dispatched)."""
    return x if x.dtype == torch.float32 else x.float()


def shared(rec: Recorder, hook_name: str, what: Hashable, x: Tensor, build: Callable[[Tensor], T]) -> T:
    """``build(x)`` of the activation ``x`` at ``hook_name``, made once in the batch and shared by
    every reduction that asks for ``what`` there (the same tensor: a later activation at the same
    address is not mistaken for it). Only the latest hook point's products are kept."""
    cache: dict[Any, Any] = rec.per_batch(_CACHE, lambda batch: {})
    if cache.get("hook") != hook_name:
        cache.clear()
        cache["hook"] = hook_name
    got = cache.get(what)
    if got is not None and _same(got[0], x):
        return got[1]
    out = build(x)
    cache[what] = (x, out)
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same values: the same tensor, or views of the same memory with the
    same layout and no in-place change since (a host may hand each hook at a point its own view, e.g.
    the bridge's ``attn.hook_z``)."""
    if a is b:
        return True
    if a.data_ptr() != b.data_ptr() or a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype \
            or a.device != b.device:
        return False
    # (inference tensors, the pass's default, keep no version counter: nothing but the reductions, which
    # never change an activation, runs between two reductions at one hook point)
    return a.is_inference() or b.is_inference() or a._version == b._version


def _norms32(x: Tensor) -> Tensor:
    """``[..., pos, 1]`` per-token L2 norms over the last dimension (kept), float32. ``vector_norm(dtype=float32)``
    reduces in float32 without a full float32 copy; a float64 activation reduces in float64
    (vector_norm refuses to narrow) and is returned as float32."""
    if x.dtype == torch.float64:
        return torch.linalg.vector_norm(x, dim=-1, keepdim=True).float()
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)


def token_norms(rec: Recorder, hook_name: str, x: Tensor) -> Tensor:
    """``[batch, pos, 1]`` float32 per-token L2 norms of the residual state ``x`` ``[batch, pos, d_model]``
    read at ``hook_name`` (shared by the gain and the anisotropy)."""
    return shared(rec, hook_name, "norms32", x, _norms32)


def scoped_rows(rec: Recorder, hook_name: str, x: Tensor, token_scope: str) -> Tensor:
    """``[n, ...]`` float32: the rows of ``x`` ``[batch, pos, ...]`` at the scope's real tokens
    (:meth:`Recorder.scope_rows`, flat ``(prompt, position)`` order), a new tensor shared by every
    reduction that asks (read it, never change it in place)."""
    def build(t: Tensor) -> Tensor:
        rows = rec.scope_rows(token_scope, t.device)[0]
        return as_float32(t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]).index_select(0, rows))
    return shared(rec, hook_name, ("scoped rows", token_scope), x, build)


class PerLayer:
    """The per-layer results of one reduction, kept for the batch and finished together.

    Register the reduction's hooks (each calling :meth:`add` with its layer and its small results),
    then :meth:`close`: the last of those hooks (the largest layer the recorder kept: a sweep keeps
    some blocks' hooks) calls ``finish(layers, values)`` within the same batch, ``values[i]`` the
    stack ``[layer, ...]`` of the ``i``-th result each layer added (one op per result for all
    layers). A layer whose hook did not run is absent from ``layers`` (the pass then fails on the
    silent hook)."""

    def __init__(self, rec: Recorder, name: str, finish: Callable[[list[int], list[Tensor]], None]) -> None:
        self.rec, self.name, self.finish = rec, name, finish
        self._start = len(rec.registered())
        self.last = -1

    def close(self) -> None:
        """After the reduction's hooks are registered: find the last one the recorder kept."""
        mine = self.rec.registered()[self._start:]
        self.last = max((key[1] for key in mine if key[0] == self.name), default=-1)

    def add(self, layer: int, *values: Tensor) -> None:
        """Keep ``values`` of ``layer`` for this batch; at the last layer, finish every layer kept."""
        kept: list[tuple[int, Sequence[Tensor]]] = self.rec.per_batch(("per layer", self.name, id(self)),
                                                                       lambda batch: [])
        kept.append((layer, values))
        if layer == self.last:
            layers = [k[0] for k in kept]
            stacks = [torch.stack([k[1][i] for k in kept]) for i in range(len(values))]
            kept.clear()
            self.finish(layers, stacks)
