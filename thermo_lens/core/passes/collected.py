"""What one pass recorded (:class:`Collected`), and the checks every pass ends with.

A :class:`Collected` is the one place a pass's provenance is built: every result of the pass
records the same prompts, lengths, BOS mode, hooks, batch plan and origin.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.core.model import ModelView
from thermo_lens.core.packed import read_rows
from thermo_lens.core.passes.recorder import Recorder
from thermo_lens.core.provenance import Provenance

__all__ = ["Collected", "check_silent", "check_finite"]


@dataclass(frozen=True)
class Collected:
    """What one pass over a prompt list recorded.

    Attributes:
        recorder: the reductions (``recorder.stack(name)``).
        lengths: ``[prompt]`` real token counts (BOS included when prepended).
        prompts: the prompt texts, in the caller's order.
        prepend_bos: the BOS mode used (``"host"`` recorded as what it resolved to;
            ``"tokens_as_given"`` for token-id input).
        truncated: per prompt, whether it was cut to ``n_ctx``.
        view: the :class:`ModelView`.
        row_prompt: ``[prompt]`` for each recorded row (batches may run in length order), the
            caller's index of its prompt; :meth:`stack` restores the caller's order.
        hooks: every hook active in the pass (:class:`thermo_lens.core.provenance.HookRecord`): the
            ``fwd_hooks`` first, then those already on the model (``add_hook``, ``model.hooks``,
            PyTorch module hooks, SAEs), detected before the pass.
        prompt_set, categories: the prompt set's name and one category per prompt.
        settings: the :class:`thermo_lens.core.settings.RunSettings` of the run.
        padding: how the padding of token ids given without a mask was found (``""`` otherwise).
        batch_plan: the caller's prompt indices of each batch, in the order they ran.
        origin: ``"forward pass"`` or ``"ActivationCache"`` (:func:`collect_cached`).
        cache_match: with a cache, how it was matched to the prompts and the model
            (:func:`thermo_lens.core.cache_match.match_cache`).
    """

    recorder: Recorder
    lengths: Tensor
    prompts: tuple[str, ...]
    prepend_bos: Any
    truncated: tuple[bool, ...]
    view: ModelView
    row_prompt: Tensor | None = None
    hooks: tuple = ()
    prompt_set: str = "custom"
    categories: tuple[str, ...] = ()
    settings: Any = None
    padding: str = ""
    batch_plan: tuple[tuple[int, ...], ...] = ()
    origin: str = "forward pass"
    cache_match: str = ""

    def stack(self, name: str) -> Tensor:
        """Reduction ``name`` as ``[index, prompt, ...]`` in the caller's prompt order."""
        data = self.recorder.stack(name)
        if self.row_prompt is None:
            return data
        return data[:, torch.argsort(self.row_prompt)]

    def batches(self, name: str) -> Iterable[tuple[Tensor, Tensor]]:
        """Reduction ``name`` batch by batch, as recorded: ``([index, batch, ...], lengths [batch])``,
        each batch padded only to its own longest prompt (possibly a view of the stored results: read
        it, never change it in place). Concatenate what you compute from them and put it back in the
        caller's order with :meth:`in_caller_order`."""
        keys = sorted(k for k in self.recorder._parts if k[0] == name)
        if not keys:
            raise KeyError(f"no reduction named {name!r} was recorded; recorded: {sorted(self.recorder.names)}")
        rows = self.lengths if self.row_prompt is None else self.lengths[self.row_prompt]
        start = 0
        lists = [self.recorder._parts[k] for k in keys]
        for i in range(min(len(p) for p in lists)):
            part = read_rows(self.recorder._slabs, lists, i)  # [index, batch, ...]
            size = part.shape[1]
            yield part, rows[start:start + size]
            start += size

    def in_caller_order(self, rows: Tensor, dim: int = 0) -> Tensor:
        """``rows`` (recording order along ``dim``, as from :meth:`batches`) in the caller's order."""
        if self.row_prompt is None:
            return rows
        return rows.index_select(dim, torch.argsort(self.row_prompt))

    def reduce(self, name: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """``fn`` applied per recorded batch (see :meth:`Recorder.reduce`), ``[index, prompt, ...]``
        in the caller's prompt order. Use it instead of :meth:`stack` when ``fn`` reduces the
        position dimension: no array is padded to the longest prompt of the run."""
        data = self.recorder.reduce(name, fn)
        if self.row_prompt is None:
            return data
        return data[:, torch.argsort(self.row_prompt)]

    @property
    def mask(self) -> Tensor:
        """``[prompt, pos]`` True on real tokens (pos up to the longest prompt)."""
        width = int(self.lengths.max())
        return torch.arange(width)[None, :] < self.lengths[:, None]

    @functools.cached_property
    def _model_metadata(self) -> dict[str, Any]:
        # Read once per pass (finding a dispatched model's device walks every module); each result
        # gets its own copy.
        return self.view.metadata()

    def provenance(self) -> Provenance:
        """The :class:`thermo_lens.core.provenance.Provenance` every result of this pass records."""
        return Provenance(prompts=tuple(self.prompts), lengths=self.lengths.to(torch.long).clone(),
                          truncated=tuple(bool(t) for t in self.truncated), prepend_bos=self.prepend_bos,
                          model=copy.deepcopy(self._model_metadata), hooks=tuple(self.hooks), prompt_set=self.prompt_set,
                          categories=tuple(self.categories), padding=self.padding, batch_plan=self.batch_plan,
                          origin=self.origin, cache_match=self.cache_match)



def check_silent(view: ModelView, rec: Recorder) -> None:
    """After a batch: every reduction's hook ran (host bookkeeping only: no device sync)."""
    silent = rec.silent_hooks()
    if silent:
        # Some hosts skip hook names they do not know without a word; never return a
        # result built from a partial set of states.
        raise ThermoLensInputError(
            f"{view.name} ({view.host.describe()}) never ran thermo-lens' hooks at "
            f"{', '.join(silent[:4])}{' ...' if len(silent) > 4 else ''}: its run_with_hooks "
            "skipped them, so nothing was measured. This host does not expose TransformerLens' "
            "standard hook names there; use a supported host (see thermo_lens.core.host)."
        )


def check_finite(view: ModelView, rec: Recorder) -> None:
    """After a pass (:meth:`Recorder.finish`: the results and the finiteness counts reach the host
    here, once): no real token was NaN/inf; the error names the first hook point, in the first
    failing batch, and that batch's prompts."""
    rec.finish()
    if rec.nonfinite:
        batch = rec.nonfinite_batch
        first = rec.nonfinite[0]
        layer = first.split(".")[1] if first.startswith("blocks.") else "?"
        where = f"{first} (layer {layer})" if layer != "?" else first
        if first.endswith(".hook_resid_pre") and layer.isdigit() and int(layer) > 0:
            # x_l is read where block l reads it: name the block whose output it is
            l = int(layer)
            where = f"blocks.{l - 1}.hook_resid_post (layer {l - 1}), read at {first} where block {l} reads it,"
        hint = (f" in {str(view.dtype).replace('torch.', '')} this is often overflow: try float32 or bfloat16"
                if view.dtype in (torch.float16, torch.bfloat16) else
                " check the weights (e.g. a NaN/inf parameter) and any hooks you passed")
        raise ThermoLensNumericsError(
            f"{view.name} produced NaN/inf at {where} for prompt(s) "
            f"{batch.prompt_index.tolist() if batch is not None else '?'};{hint}."
        )

