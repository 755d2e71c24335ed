"""Passes that start at a layer from given residuals: the :class:`FromLayer` runner, and where hosts allow it.

A sweep's cell at layer ``l`` leaves blocks ``0..l-1`` as they were without it, so its pass can
begin at block ``l`` from the unpatched run's ``x_l`` instead of from the embedding.

Host support (:func:`start_support`; the host's part, and how it skips the earlier blocks, is its
adapter's: :meth:`thermo_lens.core.hosts.HostAdapter.start_support` and
:meth:`~thermo_lens.core.hosts.HostAdapter.only_later_blocks`):

* ``HookedTransformer`` (TransformerLens 2.x / 3.x): ``forward(x_l, start_at_layer=l,
  attention_mask=...)`` runs blocks ``l..L-1`` only (the attention mask given explicitly, as its
  docstring asks; rotary positions and the causal mask come from the block itself).
* ``TransformerBridge`` (TransformerLens 4.x): ``start_at_layer=l`` feeds ``x_l`` to the HF model as
  ``inputs_embeds`` (so HF builds the attention mask, position ids and rotary embeddings of the right
  length) and block ``l`` swaps ``x_l`` back in, but HF still runs blocks ``0..l-1`` and discards
  them. Here the HF model's layer list is cut to blocks ``l..L-1`` for the pass (and restored after
  it), so they are not run at all; every block that runs gets what HF builds for a full pass.

Not used (the sweep then runs every pass from the embedding, and says why in its result): a host
without ``start_at_layer`` (``HookedEncoder``, a shortformer model, a bridge whose HF model holds the
blocks in no layer list), hooks already on the model (``model.add_hook``, ``model.hooks``, SAEs,
PyTorch module hooks: they would have to run in the blocks that are skipped), and user ``fwd_hooks``
that are not per-block names or that sit at a ``hook_resid_pre`` (the cached ``x_l`` is read after
them). User hooks of blocks below the start ran in the unpatched pass that ``x_l`` comes from; those
of later blocks run in every pass. The HF model's per-layer attention kinds (``config.layer_types``,
read by loop position) are cut with the layer list. Every sweep also checks the host at every start
layer: each group of passes carries one unpatched copy of the prompts, whose measure must equal the
full pass's (float32 rounding), else the sweep falls back to full passes (a per-layer difference such
as a block getting another block's mask shows at its own start layer only).

Memory: the unpatched pass keeps ``x_l`` of every start layer for every prompt (``[prompt, pos,
d_model]`` per layer, on the model's device) until the sweep ends, besides the passes' own batches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, ContextManager

import torch
from torch import Tensor

from thermo_lens.core.hosts import takes_start_at_layer
from thermo_lens.core.model import ModelView, _StopForward, _stop_forward
from thermo_lens.core.tokens import TokenBatch

__all__ = ["start_support", "FromLayer", "BLOCK_HOOK"]

#: A per-block hook name: ``blocks.{layer}.<point>``.
BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")
# The host's part of start-at-layer lives in its adapter (thermo_lens.core.hosts); the name stays importable.
_takes_start = takes_start_at_layer


def start_support(view: ModelView, fwd_hooks: Sequence[tuple[Any, Callable]]) -> str | None:
    """Why passes cannot start at a layer on this model with these user hooks, or None."""
    model = view.model
    why = view.adapter.start_support(model, view.host.describe())  # the host's own reasons
    if why:
        return why
    on_model = view.adapter.attached_hooks(model)
    if on_model:
        return (f"hooks are already on the model ({on_model[0].hook_point}, {on_model[0].attached}): they run in "
                "the blocks a start-at-layer pass skips")
    for name, _ in fwd_hooks:
        m = BLOCK_HOOK.match(name) if isinstance(name, str) else None
        if m is None:
            return f"a user hook at {name!r} is not a per-block hook point"
        if m.group(2) in ("hook_resid_pre", "hook_in"):
            return f"a user hook at {name} edits the residual a start-at-layer pass starts from"
    return None



class FromLayer:
    """A runner whose batches start at block ``layer`` from ``residual`` (``[prompt, pos, d_model]`` on
    the model's device, indexed by the caller's prompt of each row): blocks ``0..layer-1`` never run.
    Only where :func:`start_support` found none."""

    def __init__(self, view: ModelView, layer: int, residual: Tensor) -> None:
        self.start_layer = int(layer)
        self._residual = residual

    def _only_later_blocks(self, view: ModelView) -> ContextManager[None]:
        """The host's context in which a pass given ``start_at_layer`` runs the later blocks only."""
        return view.adapter.only_later_blocks(view.model, self.start_layer)

    def run_batch(self, view: ModelView, batch: TokenBatch, rows: Tensor, hooks: Sequence[tuple[Any, Callable]], *,
                  stop_after: str | None, return_logits: bool) -> Tensor | None:
        """One pass of the batch's rows from block ``start_layer`` (the tokens give the shape only)."""
        width = int(batch.tokens.shape[1])
        x = self._residual.index_select(0, rows.to(self._residual.device))[:, :width]
        mask = batch.mask.to(device=view.device, dtype=torch.long)
        run_hooks = list(hooks)
        if stop_after is not None:
            run_hooks.append((stop_after, _stop_forward))
        with torch.inference_mode(), self._only_later_blocks(view):
            try:
                out = view.model.run_with_hooks(x, fwd_hooks=run_hooks, return_type="logits" if return_logits else None,
                                                attention_mask=mask, start_at_layer=self.start_layer)
            except _StopForward:
                return None
        if return_logits:
            return out.logits if hasattr(out, "logits") else out
        return None
