"""Passes that start at a layer from given residuals: the :class:`FromLayer` runner, and where hosts allow it.

A sweep's cell at layer ``l`` leaves blocks ``0..l-1`` as they were without it, so its pass can
begin at block ``l`` from the unpatched run's ``x_l`` instead of from the embedding.

Host support (:func:`start_support`):

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

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from thermo_lens import attached
from thermo_lens.model import ModelView, _StopForward, _stop_forward
from thermo_lens.tokens import TokenBatch

__all__ = ["start_support", "FromLayer", "BLOCK_HOOK"]

#: A per-block hook name: ``blocks.{layer}.<point>``.
BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")
def _layer_list(model: Any) -> tuple[torch.nn.Module, str] | None:
    """The module and attribute of the bridge's HF model that hold its blocks as a ``ModuleList``
    (``transformer.h``, ``model.layers`` ...), or None."""
    hf = getattr(model, "original_model", None)
    blocks = list(getattr(model, "blocks", []) or [])
    if not isinstance(hf, torch.nn.Module) or not blocks:
        return None
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == len(blocks) and all(
                a is b for a, b in zip(mod, blocks)):
            parent, _, attr = name.rpartition(".")
            return (hf.get_submodule(parent) if parent else hf), attr
    return None


def _takes_start(model: Any) -> bool:
    """Whether ``model.forward`` takes ``start_at_layer``: named in its signature, or passed on by
    a subclass's ``forward(input, **kwargs)`` to a parent class's forward that names it (SAELens'
    ``HookedSAETransformer.forward`` hands every keyword to ``HookedTransformer.forward``)."""
    # an instance's own forward first (e.g. accelerate's offloading wrapper), then the classes'
    owners = [getattr(model, "__dict__", {})] + [cls.__dict__ for cls in type(model).__mro__]
    for owner in owners:
        fn = owner.get("forward")
        if fn is None:
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        if "start_at_layer" in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False  # this forward neither names it nor passes keywords on
    return False


def start_support(view: ModelView, fwd_hooks: Sequence[tuple[Any, Callable]]) -> str | None:
    """Why passes cannot start at a layer on this model with these user hooks, or None."""
    model = view.model
    if view.backend == "hooked_encoder":
        return "HookedEncoder has no start_at_layer"
    if not _takes_start(model):  # run_with_hooks passes it on (by name or **kwargs)
        return f"{view.host.describe()} has no start_at_layer"
    if view.backend == "bridge" and _layer_list(model) is None:
        return "the bridge's HF model holds its blocks in no layer list (its start_at_layer would run every block)"
    if getattr(getattr(model, "cfg", None), "positional_embedding_type", None) == "shortformer":
        return "a shortformer model adds its positional embedding in every block"
    on_model = attached.attached_hooks(model)
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
        self._hf_layers = _layer_list(view.model) if view.backend == "bridge" else None

    @contextlib.contextmanager
    def _only_later_blocks(self, view: ModelView) -> Iterator[None]:
        if view.backend != "bridge":
            yield
            return
        assert self._hf_layers is not None, "start_support checked the layer list"
        parent, attr = self._hf_layers
        full = getattr(parent, attr)
        # HF models with per-layer attention kinds (Gemma-2/3, Qwen2, GPT-OSS ...) pick each block's mask
        # and rotary embedding by its position in the loop (config.layer_types[i]): cut that list too, or
        # block l would get block 0's kind (a sliding window, a local rotary base).
        cfg: Any = getattr(parent, "config", None)
        types: Any = getattr(cfg, "layer_types", None)
        cut_types = isinstance(types, (list, tuple)) and len(types) == len(full)
        setattr(parent, attr, torch.nn.ModuleList(list(full)[self.start_layer:]))
        if cut_types:
            cfg.layer_types = list(types)[self.start_layer:]
        try:
            yield
        finally:
            setattr(parent, attr, full)
            if cut_types:
                cfg.layer_types = types

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
