"""Provenance: what was run to produce a result (prompts, tokenization, model, interventions).

One :class:`Provenance` is shared by every activation-based result (gain, anisotropy, sheaf
traces, gain attribution) instead of the same eight fields re-declared on each. It records every
hook active during the pass (:class:`HookRecord`: the hook point, the function's qualified name,
how it was attached and, for :func:`thermo_lens.patch_from` patches or SAE-like hook objects,
where the inserted activations come from): the ``fwd_hooks`` passed to the call and those already
on the model (``model.add_hook``, ``with model.hooks(...)``, permanent hooks, PyTorch module hooks,
SAEs spliced in with SAELens), so an ablated, patched or SAE-spliced run never looks like a clean
one in its repr, frame, JSON or report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch import Tensor

from thermo_lens.core.attached import hook_source as _source, qualname as _qualname
from thermo_lens.core.result import Result

if TYPE_CHECKING:
    from thermo_lens.core.attached import AttachedHook

__all__ = ["Provenance", "HookRecord", "ATTACHED", "describe_hook", "attached_records", "hooks_text",
           "fold_legacy_fields", "ProvenanceFields"]

#: How a hook came to run in a pass (:attr:`HookRecord.attached`).
ATTACHED: dict[str, str] = {
    "fwd_hooks": "passed as fwd_hooks",
    "add_hook": "attached to the model with model.add_hook",
    "permanent": "attached to the model permanently (add_perma_hook)",
    "model.hooks": "attached by an enclosing `with model.hooks(...)`",
    "torch": "a PyTorch hook registered on a module of the model",
    "sae": "an SAE spliced in with SAELens' add_sae",
}


@dataclass(frozen=True)
class HookRecord(Result):
    """One hook active during a run.

    Attributes:
        hook_point: the hook name (``"blocks.1.hook_resid_pre"``), the filter function's name, or
            ``"module <path> (forward hook)"`` for a PyTorch module hook.
        function: the hook function's qualified name (``module.qualname``); for an SAE, its class
            and width.
        source: where inserted activations come from (a patch's clean prompts, an SAE's id), or
            ``""`` when the function does not say (set ``fn.thermo_lens_source = "..."`` to say).
        attached: how it came to run (a key of :data:`ATTACHED`): ``"fwd_hooks"`` (passed to the
            call) or already on the model (``"add_hook"``, ``"permanent"``, ``"model.hooks"``,
            ``"torch"``, ``"sae"``).
    """

    hook_point: str
    function: str
    source: str = ""
    attached: str = "fwd_hooks"

    @property
    def hidden(self) -> bool:
        """True for a hook already on the model (not passed as ``fwd_hooks``)."""
        return self.attached != "fwd_hooks"

    def __str__(self) -> str:
        how = "" if not self.hidden else f" ({ATTACHED.get(self.attached, self.attached)})"
        return f"{self.hook_point} <- {self.function}" + (f" [{self.source}]" if self.source else "") + how


def describe_hook(hook_point: str | Callable[[str], bool], fn: Callable) -> HookRecord:
    """The :class:`HookRecord` of one ``(hook_point, fn)`` pair."""
    point = hook_point if isinstance(hook_point, str) else f"filter {_qualname(hook_point)}"
    return HookRecord(hook_point=point, function=_qualname(fn), source=_source(fn))


def attached_records(hooks: Iterable[AttachedHook]) -> tuple[HookRecord, ...]:
    """:class:`HookRecord` of each :class:`thermo_lens.core.attached.AttachedHook` (what
    :func:`thermo_lens.core.attached.attached_hooks` finds on a model)."""
    return tuple(HookRecord(h.hook_point, h.function, h.source, attached=h.attached) for h in hooks)


def hooks_text(hooks: tuple[HookRecord, ...]) -> str:
    """``"none (clean run)"`` or the hooks, one per ``;``."""
    return "none (clean run)" if not hooks else "; ".join(str(h) for h in hooks)


@dataclass(frozen=True, eq=False)
class Provenance(Result):
    """What produced a result.

    Attributes:
        prompts: the prompt texts, in the caller's order.
        lengths: ``Int[Tensor, "prompt"]`` real tokens per prompt (BOS included when prepended).
        truncated: per prompt, whether it was cut to the context.
        prepend_bos: ``True``, ``False``, ``"tokenizer"`` or ``"tokens_as_given"``.
        model: :meth:`thermo_lens.ModelView.metadata` (name, geometry, dtype, raw/processed
            weights, norm placement).
        hooks: every hook active during the pass (:class:`HookRecord`): the ``fwd_hooks`` of the
            call first, then those already on the model (``add_hook``, ``model.hooks``, SAEs ...);
            empty for a clean run.
        prompt_set: the prompt set's name (``"custom"`` for a list, ``"tokens"`` for token ids).
        categories: one category per prompt.
        padding: for token ids given without a mask, how their padding was found (the pad token
            and side, as ``transformer_lens.utils.get_attention_mask`` derives it); else ``""``.
        batch_plan: the caller's prompt indices of each forward batch, in the order they ran
            (two runs with the same plan differ by exactly their hooks, no float rounding).
        origin: ``"forward pass"``, or ``"ActivationCache"`` when measured from a
            ``run_with_cache`` cache (no forward pass ran; the hooks active when it was made
            are not known).
        cache_match: with a cache, how it was matched to the prompts, the model and the pads
            (:func:`thermo_lens.core.cache_match.match_cache`); ``""`` for a forward pass.
    """

    prompts: tuple[str, ...]
    lengths: Tensor
    truncated: tuple[bool, ...]
    prepend_bos: str | bool  # as it resolved: True, False, "host:<id>" or "tokens_as_given"
    model: dict[str, Any]
    hooks: tuple[HookRecord, ...] = ()
    prompt_set: str = "custom"
    categories: tuple[str, ...] = field(default=())
    padding: str = ""
    batch_plan: tuple[tuple[int, ...], ...] = ()
    origin: str = "forward pass"
    cache_match: str = ""

    @property
    def dtype(self) -> str:
        return str(self.model.get("dtype"))

    @property
    def weights(self) -> str:
        return str(self.model.get("weights"))

    @property
    def post_ln(self) -> bool:
        return bool(self.model.get("post_ln"))

    @property
    def weights_text(self) -> str:
        """``"raw"``, or ``"processed (fold_ln, center_writing_weights, ...)"`` naming the steps."""
        steps = self.model.get("weight_processing") or ()
        w = self.weights
        return f"{w} ({', '.join(steps)})" if steps and w != "raw" else w

    @property
    def intervened(self) -> bool:
        """True when hooks or SAEs changed the run (ablation, patching, SAE...)."""
        return bool(self.hooks)

    @property
    def hidden_hooks(self) -> tuple[HookRecord, ...]:
        """The hooks that were already on the model (not passed as ``fwd_hooks``)."""
        return tuple(h for h in self.hooks if h.hidden)

    @property
    def hooks_text(self) -> str:
        if self.origin == "ActivationCache":
            sae = [h for h in self.hooks if h.attached == "sae"]
            known = "; ".join(str(h) for h in sae)
            return ("unknown: measured from an ActivationCache (the hooks active when it was made are not "
                    "visible)" + (f"; SAEs attached now: {known}" if known else ""))
        return hooks_text(self.hooks)

    def select(self, index: Tensor) -> "Provenance":
        """The provenance of the prompts ``index`` (``[k]`` long), in that order."""
        idx = [int(i) for i in index]
        cats = tuple(self.categories[i] for i in idx) if self.categories else ()
        return Provenance(prompts=tuple(self.prompts[i] for i in idx), lengths=self.lengths[index].clone(),
                          truncated=tuple(self.truncated[i] for i in idx), prepend_bos=self.prepend_bos,
                          model=self.model, hooks=self.hooks, prompt_set=self.prompt_set, categories=cats,
                          padding=self.padding, batch_plan=self.batch_plan, origin=self.origin,
                          cache_match=self.cache_match)

    def same_run_as(self, other: "Provenance") -> list[str]:
        """What differs between two runs besides their hooks (empty when they are paired)."""
        out = []
        if self.prompts != other.prompts:
            out.append(f"prompts differ ({len(self.prompts)} vs {len(other.prompts)} prompts"
                       + ("" if len(self.prompts) != len(other.prompts) else
                          f", first difference at prompt {next(i for i, (a, b) in enumerate(zip(self.prompts, other.prompts)) if a != b)}")
                       + ")")
        elif not torch.equal(self.lengths, other.lengths):
            out.append("token lengths differ (another tokenization)")
        if self.prepend_bos != other.prepend_bos:
            out.append(f"prepend_bos differs ({self.prepend_bos!r} vs {other.prepend_bos!r})")
        for k in ("name", "n_layers", "n_heads", "d_model", "dtype", "weights"):
            if self.model.get(k) != other.model.get(k):
                out.append(f"model {k} differs ({self.model.get(k)!r} vs {other.model.get(k)!r})")
        steps = [tuple(p.model.get("weight_processing") or ()) for p in (self, other)]
        if steps[0] != steps[1] and all("weight_processing" in p.model for p in (self, other)):
            out.append(f"model weight_processing differs ({list(steps[0])} vs {list(steps[1])})")
        return out

    def pairing_notes(self, other: "Provenance") -> list[str]:
        """What a paired difference ``other - self`` must say besides its numbers: hooks already on
        the model that differ between the two runs (not passed as ``fwd_hooks``, so easy to miss),
        a different batch plan (the difference then includes float rounding), a cache."""
        notes = []
        mine, theirs = [str(h) for h in self.hidden_hooks], [str(h) for h in other.hidden_hooks]
        if mine != theirs:
            notes.append("the two runs ran under different hooks already on the model (not passed as fwd_hooks): "
                         f"a: {'; '.join(mine) or 'none'} / b: {'; '.join(theirs) or 'none'}")
        if self.batch_plan and other.batch_plan and self.batch_plan != other.batch_plan:
            notes.append("the two runs were batched differently (another batch_size or sort_by_length), so the "
                         "differences include float rounding (~1e-7 relative); run both with the same settings")
        if "ActivationCache" in (self.origin, other.origin):
            notes.append("measured from an ActivationCache: the hooks active when it was made are not recorded")
        return notes

    def columns(self) -> dict[str, Any]:
        """The definition columns every frame carries."""
        return {"model": self.model.get("name"), "prepend_bos": str(self.prepend_bos), "dtype": self.dtype,
                "weights": self.weights, "weight_processing": ", ".join(self.model.get("weight_processing") or ()),
                "post_ln": self.post_ln, "hooks": self.hooks_text}


_LEGACY = ("prompts", "lengths", "truncated", "prepend_bos", "dtype", "weights", "post_ln", "model")


def fold_legacy_fields(fields: dict[str, Any], lengths_key: str = "lengths") -> dict[str, Any]:
    """Results stored before :class:`Provenance` existed carry its fields flat: fold them in."""
    if "provenance" in fields or "prompts" not in fields:
        return fields
    f = dict(fields)
    model = dict(f.pop("model", {}) or {})
    for k in ("dtype", "weights", "post_ln"):
        if k in f:
            model.setdefault(k, f.pop(k))
    prompts = tuple(f.pop("prompts"))
    lengths = f.pop(lengths_key)
    f["provenance"] = Provenance(prompts=prompts, lengths=lengths,
                                 truncated=tuple(f.pop("truncated", (False,) * len(prompts))),
                                 prepend_bos=f.pop("prepend_bos", None), model=model)
    return f


class ProvenanceFields:
    """Read-only access to a result's ``provenance`` under the names results always had."""

    provenance: Provenance

    @property
    def prompts(self) -> tuple[str, ...]:
        return self.provenance.prompts

    @property
    def lengths(self) -> Tensor:
        """``[prompt]`` real tokens per prompt (BOS included when prepended)."""
        return self.provenance.lengths

    @property
    def n_tokens(self) -> Tensor:
        """``[prompt]`` real tokens per prompt (BOS included when prepended)."""
        return self.provenance.lengths

    @property
    def truncated(self) -> tuple[bool, ...]:
        return self.provenance.truncated

    @property
    def prepend_bos(self) -> str | bool:
        return self.provenance.prepend_bos

    @property
    def dtype(self) -> str:
        return self.provenance.dtype

    @property
    def weights(self) -> str:
        return self.provenance.weights

    @property
    def post_ln(self) -> bool:
        return self.provenance.post_ln

    @property
    def model(self) -> dict[str, Any]:
        return self.provenance.model

    @property
    def hooks(self) -> tuple[HookRecord, ...]:
        """The user hooks of the run (empty for a clean run)."""
        return self.provenance.hooks

    @classmethod
    def _upgrade_fields(cls, fields: dict[str, Any]) -> dict[str, Any]:
        return fold_legacy_fields(fields)
